"""What a plugin declares: an accelerator (the target_arch) and its memory pools."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from umahub.plugin.options import Option, checked_options

__all__ = [
    "CODEGENS",
    "COPY_KINDS",
    "SCOPE_RANKS",
    "Accelerator",
    "MemoryPool",
    "OnChipBuffer",
]

#: The default codegens an accelerator can name; ``"device"``: a device of its own, whose
#: plugin's ``umahub_codegen`` returns a :class:`umahub.plugin.device.DeviceProgram`.
CODEGENS = ("c", "llvm", "device")
#: How a pool is filled: ``"sync"`` copies by the CPU, ``"async"`` by a DMA engine.
COPY_KINDS = ("sync", "async")

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_RUNTIME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: The shape of a Relax operator's name; whether it is registered is checked with TVM.
_OP = re.compile(r"^relax(\.[A-Za-z_][A-Za-z0-9_]*)+$")
#: The ranks an on-chip buffer's storage scope may have (TVM's, before the tag).
SCOPE_RANKS = ("local", "shared", "global")
#: A TVM storage scope with a tag, as ``Schedule.set_scope`` takes it: ``local.npu.inp``.
_SCOPE = re.compile(r"^(local|shared|global)\.[A-Za-z0-9_.]+$")


@dataclass(frozen=True)
class MemoryPool:
    """A memory an accelerator computes in.

    Args:
        scope: the memory scope's name, e.g. ``"npu.sram"``; a partition placed
            on the accelerator keeps its tensors (per ``scope-policy``) in it.
        size_bytes: capacity; checked before codegen by the memory planner.
        copy: ``"sync"`` (the CPU copies) or ``"async"`` (a DMA engine copies,
            overlapping compute on the report's timeline).
        bandwidth: bytes per second a copy between the host and this pool
            moves, for placement by cost; None: measured (see :mod:`umahub.auto`).
    """

    scope: str
    size_bytes: int
    copy: str = "sync"
    bandwidth: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.scope, str) or not self.scope:
            raise ValueError(f"MemoryPool.scope must be a non-empty string, got {self.scope!r}")
        if not isinstance(self.size_bytes, int) or self.size_bytes <= 0:
            raise ValueError(
                f"MemoryPool({self.scope!r}).size_bytes must be a positive int, "
                f"got {self.size_bytes!r}"
            )
        if self.copy not in COPY_KINDS:
            raise ValueError(
                f"MemoryPool({self.scope!r}).copy must be one of {COPY_KINDS}, got {self.copy!r}"
            )
        if self.bandwidth is not None and (
            isinstance(self.bandwidth, bool)
            or not isinstance(self.bandwidth, (int, float))
            or not 0 < self.bandwidth < float("inf")
        ):
            raise ValueError(
                f"MemoryPool({self.scope!r}).bandwidth must be a positive number of bytes per "
                f"second (or None: measured), got {self.bandwidth!r}"
            )


@dataclass(frozen=True)
class OnChipBuffer:
    """A buffer on the accelerator's chip, where its kernels keep their tiles: a TIR
    memory scope of fixed capacity (VTA's input, weight and accumulator buffers).

    A pool (:class:`MemoryPool`) holds the tensors a partition reads and writes; an
    on-chip buffer holds the tiles its kernel works on, one partition at a time.
    The plugin's TIR allocates its tiles in the buffer's ``scope`` (a schedule's
    ``set_scope``, or ``T.alloc_buffer(..., scope=...)``); after the TIR passes,
    umahub adds up each scope's allocations in the partition's PrimFunc, refuses
    a partition whose tiles need more than ``size_bytes`` (naming the scope, what
    is needed and what there is), and shows each buffer's use in the report.

    Args:
        scope: the TIR storage scope, a rank (``local``, ``shared`` or ``global``)
            and a tag as TVM writes them, the tag starting with the accelerator's
            name (``"local.simnpu.inp"`` on accelerator ``simnpu``); unique among
            the accelerator's buffers. A scope tagged with the accelerator's name
            that its TIR allocates in but no buffer declares is refused.
        size_bytes: capacity in bytes.
        description: what it holds, for the report and ``umahub plugins``
            (``"input tiles, int8"``).
    """

    scope: str
    size_bytes: int
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.scope, str) or not _SCOPE.match(self.scope):
            raise ValueError(
                f"OnChipBuffer.scope must be a TIR storage scope: a rank "
                f"({', '.join(SCOPE_RANKS)}), then the accelerator's name and the buffer's, "
                f"like 'local.npu.inp'; got {self.scope!r}"
            )
        if (
            isinstance(self.size_bytes, bool)
            or not isinstance(self.size_bytes, int)
            or (self.size_bytes <= 0)
        ):
            raise ValueError(
                f"OnChipBuffer({self.scope!r}).size_bytes must be a positive int, "
                f"got {self.size_bytes!r}"
            )
        if not isinstance(self.description, str):
            raise ValueError(
                f"OnChipBuffer({self.scope!r}).description must be a string, "
                f"got {self.description!r}"
            )


@dataclass(frozen=True)
class Accelerator:
    """A target_arch: a named accelerator tied to one codegen and one way of loading.

    Args:
        name: what the user writes in ``priority`` and pins (``"dsp_cpu"``);
            lower-case letters, digits and ``_``. It also names the TVM codegen
            ``relax.ext.<name>`` and the partitions' symbols.
        codegen: the default codegen, ``"c"`` (TVM's C codegen, compiled at
            export) or ``"llvm"``; a plugin's ``umahub_codegen`` may replace it.
            ``"device"`` (the default when ``runtime`` is given, and only then):
            no host code; the plugin's ``umahub_codegen`` returns a
            :class:`umahub.plugin.device.DeviceProgram` for the device's runtime.
            Left empty: ``"llvm"``, or ``"device"`` with a runtime.
        instances: how many identical units; they are the virtual devices
            ``name:0`` .. ``name:<instances-1>``.
        memory: the accelerator's memory pools; the first is where its
            partitions' tensors live.
        c_includes: text put at the top of the generated C (``#include`` lines).
        c_sources: C files of a vendor kernel library, compiled and linked into
            the exported library.
        include_dirs: directories searched for the headers of ``c_includes``.
        description: one line shown by ``umahub plugins``.
        merge: neighbouring matches of this accelerator become one partition
            (fused into one kernel by the default lowering). False keeps one
            pattern match per partition, for backends whose schedules handle
            one kernel at a time.
        operators: the Relax operators it can take (``"relax.nn.conv2d"``), as
            a promise to its users and to the conformance kit; () = not said.
            Optional and informative: the patterns still decide what it takes.
            With it, a kit run on models that have none of these operators is
            reported as such (skipped, saying so) instead of failing for taking
            nothing. Each name must be a registered Relax operator: the shape
            of the name is checked here, the registry (which needs TVM, which
            loading a plugin does not import) by :func:`unknown_operators`, which
            the kit and ``umahub plugins`` call; a typo is named with the
            closest registered operator.
        runtime: the name of the device runtime (an entry point of group
            ``umahub.runtimes``, see :mod:`umahub.plugin.device`) that runs
            this accelerator's programs on a device with memory of its own;
            "" (the default): the accelerator's code runs in the host's process,
            on host memory.
        runtime_package: the distribution that provides ``runtime``, named
            when a library that needs it is loaded where it is not installed
            (``pip install <runtime_package>``); "": ``runtime``'s name.
        buffers: its on-chip buffers (:class:`OnChipBuffer`), the memory scopes
            its kernels' tiles live in; () = none declared (no scope is checked).
        clock_hz: the device's clock, in cycles per second: what turns the
            cycles of a device program (:class:`umahub.plugin.device.ProgramTiming`)
            into seconds in the report and in placement by cost; None = not said
            (cycles are shown as cycles).
        options: the backend options users may set for this accelerator
            (:class:`umahub.plugin.Option`, names unique), which its hooks
            read as ``context.options`` (see :mod:`umahub.plugin.options`).
    """

    name: str
    codegen: str = ""
    instances: int = 1
    memory: tuple[MemoryPool, ...] = ()
    c_includes: str = ""
    c_sources: tuple[str, ...] = ()
    include_dirs: tuple[str, ...] = ()
    description: str = ""
    merge: bool = True
    operators: tuple[str, ...] = ()
    runtime: str = ""
    runtime_package: str = ""
    buffers: tuple[OnChipBuffer, ...] = ()
    clock_hz: float | None = None
    options: tuple[Option, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(
                f"Accelerator name {self.name!r} must start with a lower-case letter and hold "
                "only lower-case letters, digits and '_' (it names a TVM codegen)"
            )
        if self.name == "host":
            raise ValueError("'host' is reserved for the host; choose another accelerator name")
        for key in ("runtime", "runtime_package"):
            if not isinstance(getattr(self, key), str):
                raise ValueError(
                    f"Accelerator {self.name!r}: {key} must be a string, got {getattr(self, key)!r}"
                )
        if self.runtime and not _RUNTIME.match(self.runtime):
            raise ValueError(
                f"Accelerator {self.name!r}: runtime {self.runtime!r} must be an entry point "
                "name of group umahub.runtimes (letters, digits, '_', '-', '.')"
            )
        if not self.codegen:
            object.__setattr__(self, "codegen", "device" if self.runtime else "llvm")
        if self.codegen not in CODEGENS:
            raise ValueError(
                f"Accelerator {self.name!r}: codegen must be one of {CODEGENS}, "
                f"got {self.codegen!r}"
            )
        if (self.codegen == "device") != bool(self.runtime):
            raise ValueError(
                f"Accelerator {self.name!r}: "
                + (
                    f"codegen {self.codegen!r} runs on the host, runtime {self.runtime!r} on a "
                    "device of its own: leave codegen out for a device accelerator"
                    if self.runtime
                    else "codegen 'device' needs runtime=<the name of its umahub.runtimes entry "
                    "point>"
                )
            )
        if self.runtime and (self.c_sources or self.c_includes):
            raise ValueError(
                f"Accelerator {self.name!r}: c_sources and c_includes are host code; a device "
                "accelerator's code is its runtime's"
            )
        if not isinstance(self.instances, int) or self.instances < 1:
            raise ValueError(
                f"Accelerator {self.name!r}: instances must be an int >= 1, got {self.instances!r}"
            )
        # Accept lists from plugin authors but store tuples, so the value is hashable.
        object.__setattr__(self, "memory", self._sequence("memory", "MemoryPool"))
        sources = self._sequence("c_sources", "path")
        object.__setattr__(self, "c_sources", tuple(str(Path(p)) for p in sources))
        dirs = self._sequence("include_dirs", "path")
        object.__setattr__(self, "include_dirs", tuple(str(Path(p)) for p in dirs))
        for pool in self.memory:
            if not isinstance(pool, MemoryPool):
                raise ValueError(
                    f"Accelerator {self.name!r}: memory holds {pool!r}, not a umahub.MemoryPool"
                )
        object.__setattr__(self, "buffers", self._sequence("buffers", "OnChipBuffer"))
        scopes = set()
        for buffer in self.buffers:
            if not isinstance(buffer, OnChipBuffer):
                raise ValueError(
                    f"Accelerator {self.name!r}: buffers holds {buffer!r}, not a "
                    "umahub.plugin.OnChipBuffer"
                )
            _, _, tag = buffer.scope.partition(".")
            if tag.split(".", 1)[0] != self.name:
                raise ValueError(
                    f"Accelerator {self.name!r}: on-chip buffer {buffer.scope!r} is not tagged "
                    f"with the accelerator's name: write '<rank>.{self.name}.<buffer>' with "
                    f"rank {', '.join(SCOPE_RANKS[:-1])} or {SCOPE_RANKS[-1]} "
                    f"(e.g. 'local.{self.name}.{tag.rsplit('.', 1)[-1]}')"
                )
            if buffer.scope in scopes:
                raise ValueError(
                    f"Accelerator {self.name!r}: two on-chip buffers have the scope "
                    f"{buffer.scope!r}"
                )
            scopes.add(buffer.scope)
        if self.clock_hz is not None and (
            isinstance(self.clock_hz, bool)
            or not isinstance(self.clock_hz, (int, float))
            or not 0 < self.clock_hz < float("inf")
        ):
            raise ValueError(
                f"Accelerator {self.name!r}: clock_hz must be a positive number of cycles per "
                f"second (or None), got {self.clock_hz!r}"
            )
        if isinstance(self.operators, str):
            raise ValueError(
                f"Accelerator {self.name!r}: operators must be a sequence of Relax operator "
                f"names, got the string {self.operators!r} (write ({self.operators!r},))"
            )
        object.__setattr__(self, "operators", tuple(dict.fromkeys(self.operators)))
        for op in self.operators:
            # The registry check needs TVM, which loading a plugin must not import:
            # unknown_operators() does it where TVM is at hand (the kit, ``umahub plugins``).
            if not isinstance(op, str) or not _OP.match(op):
                raise ValueError(
                    f"Accelerator {self.name!r}: operators holds {op!r}, which is not a Relax "
                    "operator name: write them as in is_op(...), e.g. 'relax.nn.conv2d', "
                    "'relax.add'"
                )
        object.__setattr__(self, "options", checked_options(self.name, self.options))

    def _sequence(self, key: str, kind: str) -> tuple:
        """Field ``key`` as a tuple, or ValueError when it is one value instead of a list."""
        value = getattr(self, key)
        if isinstance(value, (str, bytes, Path, MemoryPool, OnChipBuffer)) or not isinstance(
            value, Iterable
        ):
            raise ValueError(
                f"Accelerator {self.name!r}: Accelerator.{key} must be a list of {kind}, got "
                f"{value!r}; write {key}=[...]"
            )
        return tuple(value)

    @property
    def devices(self) -> tuple[str, ...]:
        """The virtual device names, ``("name:0", ..., "name:<instances-1>")``."""
        return tuple(f"{self.name}:{i}" for i in range(self.instances))

    @property
    def has_device(self) -> bool:
        """Whether the accelerator is a device of its own, run by its runtime."""
        return bool(self.runtime)

    @property
    def package(self) -> str:
        """The distribution to install for its runtime (``runtime_package`` or ``runtime``)."""
        return self.runtime_package or self.runtime

    def buffer(self, scope: str) -> OnChipBuffer | None:
        """The on-chip buffer of ``scope``, or None when the accelerator has none there."""
        return next((b for b in self.buffers if b.scope == scope), None)

    @property
    def pool(self) -> MemoryPool | None:
        """The pool the accelerator's partitions live in (the first), or None."""
        return self.memory[0] if self.memory else None


def relax_operators() -> frozenset[str]:
    """The names of the Relax operators registered in TVM (``relax.*``; imports TVM)."""
    import tvm

    return frozenset(str(n) for n in tvm.ir.Op.list_op_names() if str(n).startswith("relax."))


def unknown_operators(accelerator: Accelerator) -> list[str]:
    """What is wrong with ``accelerator.operators``: one sentence per name that is not a
    registered Relax operator, with the closest registered name; [] when all are (imports TVM).
    """
    from umahub.errors import did_you_mean

    known = relax_operators()
    return [
        f"Accelerator {accelerator.name!r}: operators names {op!r}, which is not a registered "
        f"Relax operator{did_you_mean(op, known)}"
        for op in accelerator.operators
        if op not in known
    ]
