"""The machine a model is built for: this one, or another (cross-compiling).

::

    hub.compile(mod, target="llvm -mtriple=aarch64-linux-gnu", cc="aarch64-linux-gnu-gcc")
    umahub compile cnn -o cnn.so --target "llvm -mtriple=aarch64-linux-gnu" \\
        --cc aarch64-linux-gnu-gcc

A target is an LLVM target, written as TVM's older command-line form
(``"llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a76 -mattr=+neon"``), as
TVM's JSON form (``'{"kind": "llvm", "mtriple": "aarch64-linux-gnu"}'``), or
as a dict of that form; apache-tvm 0.27 takes only the dict, so umahub turns
the command-line form into it. The host part and the LLVM partitions of a
model are built for it (plugins read it as ``context.target``); the C
partitions and the export are compiled and linked by ``cc``. A target of
another architecture than this machine's needs a ``cc`` for it, and the
model cannot run here: run its library on a board (``umahub run model.so
--rpc ...``).

Everything is checked before the long work starts: the target string
(TVM and its LLVM must know it), the compiler (on ``PATH``, and building for
the target's architecture, as ``cc -dumpmachine`` says). This module imports
TVM only inside the functions that ask it.

Why this module is long: a target is read (the forms above), checked
(TVM's LLVM, the compiler's architecture), found for this machine (the CPU's
name and the features LLVM's name for it lacks) and asked about (features,
vector lanes, the build's target where none is given) in one place; split,
the host's target and the user's would be parsed and asked by two modules.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from umahub.errors import UmahubError, last_line

__all__ = [
    "BuildTarget",
    "TargetError",
    "elf_machine",
    "has_feature",
    "host_target",
    "machine_of",
    "or_host",
    "parse_target",
    "resolve",
    "this_machine",
    "vector_lanes",
]


def host_target() -> dict[str, Any]:
    """The LLVM target of this machine's CPU (``-mcpu``), so that its vector units are used.

    Plain ``"llvm"`` is generic x86-64 (SSE2, no FMA): vectorized loops would
    run at a fraction of the CPU's width. The wheel's LLVM rejects
    ``-mcpu=native`` for its target triple, so the CPU is asked by name; where
    LLVM cannot name it, the generic target. Features the CPU reports that
    LLVM's CPU of that name lacks (AMX on a Xeon a virtual machine reports as
    another model) are named as well (``mattr``). A dict, because TVM 0.27
    reads no ``-mcpu=`` in a target string. The host's part of a model and the bundled
    accelerators' LLVM kernels are built for it unless a compile names a
    target.
    """
    import tvm

    try:
        cpu = str(tvm.target.codegen.llvm_get_system_cpu())
    except Exception:  # an LLVM that cannot say
        cpu = ""
    if not cpu or cpu == "generic":
        return {"kind": "llvm"}
    target: dict[str, Any] = {"kind": "llvm", "mcpu": cpu}
    extra = _unnamed_features(cpu, frozenset(_cpu_flags()))
    if extra:
        target["mattr"] = [f"+{f}" for f in extra]
    return target


#: CPU features whose instructions umahub's kernels may use, as ``/proc/cpuinfo``
#: names them and as LLVM does.
_FEATURES = {
    "avx512_vnni": "avx512vnni",
    "avx512_bf16": "avx512bf16",
    "avx512_fp16": "avx512fp16",
    "avx512vbmi": "avx512vbmi",
    "avx512_vbmi2": "avx512vbmi2",
    "avx_vnni": "avxvnni",
    "amx_tile": "amx-tile",
    "amx_int8": "amx-int8",
    "amx_bf16": "amx-bf16",
}


@functools.cache
def _unnamed_features(cpu: str, flags: frozenset[str]) -> tuple[str, ...]:
    """Features of ``flags`` (as ``/proc/cpuinfo`` reports them) that LLVM's CPU
    ``cpu`` lacks, in LLVM's names. Asked once per CPU: LLVM takes about 1.4 ms
    to say, and every build asks for the host's target many times.

    LLVM names the CPU by its model number, and a virtual machine may report a
    model that is not its CPU's: an Intel Xeon with AMX, AVX512-FP16 and BF16
    (Sapphire Rapids or later) reported as model 167, which LLVM takes for a Rocket
    Lake, a CPU without them. Built for the name alone, a kernel could not use them.
    """
    import tvm

    named = tvm.target.Target({"kind": "llvm", "mcpu": cpu})
    extra = []
    for flag, feature in _FEATURES.items():
        if flag not in flags:
            continue
        try:
            if not tvm.target.codegen.target_has_features(feature, named):
                extra.append(feature)
        except Exception:  # an LLVM that does not know the feature
            continue
    return tuple(extra)


def or_host(target: Any = None) -> Any:
    """``target`` (a ``tvm.target.Target``, as ``CompileContext.target`` holds one),
    or this machine's (:func:`host_target`) where it is None: what a build for it
    targets."""
    import tvm

    return target if target is not None else tvm.target.Target(host_target())


def has_feature(feature: str, target: Any = None) -> bool:
    """Whether the LLVM ``target`` (a ``tvm.target.Target``, a dict or a string; None:
    :func:`host_target`) has CPU feature ``feature`` as LLVM names it
    (``"avx512vnni"``); False for another kind of target or an LLVM that cannot say."""
    import tvm

    if target is None:
        target = host_target()
    if not isinstance(target, tvm.target.Target):
        target = tvm.target.Target(target)
    if str(target.kind.name) != "llvm":
        return False
    try:
        return bool(tvm.target.codegen.target_has_features(feature, target))
    except Exception:  # an LLVM that cannot say
        return False


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def vector_lanes(target: Any = None) -> int:
    """float32 lanes of one vector register: of ``target``, or of this machine's CPU.

    With a target (a ``tvm.target.Target``, as a cross build's
    ``context.target``): what LLVM says of its vector width, 4 lanes where it
    cannot say. Without one: the widest vector registers this CPU reports
    (``/proc/cpuinfo``: 16 with AVX-512, 8 with AVX or AVX2, 4 otherwise),
    which need not be the width LLVM prefers for the CPU. Kernels pick tile
    sizes by it.
    """
    if target is None:
        flags = _cpu_flags()
        if "avx512f" in flags:
            return 16
        return 8 if "avx2" in flags or "avx" in flags else 4
    import tvm

    try:
        bits = int(tvm.target.codegen.llvm_get_vector_width(target))
    except Exception:
        bits = 128
    return max(1, bits // 32)


# ELF e_machine -> what platform.machine() says on such a machine.
_ELF_MACHINES = {3: "i386", 40: "arm", 62: "x86_64", 183: "aarch64", 243: "riscv64"}
_SAME_MACHINE = {"amd64": "x86_64", "arm64": "aarch64", "i486": "i386", "i586": "i386"}
_SAME_MACHINE.update({"i686": "i386", "x64": "x86_64"})

EXAMPLE = "llvm -mtriple=aarch64-linux-gnu"
_LIST_OPTIONS = {"mattr", "keys", "libs", "cl-opt"}


class TargetError(UmahubError):
    """A target or cross compiler that cannot be used; the message says what to give instead."""


def machine_of(name: str) -> str:
    """The architecture of a triple or machine name as ``platform.machine()`` says it.

    ``"aarch64-linux-gnu"`` and ``"arm64"`` are ``"aarch64"``,
    ``"armv7l"`` and ``"arm-linux-gnueabihf"`` are ``"arm"``, ``"amd64"`` is
    ``"x86_64"``.
    """
    arch = str(name).strip().split("-", 1)[0].lower()
    arch = _SAME_MACHINE.get(arch, arch)
    if arch.startswith("arm") or arch.startswith("thumb"):
        return "arm"
    return arch


def this_machine() -> str:
    """This machine's architecture (``x86_64``, ``aarch64``...)."""
    return machine_of(platform.machine())


def elf_machine(path: str) -> str:
    """The architecture an ELF library is built for (``x86_64``, ``aarch64``...); "" if unknown."""
    with open(path, "rb") as f:
        head = f.read(20)
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return ""
    order: Literal["little", "big"] = "little" if head[5] == 1 else "big"
    code = int.from_bytes(head[18:20], order)
    return _ELF_MACHINES.get(code, f"ELF machine {code}")


def triple_of(machine: str) -> str:
    """The usual GNU/Linux triple of an architecture (the prefix of its cross compiler)."""
    return {"arm": "arm-linux-gnueabihf"}.get(machine, f"{machine}-linux-gnu")


def parse_target(value: Any, where: str = "target") -> dict[str, Any]:
    """A target as TVM's dict form: from a dict, a JSON string, the command-line form,
    or a ``tvm.target.Target`` (its JSON).

    Raises:
        TargetError: not of any of these forms, or not an LLVM target.
    """
    if isinstance(value, Mapping):
        spec = dict(value)
    elif isinstance(value, str) or type(value).__name__ == "Target":
        text = str(value).strip()
        if text.startswith("{"):
            try:
                spec = json.loads(text)
            except ValueError as exc:
                raise TargetError(f"{where} {text!r} is not valid JSON: {exc}") from None
            if not isinstance(spec, dict):
                raise TargetError(f"{where} {text!r}: expected a JSON object")
        else:
            spec = _command_line(text, where)
    else:
        raise TargetError(
            f"{where}: expected a string like {EXAMPLE!r} or a dict, got {type(value).__name__}"
        )
    kind = spec.get("kind")
    if kind != "llvm":
        raise TargetError(
            f"{where} {_show(value)}: umahub builds the host part with LLVM, so the target "
            f"must be an llvm target (kind {kind!r} is not); say {EXAMPLE!r}"
        )
    return spec


def _show(value: Any) -> str:
    return repr(value if isinstance(value, str) else json.dumps(value, default=str))


def _command_line(text: str, where: str) -> dict[str, Any]:
    """``"llvm -mtriple=x -mattr=+a,+b"`` as ``{"kind": "llvm", "mtriple": "x", "mattr": [..]}``."""
    words = text.split()
    if not words:
        raise TargetError(f"{where} is empty; say {EXAMPLE!r}")
    spec: dict[str, Any] = {"kind": words[0]}
    for word in words[1:]:
        key, sep, raw = word.lstrip("-").partition("=")
        if not word.startswith("-") or not sep or not key:
            raise TargetError(
                f"{where} {text!r}: {word!r} is not an option of the form -name=value "
                f"(as in {EXAMPLE!r})"
            )
        value: Any = raw
        if key in _LIST_OPTIONS:
            value = [v for v in raw.split(",") if v]
        elif raw.isdigit():
            value = int(raw)
        spec[key] = value
    return spec


@dataclass(eq=False)
class BuildTarget:
    """The machine a compile builds for, checked (made by :func:`resolve`).

    Attributes:
        spec: the LLVM target in TVM's dict form.
        text: the target as the user wrote it, for messages.
        cc: the C compiler of C partitions and the export (None: TVM's default,
            ``$CXX``/``$CC`` or ``g++``).
        arch: the architecture it builds for (``"aarch64"``).
    """

    spec: dict[str, Any]
    text: str
    cc: str | None = None
    arch: str = field(default_factory=this_machine)
    _tvm: Any = field(default=None, repr=False)

    @property
    def native(self) -> bool:
        """Whether a model built for it runs on this machine."""
        return self.arch == this_machine()

    def tvm(self) -> Any:
        """The ``tvm.target.Target``."""
        if self._tvm is None:
            import tvm

            self._tvm = tvm.target.Target(self.spec)
        return self._tvm

    def not_here(self, library: str = "model.so") -> str:
        """Why a model built for it cannot run here, and where to run it."""
        return (
            f"this model is built for {self.arch} (target {self.text}), not for this machine "
            f"({this_machine()}); run it on such a board: umahub run {library} --rpc HOST:PORT "
            "--key KEY (export it first: Compiled.export_library)"
        )


def resolve(
    target: Any = None, cc: str | None = None, *, target_option: str = "target",
    cc_option: str = "cc",
) -> BuildTarget | None:  # fmt: skip
    """Check a target and a C compiler; None when neither is given (build for this machine).

    ``target_option`` and ``cc_option`` name them in messages (``--target``).

    Raises:
        TargetError: a target TVM or its LLVM does not know, a compiler that
            is not installed or builds for another architecture, a target of
            another architecture without a compiler for it.
    """
    if isinstance(target, BuildTarget):
        return target
    if target is None and cc is None:
        return None
    spec = parse_target(target if target is not None else {"kind": "llvm"}, target_option)
    text = _show(target) if target is not None else "llvm"
    built = _tvm_target(spec, text, target_option)
    triple = str(spec.get("mtriple") or built.attrs.get("mtriple", "") or "")
    arch = machine_of(triple) if triple else this_machine()
    if cc is not None:
        _check_cc(cc, arch, cc_option)
    elif arch != this_machine():
        raise TargetError(
            f"{target_option} {text} builds for {arch}, not for this machine "
            f"({this_machine()}): give a C compiler for {arch} to compile and link the "
            f"library ({cc_option} {triple_of(arch)}-gcc; on Debian or Ubuntu: apt install "
            f"gcc-{triple_of(arch)})"
        )
    return BuildTarget(spec, text.strip("'\""), cc, arch, built)


def _tvm_target(spec: dict[str, Any], text: str, option: str) -> Any:
    """The ``tvm.target.Target`` of ``spec``; a target TVM or LLVM refuses is a TargetError."""
    import tvm

    try:
        built = tvm.target.Target(spec)
        tvm.target.codegen.llvm_get_vector_width(built)  # LLVM checks the triple only here
        return built
    except Exception as exc:
        detail = last_line(exc).split("error: ")[-1].strip(" `'")
        raise TargetError(
            f"{option} {text} is not a target this TVM can build for ({detail}); say, for a "
            f"64-bit Arm board, {EXAMPLE!r}"
        ) from None


def _check_cc(cc: str, arch: str, option: str) -> None:
    """``cc`` is installed and builds for ``arch`` (by ``cc -dumpmachine``)."""
    path = shutil.which(cc) if os.sep not in cc else (cc if os.access(cc, os.X_OK) else None)
    if path is None:
        raise TargetError(
            f"{option} {cc}: no such compiler (not on PATH); install it (for {arch} on "
            f"Debian or Ubuntu: apt install gcc-{triple_of(arch)}) or give its path"
        )
    try:
        done = subprocess.run(
            [path, "-dumpmachine"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TargetError(f"{option} {cc} cannot be run: {exc}") from None
    builds_for = done.stdout.strip()
    if done.returncode != 0 or not builds_for:
        return  # a compiler that does not say (not GCC or Clang): trusted
    if machine_of(builds_for) != arch:
        raise TargetError(
            f"{option} {cc} builds for {builds_for}, the target is {arch}; give a compiler "
            f"for {arch} ({option} {triple_of(arch)}-gcc)"
        )
