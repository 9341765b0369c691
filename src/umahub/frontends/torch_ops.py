"""Converters of ATen operators that TVM's PyTorch frontend lacks or converts wrongly,
given to its importer as ``custom_convert_map`` entries (keyed as it looks them up,
by the overload's name).

- **Types** (arithmetic, ``where``, ``clamp`` and the unary functions of float
  values: :data:`IN_RESULT_TYPE`). TVM 0.27 makes a Python number a constant
  of the tensor's type and computes in it, so ``int_tensor * 0.5`` gave
  integers (zeros), ``1.5 - int_tensor`` and ``clamp(int_tensor, -2.5, 2.5)``
  integers too, where PyTorch computes in float32: silent wrong answers; and
  ``exp`` or ``sigmoid`` of an integer tensor failed to import. PyTorch's own
  answer is in the export: each node's ``meta["val"]`` has the type of its
  result, and for these operators it is the type they compute in. So their
  tensor operands are cast to it first (``where``'s condition excepted), and
  TVM's converter does the rest.
- **Division** (``div.Tensor``, ``div.Scalar`` and their ``_mode`` forms). TVM
  0.27 makes a number operand an ``int32`` or ``float32`` constant whatever
  the tensor's type, so ``torch.div(x, 2, rounding_mode="floor")`` of a float
  tensor (timm's XCiT) failed to import, and it divided integer tensors as
  integers, where PyTorch's true division gives floats
  (``torch.div(arange(5), 2)``: ``[0, 0, 1, 1, 2]`` against ``[0, 0.5, 1, 1.5,
  2]``). Here the operands take the result's type (float32 for a true
  division of integers) and each rounding mode rounds as PyTorch's does:
  ``floor`` toward minus infinity, ``trunc`` toward zero, for integers as for
  floats.
- **Sliding windows** (``unfold.default``, ``Tensor.unfold(dim, size, step)``,
  which HaloNet's and other local-attention blocks use): missing from TVM
  0.27. Imported as one ``take`` of the windows' indices along ``dim`` (a
  constant of ``windows x size``), then a reshape and a transpose that put
  each window's elements on a new last axis, as PyTorch does.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from umahub.errors import UmahubError

__all__ = ["IN_RESULT_TYPE", "converters"]

_UNARY_FLOAT = (
    "acos acosh asin asinh atan atanh cos cosh erf exp exp2 expm1 gelu log log10 log1p "
    "log2 reciprocal rsqrt sigmoid silu sin sinh softplus sqrt tan tanh"
).split()

#: The operators whose tensor operands are cast to their result's type before TVM
#: converts them (the type they compute in), by overload name; with the positions of
#: the operands that keep their own (``where``'s condition).
IN_RESULT_TYPE: dict[str, tuple[int, ...]] = {
    **{
        f"{op}.{overload}": ()
        for op in ("add", "sub", "rsub", "mul", "remainder", "fmod")
        for overload in ("Tensor", "Scalar")
    },
    **{f"pow.{overload}": () for overload in ("Tensor_Tensor", "Tensor_Scalar", "Scalar")},
    **{
        f"{op}.default": ()
        for op in ("floor_divide", "maximum", "minimum", "clamp", "clamp_min", "clamp_max")
    },
    "clamp.Tensor": (),
    "where.self": (0,),
    **{f"{op}.default": () for op in _UNARY_FLOAT},
}


def converters() -> dict[str, Callable[[Any, Any], Any]]:
    """The ``custom_convert_map`` entries of this module (see its documentation), for the
    operators this TVM's frontend converts (division and ``unfold`` always)."""
    known = _tvm_names()
    found: dict[str, Callable[[Any, Any], Any]] = {
        name: functools.partial(_in_result_type, name, keep)
        for name, keep in IN_RESULT_TYPE.items()
        if name in known
    }
    for name in ("div.Tensor", "div.Scalar", "div.Tensor_mode", "div.Scalar_mode"):
        found[name] = _divide
    found["unfold.default"] = _unfold
    return found


@functools.cache
def _tvm_names() -> frozenset[str]:
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    return frozenset(k for k in ExportedProgramImporter().convert_map if isinstance(k, str))


# --------------------------------------------------------------------------- types


def _result_dtype(node: Any) -> str | None:
    """The type of the node's result as PyTorch computed it at export (None: unknown)."""
    value = node.meta.get("val") if hasattr(node, "meta") else None
    dtype = getattr(value, "dtype", None)
    return str(dtype).removeprefix("torch.") if dtype is not None else None


def _dtype(value: Any) -> str | None:
    """A Relax expression's element type; None for a Python number."""
    if isinstance(value, (bool, int, float)):
        return None
    from umahub._tvm import type_of

    return str(getattr(type_of(value), "dtype", "")) or None


@contextlib.contextmanager
def _operands_as(importer: Any, node: Any, dtype: str, keep: tuple[int, ...]) -> Iterator[None]:
    """While open, the node's tensor operands (but those at ``keep``) read as ``dtype``."""
    from torch import fx
    from tvm import relax

    saved = {}
    for i, arg in enumerate(node.args):
        if i in keep or not isinstance(arg, fx.Node) or arg not in importer.env:
            continue
        value = importer.env[arg]
        if _dtype(value) not in (None, dtype) and arg not in saved:
            saved[arg] = value
            importer.env[arg] = importer.block_builder.emit(relax.op.astype(value, dtype))
    try:
        yield
    finally:
        importer.env.update(saved)  # the node's other readers see the operand as it was


def _in_result_type(name: str, keep: tuple[int, ...], node: Any, importer: Any) -> Any:
    original = _originals(importer)[name]
    dtype = _result_dtype(node)
    if dtype is None:
        return original(node)
    with _operands_as(importer, node, dtype, keep):
        return original(node)


def _originals(importer: Any) -> dict[str, Any]:
    """TVM's own converters, bound to this importer (its map holds ours in their place)."""
    found = importer.__dict__.get("_umahub_originals")
    if found is None:
        found = importer.__dict__["_umahub_originals"] = importer.create_convert_map()
    return found


# --------------------------------------------------------------------------- division


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def _as(value: Any, dtype: str) -> Any:
    from tvm import relax

    if _dtype(value) is None:
        return relax.const(value, dtype)
    return value if _dtype(value) == dtype else relax.op.astype(value, dtype)


def _divide(node: Any, importer: Any) -> Any:
    from tvm import relax

    args = importer.retrieve_args(node)
    a, b = args[0], args[1]
    mode = node.kwargs.get("rounding_mode", args[2] if len(args) > 2 else None)
    dtype = _result_dtype(node) or _dtype(a) or _dtype(b) or "float32"
    a, b = _as(a, dtype), _as(b, dtype)
    emit = importer.block_builder.emit
    if mode is None:
        return emit(relax.op.divide(a, b))
    if mode == "floor":
        return emit(relax.op.floor_divide(a, b))
    if mode == "trunc":
        if _is_float(dtype):
            return emit(relax.op.trunc(emit(relax.op.divide(a, b))))
        return emit(relax.op.divide(a, b))  # integer division in TVM rounds toward zero
    raise UmahubError(
        f"node '{node.name}': torch.div with rounding_mode={mode!r}; PyTorch knows None, "
        "'floor' and 'trunc'"
    )


# --------------------------------------------------------------------------- unfold


def _unfold(node: Any, importer: Any) -> Any:
    from tvm import relax

    args = importer.retrieve_args(node)
    x, dim, size, step = args[0], int(args[1]), int(args[2]), int(args[3])
    from umahub._tvm import type_of

    shape = list(type_of(x).shape)
    rank = len(shape)
    dim %= rank
    try:
        length = int(shape[dim])
    except TypeError:
        raise UmahubError(
            f"node '{node.name}': Tensor.unfold along axis {dim}, whose size is known only "
            "at run time; umahub unfolds axes of static size (export with that size fixed)"
        ) from None
    windows = (length - size) // step + 1
    index = (np.arange(windows)[:, None] * step + np.arange(size)[None, :]).reshape(-1)
    emit = importer.block_builder.emit
    taken = emit(relax.op.take(x, relax.const(index.astype("int64")), axis=dim))
    split = [*shape[:dim], windows, size, *shape[dim + 1 :]]
    windowed = emit(relax.op.reshape(taken, split))
    # the window's own axis (dim + 1) last, the others in order
    axes = [*range(dim + 1), *range(dim + 2, rank + 1), dim + 1]
    return emit(relax.op.permute_dims(windowed, axes))
