"""A search space for ``umahub tune``: what MetaSchedule may try for an accelerator's kernel.

A plugin returns a :class:`TuningSpace` from ``umahub_tuning_space`` for the
partitions whose schedule is worth searching. ``umahub tune MODEL`` then draws
candidates from it, builds each exactly as the compile builds the partition
(the plugin's TIR passes and codegen), measures them beside the schedule of
the plugin's ``umahub_schedule`` hook, and keeps a candidate only where it
measured faster. A plugin that offers no space keeps its hook's schedule.

Two kinds of space, as MetaSchedule has them:

``schedule=``
    A design space written as a schedule: a function that schedules the
    partition's PrimFunc as the plugin's hook does, but draws its decisions
    (tile sizes, unroll factors, which loop is vectorized) with the
    schedule's sampling instructions, ``schedule.sample_categorical(candidates,
    probs)`` and ``schedule.sample_perfect_tile(loop, n, max_innermost_factor)``,
    and reads the value drawn with ``schedule.get(rv)``. Each candidate is one
    call on a schedule with a fresh seed; the trace keeps the decisions, and
    the compile replays it. It is MetaSchedule's ``ScheduleFn`` space searched
    by replaying the function: no cost model, the farm measures.
``rules=``
    MetaSchedule's schedule rules, applied block by block: ``"llvm"`` for its
    rules for a CPU through LLVM (multi-level tiling, inlining, rfactor,
    parallel, vectorize, unroll), or a sequence of
    ``tvm.s_tir.meta_schedule.ScheduleRule``. For an accelerator whose code is
    built through LLVM.

Either way the function is named ``"main"`` in ``schedule.mod`` (so
``schedule.get_sblock(name)`` needs no ``func_name``), and the weights the
model passes as constants are still ``context.weights``: a space that packs
them with :func:`umahub.plugin.pack_weight` has them packed once, at compile
time, as the hook's schedule does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["RULE_SETS", "TuningSpace"]

#: The names of MetaSchedule's own rule sets a space may name.
RULE_SETS = ("llvm",)


@dataclass(frozen=True)
class TuningSpace:
    """What ``umahub tune`` may search for one partition (see :mod:`umahub.plugin.tuning`).

    Args:
        schedule: a design space: a function of a ``tvm.s_tir.Schedule`` that
            schedules the partition's PrimFunc (``"main"``), drawing its
            decisions with the schedule's sampling instructions. What it
            returns is not used.
        rules: or MetaSchedule's schedule rules: ``"llvm"``, or a sequence of
            ``tvm.s_tir.meta_schedule.ScheduleRule``.
        description: one line for ``umahub tune``'s progress line of the
            partition (``"npu tiles: rows, columns and reduction steps"``).

    Exactly one of ``schedule`` and ``rules`` is given; anything else is a
    ``ValueError`` naming what is wrong (in the hook, a failure of the
    plugin's that ``umahub tune`` reports, and the partition keeps the hook's
    schedule).
    """

    schedule: Callable[[Any], Any] | None = None
    rules: str | Sequence[Any] = ()
    description: str = ""

    def __post_init__(self) -> None:
        if self.schedule is not None and not callable(self.schedule):
            raise ValueError(
                f"TuningSpace(schedule=...) takes a function of a schedule, not "
                f"{type(self.schedule).__name__}"
            )
        if isinstance(self.rules, str):
            if self.rules and self.rules not in RULE_SETS:
                raise ValueError(
                    f"TuningSpace(rules={self.rules!r}): MetaSchedule's rule sets here are "
                    f"{', '.join(map(repr, RULE_SETS))}; or give a list of ScheduleRule"
                )
        else:
            object.__setattr__(self, "rules", tuple(self.rules))
        if (self.schedule is None) == (not self.rules):
            raise ValueError(
                "TuningSpace takes exactly one of schedule= (a design space) and rules= "
                "(MetaSchedule's schedule rules)"
            )

    def kind(self) -> str:
        """``"schedule"`` or ``"rules"``: which of the two the space is."""
        return "schedule" if self.schedule is not None else "rules"
