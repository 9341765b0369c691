"""A model's quantization parameters, checked before anything computes with them.

A scale of zero divides by zero in ``quantize`` and a negative one flips the
sign of every value; a zero point outside its type wraps. Either would be a
silently wrong model, so a model whose ``quantize`` or ``dequantize`` has a
constant scale that is not a positive finite number, a zero point outside the
range of its integer type is refused in one line naming the node (whatever frontend made it:
ONNX, PT2E, a hand-written Relax module).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax

from umahub._tvm import Constant, constant_value
from umahub.errors import QuantizationError
from umahub.ir import bindings, node_name
from umahub.plugin.patterns import dtype_of

__all__ = ["check_quantization"]

_QDQ = ("relax.quantize", "relax.dequantize")


def _problem(call: relax.Call) -> str | None:
    """What is wrong with ``call``'s constant parameters, or None."""
    scale, zero = (
        constant_value(a).numpy() if isinstance(a, Constant) else None for a in call.args[1:3]
    )
    integer = dtype_of(call.args[0]) if call.op.name == "relax.dequantize" else dtype_of(call)
    if scale is not None:
        bad = scale[~(np.isfinite(scale) & (scale > 0))]
        if bad.size:
            return f"scale {bad.ravel()[0]:g} is not a positive finite number"
    if zero is not None and integer.startswith(("int", "uint")):
        info = np.iinfo(integer)
        values = zero.astype(np.float64)
        outside = values[(values < info.min) | (values > info.max) | (values != np.rint(values))]
        if outside.size:
            return f"zero point {outside.ravel()[0]:g} is outside {integer}'s range"
    return None


def check_quantization(mod: tvm.IRModule) -> None:
    """Raise :class:`QuantizationError` for the first ``quantize`` / ``dequantize`` of
    ``mod["main"]`` whose constant parameters are malformed (see the module's docs)."""
    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        return
    main = mod["main"]
    if not isinstance(main, relax.Function):
        return
    for binding in bindings(main):
        value: Any = binding.value
        if not (
            isinstance(value, relax.Call)
            and isinstance(value.op, tvm.ir.Op)
            and value.op.name in _QDQ
        ):
            continue
        problem = _problem(value)
        if problem is not None:
            raise QuantizationError(
                f"node '{node_name(binding)}' ({value.op.name.split('.')[-1]}): {problem}; "
                "the model's quantization parameters are malformed: quantize it again "
                "(a scale is a positive number, a zero point a value of the integer type)"
            )
