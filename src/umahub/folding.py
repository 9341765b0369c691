"""What depends on weights alone, computed once at compile time.

A transpose of a constant weight (ONNX's ``Gemm`` with ``transB``, a PyTorch
``linear``), a reshape or a cast of one: left in the graph, it would run, and
its result be copied to an accelerator, at every inference. Relax's
``FoldConstant`` evaluates such expressions, but it builds and runs a kernel
for each one with TVM, about a tenth of a second apiece: a ViT-B/16 has 50
transposed weights. The layout operators that make most of them
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

__all__ = ["fold_constants", "fold_layout_of_constants"]


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
class _LayoutFolder(relax.PyExprMutator):  # type: ignore[misc]
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


def fold_constants(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with what depends on weights alone computed once, now (see the module's
    docs). A module that cannot be folded is kept as it is (only slower, never
    different)."""
    try:
        layout, _ = fold_layout_of_constants(mod)
        layout = layout if well_formed(layout) else mod
        folded = relax.transform.FoldConstant()(layout)
    except Exception:  # an optimisation: the module stays correct without it
        return mod
    # FoldConstant (TVM 0.27) can fold a call whose PrimFunc it then drops while
    # another call still names it (ONNX Slice with run-time starts: "shape_func")
    return folded if well_formed(folded) else layout
