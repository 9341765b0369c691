"""How the npu turns its partitions into TIR: TVM's legalization, four operators its own.

* GELU: erf as a polynomial the vector units evaluate (TVM's legalization
  calls the C library's scalar ``erff`` once per element, which costs more
  than the matrix multiply it follows); max error 4e-7.
* sigmoid (SiLU's, in a convolution's epilogue): ``1 / (1 + exp(-x))`` with
  TVM's polynomial ``fast_exp``, for the same reason (``expf`` per element).
* batch norm after a convolution (inference): TVM's legalization divides by
  ``sqrt(var + eps)`` at every element of the output; here the per-channel
  ``scale = gamma / sqrt(var + eps)`` and ``shift = beta - mean * scale`` are
  computed once per channel and the element costs one multiply-add.
* max pooling: as umahub lowers the host's, two 1-D ones
  (:func:`umahub.plugin.max_pool2d`).

And one rewrite for the vector units: a convolution with a constant filter
whose output channels no vector width divides (SqueezeNet's 1000 classes,
MobileNet's 24, 40, 72 or 120 channels) computes :data:`CHANNEL_MULTIPLE`-
aligned channels with a zero-padded filter, and the extra ones are dropped in
its epilogue: the micro-kernel then runs whole vectors instead of half ones.
Not where the vectors hold positions instead (a 1x1 convolution on a
multiple of 16 positions), which any channel count fills.
The filter is padded once, at compile time, with its packing (see
``umahub_npu.schedules``).
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import relax

from umahub.plugin import max_pool2d

__all__ = ["LEGALIZE", "lower"]


def _fast_gelu(bb, call):
    from tvm import topi

    def gelu(x):
        return x * (0.5 + 0.5 * topi.fast_erf(x * 0.7071067811865476))

    return bb.call_te(gelu, call.args[0], primfunc_name_hint="gelu")


def _fast_sigmoid(bb, call):
    from tvm import te, topi

    def sigmoid(x):
        e = topi.fast_exp(topi.negative(x))
        return te.compute(x.shape, lambda *i: 1.0 / (1.0 + e(*i)), name="sigmoid")

    from umahub.plugin import dtype_of

    if dtype_of(call) != "float32":
        return _default(bb, call)
    return bb.call_te(sigmoid, call.args[0], primfunc_name_hint="sigmoid")


def _default(bb, call):
    return tvm.ir.Op.get(call.op.name).get_attr("FLegalize")(bb, call)


def _batch_norm(bb, call):
    """Inference batch norm as one multiply-add per element (see the module's docs)."""
    from tvm import te

    attrs = call.attrs
    data = call.args[0]
    from umahub.plugin import shape_of

    shape = shape_of(data)
    if bool(attrs.training) or shape is None or len(shape) != 4 or int(attrs.axis) not in (1, -3):
        return _default(bb, call)
    eps = float(attrs.epsilon)
    scaled, centered = bool(attrs.scale), bool(attrs.center)
    channels = shape[1]

    def affine(gamma, beta, mean, var):
        scale = te.compute(
            (channels,),
            lambda c: (gamma[c] if scaled else 1.0) / te.sqrt(var[c] + eps),
            name="bn_scale",
        )
        shift = te.compute(
            (channels,),
            lambda c: (beta[c] if centered else 0.0) - mean[c] * scale[c],
            name="bn_shift",
        )
        return [scale, shift]

    params = bb.emit(bb.call_te(affine, *call.args[1:], primfunc_name_hint="batch_norm_affine"))
    scale, shift = bb.emit(relax.TupleGetItem(params, 0)), bb.emit(relax.TupleGetItem(params, 1))

    def apply(x, s, b):
        return te.compute(
            x.shape, lambda n, c, h, w: x[n, c, h, w] * s[c] + b[c], name="batch_norm"
        )

    out = bb.emit(bb.call_te(apply, data, scale, shift, primfunc_name_hint="batch_norm"))
    # the running statistics, unchanged in inference: the call's inputs themselves
    return relax.Tuple([out, call.args[3], call.args[4]])


#: Output channels of a convolution are padded to a multiple of this (two
#: AVX2 vectors, one AVX-512 vector) when they are more than it and not one.
CHANNEL_MULTIPLE = 16


def _positions_in_vectors(call) -> bool:
    """Whether the npu computes this convolution with output positions in its
    vectors (a 1x1, stride-1 one on whole vectors of positions; see
    ``umahub_npu.schedules``), where any channel count is whole vectors."""
    from umahub.plugin import shape_of

    attrs = call.attrs
    out = shape_of(call)
    return (
        tuple(shape_of(call.args[1])[2:]) == (1, 1)
        and all(int(s) == 1 for s in attrs.strides)
        and out is not None
        and (out[2] * out[3]) % CHANNEL_MULTIPLE == 0
    )


def _padded_channels(constants: frozenset) -> Callable:
    """conv2d's legalization: a filter among ``constants`` (the partition's weight
    parameters) whose output channels are not a multiple of :data:`CHANNEL_MULTIPLE`
    is zero-padded to one, and the extra channels dropped after the convolution."""

    def legalize(bb, call):
        from tvm import te

        from umahub.plugin import dtype_of, shape_of

        data, weight = call.args
        shape = shape_of(weight)
        attrs = call.attrs
        if (
            weight not in constants
            or shape is None
            or len(shape) != 4
            or dtype_of(call) != "float32"
            or (str(attrs.data_layout), str(attrs.kernel_layout)) != ("NCHW", "OIHW")
            or str(attrs.out_layout) not in ("NCHW", "")
            or int(attrs.groups) != 1
            or shape[0] <= CHANNEL_MULTIPLE
            or shape[0] % CHANNEL_MULTIPLE == 0
            or _positions_in_vectors(call)
        ):
            return _default(bb, call)
        channels = shape[0]
        padded = -(-channels // CHANNEL_MULTIPLE) * CHANNEL_MULTIPLE

        def pad(w):
            return te.compute(
                (padded, *shape[1:]),
                lambda f, c, h, k: te.if_then_else(f < channels, w[f, c, h, k], 0.0),
                name="filter_pad",
            )

        filters = bb.emit(bb.call_te(pad, weight, primfunc_name_hint="filter_pad"))
        conv = bb.normalize(
            relax.op.nn.conv2d(
                data,
                filters,
                strides=attrs.strides,
                padding=attrs.padding,
                dilation=attrs.dilation,
                groups=1,
                data_layout="NCHW",
                kernel_layout="OIHW",
                out_dtype=attrs.out_dtype,
            )
        )
        wide = bb.emit(_default(bb, conv))

        def narrow(y):
            n, _, h, w = y.shape
            return te.compute((n, channels, h, w), lambda *i: y(*i), name="channels")

        return bb.call_te(narrow, wide, primfunc_name_hint="channels")

    return legalize


#: The npu's legalizations, by operator.
LEGALIZE: dict[str, Callable] = {
    "relax.nn.max_pool2d": max_pool2d,
    "relax.nn.gelu": _fast_gelu,
    "relax.sigmoid": _fast_sigmoid,
    "relax.nn.batch_norm": _batch_norm,
}


def lower(
    function: relax.Function, symbol: str, accelerator: str, weights: frozenset[int] = frozenset()
) -> tvm.IRModule:
    """The default lowering with :data:`LEGALIZE`, and convolutions' output channels
    padded for the vector units where the filter is one of ``weights`` (indices of
    ``function``'s parameters the model passes as constants)."""
    from umahub.plugin import default_relax_to_tir

    constants = frozenset(p for i, p in enumerate(function.params) if i in weights)
    legalize = dict(LEGALIZE)
    if constants:
        legalize["relax.nn.conv2d"] = _padded_channels(constants)
    return default_relax_to_tir(function, symbol, accelerator, legalize=legalize)
