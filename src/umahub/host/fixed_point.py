"""Steps 3 and 4 of umahub's integer arithmetic in TE (:mod:`umahub.plugin.quantization`).

A quantized kernel reads its scales and zero points as tensors (one value, or
one per output channel), turns each float64 multiplier into the fixed point
``m * 2**-k`` in a stage of its own (:func:`fixed_point`), and rounds its
int64 products by ``k`` half to even (:func:`requantized`): the same integers
as :func:`umahub.plugin.requantize` computes in numpy, on every device. The
quantized operators (:mod:`umahub.host.quantized`) and the quantized mean
(:mod:`umahub.host.integer_mean`) share them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tvm
from tvm import te, tirx

__all__ = ["at_channel", "channel_index", "fixed_point", "int64", "requantized", "type_range"]


def int64(value: int) -> Any:
    """``value`` as a TIR int64 constant."""
    return tirx.const(value, "int64")


def at_channel(t: te.Tensor, channel: Any, channels: int) -> Any:
    """``t`` (a scale or zero point: one value, or one per channel) at ``channel``."""
    size = 1
    for d in t.shape:
        size *= int(d)
    if size == 1:
        return t[tuple([0] * len(t.shape))]
    return t[channel] if len(t.shape) == 1 else t[tuple(channel_index(t, channel, channels))]


def channel_index(t: te.Tensor, channel: Any, channels: int) -> list[Any]:
    """The index of ``t`` (a bias broadcast against the output) for one output channel."""
    return [channel if int(d) == channels and int(d) != 1 else 0 for d in t.shape]


def fixed_point(multiplier: Callable[[Any], Any], channels: int, name: str):
    """Per channel, ``(m, k)`` of the float64 ``multiplier(channel)``
    (:func:`umahub.plugin.requantization`, bit for bit). ``m`` is below 2**31 (53
    significand bits less 22) and is kept as int32: an int32 by int32 product in
    int64 is one multiply per pair of lanes on x86 (``vpmuldq``), where an int64
    by int64 one is several."""
    bits = te.compute(
        (channels,), lambda o: tirx.reinterpret("int64", multiplier(o)), name=f"{name}_bits"
    )
    exponent = te.compute(
        (channels,), lambda o: (bits[o] >> int64(52)) & int64(0x7FF), name=f"{name}_exp"
    )

    def m_of(o: Any) -> Any:
        significand = (bits[o] & int64((1 << 52) - 1)) | int64(1 << 52)
        return tirx.Select(exponent[o] < int64(991), int64(0), significand >> int64(22)).astype(
            "int32"
        )

    def k_of(o: Any) -> Any:
        return tirx.Select(exponent[o] < int64(991), int64(62), int64(1053) - exponent[o])

    return te.compute((channels,), m_of, name=f"{name}_m"), te.compute(
        (channels,), k_of, name=f"{name}_k"
    )


def type_range(dtype: str) -> tuple[Any, Any]:
    """The least and the greatest value of the integer type ``dtype``, as int64 constants:
    the clamp of a saturating requantization."""
    low = tirx.const(int(tvm.tirx.min_value(dtype).value), "int64")
    return low, tirx.const(int(tvm.tirx.max_value(dtype).value), "int64")


def requantized(p: Any, k: Any, zero: Any, low: Any, high: Any, dtype: str) -> Any:
    """Step 4: the int64 product ``p`` divided by ``2**k``, rounded half to even,
    plus the output's zero point ``zero``, clamped to ``[low, high]`` (int64) and
    cast to ``dtype``."""
    one = int64(1)
    product = tirx.Var("product", "int64")  # bound once: LLVM multiplied it twice
    rounded = (product + (one << (k - one)) - one + ((product >> k) & one)) >> k
    clamped = tirx.max(low, tirx.min(high, rounded + zero)).astype(dtype)
    return tirx.Let(product, p, clamped)
