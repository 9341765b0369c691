"""Stage 4, lower: each partition through its plugin's hooks, in ``lowering-order``.

Per partition: ``umahub_relax_to_tir`` (or the default lowering, one PrimFunc)
-> ``umahub_schedule`` -> ``umahub_tir_passes`` (phases 0-3) ->
``umahub_codegen`` (or the default codegen); generated C is compiled (syntax
only) right away. What each hook returns is checked (:mod:`umahub.hub.contract`);
the whole lowering of a partition runs under ``hook-timeout``
(:mod:`umahub.hub.timelimit`). A failure at any point is the partition's: it goes
back to the host, or the compile stops (``on-error``), with a message naming
plugin, hook and partition. Each hook sees the memory plan as the partitions
lowered before it left it.

Before the ``umahub_schedule`` hooks, the tuning database is asked for a
schedule ``umahub tune`` measured faster (:func:`umahub.tuning.lookup.tuned_partition`);
the rest of the lowering is the same either way, which is what ``umahub tune``
builds its candidates with.

Why this module is long: a partition's lowering is one sequence of hooks, each
with its contract check and its blame (a TVM pass, a plugin's pass, a codegen,
the C compiler); split up, the order of the checks and who is blamed for what
would be spread over several modules.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import tvm
from tvm import relax

from umahub.compiler import codegen, onchip
from umahub.compiler.compilation import Compilation, Partition, written
from umahub.compiler.lowering import default_relax_to_tir
from umahub.compiler.tir_phases import PHASES, use_phase_passes
from umahub.errors import CompileError, PluginFailure, PluginOutputError, message_line
from umahub.host import constant_stages, prepack
from umahub.host.constant_stages import ConstantStages
from umahub.host.prepack import Packing
from umahub.hub.contract import (
    checked_codegen,
    checked_device_program,
    checked_passes,
    checked_relax_to_tir,
    checked_schedule,
)
from umahub.hub.timelimit import within
from umahub.hub.tracing import last_returned, recording, returned_by
from umahub.plugin.context import CompileContext
from umahub.plugin.memory import MemoryPlan, PoolUse
from umahub.plugin.patterns import Unsupported
from umahub.report.data import program_report
from umahub.report.report import hooks_that_acted
from umahub.runtime import devices
from umahub.targets import or_host
from umahub.tuning.lookup import PartitionKernel, tuned_partition
from umahub.tuning.lookup import recording as tuned_kernels

__all__ = ["run"]


@dataclass
class _Lowered:
    """What lowering one partition gave.

    Attributes:
        module: the runtime module (for a device partition: the host's stub).
        said: what the schedule hooks said they did.
        default: the default lowering's TIR when it was used (the verify stage's
            reference, unscheduled), else None.
        packings: the weights the kernel takes packed (:mod:`umahub.host.prepack`).
        buffers: ``{scope: (bytes used, capacity)}`` of the accelerator's on-chip buffers.
        passes: the TIR passes run, ``"phase N: name (plugin)"``.
        call: a device partition's :class:`~umahub.runtime.devices.DeviceCall`, else None.
        kernel: the scheduled TIR, its weights' packing split off (what the code takes).
        stages: its stages computed at compile time (:mod:`umahub.host.constant_stages`).
    """

    module: Any
    said: list[str]
    default: tvm.IRModule | None
    packings: dict[int, Packing]
    buffers: dict[str, tuple[int, int]] = field(default_factory=dict)
    passes: list[str] = field(default_factory=list)
    call: Any = None
    kernel: tvm.IRModule | None = None
    stages: ConstantStages | None = None


def _lower_one(
    hub: Any, ctx: CompileContext, func: relax.Function, cc: str | None = None
) -> _Lowered:
    """relax_to_tir -> schedule (tuned, else the hooks') -> tir_passes -> codegen for one
    partition."""
    acc = ctx.accelerator
    # the target entered: TVM's lowering, and umahub's quantized kernels, choose by it
    with or_host(ctx.target):
        tir_mod = hub.traced_hook.umahub_relax_to_tir(accelerator=acc, function=func, context=ctx)
        default = None
        if tir_mod is None:
            tir_mod = default = default_relax_to_tir(func, ctx.symbol, acc.name)
    if default is None:
        _blame(ctx, "umahub_relax_to_tir", checked_relax_to_tir, tir_mod, ctx.symbol, func)
    # a schedule tuned faster than the hooks' (tuning-database), else the hooks'
    finish = functools.partial(_finish, hub, ctx, func, default=default, cc=cc)
    kernel = PartitionKernel(
        hub, ctx, tir_mod, functools.partial(_hook_schedule, hub, ctx, tir_mod), finish
    )
    scheduled, said = tuned_partition(kernel) or kernel.schedule_by_hooks()
    return finish(scheduled, said)


def _hook_schedule(
    hub: Any, ctx: CompileContext, tir_mod: tvm.IRModule
) -> tuple[tvm.IRModule, list[str]]:
    """The partition's TIR as the ``umahub_schedule`` hooks schedule it, and what they said."""
    schedule = tvm.s_tir.Schedule(tir_mod)
    schedule.work_on(ctx.symbol)
    results = hub.traced_hook.umahub_schedule(
        accelerator=ctx.accelerator, schedule=schedule, context=ctx
    )
    said = [
        s
        for _, s in _checked_each(ctx, "umahub_schedule", checked_schedule, results)
        if s is not None
    ]
    return schedule.mod, said


def _finish(
    hub: Any,
    ctx: CompileContext,
    func: relax.Function,
    scheduled: tvm.IRModule,
    said: list[str],
    default: tvm.IRModule | None = None,
    cc: str | None = None,
) -> _Lowered:
    """A scheduled partition through its weights' packing, its TIR passes and its codegen."""
    acc = ctx.accelerator
    scheduled, packings = _blame(
        ctx, "umahub_schedule", prepack.split, scheduled, ctx.symbol, func, ctx.weights
    )
    phase_passes: dict[int, list[Any]] = {}
    passes: list[str] = []
    failed: list[str] = []  # the plugin whose pass raised: no blame crosses TVM's FFI with it
    for phase in PHASES:
        results = hub.traced_hook.umahub_tir_passes(accelerator=acc, phase=phase, context=ctx)
        phase_passes[phase] = []
        for plugin, given in _checked_each(
            ctx, "umahub_tir_passes", checked_passes, results, phase
        ):
            for p in given:
                phase_passes[phase].append(_attributed(p, plugin, failed))
                passes.append(f"phase {phase}: {p.info.name} ({plugin})")
    lowered = _Lowered(None, said, default, packings, passes=passes, kernel=scheduled)
    if acc.has_device:
        return _lower_device(hub, ctx, func, scheduled, phase_passes, failed, lowered)
    lowered.buffers = onchip.check(acc, scheduled[ctx.symbol], ctx.symbol)
    if ctx.target is None:  # built for this machine: the build can run the stages
        scheduled, lowered.stages = constant_stages.split(
            scheduled, ctx.symbol, len(func.params), ctx.weights
        )
        lowered.kernel = scheduled
    with use_phase_passes(phase_passes) as pipeline:
        ctx = replace(ctx, tir_pipeline=pipeline)
        try:
            module = hub.traced_hook.umahub_codegen(accelerator=acc, module=scheduled, context=ctx)
            if module is None:  # valid C already (see codegen.prepend_c)
                module = codegen.build_default(acc, scheduled, ctx.symbol, pipeline, ctx.target)
            else:
                _blame(
                    ctx, "umahub_codegen", checked_codegen, module, ctx.symbol, codegen.module_kind
                )
                if codegen.module_kind(module) == "c":  # a plugin's C: made valid the same way
                    module = codegen.prepend_c(module, "", ctx.symbol)
        except Exception as exc:
            if failed:  # a pass raised, maybe inside a plugin's codegen: the pass is at fault
                cause = exc.cause if isinstance(exc, PluginFailure) else exc
                raise PluginFailure(failed[0], "umahub_tir_passes", cause, ctx.symbol) from cause
            raise
    if codegen.module_kind(module) == "c":  # compiled now, so that a failure can fall back
        try:
            codegen.check_c(module, acc, cc)
        except CompileError as exc:
            culprit = last_returned("umahub_codegen")
            if culprit is None:
                raise CompileError(
                    f"the default C codegen of '{acc.name}' failed for partition {ctx.symbol} "
                    f"on {ctx.device}: {exc}"
                ) from exc
            raise PluginFailure(culprit, "umahub_codegen", exc, ctx.symbol) from exc
    if ctx.target is not None and codegen.module_kind(module) == "llvm":
        try:
            codegen.check_llvm_target(module, ctx.target)
        except CompileError as exc:
            culprit = last_returned("umahub_codegen")
            if culprit is not None:
                raise PluginFailure(culprit, "umahub_codegen", exc, ctx.symbol) from exc
            raise
    lowered.module = module
    return lowered


def _lower_device(
    hub: Any,
    ctx: CompileContext,
    func: relax.Function,
    scheduled: tvm.IRModule,
    phase_passes: dict[int, list[Any]],
    failed: list[str],
    lowered: _Lowered,
) -> _Lowered:
    """The rest of a device partition's lowering: no TVM build makes a device's
    program, so the plugin's TIR passes run here, phase after phase, on the scheduled
    TIR; its tiles are checked against the on-chip buffers; its codegen gives the
    program, called from the host through a stub."""
    acc = ctx.accelerator
    module = scheduled
    try:
        for phase in PHASES:
            if phase_passes[phase]:
                module = tvm.transform.Sequential(phase_passes[phase])(module)
    except Exception as exc:
        if failed:
            cause = exc.cause if isinstance(exc, PluginFailure) else exc
            raise PluginFailure(failed[0], "umahub_tir_passes", cause, ctx.symbol) from cause
        raise
    lowered.buffers = onchip.check(acc, module[ctx.symbol], ctx.symbol)
    program = hub.traced_hook.umahub_codegen(accelerator=acc, module=module, context=ctx)
    stub = _device_stub(hub, ctx, func, module, program)
    lowered.module, lowered.call = stub.module, stub.call
    return lowered


def _device_stub(
    hub: Any, ctx: CompileContext, func: relax.Function, scheduled: tvm.IRModule, program: Any
) -> Any:
    """The host's stub of a device partition (:func:`umahub.runtime.devices.stub_module`),
    carrying its :class:`~umahub.runtime.devices.DeviceCall` as ``device_call``."""
    acc = ctx.accelerator
    try:
        checked_device_program(program, acc.name)
    except PluginOutputError as exc:
        plugin = last_returned("umahub_codegen") or hub.owner(acc.name)
        raise PluginFailure(plugin, "umahub_codegen", exc, ctx.symbol) from exc
    resident = sorted(i for i in ctx.constants if i in ctx.weights)
    call = devices.DeviceCall(
        symbol=ctx.symbol,
        accelerator=acc.name,
        instance=ctx.instance,
        runtime=acc.runtime,
        package=acc.package,
        program=program,
        inputs=tuple(resident.index(i) if i in resident else -1 for i in range(len(func.params))),
        # (np.ascontiguousarray would make a 0-d scale 1-d)
        constants=tuple(np.require(ctx.constants[i].numpy(), requirements="C") for i in resident),
    )
    stub = devices.stub_module(call, scheduled[ctx.symbol], ctx.target)
    return _WithCall(stub, call)


class _WithCall:
    """A stub module and its device call, as ``_lower_one`` returns them."""

    def __init__(self, module: Any, call: Any):
        self.module, self.call = module, call


def _attributed(tir_pass: Any, plugin: str, failed: list[str]) -> Any:
    """``tir_pass`` wrapped so that, when it raises, ``failed`` gets the plugin's name."""

    @tvm.transform.module_pass(opt_level=0, name=f"umahub.{plugin}.{tir_pass.info.name}")
    def run(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        try:
            return tir_pass(mod)
        except Exception:
            failed.append(plugin)
            raise

    return run


def _checked_each(
    ctx: CompileContext, hook: str, check: Callable[..., Any], results: list[Any], *args: Any
) -> list[tuple[str, Any]]:
    """``(plugin, check(result, *args))`` for each result of a hook that every plugin
    answers (pluggy's list), each blamed on the plugin that gave it.

    Raises:
        PluginFailure: a result failed its check.
    """
    checked = []
    for plugin, result in zip(returned_by(hook, len(results)), results):
        try:
            checked.append((plugin, check(result, *args)))
        except PluginOutputError as exc:
            raise PluginFailure(plugin, hook, exc, ctx.symbol) from exc
    return checked


def _blame(ctx: CompileContext, hook: str, check: Callable[..., Any], *args: Any) -> Any:
    """Run a contract check on what ``hook`` returned for ``ctx``'s partition.

    Raises:
        PluginFailure: the check failed, and the plugin that gave the result is known.
        PluginOutputError: the check failed; no plugin's result is known to be at fault.
    """
    try:
        return check(*args)
    except PluginOutputError as exc:
        plugin = last_returned(hook)
        if plugin is not None:
            raise PluginFailure(plugin, hook, exc, ctx.symbol) from exc
        raise


def _refusal(exc: BaseException, p: Partition) -> str | None:
    """The message of a plugin's :class:`~umahub.plugin.Unsupported` (its refusal of the
    partition), or None when ``exc`` is a failure."""
    if isinstance(exc, PluginFailure) and isinstance(exc.cause, Unsupported):
        return f"plugin '{exc.plugin}' refused partition {p.symbol} in {exc.hook}: {exc.cause}"
    return None


def _lowering_failure(
    exc: BaseException, p: Partition, acc: Any
) -> tuple[str, type, BaseException]:
    """The message, error type and cause for a partition whose lowering failed."""
    if isinstance(exc, PluginFailure):
        who, exc = f"plugin '{exc.plugin}' failed in {exc.hook}", exc.cause
    elif isinstance(exc, CompileError):  # umahub's message names the culprit
        return str(exc), type(exc), exc
    else:
        who = f"lowering of '{acc.name}' failed"
    detail = message_line(exc)
    return (
        f"{who} for partition {p.symbol} ({', '.join(p.patterns)}) on {p.device}: "
        f"{type(exc).__name__}: {detail}",
        CompileError,
        exc,
    )


def run(comp: Compilation) -> None:
    """Stage 4: lower every partition that fits its pool; fill ``comp.modules``."""
    part = written(comp.partitioned, "partitioned")
    functions = comp.functions()
    plan = written(comp.plan, "plan")
    lowered = MemoryPlan(
        pools=tuple(PoolUse(p.device, p.scope, p.size_bytes, p.copy) for p in plan.pools),
        host_bytes=plan.host_bytes,
        host_constants=plan.host_constants,
    )
    todo = [
        p
        for name in comp.order
        for p in part.partitions
        if p.accelerator == name and not comp.reports[p.symbol].fallback
    ]
    weights = prepack.weights_of(part.mod)
    constants = prepack.constants_of(part.mod)
    with tuned_kernels() as found:
        for i, p in enumerate(todo, 1):
            lowered = _lower_partition(
                comp, p, i, len(todo), lowered, functions, weights, constants
            )
    comp.tuned_kernels.extend(found)
    comp.lowered_plan = lowered


def _lower_partition(
    comp: Compilation,
    p: Partition,
    i: int,
    count: int,
    lowered: MemoryPlan,
    functions: dict[str, relax.Function],
    weights: dict[str, frozenset[int]],
    constants: dict[str, dict[int, Any]],
) -> MemoryPlan:
    """Lower partition ``p`` (the ``i``-th of ``count``); the memory plan after it."""
    hub = comp.hub
    target = comp.target.tvm() if comp.target is not None else None
    cc = comp.target.cc if comp.target is not None else None
    report = comp.reports[p.symbol]
    name = p.accelerator
    acc = hub.accelerator(name)
    ctx = CompileContext(
        hub.config,
        acc,
        p.instance,
        p.symbol,
        p.operators,
        lowered,
        target=target,
        weights=weights.get(p.symbol, frozenset()),
        constants=constants.get(p.symbol, {}),
        options=hub.options_of(name),
    )
    said: list[str] = []
    step = f"{i}/{count} {p.symbol} on {p.device}"
    with comp.clock.stage("lower", step), recording() as calls:
        start = time.perf_counter()
        try:
            done = within(
                hub.config.hook_timeout,
                functools.partial(_lower_one, hub, ctx, functions[p.symbol], cc),
                f"lowering {p.symbol}",
            )
            said = done.said
            if done.call is not None:
                comp.device_calls[p.symbol] = done.call
                report.program = program_report(done.call, acc)
            comp.modules[p.symbol] = done.module
            if done.default is not None:
                comp.reference_tir[p.symbol] = done.default
            comp.packers.packings[p.symbol] = done.packings
            if done.stages is not None:
                comp.packers.stages[p.symbol] = done.stages
                report.precomputed = [constant_stages.describe(done.stages)]
            report.packed = [
                prepack.describe(functions[p.symbol], i, k) for i, k in done.packings.items()
            ]
            report.buffers = {scope: list(use) for scope, use in done.buffers.items()}
            report.passes = done.passes
        except onchip.DoesNotFit as exc:
            comp.does_not_fit(p.symbol, str(exc))
        except Exception as exc:
            refusal = _refusal(exc, p)
            if refusal is not None:
                comp.refused(p.symbol, refusal)
            else:
                comp.fall_back(p.symbol, *_lowering_failure(exc, p, acc))
        report.seconds["lower"] = time.perf_counter() - start
    comp.clock.count(list(calls))
    report.hooks = hooks_that_acted(list(calls))
    report.schedule = said
    if p.symbol in comp.modules and acc.pool is not None:
        lowered = lowered.add(p.device, acc.pool.scope, comp.needs[p.symbol])
    return lowered
