"""The compile pipeline: the stages in order, the data going one way.

::

    plan (patterns, pins, priority) -> partition -> memory plan
      -> per partition, in lowering-order:
           relax_to_tir -> schedule -> tir_passes (phases 0..3) -> codegen
      -> build (RunCodegen, devices and copies, tvm.compile)

Each stage is a function in a module of its own; this module only sequences
them, keeps the time of each, and applies ``on-error``: a partition whose
plugin fails (or that does not fit its pool, or that its lowering cannot
handle) goes back to the host with a warning and a note in the report, or
stops the compile with the same message.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import tvm
from tvm import relax

from umahub import codegen as codegen_stage
from umahub._tvm import Constant, name_of, ret_type, type_of
from umahub.build import place_on_devices
from umahub.compiled import Compiled, signature_of
from umahub.config import HOST, parse_pin
from umahub.context import CompileContext
from umahub.contract import (
    checked_codegen,
    checked_passes,
    checked_patterns,
    checked_relax_to_tir,
)
from umahub.dispatch import HookCall, last_returned, recording, returned_by
from umahub.errors import (
    CompileError,
    ConfigError,
    MemoryPoolError,
    PlacementError,
    PluginOutputError,
    VerificationError,
    did_you_mean,
)
from umahub.lowering import default_relax_to_tir
from umahub.memory import (
    MemoryPlan,
    Need,
    PoolUse,
    bounded,
    size_bounds,
    symbolic_sizes,
    tensor_bytes,
)
from umahub.partition import Partition, Partitioned, partition, to_host
from umahub.placement import Pins, model_pins, pinned_accelerators, plan_patterns
from umahub.report import PartitionReport, Report, hooks_that_acted
from umahub.timelimit import within
from umahub.tir_phases import PHASES, use_phase_passes

if TYPE_CHECKING:
    from umahub.hub import Hub

__all__ = ["compile", "explain"]

Progress = Callable[[str, str], None]


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


class _Clock:
    """Times the stages and tells ``progress`` when each starts."""

    def __init__(self, progress: Progress | None):
        self.progress = progress
        self.stages: dict[str, float] = {}
        self.hooks: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str, detail: str = "") -> Iterator[None]:
        if self.progress is not None:
            self.progress(name, detail)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.stages[name] = self.stages.get(name, 0.0) + time.perf_counter() - start

    def count(self, calls: list[HookCall]) -> None:
        for c in calls:
            key = c.hook.removeprefix("umahub_")
            self.hooks[key] = self.hooks.get(key, 0.0) + c.seconds


def _pins(hub: Hub, mod: tvm.IRModule, placement: Mapping[str, str] | None) -> Pins:
    api = {str(k): parse_pin(v, "compile(placement=...)") for k, v in (placement or {}).items()}
    layers = [model_pins(mod), dict(hub.config.placement), api]
    known = {a.name: a.instances for a in hub.accelerators}
    for layer in layers[::2]:  # the config's own pins were checked when the hub was made
        for selector, pin in layer.items():
            if pin.accelerator != HOST and pin.accelerator not in known:
                raise ConfigError(
                    f"pin {selector!r} -> '{pin}': unknown accelerator "
                    f"'{pin.accelerator}'{did_you_mean(pin.accelerator, known)}"
                )
            if pin.instance is not None and pin.instance >= known.get(pin.accelerator, 1):
                raise ConfigError(
                    f"pin {selector!r} -> '{pin}': '{pin.accelerator}' has "
                    f"{known[pin.accelerator]} instance(s)"
                )
    return Pins(layers)


def _patterns_getter(hub: Hub, notes: list[str]) -> Callable[[Any], list[Any]]:
    def ask(acc: Any) -> list[Any]:
        with recording() as calls:
            results = hub.traced_hook.umahub_patterns(accelerator=acc)
        givers = [c.plugin for c in calls if c.returned]  # pluggy drops None results
        patterns = []
        for plugin, result in zip(givers, results):
            try:
                patterns += checked_patterns(acc, result)
            except PluginOutputError as exc:
                exc.umahub_culprit = (plugin, "umahub_patterns")  # type: ignore[attr-defined]
                raise
        return patterns

    def patterns_of(acc: Any) -> list[Any]:
        try:
            return within(hub.config.hook_timeout, lambda: ask(acc), f"patterns of {acc.name}")
        except Exception as exc:
            plugin, hook = getattr(exc, "umahub_culprit", (hub.owner(acc.name), "umahub_patterns"))
            message = (
                f"plugin '{plugin}' failed in {hook} for accelerator '{acc.name}': "
                f"{type(exc).__name__}: {exc}"
            )
            if hub.config.on_error == "error":
                raise CompileError(message) from exc
            _warn(f"{message}; '{acc.name}' claims nothing in this compile")
            notes.append(message)
            return []

    return patterns_of


def _warn(message: str) -> None:
    from umahub.hub import UmahubWarning

    warnings.warn(f"umahub: {message}", UmahubWarning, stacklevel=4)


def _placement_problem(hub: Hub, message: str, notes: list[str]) -> None:
    """A pin that cannot be honoured: an error with on-error "error", else a warning and a note."""
    if hub.config.on_error == "error":
        raise PlacementError(message)
    _warn(message)
    notes.append(message)


def _check_pins(
    part: Partitioned, pins: Pins, hub: Hub, planned_names: dict[str, list[str]], notes: list[str]
) -> None:
    """Every pin selects some operator, and every pinned operator is where its pin says."""
    selected = {selector: False for selector, _ in pins.ordered}
    for op in part.operators:
        hit = pins.resolve(op.name, op.op, op.pattern)
        if hit is None:
            continue
        selector, pin = hit
        selected[selector] = True
        accel, _, instance = op.device.partition(":")
        ok = accel == pin.accelerator and (pin.instance is None or str(pin.instance) == instance)
        if ok:
            continue
        if pin.accelerator == HOST:
            continue  # only a pattern pin that a plugin check overrode could land here
        names = ", ".join(planned_names.get(pin.accelerator, [])) or "none"
        message = (
            f"pin {selector!r} -> '{pin}': operator '{op.name}' ({op.op}) runs on "
            f"{op.device}, because the patterns of '{pin.accelerator}' ({names}) do not "
            "take it; pin it elsewhere or extend the plugin's patterns"
        )
        _placement_problem(hub, message, notes)
    candidates = {n for o in part.operators for n in (o.name, o.op, o.pattern) if n}
    for selector, used in selected.items():
        if used or any(ch in selector for ch in "*?["):
            continue
        message = (
            f"pin {selector!r} selects no operator of the model"
            f"{did_you_mean(selector, candidates)}; a pin names a node, an op "
            "('relax.nn.conv2d' or 'nn.conv2d') or a pattern"
        )
        _placement_problem(hub, message, notes)


def _partition_calls(part: Partitioned) -> dict[str, tuple[relax.Function, list[Any]]]:
    """symbol -> (partition function, the arguments main calls it with)."""
    found = {}
    for block in part.mod["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar):
                func = part.mod[value.op]
                if isinstance(func, relax.Function) and func.attrs and "Codegen" in func.attrs:
                    found[str(func.attrs["global_symbol"])] = (func, list(value.args))
    return found


def _need(p: Partition, func: relax.Function, call_args: list[Any], scope_policy: str) -> Need:
    """What a partition needs of its pool (see :mod:`umahub.memory`)."""
    resident = transient = 0
    if scope_policy == "io":
        for param, arg in zip(func.params, call_args):
            size = tensor_bytes(type_of(param))
            if isinstance(arg, Constant):
                resident += size
            else:
                transient += size
    intermediates = sum(o.bytes for o in p.operators)  # every operator's output
    transient += max(intermediates, tensor_bytes(ret_type(func)))
    return Need(resident, transient)


def _run_time_sizes(main: relax.Function) -> set[str]:
    """Symbolic sizes of ``main``'s inputs and of the tensors its bindings compute."""
    sizes = set().union(*(symbolic_sizes(type_of(p)) for p in main.params))
    for block in main.body.blocks:
        for b in block.bindings:
            sizes |= symbolic_sizes(type_of(b.var))
    return sizes


def _unbounded_sizes(func: relax.Function, call_args: list[Any], bounds: dict) -> set[str]:
    """Symbolic sizes of a partition's tensors that no upper bound covers."""
    sizes = set().union(*(symbolic_sizes(type_of(p)) for p in func.params))
    sizes |= symbolic_sizes(ret_type(func))
    return {s for s in sizes if s not in bounds}


def _host_plan(part: Partitioned) -> tuple[int, int]:
    """(peak live bytes, constant bytes) of the host's tensors in ``main``."""
    main = part.mod["main"]
    last_use: dict[Any, int] = {}
    bindings = [b for block in main.body.blocks for b in block.bindings]
    for i, b in enumerate(bindings):
        for v in relax.analysis.free_vars(b.value):
            last_use[v] = i
    for v in relax.analysis.free_vars(main.body.body):
        last_use[v] = len(bindings)
    live = {p: tensor_bytes(type_of(p)) for p in main.params}
    peak = sum(live.values())
    constants = 0
    for i, b in enumerate(bindings):
        live[b.var] = tensor_bytes(type_of(b.var))

        args = b.value.args if isinstance(b.value, relax.Call) else ()
        constants += sum(tensor_bytes(type_of(a)) for a in args if isinstance(a, Constant))
        peak = max(peak, sum(live.values()))
        live = {v: s for v, s in live.items() if last_use.get(v, -1) > i}
    return peak, constants


def _lowering_order(hub: Hub, part: Partitioned) -> list[str]:
    """Accelerator names (and "host") in the order in which they are lowered."""
    order = list(hub.config.lowering_order or [HOST, *[a.name for a in hub.accelerators]])
    present = {p.accelerator for p in part.partitions}
    order += [a for a in sorted(present) if a not in order]
    if HOST not in order:
        order.insert(0, HOST)
    return order


def _lower_one(hub: Hub, ctx: CompileContext, func: relax.Function) -> tuple[Any, list[str]]:
    """relax_to_tir -> schedule -> tir_passes -> codegen for one partition."""
    acc = ctx.accelerator
    tir_mod = hub.traced_hook.umahub_relax_to_tir(accelerator=acc, function=func, context=ctx)
    if tir_mod is None:
        tir_mod = default_relax_to_tir(func, ctx.symbol, acc.name)
    else:
        _blame("umahub_relax_to_tir", checked_relax_to_tir, tir_mod, ctx.symbol, func)
    schedule = tvm.s_tir.Schedule(tir_mod)
    schedule.work_on(ctx.symbol)
    said = [
        s
        for s in hub.traced_hook.umahub_schedule(accelerator=acc, schedule=schedule, context=ctx)
        if isinstance(s, str)
    ]
    scheduled = schedule.mod
    phase_passes: dict[int, list[Any]] = {}
    failed: list[str] = []  # the plugin whose pass raised: TVM's FFI drops exception attributes
    for phase in PHASES:
        results = hub.traced_hook.umahub_tir_passes(accelerator=acc, phase=phase, context=ctx)
        phase_passes[phase] = []
        for plugin, result in zip(returned_by("umahub_tir_passes", len(results)), results):
            passes = _blame("umahub_tir_passes", checked_passes, result, phase)
            phase_passes[phase] += [_attributed(p, plugin, failed) for p in passes]
    with use_phase_passes(phase_passes) as pipeline:
        ctx = replace(ctx, tir_pipeline=pipeline)
        try:
            module = hub.traced_hook.umahub_codegen(accelerator=acc, module=scheduled, context=ctx)
            if module is None:
                module = codegen_stage.build_default(acc, scheduled, ctx.symbol, pipeline)
            else:
                _blame("umahub_codegen", checked_codegen, module, ctx.symbol, _module_kind)
        except Exception as exc:
            if failed:
                exc.umahub_culprit = (failed[0], "umahub_tir_passes")  # type: ignore[attr-defined]
            raise
    if _module_kind(module) == "c":  # compiled now, so that a failure can fall back
        module = codegen_stage.prepend_c(module, "", ctx.symbol)
        try:
            codegen_stage.check_c(module, acc)
        except CompileError as exc:
            plugin = last_returned("umahub_codegen")
            if plugin is None:
                raise CompileError(
                    f"the default C codegen of '{acc.name}' failed for partition {ctx.symbol} "
                    f"on {ctx.device}: {exc}"
                ) from exc
            exc.umahub_culprit = (plugin, "umahub_codegen")  # type: ignore[attr-defined]
            raise
    return module, said


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


def _blame(hook: str, check: Callable[..., Any], *args: Any) -> Any:
    """Run a contract check on what ``hook`` returned; a failure names the plugin that gave it."""
    try:
        return check(*args)
    except PluginOutputError as exc:
        plugin = last_returned(hook)
        if plugin is not None:
            exc.umahub_culprit = (plugin, hook)  # type: ignore[attr-defined]
        raise


def _module_kind(module: Any) -> str:
    kind = getattr(module, "kind", None)
    return str(kind if kind is not None else getattr(module, "type_key", ""))


def _plan_and_partition(
    hub: Hub,
    mod: tvm.IRModule,
    placement: Mapping[str, str] | None,
    clock: _Clock,
    notes: list[str],
) -> Partitioned:
    if not _has_main(mod):
        raise CompileError("the module has no 'main' function to compile")
    with clock.stage("plan"):
        unbounded = _run_time_sizes(mod["main"]) - set(size_bounds(mod["main"]))
        if unbounded and hub.accelerators:
            notes.append(
                f"sizes {', '.join(sorted(unbounded))} are known only at run time: pattern "
                "checks count tensors of those sizes as unbounded (umahub.memory.UNBOUNDED) "
                "and memory pools plan the tensors of static shape only; bound the sizes with "
                "main's tir_var_upper_bound attribute to place and check them"
            )
        pins = _pins(hub, mod, placement)
        claimants = hub.claimants
        claiming = {a.name for a in claimants}
        pinned_only = [
            hub.accelerator(n) for n in sorted(pinned_accelerators(pins)) if n not in claiming
        ]
        planned = plan_patterns(claimants, pinned_only, _patterns_getter(hub, notes))
    with clock.stage("partition"):
        accelerators = {a.name: a for a in hub.accelerators}
        failures: list = []
        part = partition(mod, planned, pins, accelerators, failures)
        _check_failures(hub, failures, notes)
        names: dict[str, list[str]] = {}
        for p in planned:
            names.setdefault(p.accelerator.name, []).append(p.name)
        _check_pins(part, pins, hub, names, notes)
    return part


def _check_failures(hub: Hub, failures: list, notes: list[str]) -> None:
    """Pattern checks that raised: their matches were refused; say so, once per pattern."""
    seen: dict[str, int] = {}
    for pattern, _, _ in failures:
        seen[pattern] = seen.get(pattern, 0) + 1
    for pattern, count in seen.items():
        _, nodes, exc = next(f for f in failures if f[0] == pattern)
        accelerator = pattern.split(".", 1)[0]
        message = (
            f"plugin '{hub.owner(accelerator)}' failed in the check of pattern '{pattern}' "
            f"(from umahub_patterns) on {', '.join(nodes) or 'a match'}"
            f"{f' and {count - 1} more match(es)' if count > 1 else ''}: "
            f"{type(exc).__name__}: {exc}"
        )
        if hub.config.on_error == "error":
            raise CompileError(message) from exc
        _warn(f"{message}; those operators go to the next claimant or the host")
        notes.append(message)


def _fail(hub: Hub, message: str, exc: BaseException | None, error_type: type) -> str:
    if hub.config.on_error == "error":
        raise error_type(message) from exc
    _warn(f"{message}; its partition runs on the host")
    return message


def _memory(
    hub: Hub, part: Partitioned, order: list[str], notes: list[str]
) -> tuple[MemoryPlan, dict[str, Need], dict[str, str]]:
    """Plan every pool in lowering order; return the plan, each need, and misfits."""
    pools = []
    for acc in hub.accelerators:
        for i in range(acc.instances):
            pools += [PoolUse(f"{acc.name}:{i}", p.scope, p.size_bytes, p.copy) for p in acc.memory]
    plan = MemoryPlan.for_devices(pools)
    needs: dict[str, Need] = {}
    misfits: dict[str, str] = {}
    calls = _partition_calls(part)
    bounds = size_bounds(part.mod["main"])
    for name in order:
        if name == HOST:
            plan = plan.with_host(*_host_plan(part))
            continue
        acc = hub.accelerator(name)
        for p in (p for p in part.partitions if p.accelerator == name):
            needs[p.symbol] = need = _need(p, *calls[p.symbol], hub.config.scope_policy)
            pool = acc.pool
            if pool is None:
                continue
            unknown = _unbounded_sizes(*calls[p.symbol], bounds)
            if unknown:
                notes.append(
                    f"partition {p.symbol} on {p.device}: sizes {', '.join(sorted(unknown))} are "
                    f"known only at run time; pool '{pool.scope}' is planned with its tensors of "
                    "static shape only (bound the sizes with main's tir_var_upper_bound "
                    "attribute to check the worst case)"
                )
            use = plan.pool(p.device, pool.scope)
            if not use.fits(need):
                misfits[p.symbol] = _fail(
                    hub,
                    f"partition {p.symbol} ({', '.join(p.patterns)}) needs {need.total} bytes "
                    f"of pool '{pool.scope}' on {p.device} ({need.resident} resident + "
                    f"{need.transient} working), but only {use.free} of {use.size_bytes} are "
                    "free",
                    None,
                    MemoryPoolError,
                )
                notes.append(misfits[p.symbol])
                continue
            plan = plan.add(p.device, pool.scope, need)
    return plan, needs, misfits


def _lowering_failure(exc: Exception, p: Partition, acc: Any) -> tuple[str, Exception, type]:
    """The message, cause and error type for a partition whose lowering failed."""
    plugin, hook = getattr(exc, "umahub_culprit", (None, None))
    if isinstance(exc, CompileError) and not plugin:  # umahub's message names the culprit
        return str(exc), exc, type(exc)
    who = f"plugin '{plugin}' failed in {hook}" if plugin else f"lowering of '{acc.name}' failed"
    text = str(exc).strip()
    detail = text.splitlines()[-1] if text else ""  # TVM errors carry a long trace first
    return (
        f"{who} for partition {p.symbol} ({', '.join(p.patterns)}) on {p.device}: "
        f"{type(exc).__name__}: {detail}",
        exc,
        CompileError,
    )


def _report_partitions(part: Partitioned) -> list[PartitionReport]:
    return [
        PartitionReport(p.symbol, p.accelerator, p.device, p.patterns, len(p.operators))
        for p in part.partitions
    ]


def explain(
    hub: Hub,
    mod: tvm.IRModule,
    *,
    placement: Mapping[str, str] | None = None,
    progress: Progress | None = None,
) -> Report:
    """Plan placement, memory and copies of ``mod`` without lowering or building it."""
    with _gc_paused(), bounded(_main_bounds(mod)):
        return _explain(hub, mod, placement, progress)


def _main_bounds(mod: tvm.IRModule) -> dict[str, int]:
    main = mod.functions.get(mod.get_global_var("main")) if _has_main(mod) else None
    return size_bounds(main)


def _has_main(mod: tvm.IRModule) -> bool:
    return "main" in [name_of(gv) for gv in mod.get_global_vars()]


def _explain(
    hub: Hub, mod: tvm.IRModule, placement: Mapping[str, str] | None, progress: Progress | None
) -> Report:
    clock, notes = _Clock(progress), []
    part = _plan_and_partition(hub, mod, placement, clock, notes)
    with clock.stage("memory"):
        plan, _, misfits = _memory(hub, part, _lowering_order(hub, part), notes)
    reports = _report_partitions(part)
    for r in reports:
        r.fallback = misfits.get(r.symbol, "")
    part = to_host(part, set(misfits))
    with clock.stage("copies"):
        devices, device_of, kinds = _devices(hub, part)
        _, copies, _ = place_on_devices(part.mod, device_of, devices, kinds, realize=False)
    _virtual_devices(hub, reports, devices)
    return Report(
        list(part.operators),
        reports,
        devices,
        copies,
        plan,
        clock.stages,
        clock.hooks,
        notes,
        built=False,
    )


def _virtual_devices(hub: Hub, reports: Any, devices: list[str]) -> None:
    """Write each placed partition's :class:`umahub.VirtualDevice` into its report."""
    from umahub.vdevice import VirtualDevice

    for r in reports:
        if r.fallback or r.device not in devices:
            continue
        acc = hub.accelerator(r.accelerator)
        scope = acc.pool.scope if acc.pool else None
        r.virtual_device = str(VirtualDevice("cpu", devices.index(r.device), acc.codegen, scope))


def _devices(hub: Hub, part: Partitioned) -> tuple[list[str], dict[str, str], dict[str, str]]:
    used = {p.device for p in part.partitions}
    devices = [HOST] + [d for a in hub.accelerators for d in a.devices if d in used]
    device_of = {p.symbol: p.device for p in part.partitions}
    kinds = {
        d: (
            hub.accelerator(d.split(":")[0]).pool.copy
            if hub.accelerator(d.split(":")[0]).pool
            else "sync"
        )
        for d in devices[1:]
    }
    return devices, device_of, kinds


def _build_host(mod: tvm.IRModule, multi_device: bool) -> Any:
    """``tvm.compile`` of the host part.

    With several devices, Relax's StaticPlanBlockMemory (TVM 0.25-0.27) would
    let a tensor on one device reuse storage allocated on another (it plans by
    size and scope, not by device), so it is disabled: each tensor is then
    allocated by the VM's pooled allocator of its own device.
    """
    disabled = ["StaticPlanBlockMemory"] if multi_device else []
    with tvm.transform.PassContext(opt_level=3, disabled_pass=disabled):
        return tvm.compile(mod, target="llvm")


def compile(
    hub: Hub,
    mod: tvm.IRModule,
    *,
    placement: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    verify: bool | None = None,
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
            operators on the model's own values (:mod:`umahub.verify`); None:
            the config's ``verify``.

    Raises:
        CompileError: a stage failed and ``on-error = "error"`` (or the failure
            cannot fall back, like a model without ``main``).
    """
    verify = hub.config.verify if verify is None else verify
    with bounded(_main_bounds(mod)):
        return _compile(hub, mod, placement, progress, verify)


def _compile(
    hub: Hub,
    mod: tvm.IRModule,
    placement: Mapping[str, str] | None,
    progress: Progress | None,
    verify: bool,
) -> Compiled:
    clock, notes = _Clock(progress), []
    with _gc_paused():
        part = _plan_and_partition(hub, mod, placement, clock, notes)
    order = _lowering_order(hub, part)
    with clock.stage("memory"):
        plan, needs, misfits = _memory(hub, part, order, notes)
    reports = {r.symbol: r for r in _report_partitions(part)}
    for symbol, why in misfits.items():
        reports[symbol].fallback = why
    functions = {
        str(f.attrs["global_symbol"]): f
        for f in part.mod.functions.values()
        if isinstance(f, relax.Function) and f.attrs and "Codegen" in f.attrs
    }
    modules: dict[str, Any] = {}
    lowered_plan = MemoryPlan(
        pools=tuple(PoolUse(p.device, p.scope, p.size_bytes, p.copy) for p in plan.pools),
        host_bytes=plan.host_bytes,
        host_constants=plan.host_constants,
    )
    for name in order:
        for p in (p for p in part.partitions if p.accelerator == name):
            if p.symbol in misfits:
                continue
            acc = hub.accelerator(name)
            ctx = CompileContext(hub.config, acc, p.instance, p.symbol, p.operators, lowered_plan)
            with clock.stage("lower", f"{p.symbol} on {p.device}"), recording() as calls:
                start = time.perf_counter()
                try:
                    modules[p.symbol], said = within(
                        hub.config.hook_timeout,
                        functools.partial(_lower_one, hub, ctx, functions[p.symbol]),
                        f"lowering {p.symbol}",
                    )
                except Exception as exc:
                    reports[p.symbol].fallback = _fail(hub, *_lowering_failure(exc, p, acc))
                    notes.append(reports[p.symbol].fallback)
                    modules.pop(p.symbol, None)
                    said = []
                reports[p.symbol].seconds["lower"] = time.perf_counter() - start
            clock.count(list(calls))
            reports[p.symbol].hooks = hooks_that_acted(list(calls))
            reports[p.symbol].schedule = said
            if p.symbol in modules and acc.pool is not None:
                lowered_plan = lowered_plan.add(p.device, acc.pool.scope, needs[p.symbol])
    build = functools.partial(
        _build_and_load, hub, mod, part, modules, reports, notes, clock, lowered_plan
    )
    compiled = build()
    if verify:
        placed = {p.symbol: functions[p.symbol] for p in part.partitions if p.symbol in modules}
        placed = {s: f for s, f in placed.items() if not reports[s].fallback}
        with clock.stage("verify", f"{len(placed)} partition(s)"):
            wrong = _verify(hub, compiled, placed, reports, notes)
        if wrong:
            compiled = build()
    return compiled


def _verify(
    hub: Hub, compiled: Compiled, functions: dict[str, relax.Function], reports, notes: list[str]
) -> set[str]:
    """Verify the placed partitions (see :mod:`umahub.verify`); return those that failed."""
    from umahub.compiled import example_inputs
    from umahub.verify import verify_partitions

    runner = compiled._runner
    verdicts = verify_partitions(
        runner.library,
        runner.devices,
        runner.weights,
        example_inputs(compiled.input_info, seed=0),
        functions,
        hub.config.verify_tolerance,
    )
    wrong = set()
    for symbol, verdict in verdicts.items():
        report = reports[symbol]
        report.verified = str(verdict)
        report.max_error = verdict.max_error
        if verdict.ok:
            continue
        acted = "; ".join(f"{hook}: {', '.join(p)}" for hook, p in report.hooks.items())
        owner = hub.owner(report.accelerator)
        message = (
            f"plugin '{owner}' computes wrong numbers in partition {symbol} "
            f"({', '.join(report.patterns)}) on {report.device}: {verdict} against the host's "
            f"lowering of the same operators on the model's own values (hooks that acted: "
            f"{acted or 'none, the default lowering and codegen'})"
        )
        report.fallback = _fail(hub, message, None, VerificationError)
        notes.append(report.fallback)
        wrong.add(symbol)
    return wrong


def _build_and_load(
    hub: Hub,
    mod: tvm.IRModule,
    part: Partitioned,
    modules: dict[str, Any],
    reports: dict[str, PartitionReport],
    notes: list[str],
    clock: _Clock,
    plan: MemoryPlan,
) -> Compiled:
    """Build the host part with the partitions that did not fall back, and load it.

    A failure here is umahub's or TVM's, not one partition's: with ``on-error
    = "fallback"`` the model is built again with every partition on the host
    (never worse than plain TVM), with a warning and a note; with ``"error"``
    the compile stops.
    """
    fallen = {s for s, r in reports.items() if r.fallback}
    try:
        return _build(hub, mod, to_host(part, fallen), modules, reports, notes, clock, plan)
    except Exception as exc:
        remaining = {p.symbol for p in part.partitions} - fallen
        if not remaining:
            raise
        text = str(exc).strip()
        message = (
            f"building the model with its partitions placed failed ({type(exc).__name__}: "
            f"{text.splitlines()[-1] if text else ''}); this is a bug of umahub or TVM, "
            "please report it"
        )
        if hub.config.on_error == "error":
            raise CompileError(message) from exc
        _warn(f"{message}; every partition runs on the host")
        notes.append(f"{message}; every partition runs on the host")
        for symbol in remaining:
            reports[symbol].fallback = "the placed model failed to build (see the notes)"
        return _build(hub, mod, to_host(part, set(reports)), {}, reports, notes, clock, plan)


def _build(
    hub: Hub,
    mod: tvm.IRModule,
    part: Partitioned,
    modules: dict[str, Any],
    reports: dict[str, PartitionReport],
    notes: list[str],
    clock: _Clock,
    plan: MemoryPlan,
) -> Compiled:
    with clock.stage("build"):
        devices, device_of, kinds = _devices(hub, part)
        copies: list = []
        weight_devices: list[int] = []
        host = part.mod
        if part.partitions:
            for acc in hub.accelerators:
                codegen_stage.register_ext_codegen(acc)
            with codegen_stage.serving(modules):
                host = relax.transform.RunCodegen()(host)
            host, copies, weight_devices = place_on_devices(host, device_of, devices, kinds)
        if any(r.fallback for r in reports.values()):
            host = relax.transform.LambdaLift()(host)  # fallen-back composites are local
        executable = _build_host(host, multi_device=len(devices) > 1)
    used = [hub.accelerator(p.accelerator) for p in part.partitions]
    options = codegen_stage.export_options(used)
    _virtual_devices(hub, reports.values(), devices)
    report = Report(
        list(part.operators),
        list(reports.values()),
        devices,
        copies,
        plan,
        clock.stages,
        clock.hooks,
        notes,
    )
    needs_export = any(_module_kind(modules[p.symbol]) == "c" for p in part.partitions)
    with clock.stage("load"):
        try:
            return Compiled(
                executable,
                devices,
                signature_of(mod["main"]),
                options,
                report,
                weight_devices,
                needs_export,
            )
        except Exception as exc:
            detail = str(exc).strip()
            raise CompileError(
                f"the compiled model cannot be linked or loaded: {type(exc).__name__}: {detail}"
            ) from exc
