"""Quantized models in the form umahub's patterns read, before partitioning.

Two things would hide a quantized operator from its pattern. A layout
operator between a dequantize and its convolution or matmul (ONNX's ``Gemm``
transposes its weight after the dequantize, a convolution's bias is reshaped
after its own): :func:`canonicalize_quantized` moves it under the dequantize.
And constant folding, which would turn an int8 weight and its dequantize into
a float32 constant: :func:`keep_quantized_weights` hides such dequantizes from
``FoldConstant`` while umahub folds the rest (:mod:`umahub.host.folding`).

And one thing would make a quantized model pay for floats it does not need:
an operator that only selects among its inputs (a max pooling, a max or min
over axes) between a dequantize and a quantize of the same scale and zero
point. Dequantizing is increasing, so the selection commutes with it, and
quantizing gives back the integers it selected: the operator is applied to
the integers directly, with no float tensor in between (four times the bytes).
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

from umahub.ir import bindings, name_of, name_span, span_name, var_uses
from umahub.plugin.patterns import dtype_of, shape_of

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
        self.names = _names(mod["main"])

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        name = span_name(call) or self.names.get(call)
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
        span = name_span(name) if name else call.span  # the layout operator's own name
        moved = self.builder_.emit(
            relax.Call(call.op, [dq.args[0], *call.args[1:]], call.attrs, span=span),
            name or "",
        )
        self.count += 1
        out = relax.op.dequantize(
            moved, dq.args[1], dq.args[2], axis=axis, out_dtype=str(dq.attrs.out_dtype)
        )
        # the dequantize keeps its node's name (the report's, the pins')
        return relax.Call(out.op, out.args, out.attrs, span=dq.span)


_OPERAND_OF = ("relax.nn.conv2d", "relax.matmul")


def _names(func: relax.Function) -> dict:
    """Each operator call of ``func`` -> the name of the variable it is bound to."""
    names = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            names[binding.value] = name_of(binding.var)
    return names


def _calls(mod: tvm.IRModule, op_name: str) -> bool:
    """Whether ``mod`` has a ``main`` that binds a call of ``op_name``: the passes here
    walk the whole function in Python, which a model without one need not pay for."""
    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        return False
    return any(
        isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == op_name
        for block in mod["main"].body.blocks
        for b in block.bindings
    )


@relax.expr_functor.mutator
class _OwnDequantize(relax.PyExprMutator):
    """A quantized operator's operand dequantized for it alone.

    ONNX Runtime's QDQ form dequantizes a tensor once for all its readers (a
    residual block's input feeds its first convolution and its sum; a
    squeeze-and-excitation block's input its pooling and its gate). A quantized
    operator's match holds its operands' dequantize; shared, that dequantize
    would be a value the match computes and others read, which
    ``FuseOpsByPattern`` does not match, and it ran on the host, its float
    tensor (four times the bytes) copied to the accelerator. Its own copy costs
    nothing: it disappears into the operator's kernel. A quantized operator
    here is a convolution or a matmul, or any operator whose result is only
    quantized (``quantize(op(dequantize(x), ...))``, as ONNX Runtime's node
    units are).
    """

    def __init__(self, mod: tvm.IRModule, uses: dict, quantized: set):
        super().__init__(mod)
        self.uses = uses
        self.quantized = quantized  # the calls whose result only a quantize reads
        self.count = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        quantized = call in self.quantized
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and (quantized or call.op.name in _OPERAND_OF)):
            return call
        args = list(call.args)
        for i, arg in enumerate(args):
            dq = self.lookup_binding(arg) if isinstance(arg, relax.Var) else None
            if (
                self.uses.get(arg, 0) > 1
                and isinstance(dq, relax.Call)
                and isinstance(dq.op, tvm.ir.Op)
                and dq.op.name == "relax.dequantize"
            ):
                # named as the dequantize it copies: a fresh name ("lv") could be a
                # real node's, and the pins and the report go by names
                name = span_name(dq) or name_of(arg)
                copy = relax.Call(dq.op, list(dq.args), dq.attrs, span=name_span(name))
                args[i] = self.builder_.emit(copy, name)
                self.count += 1
        if args == list(call.args):
            return call
        return relax.Call(call.op, args, call.attrs)


#: Operators that select among their inputs (the result is one of them, chosen by order).
_SELECTIONS = (
    "relax.nn.max_pool1d",
    "relax.nn.max_pool2d",
    "relax.nn.max_pool3d",
    "relax.max",
    "relax.min",
)


def _same_constant(a: relax.Expr, b: relax.Expr) -> bool:
    """Whether ``a`` and ``b`` are the same expression or one-value constants of equal value."""
    from umahub._tvm import Constant, constant_value

    if a.same_as(b):
        return True
    if not (isinstance(a, Constant) and isinstance(b, Constant)):
        return False
    left, right = constant_value(a).numpy(), constant_value(b).numpy()
    one_each = left.size == right.size == 1
    return left.dtype == right.dtype and one_each and left.item() == right.item()


@relax.expr_functor.mutator
class _SelectionOnIntegers(relax.PyExprMutator):
    """``quantize(select(dequantize(q, s, z)), s, z)`` -> ``select(q)``, ``select`` one of
    :data:`_SELECTIONS`, ``s`` and ``z`` one value each and equal in both."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.count = 0

    def _bound(self, expr: relax.Expr) -> Any:
        return self.lookup_binding(expr) if isinstance(expr, relax.Var) else expr

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.quantize"):
            return call
        select = self._bound(call.args[0])
        if not (
            isinstance(select, relax.Call)
            and isinstance(select.op, tvm.ir.Op)
            and select.op.name in _SELECTIONS
        ):
            return call
        dq = self._bound(select.args[0])
        if not (
            isinstance(dq, relax.Call)
            and isinstance(dq.op, tvm.ir.Op)
            and dq.op.name == "relax.dequantize"
            and all(_same_constant(dq.args[i], call.args[i]) for i in (1, 2))
            and shape_of(dq.args[1]) in ((), (1,))
            and dtype_of(dq.args[0]) == str(call.attrs.out_dtype)
        ):
            return call
        self.count += 1
        # the quantize's value is the selection's, on the integers: named as the selection
        return relax.Call(select.op, [dq.args[0], *select.args[1:]], select.attrs, span=select.span)


def canonicalize_quantized(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each quantized operator's operands in the form its pattern reads.

    A weight transposed after its dequantize (ONNX's ``Gemm``), a bias
    reshaped after its own (a convolution's): the layout operator moves under
    the dequantize, applies to the integers (and is folded with them, a weight
    being a constant), and the pattern sees ``dequantize`` directly on its
    operands; a per-channel axis moves with its dimension. And a dequantized
    tensor that a convolution or matmul shares with other readers gets a
    dequantize of its own for it (:class:`_OwnDequantize`). A selection between
    a dequantize and a quantize of the same parameters is applied to the
    integers (:class:`_SelectionOnIntegers`).
    """
    if not _calls(mod, "relax.dequantize"):  # a float model: nothing to walk
        return mod
    selections = _SelectionOnIntegers(mod)
    main = selections.visit_expr(mod["main"])
    if selections.count:
        mod = selections.builder_.get()
        mod["main"] = relax.analysis.remove_all_unused(main)
    mover = _LayoutUnder(mod)
    main = mover.visit_expr(mod["main"])
    if mover.count:
        mod = mover.builder_.get()
        mod["main"] = relax.analysis.remove_all_unused(main)
    owner = _OwnDequantize(mod, var_uses(mod["main"]), _quantized_calls(mod["main"]))
    main = owner.visit_expr(mod["main"])
    if owner.count:
        mod = owner.builder_.get()
        mod["main"] = relax.analysis.remove_all_unused(main)
    return mod


def _quantized_calls(func: relax.Function) -> set:
    """The operator calls of ``func`` whose result only quantizes read."""
    readers: dict = {}
    for binding in bindings(func):
        for var in relax.analysis.free_vars(binding.value):
            readers.setdefault(var, []).append(binding.value)
    for var in relax.analysis.free_vars(func.body.body):  # the function's result
        readers.setdefault(var, []).append(None)
    return {
        b.value
        for b in bindings(func)
        if isinstance(b.value, relax.Call)
        and readers.get(b.var)
        and all(
            getattr(getattr(r, "op", None), "name", "") == "relax.quantize" for r in readers[b.var]
        )
    }


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
                hidden = call_pure_packed(name, [data, *call.args[1:]], type_of(call))
                return relax.Call(
                    hidden.op, hidden.args, hidden.attrs, [type_of(call)], span=call.span
                )
        if not self.hide and op.same_as(_CALL_PURE_PACKED):
            callee = call.args[0]
            symbol = str(getattr(callee, "global_symbol", ""))
            if symbol.startswith(_KEPT):
                _, axis, dtype = symbol.split(":")
                shown = relax.op.dequantize(*call.args[1:], axis=int(axis), out_dtype=dtype)
                return relax.Call(shown.op, shown.args, shown.attrs, span=call.span)
        return call


def keep_quantized_weights(mod: tvm.IRModule, hide: bool) -> tvm.IRModule:
    """``mod`` with each ``dequantize`` of a constant hidden from ``FoldConstant``
    (``hide=True``) or shown again (False).

    Folded, an int8 weight and its dequantize would become a float32 constant:
    four times the bytes, and no quantized operator left to claim.
    """
    if not _calls(mod, "relax.dequantize" if hide else "relax.call_pure_packed"):
        return mod
    keeper = _Keep(mod, hide)
    main = keeper.visit_expr(mod["main"])
    out = keeper.builder_.get()
    out["main"] = main
    return out
