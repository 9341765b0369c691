"""Stage 1, plan: who may claim what.

The plan is the list of patterns that partitioning will match, in claiming
order: the ``priority`` accelerators first (first claimant wins, the host takes
the rest), then accelerators that claim only what is pinned to them. Pins come
from the model (:func:`umahub.annotate`), the config and the ``compile`` call,
in that precedence (see :mod:`umahub.compiler.placement` for how a pin selects).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import tvm
from tvm import relax

from umahub._tvm import type_of
from umahub.compiler.compilation import Compilation
from umahub.compiler.placement import Pins, PlannedPattern, model_pins, pinned_accelerators
from umahub.config import HOST, glob_problem, parse_pin
from umahub.errors import (
    CompileError,
    ConfigError,
    PluginFailure,
    PluginOutputError,
    did_you_mean,
    warn,
)
from umahub.hub.contract import checked_patterns
from umahub.hub.timelimit import within
from umahub.hub.tracing import recording, returned_by
from umahub.ir import bindings
from umahub.plugin.accelerator import Accelerator
from umahub.plugin.memory import size_bounds, symbolic_sizes

__all__ = ["plan_patterns", "run"]


def _pins(hub: Any, mod: tvm.IRModule, placement: Mapping[str, str] | None) -> Pins:
    """The pins of the model, the config and the call, in that precedence."""
    api = {str(k): parse_pin(v, "compile(placement=...)") for k, v in (placement or {}).items()}
    layers = [model_pins(mod), dict(hub.config.placement), api]
    known = {a.name: a.instances for a in hub.accelerators}
    for layer in layers[::2]:  # the config's own pins were checked when the hub was made
        for selector, pin in layer.items():
            problem = glob_problem(selector)
            if problem:
                warn(f"pin {selector!r}: {problem}")
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


def _patterns_getter(comp: Compilation) -> Callable[[Any], list[Any]]:
    """``umahub_patterns`` of an accelerator, checked, under the time limit and on-error."""
    hub = comp.hub

    def ask(acc: Any) -> list[Any]:
        with recording() as calls:
            results = hub.traced_hook.umahub_patterns(accelerator=acc)
            givers = returned_by("umahub_patterns", len(results))
        owner = hub.owner(acc.name)
        # pluggy leaves None out of the results: the owner's None is in the log only
        said_none = (
            [(owner, None)]
            if any(
                c.plugin == owner and c.hook == "umahub_patterns" and not c.returned for c in calls
            )
            else []
        )
        patterns = []
        for plugin, result in [*zip(givers, results), *said_none]:
            try:
                patterns += checked_patterns(acc, result, own=plugin == owner)
            except PluginOutputError as exc:
                raise PluginFailure(plugin, "umahub_patterns", exc) from exc
        return patterns

    def patterns_of(acc: Any) -> list[Any]:
        try:
            return within(hub.config.hook_timeout, lambda: ask(acc), f"patterns of {acc.name}")
        except Exception as exc:
            failure = PluginFailure.of(exc, hub.owner(acc.name), "umahub_patterns")
            cause = failure.cause
            message = (
                f"plugin '{failure.plugin}' failed in {failure.hook} for accelerator "
                f"'{acc.name}': {type(cause).__name__}: {cause}"
            )
            comp.fail(
                message, CompileError, cause, then=f"'{acc.name}' claims nothing in this compile"
            )
            return []

    return patterns_of


def plan_patterns(
    claimants: Sequence[Accelerator],
    pinned_only: Sequence[Accelerator],
    patterns_of: Callable[[Accelerator], list[Any]],
) -> list[PlannedPattern]:
    """The patterns in claiming order.

    Args:
        claimants: accelerators that claim operators, in priority order.
        pinned_only: accelerators outside ``priority`` that pins name.
        patterns_of: the accelerator's patterns (the ``umahub_patterns`` hook), as
            ``(name, pattern, annotations, check)`` (see :mod:`umahub.hub.contract`).
    """
    planned = []
    for accelerators, claims in ((claimants, True), (pinned_only, False)):
        for acc in accelerators:
            for name, pattern, annotated, check in patterns_of(acc):
                planned.append(PlannedPattern(acc, name, pattern, annotated, check, claims))
    return planned


def _run_time_sizes(main: relax.Function) -> set[str]:
    """Symbolic sizes of ``main``'s inputs and of the tensors its bindings compute."""
    sizes = set().union(*(symbolic_sizes(type_of(p)) for p in main.params))
    for b in bindings(main):
        sizes |= symbolic_sizes(type_of(b.var))
    return sizes


def run(comp: Compilation) -> None:
    """Stage 1: the pins and the planned patterns of ``comp``."""
    hub, main = comp.hub, comp.mod["main"]
    unbounded = _run_time_sizes(main) - set(size_bounds(main))
    if unbounded and hub.accelerators:
        comp.notes.append(
            f"sizes {', '.join(sorted(unbounded))} are known only at run time: pattern "
            "checks count tensors of those sizes as unbounded (umahub.plugin.memory.UNBOUNDED) "
            "and memory pools plan the tensors of static shape only; bound the sizes with "
            "main's tir_var_upper_bound attribute to place and check them"
        )
    if comp.only is not None:  # a measurement: these claim, nothing is pinned
        comp.pins = Pins([])
        comp.planned = plan_patterns(comp.only, [], _patterns_getter(comp))
        return
    pins = comp.placement if isinstance(comp.placement, Mapping) else None
    comp.pins = _pins(hub, comp.mod, pins)
    # By cost, every accelerator is a candidate (in priority order, for ties).
    claimants = hub.accelerators if comp.placing_by_cost else hub.claimants
    claiming = {a.name for a in claimants}
    pinned_only = [
        hub.accelerator(n) for n in sorted(pinned_accelerators(comp.pins)) if n not in claiming
    ]
    comp.planned = plan_patterns(claimants, pinned_only, _patterns_getter(comp))
    if comp.placing_by_cost:
        # Every match a partition of its own: what was timed is what runs (a merged
        # partition is lowered as one kernel, and may cost anything).
        comp.planned = [
            replace(p, accelerator=replace(p.accelerator, merge=False)) for p in comp.planned
        ]
