"""Activations moved before the reshapes that separate them from their producer.

``torch.export`` writes a ``Linear`` on a 3-D or 4-D input (a transformer's
``[batch, tokens, features]``, ConvNeXt's channels-last blocks) as a reshape
to 2-D, the product with its bias, and a reshape back; the activation that
follows applies to the reshaped result::

    y = reshape(add(matmul(reshape(x, [197, 768]), w), b), [1, 197, 3072])
    z = gelu(y)
    u = matmul(reshape(z, [197, 3072]), w2)

An accelerator's ``matmul -> add -> gelu`` pattern does not see through the
reshape, so the activation runs on the host, between two copies of its
tensor. An activation works element by element, so it gives the same values
before the reshape as after: ``gelu(reshape(a, s)) == reshape(gelu(a), s)``.
Moved before it, and the two reshapes that then follow each other merged
(TVM's ``RemoveRedundantReshape``: back to back, and one to the shape its
input already has, vanishes), the example is ``matmul -> add -> gelu ->
matmul``, with no reshape between the products.

``RemoveRedundantReshape`` also binds once what several bindings compute
alike (a decoder's layers' equal position counters become one value, which
``main`` may then return twice).
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

from umahub._tvm import name_of, remap_var, well_formed
from umahub.ir import span_name

__all__ = ["ACTIVATIONS", "activations_before_reshapes"]

#: Operators moved: float functions of one tensor, element by element (their other
#: operands, where they have any, are attributes or scalar bounds).
ACTIVATIONS = frozenset(
    {
        "relax.nn.relu",
        "relax.nn.gelu",
        "relax.nn.gelu_tanh",
        "relax.nn.silu",
        "relax.nn.leakyrelu",
        "relax.sigmoid",
        "relax.tanh",
        "relax.clip",
    }
)


@relax.expr_functor.mutator
class _ActivationsFirst(relax.PyExprMutator):
    """Rewrites ``v = act(reshape(a, s))`` as ``v = reshape(act(a), s)``; counts them.

    The activation keeps the model's name for it (its span, else ``v``'s name);
    the reshape after it is ``<v>_reshape``.
    """

    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.moved = 0

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        call = self.visit_expr(binding.value)
        reshape = self._reshape_read(call) if isinstance(binding.var, relax.DataflowVar) else None
        if reshape is None:
            super().visit_var_binding_(binding)
            return
        name = name_of(binding.var)
        first = relax.Call(call.op, [reshape.args[0], *call.args[1:]], call.attrs, span=call.span)
        moved = self.builder_.emit(first, name_hint=span_name(call) or name)
        after = relax.Call(reshape.op, [moved, reshape.args[1]], reshape.attrs, span=reshape.span)
        remap_var(self, binding.var, self.builder_.emit(after, name_hint=f"{name}_reshape"))
        self.moved += 1

    def _reshape_read(self, call: Any) -> relax.Call | None:
        """The reshape ``call`` (an activation) reads, or None."""
        if not (
            isinstance(call, relax.Call)
            and isinstance(call.op, tvm.ir.Op)
            and call.op.name in ACTIVATIONS
            and isinstance(call.args[0], relax.Var)
        ):
            return None
        source = self.lookup_binding(call.args[0])
        reshape = isinstance(source, relax.Call) and isinstance(source.op, tvm.ir.Op)
        return source if reshape and source.op.name == "relax.reshape" else None


def activations_before_reshapes(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every activation of :data:`ACTIVATIONS` whose input is a reshape
    computed before it, and the reshapes that then meet merged (see the module's docs).
    A module where none moves, or whose rewrite would not be well formed, is returned
    as it is."""
    mutator = _ActivationsFirst(mod)
    changed = mod.clone()
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            changed[gv] = mutator.visit_expr(func)
    if not mutator.moved:
        return mod
    merged = relax.transform.RemoveRedundantReshape()(changed)
    return merged if well_formed(merged) else mod
