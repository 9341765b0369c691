"""What a valid quantization parameter (a scale, a zero point) is, defined once.

The ONNX and PyTorch imports check what they read with it, and the compile
checks any model with it (:mod:`umahub.compiler.quantization_check`).

A quantized model carries its scales and zero points as data; a wrong one
(a scale of 0 from a calibration that saw a constant tensor, a zero point of
the wrong type) does not fail in TVM: it gives infinities or wrapped integers
at run time. The importers refuse them instead, with one line naming the node,
the parameter and what to do; these functions say what is wrong with a value.
"""

from __future__ import annotations

from typing import Any

from umahub.errors import QuantizationError

__all__ = ["RANGES", "SCALE_FIX", "refuse", "scale_problem", "zero_point_problem"]

#: The value range of each integer type a tensor can be quantized to.
RANGES: dict[str, tuple[int, int]] = {
    "int4": (-8, 7),
    "uint4": (0, 15),
    "int8": (-128, 127),
    "uint8": (0, 255),
    "int16": (-32768, 32767),
    "uint16": (0, 65535),
    "int32": (-(2**31), 2**31 - 1),
}

#: What to do about a bad scale, the end of its message.
SCALE_FIX = "a scale must be positive and finite: quantize the model again, or correct the value"


def refuse(node: str, op: str, problem: str) -> QuantizationError:
    """The error for ``problem`` (one line, ending with what to do) at ``node``:
    ``umahub compile`` prints it as one line and exits with status 2."""
    return QuantizationError(f"node '{node}' ({op}): {problem}")


def _value(x: Any) -> str:
    return f"{float(x):g}"


def scale_problem(values: Any) -> str | None:
    """What is wrong with ``values`` as scales (``"is 0, not positive"``), or None.

    Every scale must be finite and positive: ``x / scale`` of QuantizeLinear
    and ``(q - zp) * scale`` of DequantizeLinear mean nothing otherwise.
    """
    import numpy as np

    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    for i, v in enumerate(flat):
        what = "not finite" if not np.isfinite(v) else "not positive" if v <= 0 else ""
        if what:
            return (
                f"is {_value(v)}, {what}"
                if flat.size == 1
                else f"has {_value(v)} at index {i}, {what}"
            )
    return None


def zero_point_problem(
    values: Any, dtype: str, lo: int | None = None, hi: int | None = None
) -> str | None:
    """What is wrong with ``values`` as zero points of a ``dtype`` tensor, or None.

    A zero point must lie in ``[lo, hi]``: the quantized range (PT2E's
    ``quant_min``/``quant_max``), by default the whole range of ``dtype``.
    """
    import numpy as np

    low, high = RANGES.get(dtype, (None, None))
    lo = low if lo is None else lo
    hi = high if hi is None else hi
    if lo is None or hi is None:
        return None
    flat = np.asarray(values).reshape(-1)
    for i, v in enumerate(flat):
        if not (np.isfinite(v) and lo <= v <= hi and float(v) == int(v)):
            at = "" if flat.size == 1 else f" at index {i}"
            return f"has {_value(v)}{at}, outside {dtype}'s range {lo}..{hi}"
    return None
