"""An accelerator's partitions as tuning tasks: its plugin's space, drawn and built as compiled.

A partition is tuned only where its plugin offers a search space
(``umahub_tuning_space``, a :class:`umahub.plugin.TuningSpace`). Its
candidates are drawn from that space (a design space written as a schedule is
called once per candidate with a fresh seed; MetaSchedule's rules are
replayed as for the host, :func:`umahub.tuning.search.candidates`), and each
is built through the rest of the partition's lowering exactly as the compile
builds it (weights packed, the plugin's TIR passes, its codegen), then
exported as a shared library whose entry is the partition's one function.

Not tuned, with the reason said: a partition whose plugin offers no space
(or whose hook fails), one on an accelerator with a device of its own (the
runners measure in a process of their own, where the device's runtime is not
loaded), and one whose TIR holds more than its one function.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any

import tvm
import tvm_ffi
from tvm import s_tir

from umahub.errors import PluginFailure, message_line
from umahub.hub.contract import checked_tuning_space
from umahub.targets import or_host
from umahub.tuning import search
from umahub.tuning.lookup import PartitionKernel

__all__ = ["Skipped", "build", "candidates", "space_of"]


@dataclass
class Skipped:
    """A partition tuning leaves to its hooks' schedule, and why (one line of ``umahub tune``)."""

    name: str  # "<symbol> on <device>"
    why: str


def space_of(kernel: PartitionKernel) -> tuple[Any, str]:
    """(the plugin's TuningSpace, "") for a partition that can be tuned, else (None, why not)."""
    hub, ctx = kernel.hub, kernel.context
    acc = ctx.accelerator
    plugin = hub.owner(acc.name)
    if acc.has_device:
        return None, (
            f"{acc.name} has a device of its own ({acc.runtime}); its kernels are not tuned: "
            "the runners measure in a process the device's runtime is not loaded in"
        )
    if kernel.main() is None:
        return None, f"its TIR holds more than its one function ({len(kernel.tir.functions)})"
    try:
        space = checked_tuning_space(
            hub.traced_hook.umahub_tuning_space(
                accelerator=acc, function=kernel.main(), context=ctx
            )
        )
    except Exception as exc:
        failure = PluginFailure.of(exc, plugin, "umahub_tuning_space")
        return None, f"{failure}; its hooks' schedule is kept"
    if space is None:
        return None, f"{plugin} offers no search space for it; its hooks' schedule is kept"
    return space, ""


def candidates(kernel: PartitionKernel, space: Any, count: int, seed: int) -> tuple[list[Any], str]:
    """Up to ``count`` distinct schedules of the partition drawn from ``space``; and, when
    none could be drawn, why: the space's first error and how many draws failed."""
    func = kernel.main()
    mod = tvm.IRModule({"main": func})
    if space.kind() == "rules":
        target = or_host(kernel.context.target)
        drawn = search.candidates(mod, search.tuning_target(target), count, seed, space.rules)
        return drawn, "" if drawn else "MetaSchedule's rules gave no schedule of it"
    found: dict[int, s_tir.Schedule] = {}
    failed, first = 0, ""
    for attempt in range(count * 4):
        if len(found) >= count:
            break
        sch = s_tir.Schedule(mod, seed=seed * 7919 + attempt + 1, debug_mask="all")
        sch.work_on("main")
        try:
            space.schedule(sch)
        except Exception as exc:  # a draw the space cannot carry out: draw again
            failed += 1
            first = first or f"{type(exc).__name__}: {message_line(exc)}"
            continue
        found.setdefault(tvm_ffi.structural_hash(sch.mod), sch)
    why = ""
    if not found and failed:
        plugin = kernel.hub.owner(kernel.context.accelerator.name)
        why = (
            f"plugin '{plugin}' failed in its tuning space (umahub_tuning_space): {first} "
            f"(each of {failed} draws)"
        )
    return list(found.values()), why


def build(
    kernel: PartitionKernel, scheduled: list[tuple[tvm.IRModule, list[str]]], where: str
) -> tuple[list[tuple[str | None, str]], list[Any]]:
    """Each scheduled module through the partition's lowering, exported under ``where``:
    ((path or None, error) each, and the PrimFunc each takes its arguments as, or None)."""
    from umahub.compiler import codegen

    acc = kernel.context.accelerator
    symbol = kernel.context.symbol
    native = kernel.context.target is None  # C for this CPU, as its LLVM kernels are
    built: list[tuple[str | None, str]] = []
    funcs: list[Any] = []
    for mod, said in scheduled:
        try:
            lowered = kernel.build(mod, said)
            path = os.path.join(tempfile.mkdtemp(dir=where), "kernel.so")
            if codegen.module_kind(lowered.module) == "c":
                lowered.module.export_library(
                    path, options=codegen.export_options([acc], native=native)
                )
            else:
                lowered.module.export_library(path)
            built.append((path, ""))
            funcs.append(lowered.kernel[symbol])
        except Exception as exc:
            built.append((None, f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1:]}"))
            funcs.append(None)
    return built, funcs
