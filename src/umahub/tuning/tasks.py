"""A model's kernels, exactly as its compile schedules them.

The model is compiled through umahub's own pipeline (placement, partitions,
the host's fusion) with :func:`umahub.tuning.lookup.collecting` open: every
PrimFunc the host's schedule is asked for is kept, with the target it is
built for and the schedule the compile gives it without tuning; and every
partition on an accelerator whose plugin offers a search space
(:mod:`umahub.tuning.partitions`), with its hooks' schedule. So the
workloads are the compile's own, weights folded and partitions cut as they
will be; a kernel that occurs twice (twelve identical layers) is one task,
weighted by its count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from umahub.tuning.lookup import PartitionKernel, collecting, kernel_hash
from umahub.tuning.partitions import Skipped, space_of

__all__ = ["Task", "extract"]


@dataclass
class Task:
    """One kernel to tune."""

    name: str  # its host function's name, or "<symbol> on <device>" (the first of its kind)
    func: Any  # the PrimFunc as the schedule receives it
    target: Any  # what it is built for (the database's key)
    hook: str  # how the compile schedules it without tuning
    hooked: Any  # that schedule (a host PrimFunc; a partition's (IRModule, what it said))
    count: int  # how many host functions (or partitions) are this kernel
    key: str  # its key in the database
    partition: PartitionKernel | None = None  # an accelerator's partition, else the host's
    space: Any = None  # a partition's TuningSpace (the host's is MetaSchedule's "llvm")


def extract(hub: Any, mod: Any, progress: Any = None) -> tuple[list[Task], list[Skipped]]:
    """The kernels of ``mod``'s compile by ``hub``, in the order the compile meets them (the
    partitions first), and the partitions left to their hooks' schedules, with why."""
    from umahub.host.lowering import hook_schedule
    from umahub.targets import or_host

    with collecting() as found:
        compiled = hub.compile(mod, progress=progress)
    tasks: dict[str, Task] = {}
    skipped: list[Skipped] = []
    for kernel in _lowered(found.partitions, compiled.report):
        ctx = kernel.context
        name = f"{ctx.symbol} on {ctx.device}"
        space, why = space_of(kernel)
        key = kernel.key()
        if space is None or key is None:
            skipped.append(Skipped(name, why))
            continue
        if key in tasks:
            tasks[key].count += 1
            continue
        target = or_host(ctx.target)
        hook = f"{ctx.accelerator.name}'s schedule"
        hooked = kernel.schedule_by_hooks()
        tasks[key] = Task(name, kernel.main(), target, hook, hooked, 1, key, kernel, space)
    for name, func, target in found.host:
        key = kernel_hash(func)
        if key in tasks:
            tasks[key].count += 1
            continue
        hooked, how = hook_schedule(hub, func, target, name)
        tasks[key] = Task(name, func, target, how, hooked, 1, key)
    return list(tasks.values()), skipped


def _lowered(kernels: list[PartitionKernel], report: Any) -> list[PartitionKernel]:
    """The partitions the compiled model runs on accelerators, each as its last lowering
    met it: not those that went back to the host, nor those of a try the compile began
    again (a partition that did not fit, its operators placed again)."""
    kept = {p.symbol for p in report.partitions if not p.fallback}
    last: dict[str, PartitionKernel] = {}
    for kernel in kernels:
        if kernel.context.symbol in kept:
            last.pop(kernel.context.symbol, None)
            last[kernel.context.symbol] = kernel
    return list(last.values())
