"""A program's timeline, without running it: what the compiler plugin asks of a schedule.

An instruction's cost depends on its fields only, never on data (the README's
cycle model), so the C core computes the whole timeline of a program from its
bytes (``snpu_timing``): the same schedule a device's run follows, and the same
deadlock, but no data, no device and no hazard check (hazards are found by a
run).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from umahub.plugin.device import DeviceError
from umahub_simnpu_runtime import isa, native

__all__ = ["Timing", "timing"]


@dataclass(frozen=True)
class Timing:
    """When a program's instructions run, in cycles of the README's cycle model.

    Attributes:
        cycles: the run's total: the latest completion of any instruction, the
            modules overlapping as the dependency tokens allow (version 1: the
            sum of every instruction's cost).
        busy: cycles each module spends executing, by module name
            (``{"load": ..., "compute": ..., "store": ...}``): the sum of its
            instructions' costs.
        instructions: instructions of each module, by module name.
        intervals: ``(module, start, end)`` per instruction, in program order:
            it runs over cycles ``[start, end)``. Empty unless asked for
            (``timing(..., trace=True)``).
    """

    cycles: int
    busy: dict[str, int]
    instructions: dict[str, int]
    intervals: tuple[tuple[str, int, int], ...] = ()

    @property
    def serial_cycles(self) -> int:
        """What the program would take with no overlap between the modules: the sum of
        :attr:`busy` (a version 1 program's :attr:`cycles`)."""
        return sum(self.busy.values())


def _declared_count(program: bytes) -> int:
    """The instructions a program's header declares, bounded by the bytes it has."""
    if len(program) < isa.HEADER_BYTES:
        return 0
    declared = int.from_bytes(program[12:16], "little")
    return min(declared, (len(program) - isa.HEADER_BYTES) // isa.INSTRUCTION_BYTES)


def timing(
    program: bytes,
    *,
    trace: bool = False,
    inp_bytes: int = isa.INP_BYTES,
    wgt_bytes: int = isa.WGT_BYTES,
    acc_words: int = isa.ACC_WORDS,
) -> Timing:
    """The timeline of ``program`` (its bytes, as :func:`isa.program` makes them) on
    on-chip buffers of the given capacities, computed without running it.

    ``trace``: also each instruction's interval (:attr:`Timing.intervals`).

    Raises:
        DeviceError: the program is rejected (``"program rejected: ..."``, as a
            device's ``load`` would say) or deadlocks (``"fault: deadlock: ..."``).
    """
    for name, value in (
        ("inp_bytes", inp_bytes),
        ("wgt_bytes", wgt_bytes),
        ("acc_words", acc_words),
    ):
        if not 0 <= value < 2**32:
            raise DeviceError(f"timing: {name}={value} is not a capacity (0 to 2**32 - 1)")
    lib = native.library()
    data = bytes(program)
    count = _declared_count(data) if trace else 0
    intervals = (native.Interval * max(count, 1))()
    out = native.TimingResult()
    error = ctypes.create_string_buffer(native.ERROR_BYTES)
    if lib.snpu_timing(
        data,
        len(data),
        inp_bytes,
        wgt_bytes,
        acc_words,
        ctypes.byref(out),
        intervals if trace else None,
        count,
        error,
        native.ERROR_BYTES,
    ):
        raise DeviceError(error.value.decode())
    return Timing(
        cycles=int(out.cycles),
        busy={name: int(out.busy[m]) for m, name in enumerate(isa.MODULES)},
        instructions={name: int(out.instructions[m]) for m, name in enumerate(isa.MODULES)},
        intervals=tuple(
            (isa.MODULES[i.module], int(i.start), int(i.end))
            for i in intervals[: int(out.trace_len)]
        ),
    )
