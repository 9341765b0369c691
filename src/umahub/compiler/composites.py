"""Composite functions, the way partitioning needs them.

``FuseOpsByPattern`` makes one composite function per pattern match and
shares it between structurally equal matches; TVM's ``MergeCompositeFunctions``
groups neighbouring composites of one accelerator by the prefix of their
``Composite`` name. Partitioning (:mod:`umahub.compiler.stages.partition`) needs more:
every match its own copy, named after the model's nodes; instance pins and
accelerators that do not merge kept apart (the prefix is *tagged*); a
partition per match where nothing merges. These are the IR transforms for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import tvm
from tvm import relax

from umahub._tvm import name_of, rebind, ret_type, type_args, type_of
from umahub.compiler.placement import Pin, Pins
from umahub.compiler.vdevice import VirtualDevice
from umahub.errors import PlacementError
from umahub.ir import is_composite, name_span, op_calls, span_name, with_blocks
from umahub.plugin.accelerator import Accelerator

__all__ = [
    "TAG",
    "codegen_of",
    "composites",
    "mergeable",
    "name_nodes",
    "one_composite_per_call",
    "pattern_of",
    "strip_tags",
    "tag_composites",
    "untag",
]

TAG = "__umahub_"  # between an accelerator name and its tag


def composites(mod: tvm.IRModule) -> dict[str, relax.Function]:
    return {gv.name_hint: f for gv, f in mod.functions.items() if is_composite(f)}


def mergeable(mod: tvm.IRModule) -> bool:
    """Whether TVM's MergeCompositeFunctions can take ``mod``'s ``main`` (TVM 0.25-0.27).

    The pass handles plain variable bindings in dataflow blocks that call
    operators, PrimFuncs or composites: a ``MatchCast`` (a shape computed at run
    time), a plain block (control flow) or a call of another Relax function
    makes it fail. Such a module is partitioned one match per partition, which
    is always correct, only with more calls between the host and the
    accelerators.
    """
    for block in mod["main"].body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            return False
        for b in block.bindings:
            if not isinstance(b, relax.VarBinding):
                return False
            value = b.value
            if isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar):
                callee = mod[value.op]
                if isinstance(callee, relax.Function) and not is_composite(callee):
                    return False
    return True


def _pinned_device(func: relax.Function, pattern: str, pins: Pins, accel: str) -> int | None:
    """The instance the pins on a composite's operators agree on (None: unconstrained).

    Each pin is a virtual-device constraint; they are joined, and a conflict
    (two operators of one match pinned to two instances) names both pins.
    """
    constraints = [
        (selector, pin)
        for node, op in op_calls(func)
        if (hit := pins.resolve(node, op, pattern)) is not None
        for selector, pin in [hit]
    ]
    pattern_pin = pins.for_pattern(pattern)
    if pattern_pin is not None:
        constraints.append((pattern, pattern_pin))
    joined = VirtualDevice()
    first: tuple[str, Pin] | None = None  # the pin that set the instance, for the message
    for selector, pin in constraints:
        device = VirtualDevice("cpu", pin.instance, None, None)
        merged = joined.join(device)
        if merged is None:
            assert first is not None  # the first constraint always joins the empty device
            raise PlacementError(
                f"one match of pattern '{pattern}' holds operators pinned to two instances: "
                f"{first[0]!r} -> '{first[1]}' and {selector!r} -> '{pin}' "
                f"({joined.conflict(device)}); pin them to one instance"
            )
        if first is None or pin.instance is not None:
            first = (selector, pin)
        joined = merged
    return joined.virtual_device_id


def tag_composites(
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
    for index, (name, func) in enumerate(sorted(composites(mod).items())):
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
                "Composite", f"{accel}{TAG}{tag}.{what}"
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


def codegen_of(comp: relax.Function, pins: Pins) -> str:
    """The Codegen of a partition holding only ``comp``: its accelerator, tagged if pinned."""
    pattern = str(comp.attrs["Composite"])
    accel = pattern.split(".", 1)[0]
    instance = _pinned_device(comp, pattern, pins, accel) if pins else None
    return accel if instance is None else f"{accel}{TAG}i{instance}"


def untag(name: str) -> tuple[str, int | None]:
    """(accelerator, pinned instance or None) of a tagged Composite/Codegen prefix."""
    accel, sep, tag = name.partition(TAG)
    if not sep or not tag.startswith("i"):
        return accel, None
    return accel, int(tag[1:].split("m")[0])


def pattern_of(composite: relax.Function) -> str:
    """The pattern name of a composite function, without an instance tag."""
    accel_tag, what = str(composite.attrs["Composite"]).split(".", 1)
    return f"{untag(accel_tag)[0]}.{what}"


def _with_span_names(func: relax.Function, names: list[str] | None = None) -> relax.Function:
    """``func`` with each operator call's span naming its node.

    Partitioning renames the variables it moves into composites (``gv``,
    ``lv``); spans travel with the calls, so the report can still name every
    operator as the model named it. ``names`` gives the names in binding order;
    by default each call keeps the name a frontend gave it (its span), or is
    named after the variable it binds, made unique among the names taken from
    variables (``lv23``, then ``lv23.1``).

    Operators of one span name are one node of the model (a source node that
    became several operators; a dequantize copied for a convolution, named
    after the variable of the one it copies); a variable's name says nothing
    of the kind: passes before placement name the bindings they add ``lv``,
    ``lv1``, ... again, and ``efficientnet_b0`` had six such names, each on an
    add and an unrelated convolution, which placement by cost costed and
    placed as one.
    """
    pending = list(names) if names is not None else None
    taken: set[str] = set()  # the names taken from variables so far
    blocks = []
    for block in func.body.blocks:
        bindings = []
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
                if pending is not None:
                    name = pending.pop(0)
                else:
                    name = span_name(value) or _unique(name_of(binding.var), taken)
                span = name_span(name)
                value = relax.Call(value.op, value.args, value.attrs, type_args(value), span=span)
            bindings.append(rebind(binding, value))
        blocks.append(type(block)(bindings))
    return with_blocks(func, blocks)


def _unique(name: str, taken: set[str]) -> str:
    """``name``, or ``name.1``, ``name.2``, ... the first not in ``taken``; added to it."""
    unique, k = name, 0
    while unique in taken:
        k += 1
        unique = f"{name}.{k}"
    taken.add(unique)
    return unique


def name_nodes(mod: tvm.IRModule) -> tvm.IRModule:
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
    bb.add_func(with_blocks(main, blocks), "main")


def one_composite_per_call(
    mod: tvm.IRModule,
    accepted: list,
    position: dict[str, int],
    wrap: Callable[[relax.Function], str] | None = None,
) -> tvm.IRModule:
    """Give every composite call site a composite function of its own, with its own names.

    FuseOpsByPattern shares one function between structurally equal matches
    (two identical relus); each call site must be its own partition, so shared
    composites are copied, and each copy's operators are named after the match
    that made it (matches of one pattern are taken in model order). A
    composite whose operators are those of no accepted match is not placed:
    it stays a plain function that the host runs.

    With ``wrap`` (when nothing is merged afterwards), each copy goes straight
    into a partition function of its own (see :func:`_outer`), whose Codegen
    ``wrap(copy)`` gives.
    """
    queues: dict[str, list[tuple[list[str], list[str]]]] = {}  # pattern -> [(names, ops)]
    for pattern, nodes in sorted(accepted, key=lambda m: max(position.get(n, -1) for n, _ in m[1])):
        # in binding order already where the match was recorded with it (Matches)
        ordered = (
            nodes
            if getattr(accepted, "producers", None)
            else sorted(nodes, key=lambda node: position.get(node[0], -1))
        )
        queues.setdefault(pattern, []).append(
            ([n for n, _ in ordered], sorted(o for _, o in ordered))
        )
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
        ops = sorted(op for _, op in op_calls(func))
        match = next((i for i, (_, wanted) in enumerate(queue) if wanted == ops), None)
        if match is None:  # not a match any check accepted: the host runs it
            gv = bb.add_func(func.without_attr("Composite").without_attr("Primitive"), "unmatched")
            return relax.Call(gv, value.args, value.attrs, type_args(value), span=value.span)
        names = queue.pop(match)[0]
        copy = _with_span_names(func, names)
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


def strip_tags(func: relax.Function) -> relax.Function:
    """The partition with its Codegen and its composites' names untagged."""
    codegen, _ = untag(str(func.attrs["Codegen"]))
    func = func.with_attr("Codegen", codegen)

    @relax.expr_functor.mutator
    class _Untag(relax.PyExprMutator):
        def visit_function_(self, op: relax.Function) -> relax.Expr:
            op = super().visit_function_(op)
            if op.attrs and "Composite" in op.attrs:
                op = op.with_attr("Composite", pattern_of(op))
            return op

    return _Untag().visit_expr(func)
