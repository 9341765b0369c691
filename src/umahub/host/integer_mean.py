"""The quantized mean's kernel: an int32 sum and one fixed-point rounding.

:mod:`umahub.plugin.integer_mean` defines the arithmetic; :func:`mean_kernel`
is its TE function, which :func:`umahub.host.quantized.lower_quantized` puts in
place of ``quantize(mean(dequantize(x)))`` on the host and in every partition
the default lowering lowers. The sum is a plain reduction (a schedule may add
in any order: integers are exact), the requantization an elementwise stage
after it.
"""

from __future__ import annotations

from typing import Any

from tvm import te, tirx

from umahub.host.fixed_point import at_channel, fixed_point, requantized, type_range
from umahub.plugin.integer_mean import QuantizedMean

__all__ = ["mean_kernel", "mean_operands"]


def mean_operands(mean: QuantizedMean) -> list[Any]:
    """The Relax expressions :func:`mean_kernel`'s function takes, in order."""
    return [mean.exprs[n] for n in ("data", "data_scale", "data_zp", "output_scale", "output_zp")]


def mean_kernel(mean: QuantizedMean, out_shape: tuple[int, ...], out_dtype: str):
    """The TE function computing ``mean`` exactly, for ``BlockBuilder.call_te``: it
    takes the input, its scale and zero point, the output's scale and zero point."""

    def kernel(x: te.Tensor, sx: Any, zx: Any, sy: Any, zy: Any):
        reduced = [te.reduce_axis((0, int(x.shape[a])), name=f"r{a}") for a in mean.axes]

        def at_input(i: tuple) -> tuple:
            """The input's index: the output's ``i`` with the reduced axes put back."""
            kept, over, index = iter(i), iter(reduced), []
            for axis in range(len(x.shape)):
                if axis in mean.axes:
                    index.append(next(over))
                    if mean.keepdims:
                        next(kept)
                else:
                    index.append(next(kept))
            return tuple(index)

        axis = mean.channel_axis
        channels = 1 if axis is None else int(out_shape[axis])

        def channel(i: tuple) -> Any:
            return 0 if axis is None else i[axis]

        def less_zero(i: tuple) -> Any:
            value = x[at_input(i)].astype("int32")
            return value - at_channel(zx, channel(i), channels).astype("int32")

        total = te.compute(
            out_shape, lambda *i: te.sum(less_zero(i), axis=reduced), name="mean_sum"
        )
        count = tirx.const(mean.count, "float64")
        m, k = fixed_point(
            lambda c: (
                at_channel(sx, c, channels).astype("float64")
                / (at_channel(sy, 0, 1).astype("float64") * count)
            ),
            channels,
            "mean",
        )
        zero = at_channel(zy, 0, 1).astype("int64")
        low, high = type_range(out_dtype)
        return te.compute(
            out_shape,
            lambda *i: requantized(
                total[i].astype("int64") * m[channel(i)].astype("int64"),
                k[channel(i)],
                zero,
                low,
                high,
                out_dtype,
            ),
            name="requantized",
        )

    return kernel
