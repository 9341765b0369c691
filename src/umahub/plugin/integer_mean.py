"""The quantized mean: ``quantize(mean(dequantize(x)))`` computed in integers.

A global average pooling in QDQ form (a squeeze-and-excitation block's, a
classifier's) reads 8-bit integers and writes 8-bit integers; the float32
mean between them is a sum, and a float sum's last bit depends on the order
it is added in, which every kernel chooses differently (a vectorized one
adds in lanes, a serial one in sequence): two devices would quantize a
different integer now and then. umahub defines it in integers instead
(:mod:`umahub.plugin.quantization`'s arithmetic)::

    acc = sum(x - x_zp)                        # int32, over the mean's n elements
    M   = f64(x_scale) / (f64(y_scale) * n)    # as the fixed point m * 2**-k
    y   = round_half_to_even(acc * m / 2**k) + y_zp, saturated

The host computes every quantized mean so (:mod:`umahub.host.integer_mean`),
and so does :func:`umahub.plugin.default_relax_to_tir` for a partition
holding one: a plugin that claims ``quantize(mean(dequantize(x)))`` with the
default lowering gives the host's integers. A check reads what it matched
with :func:`quantized_mean`, which refuses what is not computed so (a scale
per channel of an axis the mean sums over, or of the output; a 16-bit input),
and which the check should refuse too: such a mean is computed in float32, and
only the host's order gives the host's bits. An input with a scale and zero
point per channel of an axis the mean keeps (a weight-like per-channel
scheme) has ``M`` per channel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from umahub.plugin.quantization import QuantParams, _call, _params, match_lookup

__all__ = ["QuantizedMean", "describe_quantized_mean", "quantized_mean"]

#: The input types whose mean is computed in integers: ``255 * n`` must stay in int32.
MEAN_INPUTS = ("int8", "uint8")


@dataclass(frozen=True)
class QuantizedMean:
    """A quantized mean as a check (or a lowering) reads it.

    Attributes:
        data: the input's quantization (8-bit; one scale, or one per channel
            of an axis the mean keeps).
        output: the result's (one scale).
        axes: the input's axes the mean runs over, in increasing order.
        keepdims: whether the result keeps them (as size 1).
        count: ``n``, the number of elements each output is the mean of.
        exprs: the Relax expressions of the operands, by role: ``data``,
            ``data_scale``, ``data_zp``, ``output_scale``, ``output_zp``.
    """

    data: QuantParams
    output: QuantParams
    axes: tuple[int, ...]
    keepdims: bool
    count: int
    exprs: dict

    @property
    def channel_axis(self) -> int | None:
        """The output's axis that ``data``'s scales run along (None: one scale)."""
        axis = self.data.axis
        if axis is None or self.keepdims:
            return axis
        return axis - sum(1 for a in self.axes if a < axis)

    @property
    def multiplier(self) -> Any:
        """``data.scale / (output.scale * count)`` in float64, per channel where
        ``data`` has a scale per channel (None where a scale is not a constant here)."""
        import numpy as np

        if self.data.scale is None or self.output.scale is None:
            return None
        return self.data.scale.astype(np.float64) / (np.float64(self.output.scale) * self.count)


def describe_quantized_mean(root: Any, lookup: Any) -> QuantizedMean:
    """The quantized mean whose ``relax.quantize`` call is ``root``.

    ``lookup(var)`` gives the value bound to a Relax variable (None for a
    parameter). Raises ValueError, with a reason that completes "umahub cannot
    compute it in integers: ...", when ``root`` is not such a mean.
    """
    import numpy as np

    from umahub.plugin.patterns import dtype_of, shape_of

    quantize = _call(root, lookup, "relax.quantize")
    if quantize is None:
        raise ValueError("it does not end in a quantize")
    mean = _call(quantize.args[0], lookup, "relax.mean")
    if mean is None:
        raise ValueError("no mean before the quantize")
    dequantize = _call(mean.args[0], lookup, "relax.dequantize")
    if dequantize is None:
        raise ValueError("a mean of a tensor that is not dequantized")
    shape = shape_of(dequantize)
    if shape is None or shape_of(quantize) is None:
        raise ValueError("a tensor whose shape is known only at run time")
    if dtype_of(mean) != "float32":
        raise ValueError(f"a {dtype_of(mean)} mean, not float32")
    data = _params(dequantize, lookup, "input", len(shape))
    output = _params(quantize, lookup, "output", len(shape_of(quantize) or ()))
    if data.dtype not in MEAN_INPUTS:
        raise ValueError(f"a {data.dtype} input (8-bit ones are computed in integers)")
    if output.per_channel:
        raise ValueError("a scale per channel on the output (one for the tensor is needed)")
    known = [p.scale for p in (data, output) if p.scale is not None]
    if not all(np.all(s > 0) for s in known):
        raise ValueError("a scale that is not positive")
    rank = len(shape)
    axes = mean.attrs.axis
    axes = tuple(sorted({int(a) % rank for a in axes})) if axes is not None else tuple(range(rank))
    if data.per_channel and data.axis in axes:
        raise ValueError(f"a scale per channel along axis {data.axis}, which the mean sums over")
    count = int(np.prod([shape[a] for a in axes])) if axes else 1
    if count < 1 or count * 255 > np.iinfo(np.int32).max:
        raise ValueError(f"a mean over {count} elements (its int32 sum could overflow)")
    found = QuantizedMean(
        data=data,
        output=output,
        axes=axes,
        keepdims=bool(mean.attrs.keepdims),
        count=count,
        exprs={
            "data": dequantize.args[0],
            "data_scale": dequantize.args[1],
            "data_zp": dequantize.args[2],
            "output_scale": quantize.args[1],
            "output_zp": quantize.args[2],
        },
    )
    if found.multiplier is not None and np.any(found.multiplier >= 2.0**30):
        raise ValueError("a requantization multiplier of 2**30 or more")
    return found


def quantized_mean(ctx: Any) -> QuantizedMean:
    """The quantized mean a pattern ``quantize(mean(dequantized()))`` matched, from its
    check's ``ctx`` (a ``PatternCheckContext``). Raises ValueError when umahub does
    not compute it in integers (see the module's docs): refuse the match then."""
    return describe_quantized_mean(ctx.matched_expr, match_lookup(ctx))
