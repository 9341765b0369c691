"""MetaSchedule's design space of a kernel, candidates drawn from it, and their builds.

The space is MetaSchedule's own for an LLVM target (``PostOrderApply`` with the
``"llvm"`` schedule rules and postprocessors: multi-level tiling, inlining,
rfactor, parallel/vectorize/unroll), and each candidate is a replay of one of
its design spaces with fresh random decisions, completed by the
postprocessors, as MetaSchedule's ``ReplayTrace`` strategy draws them.

Why umahub draws the candidates itself instead of calling
``meta_schedule.tune_tir``: with TVM 0.27 and apache-tvm-ffi 0.1.15 the
search strategies crash the process (a segmentation fault) when a task starts:
they copy the module per thread through ``tvm.ir.save_json``, which crashes
on every TIR node with that tvm-ffi, and so does ``LocalBuilder`` (it pickles
the module to its workers). The candidates are therefore drawn, built (in
this process, with ``tvm.compile``) and handed to MetaSchedule's runners
here, and no TIR node is ever serialized: the chosen schedule is kept as its
trace's JSON data, which holds names and numbers only.

Two more things differ from TVM's defaults. The postprocessor
``RewriteLayout`` is left out: it changes the layout a kernel expects its
weights in, which only a Relax-level rewrite of the weights would honour.
And ``import tvm.s_tir.tensor_intrin`` (which ``TuneContext`` does, parsing
every intrinsic of every target: CUDA's alone takes more than a minute on a
busy machine) is satisfied with an empty package: the LLVM rules used here
tensorize nothing.
"""

from __future__ import annotations

import os
import sys
import tempfile
import types
from typing import Any

import tvm
import tvm_ffi
from tvm import s_tir

__all__ = ["build", "candidates", "draws", "tuning_target"]


def _without_tensor_intrinsics() -> None:
    """Let ``TuneContext`` import ``tvm.s_tir.tensor_intrin`` without parsing every target's."""
    name = "tvm.s_tir.tensor_intrin"
    if name in sys.modules:
        return
    package = types.ModuleType(name)
    package.__path__ = [os.path.join(os.path.dirname(s_tir.__file__), "tensor_intrin")]
    package.__doc__ = "umahub: TVM's tensor intrinsics, each target's imported when asked for"
    sys.modules[name] = package


def tuning_target(target: Any) -> Any:
    """``target`` with the core count MetaSchedule's rules need (``num-cores``)."""
    config = dict(target.export())
    config.setdefault("num-cores", os.cpu_count() or 1)
    config.pop("host", None)
    config.pop("features", None)
    return tvm.target.Target(config)


def _space(
    mod: tvm.IRModule, target: Any, seed: int, rules: Any = "llvm"
) -> tuple[list[Any], list[Any]]:
    """(design spaces, postprocessors) of ``mod``'s ``main`` for ``target``, by ``rules``
    (MetaSchedule's rule set ``"llvm"``, or a sequence of its ScheduleRule)."""
    _without_tensor_intrinsics()
    from tvm.s_tir import meta_schedule as ms

    postprocs = [
        p for p in ms.postproc.Postproc.create("llvm") if type(p).__name__ != "RewriteLayout"
    ]
    space = ms.space_generator.PostOrderApply(
        sch_rules=rules if isinstance(rules, str) else list(rules),
        postprocs=postprocs,
        mutator_probs={},
    )
    context = ms.TuneContext(
        mod=mod,
        target=target,
        space_generator=space,
        task_name="main",
        num_threads=1,
        rand_state=seed,
    )
    return list(context.generate_design_space()), postprocs


def candidates(
    mod: tvm.IRModule, target: Any, count: int, seed: int, rules: Any = "llvm"
) -> list[s_tir.Schedule]:
    """Up to ``count`` distinct schedules of ``mod`` drawn from MetaSchedule's space of
    ``rules`` (its ``"llvm"`` rule set, or a sequence of ScheduleRule)."""
    try:
        spaces, postprocs = _space(mod, target, seed, rules)
    except Exception:  # a function no rule applies to: nothing to tune
        return []
    found: dict[int, s_tir.Schedule] = {}
    attempts = 0
    while len(found) < count and attempts < count * 4 and spaces:
        attempts += 1
        space = spaces[attempts % len(spaces)]
        sch = s_tir.Schedule(mod, seed=seed * 7919 + attempts, debug_mask="all")
        try:
            # no decisions: each sampling instruction draws again from the schedule's seed
            s_tir.Trace(space.trace.insts, {}).apply_to_schedule(sch, remove_postproc=True)
            if not all(p.apply(sch) for p in postprocs):
                continue
        except Exception:  # a draw the rules cannot carry out: draw again
            continue
        found.setdefault(tvm_ffi.structural_hash(sch.mod), sch)
    return list(found.values())


#: The most draws :func:`draws` names; a kernel of many loops draws dozens.
SHOWN_DRAWS = 8


def draws(trace: Any) -> str:
    """What a candidate's sampling instructions drew, in order, for a verdict's line: the
    value a ``sample_categorical`` picked, the factors of a ``sample_perfect_tile``
    (``4x16``); ``""`` for none."""
    values = []
    for inst in trace.insts:
        kind = inst.kind.name
        if inst not in trace.decisions:
            continue
        decision = trace.decisions[inst]
        if kind == "SampleCategorical":
            values.append(str(inst.attrs[0][int(decision)]))
        elif kind == "SamplePerfectTile":
            values.append("x".join(str(int(d)) for d in decision))
    shown = ", ".join(values[:SHOWN_DRAWS])
    more = len(values) - SHOWN_DRAWS
    return f"{shown} and {more} more" if more > 0 else shown


def build(mods: list[tvm.IRModule], target: Any, where: str) -> list[tuple[str | None, str]]:
    """Each module built for ``target`` into a library under ``where``: (path or None, error)."""
    from tvm.support.tar import tar

    built: list[tuple[str | None, str]] = []
    for mod in mods:
        try:
            lib = tvm.compile(mod, target=target)
            path = os.path.join(tempfile.mkdtemp(dir=where), "kernel.tar")
            lib.export_library(path, fcompile=tar)
            built.append((path, ""))
        except Exception as exc:
            built.append((None, f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1:]}"))
    return built
