"""Converters of ATen operators that TVM's PyTorch frontend lacks or converts wrongly,
given to its importer as ``custom_convert_map`` entries (keyed as it looks them up,
by the overload's name).

- **Division** (``div.Tensor``, ``div.Scalar`` and their ``_mode`` forms). TVM
  0.27 makes a Python number operand an ``int32`` or ``float32`` constant
  whatever the tensor's type, so ``torch.div(x, 2, rounding_mode="floor")`` of
  a float tensor (XCiT's position encoding) fails to import, and it divides
  integer tensors as integers where PyTorch's true division gives floats:
  ``torch.div(arange(5), 2)`` imported as ``[0, 0, 1, 1, 2]`` against
  PyTorch's ``[0, 0.5, 1, 1.5, 2]``, a silent wrong answer. Here the operands
  take PyTorch's promotion (a number takes the tensor's type, unless it is a
  float and the tensor an integer; two tensors the wider, float over
  integer), true division of integers is done in ``float32`` (PyTorch's
  default type), and each rounding mode rounds as PyTorch does: ``floor``
  toward minus infinity, ``trunc`` toward zero, for integers as for floats.
- **Sliding windows** (``unfold.default``, ``Tensor.unfold(dim, size, step)``,
  which HaloNet's and other local-attention blocks use): missing from TVM
  0.27. Imported as one ``take`` of the windows' indices along ``dim`` (a
  constant of ``windows x size``), then a reshape and a transpose that put
  each window's elements on a new last axis, as PyTorch does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from umahub.errors import UmahubError

__all__ = ["converters"]


def converters() -> dict[str, Callable[[Any, Any], Any]]:
    """The ``custom_convert_map`` entries of this module (see its documentation)."""
    return {
        "div.Tensor": _divide,
        "div.Scalar": _divide,
        "div.Tensor_mode": _divide,
        "div.Scalar_mode": _divide,
        "unfold.default": _unfold,
    }


# --------------------------------------------------------------------------- division


def _dtype(value: Any) -> str | None:
    """A Relax expression's element type; None for a Python number."""
    if isinstance(value, (bool, int, float)):
        return None
    from umahub._tvm import type_of

    return str(type_of(value).dtype)


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def _bits(dtype: str) -> int:
    digits = "".join(c for c in dtype if c.isdigit())
    return int(digits) if digits else 1  # bool


def _promoted(a: Any, b: Any) -> str:
    """The type PyTorch computes ``a op b`` in: a number takes the tensor's type (a float
    number with an integer tensor: float32); two tensors the wider, a float over an
    integer."""
    da, db = _dtype(a), _dtype(b)
    if da is None or db is None:
        tensor, number = (a, b) if db is None else (b, a)
        dtype = _dtype(tensor) or "float32"
        if isinstance(number, float) and not _is_float(dtype):
            return "float32"
        return dtype
    if _is_float(da) != _is_float(db):
        return da if _is_float(da) else db
    return da if _bits(da) >= _bits(db) else db


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
    dtype = _promoted(a, b)
    if mode is None and not _is_float(dtype):
        dtype = "float32"  # true division of integers gives floats
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
