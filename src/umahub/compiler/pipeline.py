"""The compile pipeline: the stages in order, the data going one way.

::

    plan (patterns, pins, priority) -> partition -> memory
      -> lower: per partition, in lowering-order,
           relax_to_tir -> schedule -> tir_passes (phases 0..3) -> codegen
      (a partition that does not fit its accelerator: placed again from plan on)
      -> build (RunCodegen, devices and copies, tvm.compile, load)
      -> verify (with verify = true; a wrong partition falls back: build again)

Each stage is a module of :mod:`umahub.compiler.stages` with a ``run(compilation)``;
this module makes the :class:`~umahub.compiler.compilation.Compilation`, runs the
stages in order and derives the report from it at the end. ``explain`` is the
same sequence stopped before lowering.

Why this module is long: it is the one place that orders the stages, for
``compile``, ``explain`` and the contenders of placement by cost, and starts a
compile again where a partition does not fit; each stage's work is in a
module of its own.
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import tvm

from umahub._tvm import name_of
from umahub.compiler.compilation import Clock, Compilation, Progress
from umahub.compiler.quantization_check import check_quantization
from umahub.compiler.refit import fitted
from umahub.compiler.reshapes import activations_before_reshapes
from umahub.compiler.stages import build, lower, memory, partition, plan
from umahub.compiler.stages import verify as verification
from umahub.errors import CompileError, warn
from umahub.host.folding import fold_constants
from umahub.plugin.memory import bounded, size_bounds
from umahub.runtime.threadpool import spin_briefly
from umahub.targets import this_machine

if TYPE_CHECKING:
    from umahub.hub.hub import Hub
    from umahub.report.report import Report
    from umahub.runtime.compiled import Compiled
    from umahub.targets import BuildTarget

__all__ = ["build_alone", "check_placement", "check_target", "compile", "explain", "prepare"]

#: What ``placement=`` takes besides a mapping of pins.
PLACEMENT_MODES = ("auto", "priority")


def check_placement(placement: Any) -> None:
    """``placement`` is None, a mapping of pins, ``"auto"`` or ``"priority"``.

    Raises:
        ConfigError: anything else, saying what is taken.
    """
    from umahub.errors import ConfigError, did_you_mean

    if placement is None or isinstance(placement, Mapping):
        return
    if isinstance(placement, str) and placement in PLACEMENT_MODES:
        return
    shown = repr(placement) if isinstance(placement, str) else type(placement).__name__
    raise ConfigError(
        f"placement={shown}{did_you_mean(str(placement), PLACEMENT_MODES)}: placement takes "
        '"auto" (placement by cost), "priority" (the config\'s priority order) or a mapping '
        'of pins, {"conv1": "npu"}'
    )


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
    placement: Mapping[str, str] | str | None,
    progress: Progress | None,
    verify: bool = False,
    target: BuildTarget | None = None,
    only: tuple[Any, ...] | None = None,
    board: Any = None,
    unfit: dict[str, dict[str, str]] | None = None,
) -> Compilation:
    """A new compilation of ``mod``, planned, partitioned and with its memory checked;
    ``unfit``: what an earlier try found does not fit (:mod:`umahub.compiler.refit`)."""
    if "main" not in [name_of(gv) for gv in mod.get_global_vars()]:
        raise CompileError("the module has no 'main' function to compile")
    check_placement(placement)
    # a compile runs kernels (constants folded, weights packed, a kernel's constant
    # stages, placement by cost's timings): the first starts TVM's pool, which reads
    # its spin count then, for the whole process
    spin_briefly()
    comp = Compilation(hub, mod, placement, verify, Clock(progress), target, board=board, only=only)
    comp.unfit = dict(unfit or {})
    comp.restart = functools.partial(
        _start, hub, mod, placement, progress, verify, target, only, board
    )
    with _gc_paused():
        with comp.clock.stage("plan"):
            check_quantization(comp.mod)
            comp.mod = activations_before_reshapes(fold_constants(comp.mod))
            plan.run(comp)
    if comp.placing_by_cost:
        from umahub.auto.choose import run as place_by_cost

        with comp.clock.stage("auto"):
            place_by_cost(comp, build_alone)
    with _gc_paused():
        with comp.clock.stage("partition"):
            partition.run(comp)
    with comp.clock.stage("memory"):
        memory.run(comp)
    return comp


def explain(
    hub: Hub,
    mod: tvm.IRModule,
    *,
    placement: Mapping[str, str] | str | None = None,
    progress: Progress | None = None,
    target: Any = None,
    cc: str | None = None,
    board: Any = None,
) -> Report:
    """Plan placement, memory and copies of ``mod`` without lowering or building it.

    ``target``, ``cc`` and ``board`` are :func:`compile`'s: with placement by
    cost, the candidate groups alone are built for the target and timed (on
    the board); the model itself is not built.
    """
    from umahub.targets import BuildTarget

    build_target = target if isinstance(target, BuildTarget) else check_target(hub, target, cc)
    with bounded(_bounds(mod)):
        comp = _start(hub, mod, placement, progress, target=build_target, board=board)
        fitted(comp)  # what does not fit its pool is placed again, as compile does
        with comp.clock.stage("copies"):
            build.count_copies(comp)
    return comp.report(built=False)


def compile(
    hub: Hub,
    mod: tvm.IRModule,
    *,
    placement: Mapping[str, str] | str | None = None,
    progress: Progress | None = None,
    verify: bool | None = None,
    executor: str | None = None,
    profile: bool | None = None,
    target: Any = None,
    cc: str | None = None,
    board: Any = None,
) -> Compiled:
    """Compile ``mod`` through the hub's plugins.

    Args:
        hub: the plugins and config.
        mod: a Relax IRModule with a ``main`` (a dataflow graph; weights may be
            bound as constants).
        placement: pins for this compile, ``{selector: "accel[:i]" | "host"}``,
            which override the config's and the model's; or ``"auto"``: every
            accelerator is considered for every group of operators its patterns
            take, and the assignment with the lowest estimated latency wins
            (:mod:`umahub.auto`; the config's and the model's pins still hold);
            or ``"priority"``: the config's ``priority`` order, even when the
            config says ``priority = "auto"``.
        progress: called as ``progress(stage, detail)`` when a stage starts.
        verify: check every partition against the host's lowering of its
            operators on the model's own values (:mod:`umahub.compiler.stages.verify`);
            None: the config's ``verify``.
        executor: how ``run`` runs the model unless told (``"auto"``,
            ``"vm"``, ``"concurrent"``); None: the config's ``executor``.
        profile: run the model once built, with both executors, and put the
            measured timeline in ``report.measured``; None: the config's ``profile``.
        target: the LLVM target of the host part and the LLVM partitions
            (``"llvm -mtriple=aarch64-linux-gnu"``, TVM's dict form, or a
            checked :class:`umahub.targets.BuildTarget`); None: the config's
            ``target``, else this machine. A model built for another
            architecture cannot run here: export it and run it on a board.
        cc: the C compiler of C partitions and the export
            (``"aarch64-linux-gnu-gcc"``); None: the config's ``cc``, else TVM's default.
        board: a :class:`umahub.boards.rpc.Board` (``umahub.remote(...)``) on which
            placement by cost times the candidate groups, built for ``target``;
            None: they are timed on this machine (a build for another machine
            then has no measured costs).

    Raises:
        TargetError: a target or compiler that cannot be used, or ``verify``
            asked for a model built for another architecture (checked first).
        CompileError: a stage failed and ``on-error = "error"`` (or the failure
            cannot fall back, like a model without ``main``).
    """
    from umahub.targets import BuildTarget

    build_target = (
        target
        if isinstance(target, BuildTarget)  # checked by the caller (the command line)
        else check_target(hub, target, cc, verify=verify, profile=profile)
    )
    if build_target is not None and not build_target.native:
        verify = False  # it runs the model: asked for, refused; from the config, warned
        profile = False
    verify = hub.config.verify if verify is None else verify
    with bounded(_bounds(mod)):
        comp = _start(hub, mod, placement, progress, verify, build_target, board=board)
        if comp.auto is None:
            _built(comp)
        else:

            def claiming(order: tuple[str, ...]) -> Compilation:
                only = tuple(hub.accelerator(name) for name in order)
                return _start(hub, mod, None, progress, verify, build_target, only=only)

            comp = _checked_by_measurement(comp, claiming)
    compiled = comp.compiled
    assert compiled is not None
    compiled.report = comp.report()
    compiled.executor = executor or hub.config.executor
    if hub.config.profile if profile is None else profile:
        compiled.profile_into_report()
    return compiled


def _built(comp: Compilation, verify: bool = True) -> Compilation:
    """Lower and build ``comp`` (placed again, in place, until its partitions fit:
    :mod:`umahub.compiler.refit`), and verify it if asked and ``verify``."""
    lower.run(comp)
    fitted(comp, lower.run)
    build.run(comp)
    return _verified(comp) if verify else comp


def _verified(comp: Compilation) -> Compilation:
    """``comp`` (built) verified if its config asks, and built again without the
    partitions verification failed."""
    if comp.verify:
        with comp.clock.stage("verify"):
            wrong = verification.run(comp)
        if wrong:
            build.run(comp)
    return comp


def _checked_by_measurement(
    comp: Compilation, claiming: Callable[[tuple[str, ...]], Compilation]
) -> Compilation:
    """``comp``, placed by cost, built; or the compilation of the claiming order
    (``claiming(order)`` starts it) that measured faster than it and every other
    contender (see :mod:`umahub.auto.finalists`)."""
    from umahub.auto import finalists
    from umahub.auto.cache import CostCache
    from umahub.runtime.compiled import example_inputs

    why = finalists.skipped(comp)
    if why:
        _built(comp)  # it may place again (refit): the try built has an auto of its own
        comp.auto.finalists = {"skipped": finalists.skipped(comp) or why}
        return comp
    cache = CostCache()
    winner = finalists.cached_winner(comp, cache)
    if winner is not None and winner != "auto":
        return _kept(_built(claiming(finalists.accelerators_of(winner))), comp.auto, winner)
    if winner == "auto":
        return _built(comp)
    _built(comp, verify=False)  # only the winner is verified
    # read after the build: a partition that did not fit starts the compile again
    # (refit), and that try places by cost again, with an auto of its own
    auto = comp.auto
    with comp.clock.stage("finalists"):
        try:
            kept, other = finalists.measure(
                comp,
                comp.compiled,
                lambda name: _built(claiming(finalists.accelerators_of(name)), verify=False),
                lambda m: example_inputs(m.input_info),
                cache,
            )
        except Exception as exc:  # inputs it cannot take, a run that fails: auto's stays
            auto.finalists = {"skipped": f"the model did not run on random inputs: {exc}"}
            return _verified(comp)
    return _verified(comp) if kept == "auto" else _kept(_verified(other), auto, kept)


def _kept(other: Compilation, auto: Any, name: str) -> Compilation:
    """The compilation of contender ``name``, reporting the choice by cost and why it lost."""
    from dataclasses import replace

    other.auto = replace(auto, changed=auto.contenders_changed.get(name, {}))
    measured = auto.finalists.get("measured_ms", {})
    if name in measured and "auto" in measured:
        tie = (
            "; the rounds did not show the choice faster, and a tie goes to the starting point"
            if auto.finalists.get("tie")
            else ""
        )
        other.notes.append(
            f"placement by cost: {name} ran in {measured[name]:.3g} ms, "
            f"the estimated choice in {measured['auto']:.3g} ms{tie}: {name} is kept"
        )
    return other


def build_alone(
    hub: Hub, mod: tvm.IRModule, accelerators: Any, target: BuildTarget | None = None
) -> Compiled:
    """``mod`` built with only ``accelerators`` claiming, no pins, no verify: a measurement.

    What :mod:`umahub.auto.costs` times: one candidate group alone, on its
    accelerator or (with no accelerators) on the host.
    """
    with bounded(_bounds(mod)):
        comp = _start(hub, mod, None, None, False, target, only=tuple(accelerators))
        lower.run(comp)
        build.run(comp)
    compiled = comp.compiled
    assert compiled is not None
    compiled.report = comp.report()
    compiled.executor = "vm"
    return compiled


def check_target(
    hub: Hub,
    target: Any = None,
    cc: str | None = None,
    *,
    verify: bool | None = None,
    profile: bool | None = None,
    names: Mapping[str, str] | None = None,
) -> BuildTarget | None:
    """The checked target of a compile (None: this machine), before any work.

    ``target`` and ``cc`` default to the config's. A model built for another
    architecture cannot run here: ``verify`` or ``profile`` asked for is an
    error, the config's are skipped with a warning. ``names`` gives the
    option names for messages (``{"target": "--target", "cc": "--cc",
    "verify": "--verify"}``).

    Raises:
        TargetError: see :func:`umahub.targets.resolve`; ``verify`` or
            ``profile`` asked for a build for another architecture.
    """
    from umahub.targets import TargetError, resolve

    config = hub.config
    names = dict(names or {})
    where = f"{config.source}: [tool.umahub]"
    from_config = {
        key: given is None and getattr(config, key) is not None
        for key, given in (("target", target), ("cc", cc))
    }
    given = resolve(
        config.target if from_config["target"] else target,
        config.cc if from_config["cc"] else cc,
        target_option=f"{where} target" if from_config["target"] else names.get("target", "target"),
        cc_option=f"{where} cc" if from_config["cc"] else names.get("cc", "cc"),
    )
    if given is None or given.native:
        return given
    for name, asked in (("verify", verify), ("profile", profile)):
        if asked:
            option = names.get(name, name)
            raise TargetError(
                f"{option} runs the model on this machine ({this_machine()}), and it is built "
                f"for {given.arch}: compile without {option}, or check a build for this "
                "machine first"
            )
    skipped = [k for k in ("verify", "profile") if getattr(config, k)]
    if skipped:
        warn(
            f"{' and '.join(skipped)} (in {config.source}) skipped: the model is built for "
            f"{given.arch} and cannot run on this machine ({this_machine()})"
        )
    return given


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

    What :class:`umahub.compiler.relax_pipeline.RelaxPipeline` hands back to
    ``tvm.compile``: the stages of :func:`compile` up to the build, with the
    weights left where the model has them (``main``'s parameters unchanged) and
    ``main`` in one memory (:mod:`umahub.compiler.one_memory`), so that TVM's own
    ``relax.VirtualMachine(executable, tvm.cpu())`` runs it.
    """
    with bounded(_bounds(mod)):
        comp = _start(hub, mod, placement, progress)
        lower.run(comp)
        with comp.clock.stage("build"):
            prepared = build.prepare(comp, comp.placed(), lift_weights=False, one_memory=True)
    return prepared, comp
