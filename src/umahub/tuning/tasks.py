"""A model's host kernels, exactly as its compile schedules them.

The model is compiled through umahub's own pipeline (placement, partitions,
the host's fusion) with :func:`umahub.tuning.lookup.collecting` open: every
PrimFunc the host's schedule is asked for is kept, with the target it is
built for and the schedule the compile gives it without tuning. So the
workloads are the compile's own, weights folded and partitions cut as they
will be; a kernel that occurs twice (twelve identical layers) is one task,
weighted by its count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from umahub.tuning.lookup import collecting, kernel_hash

__all__ = ["Task", "extract"]


@dataclass
class Task:
    """One kernel to tune."""

    name: str  # its host function's name (the first, when it occurs several times)
    func: Any  # the PrimFunc as the host's schedule receives it
    target: Any  # what it is built for
    hook: str  # how the compile schedules it without tuning
    hooked: Any  # that schedule (a PrimFunc)
    count: int  # how many host functions are this kernel
    key: str  # kernel_hash(func)


def extract(hub: Any, mod: Any, progress: Any = None) -> list[Task]:
    """The host kernels of ``mod``'s compile by ``hub``, in the order the compile meets them."""
    from umahub.host.lowering import hook_schedule

    with collecting() as found:
        hub.compile(mod, progress=progress)
    tasks: dict[str, Task] = {}
    for name, func, target in found:
        key = kernel_hash(func)
        if key in tasks:
            tasks[key].count += 1
            continue
        hooked, how = hook_schedule(hub, func, target, name)
        tasks[key] = Task(name, func, target, how, hooked, 1, key)
    return list(tasks.values())
