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

import tvm
from tvm import relax

from umahub._tvm import Constant, constant_value
from umahub.ir import bindings, node_name
from umahub.plugin.patterns import dtype_of
from umahub.qparams import SCALE_FIX, refuse, scale_problem, zero_point_problem

__all__ = ["check_quantization"]

_QDQ = ("relax.quantize", "relax.dequantize")


def _problem(call: relax.Call) -> str | None:
    """What is wrong with ``call``'s constant parameters, or None."""
    scale, zero = (
        constant_value(a).numpy() if isinstance(a, Constant) else None for a in call.args[1:3]
    )
    integer = dtype_of(call.args[0]) if call.op.name == "relax.dequantize" else dtype_of(call)
    if scale is not None:
        problem = scale_problem(scale)
        if problem is not None:
            return f"scale {problem}; {SCALE_FIX}"
    if zero is not None:
        problem = zero_point_problem(zero, integer)
        if problem is not None:
            return f"zero point {problem}; correct the value"
    return None


def check_quantization(mod: tvm.IRModule) -> None:
    """Raise :class:`~umahub.errors.QuantizationError` for the first quantize or
    dequantize of ``mod["main"]`` whose constant parameters are malformed."""
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
            raise refuse(node_name(binding), value.op.name.split(".")[-1], problem)
