"""The compile pipeline: the stages in order, the data going one way.

::

    plan (patterns, pins, priority) -> partition -> memory
      -> lower: per partition, in lowering-order,
           relax_to_tir -> schedule -> tir_passes (phases 0..3) -> codegen
      -> build (RunCodegen, devices and copies, tvm.compile, load)
      -> verify (with verify = true; a wrong partition falls back: build again)

Each stage is a module of :mod:`umahub.stages` with a ``run(compilation)``;
this module makes the :class:`~umahub.compilation.Compilation`, runs the
stages in order and derives the report from it at the end. ``explain`` is the
same sequence stopped before lowering.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import tvm

from umahub._tvm import name_of
from umahub.compilation import Clock, Compilation, Progress
from umahub.errors import CompileError
from umahub.ir import fold_constants
from umahub.memory import bounded, size_bounds
from umahub.stages import build, lower, memory, partition, plan
from umahub.stages import verify as verification

if TYPE_CHECKING:
    from umahub.compiled import Compiled
    from umahub.hub import Hub
    from umahub.report import Report

__all__ = ["compile", "explain", "prepare"]


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause Python's cycle collector while a stage creates many short-lived objects.

    Planning a large model allocates hundreds of thousands of small wrappers
    of TVM objects; with the collector running, its passes over an ever larger
    heap make partitioning grow faster than the model. Reference counting still
    frees everything; the cycles are collected once, at the end.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _start(
    hub: Hub,
    mod: tvm.IRModule,
    placement: Mapping[str, str] | None,
    progress: Progress | None,
    verify: bool = False,
) -> Compilation:
    """A new compilation of ``mod``, planned, partitioned and with its memory checked."""
    if "main" not in [name_of(gv) for gv in mod.get_global_vars()]:
        raise CompileError("the module has no 'main' function to compile")
    comp = Compilation(hub, mod, placement, verify, Clock(progress))
    with _gc_paused():
        with comp.clock.stage("plan"):
            comp.mod = fold_constants(comp.mod)
            plan.run(comp)
        with comp.clock.stage("partition"):
            partition.run(comp)
    with comp.clock.stage("memory"):
        memory.run(comp)
    return comp


def explain(
    hub: Hub,
    mod: tvm.IRModule,
    *,
    placement: Mapping[str, str] | None = None,
    progress: Progress | None = None,
) -> Report:
    """Plan placement, memory and copies of ``mod`` without lowering or building it."""
    with bounded(_bounds(mod)):
        comp = _start(hub, mod, placement, progress)
        with comp.clock.stage("copies"):
            build.count_copies(comp)
    return comp.report(built=False)


def compile(
    hub: Hub,
    mod: tvm.IRModule,
    *,
    placement: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    verify: bool | None = None,
    executor: str | None = None,
    profile: bool | None = None,
) -> Compiled:
    """Compile ``mod`` through the hub's plugins.

    Args:
        hub: the plugins and config.
        mod: a Relax IRModule with a ``main`` (a dataflow graph; weights may be
            bound as constants).
        placement: pins for this compile, ``{selector: "accel[:i]" | "host"}``;
            they override the config's and the model's.
        progress: called as ``progress(stage, detail)`` when a stage starts.
        verify: check every partition against the host's lowering of its
            operators on the model's own values (:mod:`umahub.stages.verify`);
            None: the config's ``verify``.
        executor: how ``run`` runs the model unless told (``"auto"``,
            ``"vm"``, ``"concurrent"``); None: the config's ``executor``.
        profile: run the model once built, with both executors, and put the
            measured timeline in ``report.measured``; None: the config's ``profile``.

    Raises:
        CompileError: a stage failed and ``on-error = "error"`` (or the failure
            cannot fall back, like a model without ``main``).
    """
    verify = hub.config.verify if verify is None else verify
    with bounded(_bounds(mod)):
        comp = _start(hub, mod, placement, progress, verify)
        lower.run(comp)
        build.run(comp)
        if comp.verify:
            with comp.clock.stage("verify"):
                wrong = verification.run(comp)
            if wrong:
                build.run(comp)
    compiled = comp.compiled
    assert compiled is not None
    compiled.report = comp.report()
    compiled.executor = executor or hub.config.executor
    if hub.config.profile if profile is None else profile:
        compiled.profile_into_report()
    return compiled


def _bounds(mod: tvm.IRModule) -> dict[str, int]:
    names = [name_of(gv) for gv in mod.get_global_vars()]
    return size_bounds(mod["main"]) if "main" in names else {}


def prepare(
    hub: Hub,
    mod: tvm.IRModule,
    placement: Mapping[str, str] | None = None,
    progress: Progress | None = None,
) -> tuple[tvm.IRModule, Compilation]:
    """``mod`` placed, lowered and through codegen, ready for TVM's Relax pipeline.

    What :class:`umahub.relax_pipeline.RelaxPipeline` hands back to
    ``tvm.compile``: the stages of :func:`compile` up to the build, with the
    weights left where the model has them (``main``'s parameters unchanged).
    """
    with bounded(_bounds(mod)):
        comp = _start(hub, mod, placement, progress)
        lower.run(comp)
        with comp.clock.stage("build"):
            prepared = build.prepare(comp, comp.placed(), lift_weights=False)
    return prepared, comp
