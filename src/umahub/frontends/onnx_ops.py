"""ONNX operators umahub converts itself, where TVM's converter hides the operator.

TVM's ONNX importer converts some nodes into PrimFuncs of its own, called
with ``call_tir``, where Relax has the operator: ``Clip`` with its bounds as
inputs (opset 11 on, as every exporter writes ReLU6) becomes a ``maximum``
and a ``minimum`` PrimFunc. No plugin's pattern sees an operator inside a
PrimFunc, so MobileNets' activations from ONNX ran on the host as two passes
each, apart from the convolutions the accelerators took. Here such a node
becomes the Relax operator, where that computes what ONNX defines; anything
else is left to TVM's converter.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["convert"]

_FLOATS = ("float16", "bfloat16", "float32", "float64")


def _bound(value: Any, missing: float) -> float | None:
    """A constant scalar bound as a float (NaN and absent: ``missing``); None if not constant."""
    from umahub._tvm import Constant, constant_value

    if value is None:
        return missing
    if not isinstance(value, Constant) or constant_value(value).numpy().size != 1:
        return None
    bound = float(constant_value(value).numpy().reshape(()))
    return missing if math.isnan(bound) else bound


def _clip(inputs: Any, attrs: dict, opset: int) -> Any:
    """``relax.clip`` for a float Clip whose bounds are constants with min <= max.

    ONNX treats a NaN bound as absent, and where min > max sets every value
    to max; ``relax.clip`` applies min last, so that case stays with TVM.
    """
    from tvm import relax

    from umahub._tvm import type_of

    x = inputs[0]
    if getattr(type_of(x), "dtype", None) not in _FLOATS:
        return None
    lo: float | None
    hi: float | None
    if opset < 11:
        lo, hi = float(attrs.get("min", -math.inf)), float(attrs.get("max", math.inf))
    else:
        extra = [inputs[i] if len(inputs) > i else None for i in (1, 2)]
        lo, hi = _bound(extra[0], -math.inf), _bound(extra[1], math.inf)
    if lo is None or hi is None or lo > hi:
        return None
    return relax.op.clip(x, lo, hi)


_CONVERTERS = {"Clip": _clip}


def convert(op_name: str, inputs: Any, attrs: dict, opset: int) -> Any:
    """umahub's conversion of an ONNX node into a Relax expression, or None: TVM's."""
    converter = _CONVERTERS.get(op_name)
    return None if converter is None else converter(inputs, attrs, opset)
