"""Stage 2, partition: the plan carried out.

``FuseOpsByPattern`` (constants as parameters, so that weights are partition
inputs) groups each match into a composite function; ``MergeCompositeFunctions``
then merges neighbouring composites of one accelerator into one partition
function (attribute ``Codegen`` = accelerator name, ``global_symbol`` = the
partition's symbol). A merged partition may hold several kernels; the default
lowering fuses them into one PrimFunc (see :mod:`umahub.lowering`), so that
every partition is one packed function, as ``relax.ext`` codegens expect.

Composites pinned to an instance are tagged before merging so that a partition
never mixes instances; partitions without a pinned instance are spread over
their accelerator's instances round robin, in model order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import tvm
from tvm import relax

from umahub._tvm import name_of, rebind, ret_type, type_args, type_of
from umahub.accelerator import Accelerator
from umahub.context import Operator
from umahub.errors import PlacementError
from umahub.memory import tensor_bytes
from umahub.placement import Pins, PlannedPattern
from umahub.vdevice import VirtualDevice

__all__ = ["Partition", "Partitioned", "partition"]

_TAG = "__umahub_"


@dataclass(frozen=True)
class Partition:
    """One partition: its symbol, where it runs, what it holds."""

    symbol: str
    accelerator: str
    instance: int
    patterns: tuple[str, ...]
    operators: tuple[Operator, ...]

    @property
    def device(self) -> str:
        """The virtual device, ``"name:instance"``."""
        return f"{self.accelerator}:{self.instance}"


@dataclass(frozen=True)
class Partitioned:
    """The partitioned module, its partitions in model order, every operator's placement."""

    mod: tvm.IRModule
    partitions: tuple[Partition, ...]
    operators: tuple[Operator, ...]


def _composites(mod: tvm.IRModule) -> dict[str, relax.Function]:
    return {
        gv.name_hint: f
        for gv, f in mod.functions.items()
        if isinstance(f, relax.Function) and f.attrs and "Composite" in f.attrs
    }


def _mergeable(main: relax.Function) -> bool:
    """Whether TVM's MergeCompositeFunctions can take ``main`` (TVM 0.25-0.27).

    The pass handles plain variable bindings in dataflow blocks only: a
    ``MatchCast`` (a shape computed at run time) or a plain block (control
    flow) makes it fail. Such a module is partitioned one match per partition,
    which is always correct, only with more calls between the host and the
    accelerators.
    """
    return all(
        isinstance(block, relax.DataflowBlock)
        and all(isinstance(b, relax.VarBinding) for b in block.bindings)
        for block in main.body.blocks
    )


def _ops_in(func: relax.Function) -> list[tuple[str, str]]:
    """(node, op) of the operator calls in a function's bindings, in order."""
    found = []
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
                found.append((node_name(binding), value.op.name))
    return found


def _pinned_device(func: relax.Function, pattern: str, pins: Pins, accel: str) -> int | None:
    """The instance the pins on a composite's operators agree on (None: unconstrained).

    Each pin is a virtual-device constraint; they are joined, and a conflict
    (two operators of one match pinned to two instances) names both pins.
    """
    constraints = [
        (selector, pin)
        for node, op in _ops_in(func)
        if (hit := pins.resolve(node, op, pattern)) is not None
        for selector, pin in [hit]
    ]
    pattern_pin = pins.for_pattern(pattern)
    if pattern_pin is not None:
        constraints.append((pattern, pattern_pin))
    joined, first = VirtualDevice(), None
    for selector, pin in constraints:
        device = VirtualDevice("cpu", pin.instance, None, None)
        merged = joined.join(device)
        if merged is None:
            raise PlacementError(
                f"one match of pattern '{pattern}' holds operators pinned to two instances: "
                f"{first[0]!r} -> '{first[1]}' and {selector!r} -> '{pin}' "
                f"({joined.conflict(device)}); pin them to one instance"
            )
        if first is None or pin.instance is not None:
            first = (selector, pin)
        joined = merged
    return joined.virtual_device_id


def _tag_composites(
    mod: tvm.IRModule, pins: Pins, accelerators: Mapping[str, Accelerator]
) -> tvm.IRModule:
    """Tag the composites' accelerator prefix where partitions must stay apart.

    MergeCompositeFunctions groups composites by the accelerator prefix of
    their Composite name (and the prefix becomes the partition's Codegen). The
    prefix is tagged for composites pinned to an instance (so that merging keeps
    instances apart, and the partition knows its instance) and for every
    composite of an accelerator that does not merge (``Accelerator.merge``).
    """
    updates = {}
    for index, (name, func) in enumerate(sorted(_composites(mod).items())):
        pattern = str(func.attrs["Composite"])
        accel, _, what = pattern.partition(".")
        instance = _pinned_device(func, pattern, pins, accel) if pins else None
        tag = ""
        if instance is not None:
            tag += f"i{instance}"
        if not accelerators[accel].merge:
            tag += f"m{index}"
        if tag:
            updates[mod.get_global_var(name)] = func.with_attr(
                "Composite", f"{accel}{_TAG}{tag}.{what}"
            )
    if not updates:
        return mod
    funcs = dict(mod.functions)
    funcs.update(updates)
    return tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)


def _outer(comp: relax.Function, codegen: str) -> relax.Function:
    """A partition function holding one composite, shaped as MergeCompositeFunctions shapes them.

    ``Codegen`` is the composite's accelerator (with its tag, if any); the
    composite is a local function called once. Built directly rather than
    through ``bb.function``: the module is normalized once, at the end.
    """
    params = [relax.Var(name_of(p), type_of(p)) for p in comp.params]
    inner = comp.without_attr("Primitive")
    local = relax.Var("local", type_of(inner))
    result = relax.Var("result", ret_type(comp))
    bindings = [relax.VarBinding(local, inner), relax.VarBinding(result, relax.Call(local, params))]
    body = relax.SeqExpr([relax.BindingBlock(bindings)], result)
    return relax.Function(params, body, ret_type(comp), True).with_attr("Codegen", codegen)


def _codegen_of(comp: relax.Function, pins: Pins) -> str:
    """The Codegen of a partition holding only ``comp``: its accelerator, tagged if pinned."""
    pattern = str(comp.attrs["Composite"])
    accel = pattern.split(".", 1)[0]
    instance = _pinned_device(comp, pattern, pins, accel) if pins else None
    return accel if instance is None else f"{accel}{_TAG}i{instance}"


def _untag(name: str) -> tuple[str, int | None]:
    """(accelerator, pinned instance or None) of a tagged Composite/Codegen prefix."""
    accel, sep, tag = name.partition(_TAG)
    if not sep or not tag.startswith("i"):
        return accel, None
    return accel, int(tag[1:].split("m")[0])


def _pattern_of(composite: relax.Function) -> str:
    """The pattern name of a composite function, without an instance tag."""
    accel_tag, what = str(composite.attrs["Composite"]).split(".", 1)
    return f"{_untag(accel_tag)[0]}.{what}"


def _with_span_names(func: relax.Function, names: list[str] | None = None) -> relax.Function:
    """``func`` with each operator call's span naming its node.

    Partitioning renames the variables it moves into composites (``gv``,
    ``lv``); spans travel with the calls, so the report can still name every
    operator as the model named it. ``names`` gives the names in binding order;
    by default each call is named after the variable it binds.
    """
    pending = list(names) if names is not None else None
    blocks = []
    for block in func.body.blocks:
        bindings = []
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
                name = pending.pop(0) if pending is not None else name_of(binding.var)
                span = tvm.ir.Span(tvm.ir.SourceName(name), 0, 0, 0, 0)
                value = relax.Call(value.op, value.args, value.attrs, type_args(value), span=span)
            bindings.append(rebind(binding, value))
        blocks.append(type(block)(bindings))
    return relax.Function(
        func.params, relax.SeqExpr(blocks, func.body.body), ret_type(func), func.is_pure, func.attrs
    )


def _name_nodes(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every operator of ``main`` named in its span (see _with_span_names)."""
    funcs = dict(mod.functions)  # keyed by GlobalVar: main's calls of the others stay bound
    funcs[mod.get_global_var("main")] = _with_span_names(mod["main"])
    return relax.transform.Normalize()(
        tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)
    )


def _add_rewritten_main(bb: relax.BlockBuilder, main: relax.Function, rewrite) -> None:
    """Add to ``bb`` a copy of ``main`` whose bindings' values went through ``rewrite``.

    ``rewrite(binding) -> value`` is called once per binding, in order.
    """
    blocks = [
        type(block)([rebind(b, rewrite(b)) for b in block.bindings]) for block in main.body.blocks
    ]
    bb.add_func(
        relax.Function(
            main.params,
            relax.SeqExpr(blocks, main.body.body),
            ret_type(main),
            main.is_pure,
            main.attrs,
        ),
        "main",
    )


def _one_composite_per_call(
    mod: tvm.IRModule,
    accepted: list,
    position: dict[str, int],
    wrap: Callable[[relax.Function], str] | None = None,
) -> tvm.IRModule:
    """Give every composite call site a composite function of its own, with its own names.

    FuseOpsByPattern shares one function between structurally equal matches
    (two identical relus); each call site must be its own partition, so shared
    composites are copied, and each copy's operators are named after the match
    that made it (matches of one pattern are taken in model order).

    With ``wrap`` (when nothing is merged afterwards), each copy goes straight
    into a partition function of its own (see :func:`_outer`), whose Codegen
    ``wrap(copy)`` gives.
    """
    queues: dict[str, list[list[str]]] = {}
    for pattern, nodes in sorted(accepted, key=lambda m: max(position.get(n, -1) for n, _ in m[1])):
        ordered = sorted(nodes, key=lambda node: position.get(node[0], -1))
        queues.setdefault(pattern, []).append([n for n, _ in ordered])
    bb = relax.BlockBuilder(
        tvm.IRModule(
            {gv: f for gv, f in mod.functions.items() if name_of(gv) != "main"}, attrs=mod.attrs
        )
    )
    count = 0

    def own_copy(binding: relax.VarBinding) -> relax.Expr:
        nonlocal count
        value = binding.value
        func = (
            mod[value.op]
            if (isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar))
            else None
        )
        if not (isinstance(func, relax.Function) and func.attrs and "Composite" in func.attrs):
            return value
        queue = queues.get(str(func.attrs["Composite"]), [])
        names = queue.pop(0) if queue else None
        if names is not None and len(names) != len(_ops_in(func)):
            names = None
        copy = _with_span_names(func, names) if names else func
        if wrap is None:
            gv = bb.add_func(copy.with_attr("umahub.match", count), f"{name_of(value.op)}_{count}")
        else:
            codegen = wrap(copy)
            outer = _outer(copy, codegen).with_attr("umahub.match", count)  # no deduplication
            gv = bb.add_func(outer, f"{name_of(value.op)}_{count}_{codegen}")
        count += 1
        return relax.Call(gv, value.args, value.attrs, type_args(value), span=value.span)

    _add_rewritten_main(bb, mod["main"], own_copy)
    built = bb.get()
    nested = {name_of(gv) for gv in relax.analysis.all_global_vars(built["main"])}
    funcs = {}
    for gv, f in built.functions.items():
        if f.attrs and "Composite" in f.attrs and "umahub.match" not in f.attrs:
            if name_of(gv) not in nested:
                continue  # every call of it now calls a copy
            # A match inside control flow (an If branch) is not placed: the host runs it.
            f = f.without_attr("Composite").without_attr("Primitive")
        funcs[gv] = f
    out = tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)
    return relax.transform.Normalize()(out) if wrap is not None else out


def node_name(binding: relax.VarBinding) -> str:
    """The model's name of the operator a binding computes (its span, else its variable)."""
    span = binding.value.span
    if span is not None and span.source_name is not None:
        return str(span.source_name.name)
    return name_of(binding.var)


@dataclass(frozen=True)
class _Row:
    node: str
    op: str
    pattern: str
    inputs: tuple[str, ...]
    flops: int
    bytes: int


def _producers(expr: relax.Expr, env: Mapping) -> tuple[str, ...]:
    """The node names that produced the variables ``expr`` reads, in argument order."""
    names: list[str] = []
    pending = [expr]
    while pending:  # arguments, tuples and tuple items: all a dataflow binding holds
        e = pending.pop()
        if isinstance(e, relax.Var):
            names.extend(n for n in env.get(e, ()) if n not in names)
        elif isinstance(e, relax.Call):
            pending.extend(reversed(list(e.args)))
        elif isinstance(e, relax.Tuple):
            pending.extend(reversed(list(e.fields)))
        elif isinstance(e, relax.TupleGetItem):
            pending.append(e.tuple_value)
    return tuple(names)


def _flops(call: relax.Call) -> int:
    """Floating-point operations of one call, from static shapes (0 when unknown)."""
    from umahub.patterns import shape_of

    out = shape_of(call)
    if out is None:
        return 0
    elements = int(np.prod(out)) if out else 1
    op = call.op.name
    if op == "relax.matmul":
        lhs = shape_of(call.args[0])
        return 2 * elements * lhs[-1] if lhs else 0
    if op == "relax.nn.conv2d":
        weight = shape_of(call.args[1])
        return 2 * elements * int(np.prod(weight[1:])) if weight else 0
    return elements


def _walk(
    func: relax.Function, mod: tvm.IRModule, pattern: str = "", env: Mapping | None = None
) -> tuple[list[_Row], tuple[str, ...]]:
    """Every operator reachable from ``func`` (composites expanded) and its producers.

    ``env`` maps the function's free variables and parameters to the node
    names that produced them. Returns the rows and the producers of the
    function's result.
    """
    env = dict(env or {})
    rows: list[_Row] = []
    local: dict = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Function):
                local[binding.var] = value
                continue
            callee = None
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
                name = node_name(binding)
                rows.append(
                    _Row(
                        name,
                        value.op.name,
                        pattern,
                        _producers(value, env),
                        _flops(value),
                        tensor_bytes(type_of(value)),
                    )
                )
                env[binding.var] = (name,)
                continue
            if isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar):
                callee = mod[value.op]
            elif isinstance(value, relax.Call) and isinstance(value.op, relax.Var):
                callee = local.get(value.op)
            if isinstance(callee, relax.Function):
                is_composite = callee.attrs and "Composite" in callee.attrs
                inner = {p: _producers(a, env) for p, a in zip(callee.params, value.args)}
                sub, out = _walk(
                    callee, mod, _pattern_of(callee) if is_composite else pattern, inner
                )
                rows.extend(sub)
                env[binding.var] = out
            else:  # tuples, tuple items: pass their producers on
                env[binding.var] = _producers(value, env)
    return rows, _producers(func.body.body, env)


def _strip_tags(func: relax.Function) -> relax.Function:
    """The partition with its Codegen and its composites' names untagged."""
    codegen, _ = _untag(str(func.attrs["Codegen"]))
    func = func.with_attr("Codegen", codegen)

    @relax.expr_functor.mutator
    class _Untag(relax.PyExprMutator):
        def visit_function_(self, op: relax.Function) -> relax.Expr:
            op = super().visit_function_(op)
            if op.attrs and "Composite" in op.attrs:
                op = op.with_attr("Composite", _pattern_of(op))
            return op

    return _Untag().visit_expr(func)


def _symbol(accelerator: str, index: int, ops: list[str]) -> str:
    """A partition's symbol: ``<accelerator>_<index>_<its ops>``, e.g. ``npu_2_conv2d_add_relu``."""
    short = "_".join(op.rsplit(".", 1)[-1] for op in ops)
    if len(short) > 48:
        short = short[:48].rstrip("_") + "_etc"
    return f"{accelerator}_{index}_{short}"


def partition(
    mod: tvm.IRModule,
    planned: Sequence[PlannedPattern],
    pins: Pins,
    accelerators: Mapping[str, Accelerator],
    failures: list | None = None,
) -> Partitioned:
    """Partition ``mod`` by the planned patterns; place every partition on an instance.

    A pattern check that raises refuses its match; ``(pattern, nodes,
    exception)`` is appended to ``failures`` (see :meth:`PlannedPattern.fusion_pattern`).
    """
    mod = _name_nodes(relax.transform.ConvertToDataflow()(mod))
    if planned:
        position = {node: i for i, (node, _) in enumerate(_ops_in(mod["main"]))}
        accepted: list = []
        patterns = [p.fusion_pattern(pins, accepted, failures) for p in planned]
        mod = relax.transform.FuseOpsByPattern(
            patterns, bind_constants=False, annotate_codegen=False
        )(mod)
        if not _composites(mod):
            pass  # nothing matched: the module goes on as it was
        elif any(p.accelerator.merge for p in planned) and _mergeable(mod["main"]):
            mod = _one_composite_per_call(mod, accepted, position)
            mod = _tag_composites(mod, pins, accelerators)
            mod = relax.transform.MergeCompositeFunctions()(mod)
        else:  # TVM's merge pass grows quadratically with the model: skip it when unused
            mod = _one_composite_per_call(
                mod, accepted, position, wrap=lambda comp: _codegen_of(comp, pins)
            )

    def operator(row: _Row, device: str = "host", symbol: str = "") -> Operator:
        hit = pins.resolve(row.node, row.op, row.pattern)
        pinned = hit[0] if hit else ""
        return Operator(
            row.node, row.op, device, row.pattern, symbol, pinned, row.inputs, row.flops, row.bytes
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
                accel_name, instance = _untag(str(func.attrs["Codegen"]))
                if instance is None:
                    instance = next_instance.get(accel_name, 0) % accelerators[accel_name].instances
                    next_instance[accel_name] = instance + 1
                inner = {p: _producers(a, env) for p, a in zip(func.params, value.args)}
                rows, out = _walk(func, mod, "", inner)
                symbol = _symbol(accel_name, len(placed), [r.op for r in rows])
                ops = [operator(r, f"{accel_name}:{instance}", symbol) for r in rows]
                placed[name_of(value.op)] = Partition(
                    symbol,
                    accel_name,
                    instance,
                    tuple(dict.fromkeys(o.pattern for o in ops)),
                    tuple(ops),
                )
                if _TAG in str(func.attrs["Codegen"]):
                    func = _strip_tags(func)
                renamed[value.op] = func.with_attr("global_symbol", symbol)
                operators.extend(ops)
                env[binding.var] = out
            elif isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
                name = node_name(binding)
                row = _Row(
                    name,
                    value.op.name,
                    "",
                    _producers(value, env),
                    _flops(value),
                    tensor_bytes(type_of(value)),
                )
                operators.append(operator(row))
                env[binding.var] = (name,)
            else:
                env[binding.var] = _producers(value, env)
    funcs = dict(mod.functions)
    funcs.update(renamed)
    mod = tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)
    return Partitioned(mod, tuple(placed.values()), tuple(operators))


def to_host(part: Partitioned, symbols: set[str]) -> Partitioned:
    """Send the partitions named by ``symbols`` back to the host (fallback)."""
    if not symbols:
        return part
    funcs = {}
    for gv, f in part.mod.functions.items():
        if (
            isinstance(f, relax.Function)
            and f.attrs
            and "Codegen" in f.attrs
            and str(f.attrs["global_symbol"]) in symbols
        ):
            f = f.without_attr("Codegen").without_attr("global_symbol")
        funcs[gv] = f
    mod = tvm.IRModule(funcs, attrs=part.mod.attrs, global_infos=part.mod.global_infos)
    operators = tuple(
        replace(o, device="host", pattern="", partition="") if o.partition in symbols else o
        for o in part.operators
    )
    partitions = tuple(p for p in part.partitions if p.symbol not in symbols)
    return Partitioned(mod, partitions, operators)
