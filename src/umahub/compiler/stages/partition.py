"""Stage 2, partition: the plan carried out.

``FuseOpsByPattern`` (constants as parameters, so that weights are partition
inputs) groups each match into a composite function; ``MergeCompositeFunctions``
then merges neighbouring composites of one accelerator into one partition
function (attribute ``Codegen`` = accelerator name, ``global_symbol`` = the
partition's symbol). A merged partition may hold several kernels; the default
lowering fuses them into one PrimFunc (see :mod:`umahub.compiler.lowering`), so that
every partition is one packed function, as ``relax.ext`` codegens expect.

Composites pinned to an instance are tagged before merging so that a partition
never mixes instances; partitions without a pinned instance are spread over
their accelerator's instances round robin, in model order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tvm
from tvm import relax

from umahub._tvm import name_of, type_of, well_formed
from umahub.compiler.compilation import Compilation, Partition, Partitioned, written
from umahub.compiler.composites import (
    TAG,
    codegen_of,
    composites,
    mergeable,
    name_nodes,
    one_composite_per_call,
    pattern_of,
    strip_tags,
    tag_composites,
    untag,
)
from umahub.compiler.operators import Row, flops, producers, walk
from umahub.compiler.placement import (
    CheckFailures,
    Matches,
    Pins,
    PlannedPattern,
    Refusals,
    inexact_quantized,
    producers_of,
    quantized_parts,
)
from umahub.config import HOST
from umahub.errors import CompileError, PlacementError, did_you_mean
from umahub.ir import bindings, node_name, op_calls
from umahub.plugin.accelerator import Accelerator
from umahub.plugin.context import Operator
from umahub.plugin.memory import tensor_bytes
from umahub.report.report import PartitionReport

__all__ = ["partition", "run"]


def _symbol(accelerator: str, index: int, ops: list[str]) -> str:
    """A partition's symbol: ``<accelerator>_<index>_<its ops>``, e.g. ``npu_2_conv2d_add_relu``."""
    short = "_".join(op.rsplit(".", 1)[-1] for op in ops)
    if len(short) > 48:
        short = short[:48].rstrip("_") + "_etc"
    return f"{accelerator}_{index}_{short}"


def _fuse(
    mod: tvm.IRModule,
    planned: Sequence[PlannedPattern],
    pins: Pins,
    failures: CheckFailures | None,
    refusals: Refusals | None = None,
    parts: dict | None = None,
    inexact: dict | None = None,
) -> tuple[Matches, tvm.IRModule]:
    """FuseOpsByPattern with the planned patterns: (the accepted matches, the module).

    TVM 0.25's pass loses a block output that a match holds other than as its
    result (a convolution that is returned and also activated): the module it
    gives is not well formed. Then the fusion runs again without such matches.
    """
    producers = producers_of(mod["main"])
    for inner_outputs in (True, False):
        accepted = Matches(inner_outputs, producers, parts, inexact)
        patterns = [p.fusion_pattern(pins, accepted, failures, refusals) for p in planned]
        fused = relax.transform.FuseOpsByPattern(
            patterns, bind_constants=False, annotate_codegen=False
        )(mod)
        if well_formed(fused):
            break
        for record in (failures, refusals):
            if record is not None:
                record.clear()  # the checks run again
    return accepted, fused


def _merged_or_none(mod: tvm.IRModule) -> tvm.IRModule | None:
    """TVM's ``MergeCompositeFunctions`` on ``mod``, or None where it fails: then one
    match per partition.

    The pass can lose a block output (TVM 0.25) or stop on an internal check
    (a decoder's module with a KV cache lifted to inputs and outputs, TVM 0.27).
    """
    try:
        merged = relax.transform.MergeCompositeFunctions()(mod)
    except tvm.error.InternalError:
        return None
    return merged if well_formed(merged) else None


def partition(
    mod: tvm.IRModule,
    planned: Sequence[PlannedPattern],
    pins: Pins,
    accelerators: Mapping[str, Accelerator],
    failures: CheckFailures | None = None,
    refusals: Refusals | None = None,
) -> Partitioned:
    """Partition ``mod`` by the planned patterns; place every partition on an instance.

    A pattern check that raises refuses its match and is recorded in
    ``failures``; why matches holding pinned operators were refused goes to
    ``refusals`` (see :meth:`PlannedPattern.fusion_pattern`), and what each
    accelerator's checks refused to ``refusals.checks``, which every operator
    carries as ``Operator.refused`` (the accelerator it runs on left out).
    """
    mod = name_nodes(relax.transform.ConvertToDataflow()(mod))
    parts = quantized_parts(mod["main"])
    inexact = inexact_quantized(mod["main"], parts)
    refusals = refusals if refusals is not None else Refusals()
    quantized = _quantized_roots(mod["main"], parts, inexact)
    if planned:
        position = {node: i for i, (node, _) in enumerate(op_calls(mod["main"]))}
        accepted, fused = _fuse(mod, planned, pins, failures, refusals, parts, inexact)
        merged = None
        if not composites(fused):
            pass  # nothing matched: the module goes on as it was
        elif any(p.accelerator.merge for p in planned) and mergeable(fused):
            merged = one_composite_per_call(fused, accepted, position)
            # MergeCompositeFunctions takes composites and operators only.
            merged = merged if mergeable(merged) else None
        if merged is not None:
            merged = _merged_or_none(tag_composites(merged, pins, accelerators))
        if merged is not None:
            mod = merged
        elif composites(fused):  # TVM's merge pass grows quadratically: skip it when unused
            mod = one_composite_per_call(
                fused, accepted, position, wrap=lambda comp: codegen_of(comp, pins)
            )

    def operator(row: Row, device: str = "host", symbol: str = "") -> Operator:
        hit = pins.resolve(row.node, row.op, row.pattern)
        pinned = hit[0] if hit else ""
        where = device.partition(":")[0]
        refused = {a: r for a, r in refusals.checks.get(row.node, {}).items() if a != where}
        return Operator(
            row.node,
            row.op,
            device,
            row.pattern,
            symbol,
            pinned,
            row.inputs,
            row.flops,
            row.bytes,
            refused,
        )

    # One walk over main, in model order: partitions get their instance (pinned,
    # else round robin) and their symbol as they are met.
    next_instance: dict[str, int] = {}
    placed: dict[str, Partition] = {}  # partition function name -> partition
    renamed: dict = {}
    operators: list[Operator] = []
    env: dict = {}
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            func = None
            if isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar):
                func = mod[value.op]
            if isinstance(func, relax.Function) and func.attrs and "Codegen" in func.attrs:
                accel_name, instance = untag(str(func.attrs["Codegen"]))
                if instance is None:
                    instance = next_instance.get(accel_name, 0) % accelerators[accel_name].instances
                    next_instance[accel_name] = instance + 1
                inner = {p: producers(a, env) for p, a in zip(func.params, value.args)}
                rows, out = walk(func, mod, pattern_of, "", inner)
                symbol = _symbol(accel_name, len(placed), [r.op for r in rows])
                ops = [operator(r, f"{accel_name}:{instance}", symbol) for r in rows]
                placed[name_of(value.op)] = Partition(
                    symbol,
                    accel_name,
                    instance,
                    tuple(dict.fromkeys(o.pattern for o in ops)),
                    tuple(ops),
                )
                if TAG in str(func.attrs["Codegen"]):
                    func = strip_tags(func)
                renamed[value.op] = func.with_attr("global_symbol", symbol)
                operators.extend(ops)
                env[binding.var] = out
            elif isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
                name = node_name(binding)
                row = Row(
                    name,
                    value.op.name,
                    "",
                    producers(value, env),
                    flops(value),
                    tensor_bytes(type_of(value)),
                )
                operators.append(operator(row))
                env[binding.var] = (name,)
            elif isinstance(func, relax.Function):  # a plain function the host runs
                inner = {p: producers(a, env) for p, a in zip(func.params, value.args)}
                rows, out = walk(func, mod, pattern_of, "", inner)
                operators.extend(operator(r) for r in rows)
                env[binding.var] = out
            else:
                env[binding.var] = producers(value, env)
    funcs = dict(mod.functions)
    funcs.update(renamed)
    mod = tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)
    quantized_ops = tuple(
        (
            node,
            kind,
            f"umahub does not compute it in integers: {problem}; it runs in float32 as written"
            if problem
            else _why_on_host(refusals.get(node, [])),
            not problem,
        )
        for node, kind, problem in quantized
    )
    return Partitioned(mod, tuple(placed.values()), tuple(operators), quantized_ops)


def _quantized_roots(
    main: relax.Function, parts: dict, inexact: dict
) -> list[tuple[str, str, str]]:
    """(node, kind, problem) of each quantized operator's final quantize, in model order;
    ``problem`` says why umahub does not compute it in integers ("" where it does:
    ``inexact``, :func:`umahub.compiler.placement.inexact_quantized`)."""
    roots = set(parts.values())
    bound = {b.var: b.value for b in bindings(main)}
    found = []
    for binding in bindings(main):
        if binding.var not in roots:
            continue
        kind = next(
            (
                bound[v].op.name.rsplit(".", 1)[-1]
                for v, r in parts.items()
                if r.same_as(binding.var) and bound[v].op.name in _PRODUCERS
            ),
            None,
        )
        if kind is None:  # a quantized mean: no quantized operator of the report's
            continue
        found.append((node_name(binding), kind, inexact.get(binding.var, "")))
    return found


_PRODUCERS = ("relax.nn.conv2d", "relax.matmul")


def _why_on_host(refused: list[tuple[str, str]]) -> str:
    """Why a quantized operator runs on the host, from its refused matches."""
    if not refused:
        return "no accelerator's pattern matched it"
    return "; ".join(
        f"{pattern} refused it: {reason or 'its check gives no reason'}"
        for pattern, reason in refused
    )


def _not_taken(op: Operator, pin: Any, names: list[str], refusals: Refusals) -> str:
    """Why the pinned accelerator did not take ``op``, and what to do, for the pin's message."""
    refused = refusals.of(op.name, pin.accelerator)
    if not refused:
        return (
            f"none of the patterns of '{pin.accelerator}' ({', '.join(names) or 'none'}) "
            "matches it; pin it elsewhere or extend the plugin's patterns"
        )
    by_reason: dict[str, list[str]] = {}
    for pattern, reason in refused:
        by_reason.setdefault(reason, []).append(pattern)
    said = [
        f"{_patterns(patterns)} refused it: {reason}"
        if reason
        else f"the check of {_patterns(patterns)} refused it (it gives no reason)"
        for reason, patterns in list(by_reason.items())[:_MAX_REASONS]
    ]
    if len(by_reason) > _MAX_REASONS:
        said.append(f"{len(by_reason) - _MAX_REASONS} more reason(s)")
    return f"{'; '.join(said)}; pin it elsewhere"


def _patterns(names: list[str]) -> str:
    return f"pattern{'s' if len(names) > 1 else ''} " + ", ".join(f"'{n}'" for n in names)


#: Reasons a pin's message quotes; the rest are counted.
_MAX_REASONS = 3


def _check_pins(
    comp: Compilation,
    part: Partitioned,
    planned_names: dict[str, list[str]],
    refusals: Refusals | None = None,
) -> None:
    """Every pin selects some operator, and every pinned operator is where its pin says.

    A pin that cannot be honoured is an error with on-error "error", else a
    warning and a note (a project's config may pin nodes of other models).
    The message says why: the reasons the pinned accelerator's pattern checks
    gave (``refusals``), or that none of its patterns matches the operator.
    """
    pins = written(comp.pins, "pins")
    selected = {selector: False for selector, _ in pins.ordered}
    misplaced: list = []
    honoured_nodes: set[tuple[str, str]] = set()  # (selector, node) with an operator in place
    for op in part.operators:
        hit = pins.resolve(op.name, op.op, op.pattern)
        if hit is None:
            continue
        selector, pin = hit
        selected[selector] = True
        accel, _, instance = op.device.partition(":")
        ok = accel == pin.accelerator and (pin.instance is None or str(pin.instance) == instance)
        if ok:
            honoured_nodes.add((selector, op.name))
        else:
            misplaced.append((op, selector, pin))
    for op, selector, pin in misplaced:
        if (selector, op.name) in honoured_nodes:
            continue  # a source node imported as several operators: its main one is in place
        if pin.accelerator == HOST:
            continue  # only a pattern pin that a plugin check overrode could land here
        why = _not_taken(op, pin, planned_names.get(pin.accelerator, []), refusals or Refusals())
        message = (
            f"pin {selector!r} -> '{pin}': operator '{op.name}' ({op.op}) runs on "
            f"{op.device}, because {why}"
        )
        comp.fail(message, PlacementError)
    candidates = {n for o in part.operators for n in (o.name, o.op, o.pattern) if n}
    for selector, used in selected.items():
        if used or any(ch in selector for ch in "*?["):
            continue
        message = (
            f"pin {selector!r} selects no operator of the model"
            f"{did_you_mean(selector, candidates)}; a pin names a node, an op "
            "('relax.nn.conv2d' or 'nn.conv2d') or a pattern"
        )
        comp.fail(message, PlacementError)


def _check_failures(comp: Compilation, failures: CheckFailures) -> None:
    """Pattern checks that raised: their matches were refused; say so, once per pattern."""
    for pattern, failed in failures.by_pattern().items():
        first, count = failed[0], len(failed)
        exc = first.cause
        message = (
            f"plugin '{first.plugin}' failed in the check of pattern '{pattern}' "
            f"(from umahub_patterns) on {', '.join(first.nodes) or 'a match'}"
            f"{f' and {count - 1} more match(es)' if count > 1 else ''}: "
            f"{type(exc).__name__}: {exc}"
        )
        comp.fail(
            message, CompileError, exc, then="those operators go to the next claimant or the host"
        )


def run(comp: Compilation) -> None:
    """Stage 2: partition ``comp.mod`` by ``comp.planned``; one report per partition."""
    accelerators = {a.name: a for a in comp.hub.accelerators}
    accelerators.update({p.accelerator.name: p.accelerator for p in comp.planned})
    failures = CheckFailures(comp.hub.owner)
    refusals = Refusals(comp.unfit)
    pins = written(comp.pins, "pins")
    part = partition(comp.mod, comp.planned, pins, accelerators, failures, refusals)
    _check_failures(comp, failures)
    names: dict[str, list[str]] = {}
    for p in comp.planned:
        names.setdefault(p.accelerator.name, []).append(p.name)
    _check_pins(comp, part, names, refusals)
    comp.partitioned = part
    comp.reports = {
        p.symbol: PartitionReport(p.symbol, p.accelerator, p.device, p.patterns, len(p.operators))
        for p in part.partitions
    }
