"""Stage 6, codegen: a partition's TIR becomes a runtime module.

The default codegens, named by ``Accelerator.codegen``:

* ``"llvm"``: ``tvm.tirx.build(module, target="llvm", pipeline=<phased>)``, or
  the compile's target (``context.target``, a cross build).
* ``"c"``: TVM's C codegen, built with vectorization lowered to plain loops
  (TVM's C printer has no vector types; the C compiler vectorizes them), with
  the accelerator's ``c_includes`` put at the top of the source. The C is
  compiled when the model is exported (by the compile's ``cc`` in a cross
  build), with ``-O3`` (gcc's ``-O2`` vectorizes only loops that need no
  run-time check that two pointers do not overlap, which TVM's C loops over
  several buffers do: at ``-O2`` a convolution's bias add runs one float at a
  time), for this machine's CPU in a build for it (``-march=native``, as the
  LLVM kernels are built for it: without it gcc writes SSE2 code, and the
  vanilla accelerator's kernel ran SqueezeNet's stem 1.4 times slower on an
  Intel Xeon), the accelerator's ``include_dirs`` and its ``c_sources`` (see
  :func:`export_options` and :func:`cpu_options`).

Several C modules are linked into one library; TVM's C codegen defines the
same two helper symbols in each (``__tvm_ffi__library_ctx`` and, for a module
with one function, ``__tvm_ffi_main``), so they are made weak. TVM's C printer
writes infinities and NaN as the names ``inff``, ``nanf``, ``inf`` and ``nan``,
which no C compiler knows (PyTorch's hardswish is ``clip(x, 0, inf)``): they
become ``INFINITY`` and ``NAN`` of ``<math.h>``.

Every C module, the default codegen's or a plugin's, is compiled (syntax
only) when the partition is lowered, not when the model is first exported:
C that does not compile is a failure of that partition, to which ``on-error``
applies (see :func:`check_c`).

Each accelerator is also registered as TVM's ``relax.ext.<name>`` codegen, so
that ``relax.transform.RunCodegen`` places the partitions' modules in the
host module, as for any BYOC backend.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

import tvm
import tvm_ffi

from umahub.errors import CompileError
from umahub.plugin.accelerator import Accelerator

__all__ = [
    "build_default",
    "c_special_floats",
    "check_c",
    "check_llvm_target",
    "export_options",
    "module_kind",
    "prepend_c",
    "register_ext_codegen",
    "serving",
    "static_libraries",
]

_WEAK = (
    (
        "void* __tvm_ffi__library_ctx = NULL;",
        "__attribute__((weak)) void* __tvm_ffi__library_ctx = NULL;",
    ),
    ("TVM_DLL int32_t __tvm_ffi_main(", "__attribute__((weak)) TVM_DLL int32_t __tvm_ffi_main("),
)


def _function_names(module: Any, symbol: str) -> list[str]:
    names = []
    for name in (f"__tvm_ffi_{symbol}", "__tvm_ffi_main", symbol):
        with contextlib.suppress(Exception):
            if module.implements_function(name):
                names.append(name)
    return names


# A string literal (left as it is) or one of the names TVM prints for special floats.
_SPECIAL_FLOAT = re.compile(r'("(?:\\.|[^"\\\n])*")|(?<![\w.])(inff|nanf|inf|nan)(?![\w(])')
_SPECIAL_VALUE = {
    "inff": "INFINITY",
    "nanf": "NAN",
    "inf": "((double)INFINITY)",
    "nan": "((double)NAN)",
}


def c_special_floats(source: str) -> str:
    """``source`` with TVM's names for infinities and NaN written as ``<math.h>`` constants."""
    if not any(name in source for name in ("inf", "nan")):
        return source
    return _SPECIAL_FLOAT.sub(lambda m: m.group(1) or _SPECIAL_VALUE[m.group(2)], source)


def prepend_c(module: Any, text: str, symbol: str) -> Any:
    """A C source module with ``text`` on top, its shared helper symbols made weak,
    and infinities and NaN written as valid C."""
    source = c_special_floats(module.inspect_source())
    if "<math.h>" not in source:
        source = "#include <math.h>\n" + source
    for old, new in _WEAK:
        if new not in source:
            source = source.replace(old, new)
    create = tvm_ffi.get_global_func("runtime.CSourceModuleCreate")
    header = text if not text or text.endswith("\n") else text + "\n"
    return create(header + source, "c", _function_names(module, symbol), [])


def _c_compiler() -> str:
    """The compiler that ``export_library`` uses (TVM's ``cc.create_shared``)."""
    try:
        from tvm.support import cc  # apache-tvm 0.27
    except ImportError:  # 0.25, 0.26
        from tvm.contrib import cc
    return cc.get_cc() or "g++"  # $CXX or $CC first, as the export


def check_c(module: Any, accelerator: Accelerator, cc: str | None = None) -> None:
    """Compile a C source module's code (syntax only) as the export will, with ``cc``
    (a cross compiler) or the export's default compiler.

    Raises:
        CompileError: the compiler's first error, and the line it points at.
    """
    import tvm_ffi.libinfo

    source = module.inspect_source()
    includes = [
        tvm.libinfo.find_include_path(),
        tvm_ffi.libinfo.find_include_path(),
        tvm_ffi.libinfo.find_dlpack_include_path(),
        *accelerator.include_dirs,
    ]
    with tempfile.TemporaryDirectory(prefix="umahub-c-") as tmp:
        path = os.path.join(tmp, f"{accelerator.name}.c")
        with open(path, "w") as f:
            f.write(source)
        flags = [f"-I{d}" for d in _flatten(includes)]
        done = subprocess.run(
            [cc or _c_compiler(), "-fsyntax-only", "-w", *flags, path],
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "error" in line]
        first = errors[0].split(f"{accelerator.name}.c:", 1)[-1] if errors else done.stderr
        raise CompileError(f"the generated C does not compile: {first.strip()}")


def check_llvm_target(module: Any, target: Any) -> None:
    """An LLVM module of a cross build is built for the compile's target's architecture.

    Raises:
        CompileError: it is built for another (a codegen that ignored ``context.target``).
    """
    from umahub.targets import machine_of, this_machine

    def arch(triple: str) -> str:
        return machine_of(triple) if triple else this_machine()

    try:
        built = json.loads(str(module.get_function("_get_target_string")()))
    except Exception:  # not TVM's LLVM module, or an older TVM's string form: not checked
        return
    wanted = arch(str(target.attrs.get("mtriple", "") or ""))
    got = arch(str(built.get("mtriple", "") or ""))
    if got != wanted:
        raise CompileError(
            f"the LLVM code is built for {got}, the compile's target is {wanted}: build it "
            "for context.target (tvm.tirx.build(module, target=context.target, ...))"
        )


def _flatten(paths: Iterable[Any]) -> list[str]:
    out: list[str] = []
    for p in paths:
        if isinstance(p, (list, tuple)):
            out += [str(x) for x in p]
        elif p:
            out.append(str(p))
    return out


def build_default(
    accelerator: Accelerator,
    module: tvm.IRModule,
    symbol: str,
    pipeline: str,
    target: Any = None,
) -> Any:
    """Build ``module`` with the accelerator's default codegen and the phased TIR pipeline.

    ``target``: the LLVM target of an ``"llvm"`` codegen (``context.target``);
    None: this machine. C is the same for every target (its compiler differs).
    """
    if accelerator.codegen == "llvm":
        return tvm.tirx.build(
            module, target=target if target is not None else "llvm", pipeline=pipeline
        )
    with tvm.transform.PassContext(config={"tirx.disable_vectorize": True}):
        built = tvm.tirx.build(module, target="c", pipeline=pipeline)
    return prepend_c(built, accelerator.c_includes, symbol)


def module_kind(module: Any) -> str:
    """The kind of a runtime module (``"c"``, ``"llvm"``...), on every supported TVM."""
    kind = getattr(module, "kind", None)
    return str(kind if kind is not None else getattr(module, "type_key", ""))


def cpu_options(native: bool, cc: str | None = None) -> list[str]:
    """The C compiler's options for the CPU the code runs on.

    ``native``: a build for this machine, whose LLVM kernels are built for its
    CPU (:func:`umahub.targets.host_target`): ``-march=native``, where the
    compiler (``cc``, or the export's default) takes it. A build for another
    machine gets none: its compiler targets the board's architecture, whose
    CPU umahub does not know.
    """
    return ["-march=native"] if native and _takes_native(cc or _c_compiler()) else []


@functools.cache
def _takes_native(compiler: str) -> bool:
    """Whether ``compiler`` accepts ``-march=native`` (clang on some architectures does not)."""
    try:
        done = subprocess.run(
            [compiler, "-march=native", "-x", "c", "-E", "-", "-o", os.devnull],
            input="",
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def export_options(accelerators: Iterable[Accelerator], *, native: bool) -> list[str]:
    """Compiler options that an export needs: -O3, the CPU's (:func:`cpu_options`;
    ``native``: a build for this machine), include dirs and vendor C sources."""
    # -z now: a missing vendor symbol fails when the library is loaded, not at its first call.
    options = ["-O3", *cpu_options(native), "-Wl,-z,now"]
    for acc in accelerators:
        options += [f"-I{d}" for d in acc.include_dirs]
        options += list(acc.c_sources)
    return list(dict.fromkeys(options))


def static_libraries(
    partitions: Iterable[tuple[str, Any, Accelerator]], cc: str | None = None, *, native: bool
) -> tuple[dict[str, Any], list[Any]]:
    """C modules compiled here into TVM static libraries, and the kernel libraries.

    TVM's own ``export_library`` (and ``relax.VirtualMachine`` of an
    executable, which exports it) compiles a C module with TVM's include
    directories only and links nothing else: a plugin's header
    (``include_dirs``) is not found and its ``c_sources`` are not linked. A
    static library (``tvm.runtime.load_static_library``, an object file) is
    linked as it is: each C module is compiled with the options of
    :func:`export_options`, and each accelerator's ``c_sources`` once.

    Args:
        partitions: (symbol, runtime module, accelerator) of every partition.
        cc: the C compiler (a cross build's); None: the export's default.
        native: a build for this machine, compiled for its CPU (:func:`cpu_options`).

    Returns:
        The static library of each partition whose module is C, by symbol;
        and the kernel libraries (one per C source).

    Raises:
        CompileError: a source does not compile (the compiler's first error).
    """
    import tvm_ffi.libinfo

    base = [
        tvm.libinfo.find_include_path(),
        tvm_ffi.libinfo.find_include_path(),
        tvm_ffi.libinfo.find_dlpack_include_path(),
    ]
    libraries: dict[str, Any] = {}
    kernels: list[Any] = []
    sources_done: set[str] = set()
    cpu = cpu_options(native, cc)
    with tempfile.TemporaryDirectory(prefix="umahub-static-") as tmp:

        def compile_object(source: str, accelerator: Accelerator, names: list[str]) -> Any:
            obj = os.path.join(tmp, f"{len(os.listdir(tmp))}.o")
            flags = [f"-I{d}" for d in _flatten([*base, *accelerator.include_dirs])]
            done = subprocess.run(
                [cc or _c_compiler(), "-c", "-fPIC", "-O3", *cpu, *flags, source, "-o", obj],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                errors = [line for line in done.stderr.splitlines() if "error" in line]
                raise CompileError(
                    f"{accelerator.name}: {os.path.basename(source)} does not compile: "
                    f"{(errors or [done.stderr])[0].strip()}"
                )
            return tvm.runtime.load_static_library(obj, names)

        for symbol, module, accelerator in partitions:
            if module_kind(module) == "c":
                path = os.path.join(tmp, f"{symbol}.c")
                with open(path, "w") as f:
                    f.write(module.inspect_source())
                names = _function_names(module, symbol)
                libraries[symbol] = compile_object(path, accelerator, names)
            for source in accelerator.c_sources:
                if source not in sources_done:
                    sources_done.add(source)
                    kernels.append(compile_object(source, accelerator, []))
    return libraries, kernels


_SERVING: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "umahub_serving", default=None
)


@contextlib.contextmanager
def serving(modules: dict[str, Any]) -> Iterator[None]:
    """While inside, ``relax.ext.<accelerator>`` returns these built modules by symbol."""
    token = _SERVING.set(modules)
    try:
        yield
    finally:
        _SERVING.reset(token)


def register_ext_codegen(accelerator: Accelerator) -> None:
    """Register ``relax.ext.<accelerator>`` for RunCodegen (idempotent)."""

    def codegen(functions: Any, options: Any, constant_names: Any) -> list[Any]:
        modules = _SERVING.get()
        if modules is None:
            raise CompileError(
                f"relax.ext.{accelerator.name} is umahub's codegen: compile through "
                "umahub.Hub().compile(mod) so that the plugins' hooks run"
            )
        out = []
        for func in functions:
            symbol = str(func.attrs["global_symbol"])
            if symbol not in modules:
                raise CompileError(f"relax.ext.{accelerator.name}: no module built for {symbol}")
            out.append(modules[symbol])
        return out

    tvm_ffi.register_global_func(f"relax.ext.{accelerator.name}", codegen, override=True)
