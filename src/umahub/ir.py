"""Small helpers over Relax IR that the stages share.

Questions every stage asks of a module: which functions are partitions (an
accelerator's ``Codegen`` attribute) or composites (one pattern match), where
``main`` calls them and with what, what a binding's operator is called in the
source model. Written once here so that no stage imports another for them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import tvm
from tvm import relax

from umahub._tvm import name_of, ret_type

__all__ = [
    "bindings",
    "is_composite",
    "is_partition",
    "name_span",
    "node_name",
    "op_calls",
    "partition_call",
    "partition_calls",
    "partition_constants",
    "partition_functions",
    "span_name",
    "var_uses",
    "with_blocks",
]


def is_partition(func: Any) -> bool:
    """Whether ``func`` is a partition: a Relax function with an accelerator's ``Codegen``."""
    return isinstance(func, relax.Function) and bool(func.attrs) and "Codegen" in func.attrs


def is_composite(func: Any) -> bool:
    """Whether ``func`` is a composite: the function of one pattern match."""
    return isinstance(func, relax.Function) and bool(func.attrs) and "Composite" in func.attrs


def bindings(func: relax.Function) -> Iterator[relax.Binding]:
    """The bindings of a function's body, block after block."""
    for block in func.body.blocks:
        yield from block.bindings


def with_blocks(func: relax.Function, blocks: list[relax.BindingBlock]) -> relax.Function:
    """``func`` with its body's binding blocks replaced by ``blocks``: the same
    parameters, result, return type, purity and attributes."""
    return relax.Function(
        func.params, relax.SeqExpr(blocks, func.body.body), ret_type(func), func.is_pure, func.attrs
    )


def name_span(name: str) -> tvm.ir.Span:
    """A span that names a node: the name as its source, at line 0.

    umahub and its frontends put the source model's node names on operator
    calls this way; spans of TVMScript point at lines of a file instead.
    """
    return tvm.ir.Span(tvm.ir.SourceName(name), 0, 0, 0, 0)


def span_name(expr: Any) -> str | None:
    """The node name a :func:`name_span` put on ``expr``, or None."""
    span = getattr(expr, "span", None)
    if span is None or span.source_name is None or span.line != 0:
        return None
    return str(span.source_name.name)


def node_name(binding: relax.Binding) -> str:
    """The model's name of the operator a binding computes (its name span, else its variable)."""
    return span_name(binding.value) or name_of(binding.var)


def op_calls(func: relax.Function) -> list[tuple[str, str]]:
    """(node, op) of the operator calls in a function's bindings, in order."""
    return [
        (node_name(b), b.value.op.name)
        for b in bindings(func)
        if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)
    ]


def partition_functions(mod: tvm.IRModule) -> dict[str, relax.Function]:
    """symbol -> partition function, for every partition of ``mod``."""
    return {str(f.attrs["global_symbol"]): f for f in mod.functions.values() if is_partition(f)}


def partition_calls(mod: tvm.IRModule) -> dict[str, tuple[relax.Function, list[Any]]]:
    """symbol -> (partition function, the arguments ``main`` calls it with)."""
    found = {}
    for binding in bindings(mod["main"]):
        value = binding.value
        if isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar):
            func = mod[value.op]
            if is_partition(func):
                found[str(func.attrs["global_symbol"])] = (func, list(value.args))
    return found


def partition_constants(mod: tvm.IRModule, limit: int) -> dict[str, dict[int, Any]]:
    """symbol -> {input index: relax.Constant} of the constants of at most ``limit``
    elements that ``main`` passes to the partition: in every call, the same value
    (a partition called with different constants keeps that input unknown)."""
    import numpy as np

    from umahub._tvm import Constant, constant_value

    found: dict[str, dict[int, Any]] = {}
    for binding in bindings(mod["main"]):
        value = binding.value
        if not (isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar)):
            continue
        func = mod[value.op]
        if not is_partition(func):
            continue
        symbol = str(func.attrs["global_symbol"])
        here = {
            i: a
            for i, a in enumerate(value.args)
            if isinstance(a, Constant) and int(np.prod(constant_value(a).shape)) <= limit
        }
        if symbol not in found:
            found[symbol] = here
            continue
        kept = found[symbol]
        for i in list(kept):
            same = i in here and np.array_equal(
                constant_value(kept[i]).numpy(), constant_value(here[i]).numpy()
            )
            if not same:
                del kept[i]
    return found


def partition_call(mod: tvm.IRModule, value: relax.Expr) -> tuple[str, list] | None:
    """(symbol, args) of a partition call: ``call_dps_packed`` after RunCodegen, or a
    call of the partition function itself (before codegen, as ``explain`` sees it)."""
    if not isinstance(value, relax.Call):
        return None
    if (
        isinstance(value.op, tvm.ir.Op)
        and value.op.name == "relax.call_dps_packed"
        and isinstance(value.args[0], relax.ExternFunc)
    ):
        return str(value.args[0].global_symbol), list(value.args[1].fields)
    if isinstance(value.op, relax.GlobalVar) and is_partition(func := mod[value.op]):
        return str(func.attrs["global_symbol"]), list(value.args)
    return None


def var_uses(func: relax.Function) -> dict:
    """How many times each variable is read in ``func``'s bindings and output."""
    counts: dict = {}

    def count(expr: Any) -> None:
        if isinstance(expr, relax.Var):
            counts[expr] = counts.get(expr, 0) + 1

    for binding in bindings(func):
        relax.analysis.post_order_visit(binding.value, count)
    relax.analysis.post_order_visit(func.body.body, count)
    return counts
