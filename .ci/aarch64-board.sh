#!/usr/bin/env bash
# An emulated aarch64 board for tests/test_aarch64_board.py: Debian's aarch64 Python under
# user-mode QEMU, with TVM's aarch64 wheel of the host's version. Idempotent: a second run
# only checks. Needs Debian (apt, multiarch) and root or sudo for the packages.
#
# usage: bash .ci/aarch64-board.sh [--python HOST_PYTHON] [DIR]
#   HOST_PYTHON  the Python whose apache-tvm and apache-tvm-ffi versions the board gets
#                (default: python3 on PATH; it must have apache-tvm installed)
#   DIR          where the board's environment goes (default: .aarch64-board in the repo)
#
# What it lays out:
#   Debian packages  qemu-user, gcc-aarch64-linux-gnu, libpython3.X:arm64 and libstdc++6:arm64
#                    (dpkg --add-architecture arm64). Only libpython (Multi-Arch: same) is
#                    co-installable with the host's Python: Debian's python3.X:arm64 would
#                    replace the host's interpreter, so the board's interpreter is a
#                    five-line main() calling Py_BytesMain, cross-compiled here.
#   DIR/bin/python3  a shell script running it under qemu-aarch64 with argv[0] set to the
#                    script, so that sys.executable (which TVM's RPC server starts again as
#                    a worker) comes back through QEMU: no binfmt_misc needed.
#   DIR/pyvenv.cfg   a virtual environment over Debian's stdlib (/usr/lib/python3.X), without
#                    the system's site-packages.
#   DIR/lib/python3.X/site-packages  apache-tvm, apache-tvm-ffi (the host's versions), numpy,
#                    pluggy and TVM's RPC extras (tornado, psutil, cloudpickle): aarch64 wheels
#                    installed by the host's pip (--platform), nothing run under QEMU.
# umahub itself is not installed there: the test puts the repo's src/ on the board's
# PYTHONPATH, and no plugin (a board needs none).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=python3
if [ "${1:-}" = "--python" ]; then PYTHON=$2; shift 2; fi
DIR=$(realpath -m "${1:-.aarch64-board}")
start=$SECONDS
say() { echo "aarch64-board: $* ($((SECONDS - start)) s)"; }
die() { echo "aarch64-board: error: $*" >&2; exit 1; }

# -- Debian packages --------------------------------------------------------------------------
libpython() { find /usr/lib/aarch64-linux-gnu -maxdepth 1 -name 'libpython3.*.so.1.0' 2>/dev/null | sort -V | tail -1; }
if ! command -v qemu-aarch64 >/dev/null || ! command -v aarch64-linux-gnu-gcc >/dev/null \
    || [ -z "$(libpython)" ] || [ ! -e /usr/lib/aarch64-linux-gnu/libstdc++.so.6 ]; then
    command -v apt-get >/dev/null || die "needs Debian's packages (apt-get): qemu-user," \
        "gcc-aarch64-linux-gnu, libpython3.X:arm64, libstdc++6:arm64"
    sudo=
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || die "installing Debian packages needs root or sudo"
        sudo=sudo
    fi
    dpkg --print-foreign-architectures | grep -qx arm64 || $sudo dpkg --add-architecture arm64
    $sudo apt-get update -qq
    # the Debian release's own Python 3 (libpython3-stdlib depends on libpython3.X-stdlib)
    version=$(apt-cache depends libpython3-stdlib \
        | sed -n 's/.*Depends: libpython\(3\.[0-9]*\)-stdlib.*/\1/p' | sed -n 1p)
    [ -n "$version" ] || die "apt-cache finds no libpython3.X-stdlib: which Debian is this?"
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        qemu-user gcc-aarch64-linux-gnu "libpython$version:arm64" libstdc++6:arm64 >/dev/null
    say "installed qemu-user, gcc-aarch64-linux-gnu, libpython$version:arm64, libstdc++6:arm64"
fi
LIBPYTHON=$(libpython)
PYV=$(basename "$LIBPYTHON" | sed 's/^libpython\(3\.[0-9]*\)\.so.*/\1/')

# -- the interpreter and the virtual environment ---------------------------------------------
mkdir -p "$DIR/bin"
if [ ! -x "$DIR/bin/python3.aarch64" ] || [ "$LIBPYTHON" -nt "$DIR/bin/python3.aarch64" ]; then
    printf '%s\n' 'extern int Py_BytesMain(int argc, char **argv);' \
        'int main(int argc, char **argv) { return Py_BytesMain(argc, argv); }' > "$DIR/main.c"
    aarch64-linux-gnu-gcc -O2 -o "$DIR/bin/python3.aarch64" "$DIR/main.c" "$LIBPYTHON" \
        -Wl,-rpath-link=/usr/lib/aarch64-linux-gnu
    say "built $DIR/bin/python3.aarch64 on $LIBPYTHON"
fi
cat > "$DIR/bin/python3" <<'EOF'
#!/bin/sh
# Debian's aarch64 Python under user-mode QEMU (made by .ci/aarch64-board.sh). argv[0] is this
# script, so sys.executable, which TVM's RPC server starts again, comes back here.
exec qemu-aarch64 -L / -0 "$0" "$(dirname "$0")/python3.aarch64" "$@"
EOF
chmod +x "$DIR/bin/python3"
ln -sf python3 "$DIR/bin/python"
printf 'home = /usr/bin\ninclude-system-site-packages = false\nversion = %s\n' "$PYV" \
    > "$DIR/pyvenv.cfg"

# -- the packages: aarch64 wheels, TVM of the host's version ---------------------------------
versions=$("$PYTHON" -c 'import importlib.metadata as m
print(" ".join(f"{d}=={m.version(d)}" for d in ("apache-tvm", "apache-tvm-ffi")))') \
    || die "$PYTHON has no apache-tvm: give the Python the tests run with (--python)"
want="$versions numpy pluggy tornado psutil cloudpickle"
SITE="$DIR/lib/python$PYV/site-packages"
if [ "$(cat "$DIR/installed" 2>/dev/null)" != "$want" ]; then
    rm -rf "$SITE" "$DIR/installed"
    glibc=$(getconf GNU_LIBC_VERSION | sed 's/.*2\.\([0-9]*\).*/\1/')  # 36 for 2.36
    platforms=(--platform manylinux2014_aarch64)
    for minor in $(seq 17 "$glibc"); do platforms+=(--platform "manylinux_2_${minor}_aarch64"); done
    # shellcheck disable=SC2086
    "$PYTHON" -m pip install -q --disable-pip-version-check --no-cache-dir --target "$SITE" \
        "${platforms[@]}" --python-version "$PYV" --implementation cp --only-binary=:all: $want
    echo "$want" > "$DIR/installed"
    say "installed $want for aarch64, Python $PYV"
fi

# -- it runs -----------------------------------------------------------------------------------
"$DIR/bin/python3" -c 'import platform, tvm
assert platform.machine() == "aarch64", platform.machine()
print(f"aarch64-board: Python {platform.python_version()} on {platform.machine()} (QEMU), "
      f"apache-tvm {tvm.__version__}")'
say "ready: $DIR/bin/python3"
