"""Quantized models in the form umahub's patterns read, before partitioning.

Two things would hide a quantized operator from its pattern. A layout
operator between a dequantize and its convolution or matmul (ONNX's ``Gemm``
transposes its weight after the dequantize, a convolution's bias is reshaped
after its own): :func:`canonicalize_quantized` moves it under the dequantize.
And constant folding, which would turn an int8 weight and its dequantize into
a float32 constant: :func:`keep_quantized_weights` hides such dequantizes from
``FoldConstant`` while umahub folds the rest (:mod:`umahub.host.folding`).
"""

from __future__ import annotations

import tvm
from tvm import relax

from umahub.plugin.patterns import shape_of

__all__ = ["canonicalize_quantized", "keep_quantized_weights"]


_LAYOUT = ("relax.permute_dims", "relax.reshape", "relax.expand_dims", "relax.squeeze")


def _moved_axis(call: relax.Call, before: tuple[int, ...], after: tuple[int, ...], axis: int):
    """Where a layout operator ``call`` takes axis ``axis`` of a tensor (None: nowhere one)."""
    if call.op.name == "relax.permute_dims":
        axes = call.attrs.axes
        order = list(range(len(before)))[::-1] if axes is None else [int(a) for a in axes]
        return order.index(axis)
    # reshape, expand_dims, squeeze: only unit dimensions may come or go
    if [d for d in before if d != 1] != [d for d in after if d != 1] or before[axis] == 1:
        return None
    nth = sum(1 for d in before[:axis] if d != 1)
    positions = [i for i, d in enumerate(after) if d != 1]
    return positions[nth]


@relax.expr_functor.mutator
class _LayoutUnder(relax.PyExprMutator):
    """``layout(dequantize(q))`` -> ``dequantize(layout(q))``."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.count = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name in _LAYOUT):
            return call
        source = call.args[0]
        dq = self.lookup_binding(source) if isinstance(source, relax.Var) else source
        if not (
            isinstance(dq, relax.Call)
            and isinstance(dq.op, tvm.ir.Op)
            and dq.op.name == "relax.dequantize"
        ):
            return call
        before, after = shape_of(dq), shape_of(call)
        if before is None or after is None:
            return call
        per_channel = shape_of(dq.args[1]) not in ((), (1,), None)
        axis = -1  # one scale: any axis of the new shape will do
        if per_channel:
            axis = _moved_axis(call, before, after, int(dq.attrs.axis) % max(len(before), 1))
            if axis is None:
                return call
        moved = self.builder_.emit(relax.Call(call.op, [dq.args[0], *call.args[1:]], call.attrs))
        self.count += 1
        return relax.op.dequantize(
            moved, dq.args[1], dq.args[2], axis=axis, out_dtype=str(dq.attrs.out_dtype)
        )


def canonicalize_quantized(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with layout operators moved under the dequantize they follow.

    A weight transposed after its dequantize (ONNX's ``Gemm``), a bias
    reshaped after its own (a convolution's): moved under it, the transpose or
    reshape applies to the integers (and is folded with them, a weight being a
    constant), and the quantized operator's pattern sees ``dequantize``
    directly on its operands. A per-channel axis moves with its dimension.
    """
    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        return mod
    mover = _LayoutUnder(mod)
    main = mover.visit_expr(mod["main"])
    if not mover.count:
        return mod
    out = mover.builder_.get()
    out["main"] = relax.analysis.remove_all_unused(main)
    return out


_KEPT = "umahub.kept_dequantize"


_CALL_PURE_PACKED = tvm.ir.Op.get("relax.call_pure_packed")


@relax.expr_functor.mutator
class _Keep(relax.PyExprMutator):
    """Hides ``dequantize(constant)`` from FoldConstant (``hide``), or shows it again.

    Hidden, it is a ``call_pure_packed`` of a function FoldConstant cannot run,
    its attributes in the function's name.
    """

    def __init__(self, mod: tvm.IRModule, hide: bool):
        super().__init__(mod)
        self.hide = hide

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        from umahub._tvm import Constant, call_pure_packed, type_of

        call = super().visit_call_(call)
        op = call.op
        if self.hide and isinstance(op, tvm.ir.Op) and op.name == "relax.dequantize":
            data = call.args[0]
            if isinstance(data, relax.Var) and isinstance(self.lookup_binding(data), Constant):
                data = self.lookup_binding(data)  # a weight whose layout was folded
            if isinstance(data, Constant):
                name = f"{_KEPT}:{int(call.attrs.axis)}:{call.attrs.out_dtype}"
                return call_pure_packed(name, [data, *call.args[1:]], type_of(call))
        if not self.hide and op.same_as(_CALL_PURE_PACKED):
            callee = call.args[0]
            symbol = str(getattr(callee, "global_symbol", ""))
            if symbol.startswith(_KEPT):
                _, axis, dtype = symbol.split(":")
                return relax.op.dequantize(*call.args[1:], axis=int(axis), out_dtype=dtype)
        return call


def keep_quantized_weights(mod: tvm.IRModule, hide: bool) -> tvm.IRModule:
    """``mod`` with each ``dequantize`` of a constant hidden from ``FoldConstant``
    (``hide=True``) or shown again (False).

    Folded, an int8 weight and its dequantize would become a float32 constant:
    four times the bytes, and no quantized operator left to claim.
    """
    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        return mod
    keeper = _Keep(mod, hide)
    main = keeper.visit_expr(mod["main"])
    out = keeper.builder_.get()
    out["main"] = main
    return out
