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

And one for strided 1x1 convolutions (ResNet's downsampling shortcuts): the
input positions they read are first copied into a compact tensor, then a
stride-1 1x1 convolution reads them (:func:`_subsampled`), which the schedule
runs with positions in its vectors where they fill them; read where they lie,
every vector of positions would be a strided gather and every broadcast a
position two apart.

And one for narrow planes: a stride-1 depthwise convolution whose output rows
are narrower than a vector (7x7) is computed on its padded plane read as one
row, whole vectors of positions running over the row ends
(:func:`_depthwise_plane`).
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


def _plane_grid(rows: int, width: int) -> tuple[int, int]:
    """The grid a depthwise plane is computed on (:func:`_depthwise_plane`): at
    least ``rows`` x ``width``, of the fewest positions that make whole
    :data:`CHANNEL_MULTIPLE`-wide vectors, in a count of vectors up to 8 or one
    that 4 to 8 divides (the schedule's tiles of vectors, with no remainder)."""

    def fits(r: int, w: int) -> bool:
        vectors, rest = divmod(r * w, CHANNEL_MULTIPLE)
        return rest == 0 and (vectors <= 8 or any(vectors % t == 0 for t in range(4, 9)))

    sizes = [(r * w, r, w) for r in range(rows, rows + 16) for w in range(width, width + 16)]
    _, r, w = min(x for x in sizes if fits(x[1], x[2]))
    return r, w


def _is_plane_depthwise(call) -> bool:
    """A float32, stride-1 depthwise convolution whose output rows are narrower
    than a vector (see :func:`_depthwise_plane`). Measured on an AMD EPYC: 7-wide
    rows 15% faster on the plane, 14-wide ones alike, 56-wide ones 10% slower."""
    from umahub.plugin import dtype_of, shape_of

    attrs = call.attrs
    data, weight = (shape_of(a) for a in call.args)
    out = shape_of(call)
    if data is None or weight is None or out is None or len(data) != 4 or len(weight) != 4:
        return False
    if not all(isinstance(d, int) for d in (*data, *weight)):
        return False
    return (
        all(dtype_of(e) == "float32" for e in (call, *call.args))
        and (str(attrs.data_layout), str(attrs.kernel_layout)) == ("NCHW", "OIHW")
        and str(attrs.out_layout) in ("NCHW", "")
        and int(attrs.groups) == data[1] == weight[0]
        and weight[1] == 1
        and all(int(s) == 1 for s in attrs.strides)
        and all(int(d) == 1 for d in attrs.dilation)
        and out[3] < CHANNEL_MULTIPLE
    )


def _depthwise_plane(bb, call):
    """A stride-1 depthwise convolution computed on its channel's padded plane
    read as one row: with ``Wp`` the padded width, output position
    ``p = y * Wp + x`` is ``sum w[ry, rx] * plane[p + ry * Wp + rx]``, so whole
    vectors of consecutive positions run over the plane, row ends included;
    the positions past each row's end are computed and dropped.

    On 7x7 or 14x14 planes a vector per output row is half empty or split into
    pieces (7 = 4 + 2 + 1 lanes); here the 7x7 plane is 5 whole vectors (an
    8 x 10 grid: :func:`_plane_grid`). The plane has extra zero rows at its end
    so that the last vectors read inside it. The schedule recognises the
    blocks (``umahub_npu.schedules``, "depthwise")."""
    from tvm import te, tirx

    from umahub.plugin import shape_of

    attrs = call.attrs
    N, C, H, W = shape_of(call.args[0])
    _, _, KH, KW = shape_of(call.args[1])
    top, left, bottom, right = (int(v) for v in attrs.padding)
    OH, OW = H + top + bottom - KH + 1, W + left + right - KW + 1
    rows, Wp = _plane_grid(OH, W + left + right)
    # the last position (rows - 1, Wp - 1) reads up to row rows + KH - 2, column
    # Wp + KW - 2: one row further when KW > 1
    plane_rows = rows + KH - 1 + (1 if KW > 1 else 0)

    def depthwise(x, w):
        def padded(n, c, y, xx):
            inside = tirx.all(y >= top, y < top + H, xx >= left, xx < left + W)
            return tirx.if_then_else(inside, x[n, c, y - top, xx - left], tirx.const(0, "float32"))

        plane = te.compute((N, C, plane_rows, Wp), padded, name="plane_pad")
        ry = te.reduce_axis((0, KH), name="ry")
        rx = te.reduce_axis((0, KW), name="rx")

        def tap(n, c, y, xx):
            at = (y + ry) * Wp + xx + rx
            return te.sum(plane[n, c, at // Wp, at % Wp] * w[c, 0, ry, rx], axis=[ry, rx])

        grid = te.compute((N, C, rows, Wp), tap, name="plane_conv")
        return te.compute((N, C, OH, OW), lambda *i: grid(*i), name="plane_rows")

    return bb.call_te(depthwise, *call.args, primfunc_name_hint="depthwise")


def _is_strided_pointwise(call) -> bool:
    """A float32 1x1 convolution with a stride, unpadded, not grouped (NCHW, OIHW),
    of static shape."""
    from umahub.plugin import dtype_of, shape_of

    attrs = call.attrs
    data, weight = (shape_of(a) for a in call.args)  # None where not static
    if data is None or weight is None or len(data) != 4 or len(weight) != 4:
        return False
    return (
        tuple(weight[2:]) == (1, 1)
        and dtype_of(call.args[0]) == "float32"
        and (str(attrs.data_layout), str(attrs.kernel_layout)) == ("NCHW", "OIHW")
        and str(attrs.out_layout) in ("NCHW", "")
        and int(attrs.groups) == 1
        and any(int(s) > 1 for s in attrs.strides)
        and all(int(p) == 0 for p in attrs.padding)
        and all(int(d) == 1 for d in attrs.dilation)
    )


def _subsampled(bb, call):
    """A strided 1x1 convolution as the input positions it reads, copied into a
    compact tensor, and a stride-1 1x1 convolution of them: the same products in
    the same order. Measured against the strided one (npu kernels alone, Intel
    Xeon): 256 -> 512 channels from 56x56 to 28x28 0.66 of the time, 64 -> 128
    0.79, 512 -> 1024 from 28x28 0.84, 1024 -> 2048 from 14x14 0.93."""
    from tvm import te

    from umahub.plugin import shape_of

    attrs = call.attrs
    sy, sx = (int(s) for s in attrs.strides)
    n, c, _, _ = shape_of(call.args[0])
    _, _, oh, ow = shape_of(call)

    def subsample(x):
        return te.compute(
            (n, c, oh, ow), lambda i, k, y, xx: x[i, k, y * sy, xx * sx], name="subsample"
        )

    positions = bb.emit(bb.call_te(subsample, call.args[0], primfunc_name_hint="subsample"))
    return bb.normalize(
        relax.op.nn.conv2d(
            positions,
            call.args[1],
            data_layout="NCHW",
            kernel_layout="OIHW",
            out_dtype=attrs.out_dtype,
        )
    )


def _conv2d(constants: frozenset) -> Callable:
    """conv2d's legalization: a depthwise one on its plane (:func:`_depthwise_plane`)
    where that applies, a strided 1x1 one on its input's positions copied
    (:func:`_subsampled`), and with its output channels padded
    (:func:`_padded_channels`) where its filter is one of ``constants``."""
    padded = _padded_channels(constants)

    def legalize(bb, call):
        if _is_plane_depthwise(call):
            return _depthwise_plane(bb, call)
        if _is_strided_pointwise(call):
            call = _subsampled(bb, call)
        return padded(bb, call)

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
    """The default lowering with :data:`LEGALIZE`, convolutions' output channels
    padded for the vector units where the filter is one of ``weights`` (indices of
    ``function``'s parameters the model passes as constants), and depthwise ones
    on narrow planes computed on the plane (:func:`_conv2d`)."""
    from umahub.plugin import default_relax_to_tir

    constants = frozenset(p for i, p in enumerate(function.params) if i in weights)
    legalize = dict(LEGALIZE, **{"relax.nn.conv2d": _conv2d(constants)})
    return default_relax_to_tir(function, symbol, accelerator, legalize=legalize)
