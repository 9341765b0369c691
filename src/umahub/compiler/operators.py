"""The operator table: every operator of ``main``, what it reads, what it costs.

Partitioning walks ``main`` once (partition functions and their composites
expanded) and makes one row per operator: its node name, op, the pattern that
claimed it, the nodes whose outputs it reads, its FLOPs and output bytes from
static shapes. The report, the picture and the memory plan read these rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from umahub._tvm import type_of
from umahub.ir import is_composite, node_name
from umahub.plugin.memory import tensor_bytes

__all__ = ["Row", "flops", "producers", "walk"]


@dataclass(frozen=True)
class Row:
    """One operator: node name, op, claiming pattern, producers, FLOPs, output bytes."""

    node: str
    op: str
    pattern: str
    inputs: tuple[str, ...]
    flops: int
    bytes: int


def producers(expr: relax.Expr, env: Mapping) -> tuple[str, ...]:
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


def flops(call: relax.Call) -> int:
    """Floating-point operations of one call, from static shapes (0 when unknown)."""
    from umahub.plugin.patterns import shape_of  # a plugin helper; imports TVM lazily

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


def walk(
    func: relax.Function,
    mod: tvm.IRModule,
    pattern_of: Callable[[relax.Function], str],
    pattern: str = "",
    env: Mapping | None = None,
) -> tuple[list[Row], tuple[str, ...]]:
    """Every operator reachable from ``func`` (composites expanded) and its producers.

    ``env`` maps the function's free variables and parameters to the node
    names that produced them; ``pattern_of(composite)`` names the pattern of a
    composite. Returns the rows and the producers of the function's result.
    """
    env = dict(env or {})
    rows: list[Row] = []
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
                    Row(
                        name,
                        value.op.name,
                        pattern,
                        producers(value, env),
                        flops(value),
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
                inner = {p: producers(a, env) for p, a in zip(callee.params, value.args)}
                sub, out = walk(
                    callee,
                    mod,
                    pattern_of,
                    pattern_of(callee) if is_composite(callee) else pattern,
                    inner,
                )
                rows.extend(sub)
                env[binding.var] = out
            else:  # tuples, tuple items: pass their producers on
                env[binding.var] = producers(value, env)
    return rows, producers(func.body.body, env)
