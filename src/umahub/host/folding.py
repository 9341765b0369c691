"""What depends on weights alone, computed once at compile time.

A transpose of a constant weight (ONNX's ``Gemm`` with ``transB``, a PyTorch
``linear``), a reshape or a cast of one: left in the graph, it would run, and
its result be copied to an accelerator, at every inference. An inference batch
norm after a convolution is a per-channel scale and shift: folded into the
convolution's weight and a bias (:func:`fold_batch_norms`), it costs nothing at
run time, and the convolution with its bias is a pattern every accelerator
takes (a batch norm alone is one none does, and would run on the host
between two copies). Relax's ``FoldConstant`` evaluates such expressions, but
it builds and runs a kernel with TVM for each one, which costs far more than
the numpy operation, and a transformer has a transposed weight in every
linear layer. The layout operators that make most of them
(``permute_dims``, ``reshape``, ``astype``, ``expand_dims``, ``squeeze``) are
therefore folded here first, with numpy, in one walk over ``main``; what
remains goes to ``FoldConstant``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tvm
from tvm import relax

from umahub._tvm import Constant, constant_value, type_of, well_formed

__all__ = ["fold_batch_norms", "fold_constants", "fold_layout_of_constants"]


def _ints(values: Any) -> list[int] | None:
    try:
        return [int(v) for v in values]
    except (TypeError, ValueError):  # a symbolic size
        return None


def _permute(x: np.ndarray, call: relax.Call) -> np.ndarray | None:
    axes = call.attrs.axes
    return np.transpose(x, None if axes is None else _ints(axes))


def _reshape(x: np.ndarray, call: relax.Call) -> np.ndarray | None:
    shape = call.args[1]
    values = getattr(shape, "values", None)
    dims = _ints(values) if values is not None else None
    return None if dims is None else x.reshape(dims)


def _astype(x: np.ndarray, call: relax.Call) -> np.ndarray | None:
    try:
        return x.astype(np.dtype(str(call.attrs.dtype)))
    except TypeError:  # a dtype numpy does not have (bfloat16): FoldConstant's
        return None


def _expand_dims(x: np.ndarray, call: relax.Call) -> np.ndarray | None:
    axes = _ints(call.attrs.axis)
    return None if axes is None else np.expand_dims(x, tuple(axes))


def _squeeze(x: np.ndarray, call: relax.Call) -> np.ndarray | None:
    axis = call.attrs.axis
    if axis is None:
        return np.squeeze(x)
    axes = _ints(axis)
    return None if axes is None else np.squeeze(x, tuple(axes))


_FOLDS: dict[str, Callable[[np.ndarray, relax.Call], np.ndarray | None]] = {
    "relax.permute_dims": _permute,
    "relax.reshape": _reshape,
    "relax.astype": _astype,
    "relax.expand_dims": _expand_dims,
    "relax.squeeze": _squeeze,
}


def _numpy_dtype_ok(x: np.ndarray, constant: Constant) -> bool:
    return str(x.dtype) == str(type_of(constant).dtype)


@relax.expr_functor.mutator
class _LayoutFolder(relax.PyExprMutator):
    """Replaces a layout operator of a constant (or of one folded before) by its value."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.folded = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op) or call.op.name not in _FOLDS:
            return call
        source = call.args[0]
        if isinstance(source, relax.Var):
            source = self.lookup_binding(source)
        if not isinstance(source, Constant):
            return call
        x = constant_value(source).numpy()
        if not _numpy_dtype_ok(x, source):
            return call
        try:
            value = _FOLDS[call.op.name](x, call)
        except (ValueError, TypeError):  # a shape numpy refuses: FoldConstant decides
            return call
        if value is None:
            return call
        self.folded += 1
        return relax.const(np.ascontiguousarray(value), str(value.dtype))


def fold_layout_of_constants(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """``mod`` with the layout operators of constants in ``main`` folded with numpy,
    and how many were."""
    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        return mod, 0
    folder = _LayoutFolder(mod)
    main = folder.visit_expr(mod["main"])
    if not folder.folded:
        return mod, 0
    out = folder.builder_.get()
    out["main"] = relax.analysis.remove_all_unused(main)
    return out, folder.folded


def _conv2d_into_norm(
    bindings: dict[Any, Any], users: dict[Any, list[Any]], item: relax.TupleGetItem
) -> tuple[relax.Call, np.ndarray, np.ndarray] | None:
    """(convolution, folded weight, bias) where ``item`` is item 0 of an inference
    batch norm over the channels of a 2-D NCHW/OIHW convolution of a constant
    weight, the norm's statistics constants and neither result read elsewhere."""
    if item.index != 0 or not isinstance(item.tuple_value, relax.DataflowVar):
        return None
    norm = bindings.get(item.tuple_value)
    if not (isinstance(norm, relax.Call) and norm.op == _BATCH_NORM):
        return None
    attrs = norm.attrs
    if bool(attrs.training) or int(attrs.axis) != 1 or len(users[item.tuple_value]) != 1:
        return None
    conv_var = norm.args[0]
    conv = bindings.get(conv_var)
    if not (
        isinstance(conv_var, relax.DataflowVar)
        and isinstance(conv, relax.Call)
        and conv.op == _CONV2D
        and users[conv_var] == [item.tuple_value]
        and (str(conv.attrs.data_layout), str(conv.attrs.kernel_layout)) == ("NCHW", "OIHW")
        and str(conv.attrs.out_layout) in ("NCHW", "")
        and all(isinstance(a, Constant) for a in (conv.args[1], *norm.args[1:]))
    ):
        return None
    weight = constant_value(conv.args[1]).numpy()
    gamma, beta, mean, var = (constant_value(a).numpy() for a in norm.args[1:])
    if weight.dtype.kind != "f" or any(v.shape != (weight.shape[0],) for v in (gamma, mean)):
        return None
    # in float64, then rounded once: closer to the exact norm than float32 steps
    scale = 1.0 / np.sqrt(var.astype(np.float64) + float(attrs.epsilon))
    if bool(attrs.scale):
        scale = scale * gamma
    shift = -mean.astype(np.float64) * scale
    if bool(attrs.center):
        shift = shift + beta
    folded = (weight.astype(np.float64) * scale.reshape(-1, 1, 1, 1)).astype(weight.dtype)
    bias = shift.astype(weight.dtype).reshape(1, -1, 1, 1)
    return conv, folded, bias


_BATCH_NORM = tvm.ir.Op.get("relax.nn.batch_norm")
_CONV2D = tvm.ir.Op.get("relax.nn.conv2d")


@relax.expr_functor.mutator
class _NormFolder(relax.PyExprMutator):
    """Replaces the chosen batch norms' item 0 by the convolution with the folded
    weight plus a bias; the convolution and the norm are left unused."""

    def __init__(self, mod: tvm.IRModule, folds: dict[Any, tuple[Any, Any, Any]]):
        super().__init__(mod)
        self.folds = folds

    def visit_tuple_getitem_(self, item: relax.TupleGetItem) -> relax.Expr:
        fold = self.folds.get(item.tuple_value)
        if fold is None:
            return super().visit_tuple_getitem_(item)
        conv, weight, bias = fold
        data = self.visit_expr(conv.args[0])
        out = self.builder_.emit(relax.Call(conv.op, [data, relax.const(weight)], conv.attrs))
        return relax.op.add(out, relax.const(bias))


def fold_batch_norms(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """``mod`` with every inference batch norm that follows a convolution of a
    constant weight folded into it, and how many were.

    ``conv2d(x, W)`` then ``batch_norm(gamma, beta, mean, var)`` becomes
    ``conv2d(x, W * s) + (beta - mean * s)``, ``s = gamma / sqrt(var + eps)``
    per output channel, computed in float64 and rounded once.
    """
    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        return mod, 0
    main = mod["main"]
    bindings: dict[Any, Any] = {}
    users: dict[Any, list[Any]] = {}
    body = main.body
    for block in getattr(body, "blocks", ()):
        if not isinstance(block, relax.DataflowBlock):
            continue
        for binding in block.bindings:
            if isinstance(binding, relax.VarBinding):
                bindings[binding.var] = binding.value
        users.update({k: list(v) for k, v in relax.analysis.udchain(block).items()})
    folds = {}
    for value in bindings.values():
        if isinstance(value, relax.TupleGetItem):
            fold = _conv2d_into_norm(bindings, users, value)
            if fold is not None:
                folds[value.tuple_value] = fold
    if not folds:
        return mod, 0
    folder = _NormFolder(mod, folds)
    new_main = folder.visit_expr(main)
    out = folder.builder_.get()
    out["main"] = relax.analysis.remove_all_unused(new_main)
    return out, len(folds)


def fold_constants(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with what depends on weights alone computed once, at compile time
    (see the module's docs). A module that cannot be folded is kept as it is
    (only slower, never different)."""
    from umahub.host.lookup_tables import tabulate
    from umahub.host.quantized_form import canonicalize_quantized, keep_quantized_weights

    try:
        moved = canonicalize_quantized(mod)
        mod = moved if well_formed(moved) else mod
    except Exception:  # only the quantized operators' patterns miss what it would show
        pass
    try:
        tabulated, _ = tabulate(mod)
        mod = tabulated if well_formed(tabulated) else mod
    except Exception:  # an optimisation: the chains stay as they are, only slower
        pass
    try:
        layout, _ = fold_layout_of_constants(mod)
        layout = layout if well_formed(layout) else mod
        normed, _ = fold_batch_norms(layout)
        layout = normed if well_formed(normed) else layout
        # a quantized weight stays integers under its dequantize (umahub.host.quantized)
        hidden = keep_quantized_weights(layout, hide=True)
        folded = keep_quantized_weights(relax.transform.FoldConstant()(hidden), hide=False)
    except Exception:  # an optimisation: the module stays correct without it
        return mod
    # FoldConstant (TVM 0.27) can fold a call whose PrimFunc it then drops while
    # another call still names it (ONNX Slice with run-time starts: "shape_func")
    return folded if well_formed(folded) else layout
