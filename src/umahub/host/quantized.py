"""Quantized operators in integers: the host's lowering, and every partition's by default.

TVM legalizes ``dequantize -> conv2d -> quantize`` as it is written: the
integers become float32, the convolution runs in float32 and its result is
rounded back. That is four times the memory traffic of the integers, and the
float sums round differently on every kernel that orders them differently, so
two devices would not give the same integers. :func:`lower_quantized`
replaces each quantized operator (:func:`umahub.plugin.describe_quantized`)
by one kernel that computes it as :mod:`umahub.plugin.quantization` defines:
int32 accumulation, a bias in the accumulator's units, a fixed-point
requantization rounded half to even; and each quantized mean
(:mod:`umahub.plugin.integer_mean`) by its own integer kernel
(:mod:`umahub.host.integer_mean`). The host's part of a model goes through
it before TVM's legalization (:mod:`umahub.host.lowering`), and so does every
partition that :func:`umahub.plugin.default_relax_to_tir` lowers: the npu, a
plugin's C kernels and the host give the same integers.

Why this module is long: it holds the one kernel every path computes (both of
its forms, the plain sum and the packed form the int8 schedules take, with
the weight's packing), its Relax lowering, and the two rewrites before
partitioning that keep the quantized operators whole; split, the forms would
drift apart.

The kernel reads scales and zero points as tensors, so the same code serves
the host (where they are constants) and a partition (where they are its
parameters): the fixed-point multiplier, the bias in accumulator units and the
clamp are computed per output channel, in a stage of their own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import tvm
from tvm import relax, te, tirx

from umahub._tvm import Constant, name_of
from umahub.host.fixed_point import (
    at_channel,
    channel_index,
    fixed_point,
    int64,
    requantized,
    type_range,
)
from umahub.host.integer_mean import mean_kernel, mean_operands
from umahub.plugin.integer_mean import describe_quantized_mean
from umahub.plugin.patterns import dtype_of, shape_of
from umahub.plugin.quantization import QuantizedOperator, bound_value, describe_quantized

__all__ = [
    "BLOCK_K",
    "BLOCK_O",
    "double_pays_in_pointwise",
    "flat_depthwise",
    "flat_plane",
    "flat_tile_rows",
    "has_quad_instructions",
    "lower_quantized",
    "operands",
    "pack_weight_kernel",
    "packed_form",
    "paired_depthwise",
    "pointwise",
    "pointwise_positions",
    "quad_depthwise",
    "quantized_in_integers",
    "quantized_kernel",
    "requantizes_in_double",
    "weight_sum_kernel",
]

_INT32_MAX = 2**31 - 1


def _requantizer(op: QuantizedOperator, sx: Any, sw: Any, sy: Any, channels: int):
    """Per output channel: (m, k), the fixed-point multiplier of step 3."""

    def multiplier(o: Any) -> Any:
        return (
            at_channel(sx, o, channels).astype("float64")
            * at_channel(sw, o, channels).astype("float64")
            / at_channel(sy, o, channels).astype("float64")
        )

    return fixed_point(multiplier, channels, "requant")


def _residual_requantizer(sr: Any, sy: Any):
    """(m_r, k_r): the fixed point of ``r_scale / y_scale`` (step 4's residual)."""

    def multiplier(_: Any) -> Any:
        return at_channel(sr, 0, 1).astype("float64") / at_channel(sy, 0, 1).astype("float64")

    return fixed_point(multiplier, 1, "residual")


#: Bits of a float64 significand: every integer below 2**53 in magnitude is exact.
_DOUBLE_BITS = 53


def requantizes_in_double(op: QuantizedOperator, out_dtype: str) -> bool:
    """Whether ``op``'s requantization is computed in float64, exactly as the fixed point.

    Step 4 rounds ``a * m / 2**k`` half to even (``a``: the int32 accumulator,
    ``m < 2**31``). In float64 that is ``nearbyint(a * (m * 2**-k))``: ``m * 2**-k``
    and ``a`` are exact, and so is their product wherever ``|a * m| < 2**53``. An
    output of ``b`` bits that is not clamped is below ``2**(b + 1)`` in magnitude
    before its zero point is added, so ``|a * m| < 2**(k + b + 1)``: exact when
    ``k <= 52 - b`` (44 for 8-bit outputs). A product of ``2**53`` or more is then at
    least ``2**(b + 1)`` after the scaling, rounded or not, and clamps to the same
    bound. The float64 form takes a multiply, a round and a clamp per output where
    the int64 one takes about a dozen operations.

    That needs every channel's ``k`` at compile time: the three scales known
    constants (as the host's are, and a partition's constant parameters). A
    residual keeps the int64 form (its term is shifted in before the rounding).

    The flat depthwise form (:func:`flat_depthwise`) takes it: there the kernel
    is little more than its requantization, and on a 2-core AMD EPYC (Zen 4) it
    ran 1.6x faster on 112x112 and 56x56 planes, as fast on 14x14 and 7x7 ones.
    The 1x1 form (:func:`pointwise`) takes it where the CPU runs it faster
    (:func:`double_pays_in_pointwise`). In the other forms the float64 vectors
    (8 lanes to int32's 16) cost more than they saved: on the AMD EPYC a strided
    depthwise up to 1.5x slower, 1x1 convolutions up to 1.7x, 3x3 ones from 1.2x
    faster to 1.8x slower by shape; on an Intel Xeon a convolution with its
    channels in the lanes 1.6x slower, the paired depthwise
    (:func:`paired_depthwise`) 0.88-1.15x.
    """
    import numpy as np

    from umahub.plugin.quantization import requantization

    scales = (op.data.scale, op.weight.scale, op.output.scale)
    if op.residual is not None or any(s is None for s in scales):
        return False
    sx, sw, sy = (np.asarray(s, dtype=np.float32).astype(np.float64).reshape(-1) for s in scales)
    try:
        _, k = requantization(sx * sw / sy)  # the order the kernel's stage computes it in
    except ValueError:
        return False
    bits = tvm.DataType(out_dtype).bits
    return bool(np.all(k <= _DOUBLE_BITS - 1 - bits))


#: Prefixes of LLVM's names of AMD's x86 CPUs.
_AMD_CPUS = ("znver", "bdver", "btver", "amdfam", "athlon", "k8", "opteron", "barcelona")


def double_pays_in_pointwise(target: Any = None) -> bool:
    """Whether a 1x1 convolution's requantization (positions in the lanes) runs faster
    in float64 than in int64 on ``target``'s CPU (None: the ``tvm.target.Target`` of
    the enclosing ``with``; no target: False, the int64 form).

    The CPUs measured: on an Intel Xeon (Sapphire Rapids, AVX-512) float64 was
    faster on every 1x1 convolution of MobileNetV2 and ResNet50 tried, 1.01-1.13x
    (16 -> 96 channels on 112x112: 0.206 -> 0.182 ms; the int8 models 3-4%
    faster in all); on an AMD EPYC (Zen 4) up to 1.7x slower. So: an x86 CPU with
    AVX-512 that LLVM does not name as AMD's. The same integers either way
    (:func:`requantizes_in_double`)."""
    from umahub.targets import has_feature

    target = _target_in_effect(target)
    if target is None:
        return False
    mcpu = str(target.attrs.get("mcpu", ""))
    return bool(mcpu) and not mcpu.startswith(_AMD_CPUS) and has_feature("avx512f", target)


def _double_requantizer(m: te.Tensor, k: te.Tensor, channels: int) -> te.Tensor:
    """Per channel, ``m * 2**-k`` as a float64 (exact: a power of two from its bits)."""

    def value(o: Any) -> Any:
        power = tirx.reinterpret("float64", (int64(1023) - k[o]) << int64(52))
        return m[o].astype("float64") * power

    return te.compute((channels,), value, name="requant_double")


def _bias(op: QuantizedOperator, bias: list, sx: Any, sw: Any, channels: int) -> te.Tensor:
    """The bias in accumulator units (int32), per output channel (step 2)."""
    b = bias[0]

    def value(o: Any) -> Any:
        raw = b[tuple(channel_index(b, o, channels))]
        units = at_channel(sx, o, channels).astype("float64")
        units = units * at_channel(sw, o, channels).astype("float64")
        if len(bias) == 3:  # dequantized: (b - zp) * scale in float32, as the graph says
            scale, zero = bias[1], bias[2]
            zp = at_channel(zero, o, channels).astype("int32")
            as_float = (raw.astype("int32") - zp).astype("float32") * at_channel(scale, o, channels)
            exact = tirx.all(
                zp == 0,
                at_channel(scale, o, channels)
                == at_channel(sx, o, channels).astype("float32") * at_channel(sw, o, channels),
            )
        else:
            as_float, exact = raw, None
        rounded = tirx.nearbyint(as_float.astype("float64") / units)
        rounded = tirx.max(tirx.min(rounded, float(_INT32_MAX)), float(-_INT32_MAX)).astype("int32")
        if exact is None or str(b.dtype) != "int32":
            return rounded
        return tirx.Select(exact, raw, rounded)

    return te.compute((channels,), value, name="bias_q")


def _channel_term(offset: Any, bias_q: te.Tensor | None) -> Any:
    """The accumulator's per-channel term as a function of the channel: the packed
    forms' ``- x_zp' * sum(w)`` (``offset``), plus the bias; None where both are
    absent."""
    if offset is None and bias_q is None:
        return None
    if bias_q is None:
        return offset
    if offset is None:
        return lambda o: bias_q[o]
    return lambda o: offset(o) + bias_q[o]


def _bounds(op: QuantizedOperator, sy: Any, zy: Any, dtype: str) -> tuple[Any, Any]:
    """The output's clamp: its type's range, narrowed by the activation (in output units)."""
    low, high = type_range(dtype)
    zero = _zero_point(op.output, zy, "int64")
    if op.activation == "relu":
        return tirx.max(low, tirx.min(high, zero)), high
    if isinstance(op.activation, tuple):
        _, lo, hi = op.activation

        def quantized(bound: float) -> Any:
            step = tirx.nearbyint(tirx.const(bound, "float32") / at_channel(sy, 0, 1))
            return step.astype("int64") + zero

        if math.isfinite(lo):
            low = tirx.max(low, tirx.min(high, quantized(lo)))
        if math.isfinite(hi):
            high = tirx.min(high, tirx.max(low, quantized(hi)))
    return low, high


#: Output channels of one packed weight block (a 512-bit vector of int32).
BLOCK_O = 16
#: Reduction elements one ``vpdpbusd`` lane sums (four bytes of a 32-bit lane).
BLOCK_K = 4


def packed_form(op: QuantizedOperator, w_shape: tuple[int, ...], x_dtype: str) -> bool:
    """Whether ``op`` is computed in the packed form (see :func:`quantized_kernel`).

    An int8 weight of an ungrouped convolution or a 2-D matrix, an 8-bit input:
    the sum splits into an unsigned-by-signed byte dot product (the form x86's
    ``vpdpbusd`` computes) and per-channel, per-position corrections.
    """
    if op.weight.dtype != "int8" or x_dtype not in ("uint8", "int8"):
        return False
    if op.kind == "conv2d":
        return int(op.call.attrs.groups) == 1
    return len(w_shape) == 2


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def pack_weight_kernel(op: QuantizedOperator, w_shape: tuple[int, ...]):
    """The TE function packing an int8 weight for the packed form.

    A convolution's ``[O, C, KH, KW]`` becomes ``[O/16, C/4, KH, KW, 16, 4]``, a
    matrix ``[K, N]`` becomes ``[N/16, K/4, 16, 4]`` (rounded up, the new rows
    zeros, which add nothing): the four bytes one lane of ``vpdpbusd`` sums are
    contiguous, and so are the sixteen output channels of one vector. A copy of
    one parameter, so the compiler can run it once on a constant weight.
    """
    conv = op.kind == "conv2d"

    def pack(w: te.Tensor) -> te.Tensor:
        zero = tirx.const(0, "int8")
        if conv:
            o, c, kh, kw = (int(d) for d in w.shape)
            shape: tuple[int, ...] = (
                _ceil(o, BLOCK_O),
                _ceil(c, BLOCK_K),
                kh,
                kw,
                BLOCK_O,
                BLOCK_K,
            )

            def value(*i: Any) -> Any:
                ob, cb, y, x, oi, ci = i
                oo, cc = ob * BLOCK_O + oi, cb * BLOCK_K + ci
                return tirx.if_then_else(tirx.all(oo < o, cc < c), w[oo, cc, y, x], zero)

        else:
            k, n = (int(d) for d in w.shape)
            shape = (_ceil(n, BLOCK_O), _ceil(k, BLOCK_K), BLOCK_O, BLOCK_K)

            def value(*i: Any) -> Any:
                nb, kb, ni, ki = i
                nn, kk = nb * BLOCK_O + ni, kb * BLOCK_K + ki
                return tirx.if_then_else(tirx.all(nn < n, kk < k), w[kk, nn], zero)

        return te.compute(shape, value, name="weight_packed")

    return pack


def weight_sum_kernel():
    """The TE function summing a packed weight per output channel (int32)."""

    def total(wp: te.Tensor) -> te.Tensor:
        dims = [int(d) for d in wp.shape]
        blocks, rest = dims[0], dims[1:-2]
        axes = [te.reduce_axis((0, d), f"r{i}") for i, d in enumerate(rest)]
        rk = te.reduce_axis((0, dims[-1]), "rk")

        def value(o):
            index = (o // BLOCK_O, *axes, o % BLOCK_O, rk)
            return te.sum(wp[index].astype("int32"), axis=[*axes, rk])

        return te.compute((blocks * BLOCK_O,), value, name="weight_sum")

    return total


def quantized_kernel(
    op: QuantizedOperator,
    out_shape: tuple[int, ...],
    out_dtype: str,
    prepacked: bool = False,
    double_pointwise: bool = False,
    quad_taps: bool = False,
):
    """The TE function computing ``op`` exactly, for ``BlockBuilder.call_te``.

    Its arguments, in order: the input, its scale and zero point; the weight,
    its scale and zero point; the bias (and, dequantized, its scale and zero
    point) if there is one; the residual, its scale and zero point if there is
    one; the output's scale and zero point (see :func:`operands`). With
    ``prepacked``, the weight is already packed (:func:`pack_weight_kernel`)
    and its per-channel sum
    (:func:`weight_sum_kernel`) follows it.

    In the packed form (:func:`packed_form`) the accumulator is computed as
    ``sum(x' * w) - x_zp' * sum(w) - w_zp * (sum(x') - K * x_zp')`` with
    ``x' = x`` (uint8) or ``x + 128`` (int8, ``x_zp' = x_zp + 128``): equal
    to ``sum((x - x_zp) * (w - w_zp))`` in int32, and its first term a
    uint8-by-int8 dot product over 4-byte groups. The input is copied once into
    ``[N, C/4, H, W, 4]`` (padding: ``x_zp'``), the weight packed
    ``[O/16, C/4, KH, KW, 16, 4]``, the dot product ``dot`` written
    ``[N, O/16, OH, OW, 16]`` (a matmul's: ``[.., M, N/16, 16]``); the
    ``sum(x')`` term (``window_sum``) exists only where the weight's zero
    points are not known to be 0. Otherwise (grouped convolutions, other
    types) the plain sum, ``acc``.

    ``double_pointwise``: a 1x1 convolution requantizes in float64 where that is
    exact (:func:`double_pays_in_pointwise` says where to ask for it).
    ``quad_taps``: a depthwise convolution that :func:`quad_depthwise` takes sums
    its taps four at a time (ask for it where :func:`has_quad_instructions`).
    """
    conv = op.kind == "conv2d"
    channels = out_shape[1] if conv else out_shape[-1]

    def kernel(x: te.Tensor, sx: Any, zx: Any, w: te.Tensor, *rest: Any):
        wsum = None
        if prepacked:
            wsum, sw, zw, *rest = rest  # type: ignore[assignment]
        else:
            sw, zw, *rest = rest  # type: ignore[assignment]
        residual = list(rest[-5:-2]) if op.residual is not None else []
        bias = list(rest[: len(rest) - 2 - len(residual)])
        sy, zy = rest[-2:]
        x_zero = _zero_point(op.data, zx, "int32")

        # the per-channel stages first: a schedule computes the output per tile
        # of the accumulator, after everything else it reads
        flat = pointwise(op) and (
            prepacked or packed_form(op, tuple(int(d) for d in w.shape), str(x.dtype))
        )
        quads = not flat and quad_taps and quad_depthwise(op, str(x.dtype))
        wide = not flat and not quads and flat_depthwise(op, str(x.dtype))  # rows to the pitch
        paired = not flat and not wide and not quads and paired_depthwise(op, str(x.dtype))
        m, k = _requantizer(op, sx, sw, sy, channels)
        # float64 where it is exact, in the forms where it measured faster
        in_double = (wide or (flat and double_pointwise)) and requantizes_in_double(op, out_dtype)
        scale = _double_requantizer(m, k, channels) if in_double else None  # else int64
        bias_q = _bias(op, bias, sx, sw, channels) if bias else None
        shape, pitch = out_shape, out_shape[-1]  # pitch: a flat form's positions per row
        offset = None  # the accumulator's per-channel term, where its form has one
        if flat:
            shape = (*out_shape[:2], pointwise_positions(out_shape[2] * out_shape[3]))
            at, offset = _pointwise_acc(op, x, x_zero, w, wsum, zw, out_shape, shape, prepacked)
        elif wide:  # the columns past the output's dropped
            pitch = int(x.shape[3]) + int(op.call.attrs.padding[1]) + int(op.call.attrs.padding[3])
            pitch, rows = flat_plane(out_shape[2], pitch)
            shape = (*out_shape[:2], rows, pitch)
            at = _flat_depthwise_acc(op, x, x_zero, w, zw, shape)
        elif paired or quads:  # rows of whole vectors, the columns past the output's dropped
            shape = (*out_shape[:3], _ceil(out_shape[3], BLOCK_O) * BLOCK_O)
            at, offset = _tap_groups_acc(op, x, x_zero, w, zw, shape, 4 if quads else 2)
        elif prepacked or packed_form(op, tuple(int(d) for d in w.shape), str(x.dtype)):
            at, offset = _packed_acc(op, x, x_zero, w, wsum, zw, out_shape, channels, prepacked)
        elif conv:
            at = _conv_acc(op, x, x_zero, w, zw, out_shape, channels)
        else:
            at = _matmul_acc(op, x, x_zero, w, zw, out_shape, channels)
        low, high = _bounds(op, sy, zy, out_dtype)
        zero = _zero_point(op.output, zy, "int64")
        channel_term = _channel_term(offset, bias_q)
        scaled_term = None
        if channel_term is not None and scale is None:
            scaled_term = te.compute(
                (channels,),
                lambda o: channel_term(o).astype("int64") * m[o].astype("int64"),
                name="channel_term_scaled",
            )
        if residual:
            r, sr, zr = residual
            m_r, k_r = _residual_requantizer(sr, sy)
            r_zero = at_channel(zr, 0, 1).astype("int64")

        def residual_at(i: tuple) -> Any:
            if wide or paired or quads:  # past the rows: the last; past a row: its last column
                row, column = (tirx.min(i[d], out_shape[d] - 1) for d in (2, 3))
                return r[i[0], i[1], row, column]
            if not flat:
                return r[i]
            row = tirx.min(i[2] // pitch, out_shape[2] - 1)  # past the rows: the last one
            column = tirx.min(i[2] % pitch, out_shape[3] - 1)  # past a row: its last column
            return r[i[0], i[1], row, column]

        def out(*i: Any) -> Any:
            o = i[1] if conv else i[-1]
            if scale is not None:  # exact: see requantizes_in_double
                a = at(i) if channel_term is None else at(i) + channel_term(o)
                rounded_d = tirx.nearbyint(a.astype("float64") * scale[o])
                value = rounded_d + zero.astype("float64")
                bounded = tirx.max(low.astype("float64"), tirx.min(high.astype("float64"), value))
                return bounded.astype("int32").astype(out_dtype)
            # (a + c) * m as a * m + (c * m), the second a stage per channel: LLVM then
            # multiplies two int32 values into int64 (vpmuldq), where the int32 sum
            # a + c, which it widens, took a 64-bit multiply (vpmullq: 3 micro-ops)
            p = at(i).astype("int64") * m[o].astype("int64")
            if scaled_term is not None:
                p = p + scaled_term[o]
            if residual:
                term = (residual_at(i).astype("int64") - r_zero) * m_r[0].astype("int64")
                p = p + (term << (k[o] - k_r[0]))
            return requantized(p, k[o], zero, low, high, out_dtype)

        result = te.compute(shape, out, name="requantized")
        if wide or paired or quads:
            return te.compute(out_shape, lambda *i: result[i], name="unflattened")
        if not flat:
            return result
        return te.compute(
            out_shape, lambda b, o, y, xx: result[b, o, y * pitch + xx], name="unflattened"
        )

    return kernel


def pointwise(op: QuantizedOperator) -> bool:
    """Whether ``op`` is a 1x1 convolution without padding (any stride): the packed
    form then computes it with the output positions in the vector lanes
    (:func:`_pointwise_acc`)."""
    if op.kind != "conv2d":
        return False
    w_shape = shape_of(op.call.args[1])
    attrs = op.call.attrs
    return (
        w_shape is not None
        and tuple(int(d) for d in w_shape[2:]) == (1, 1)
        and all(int(p) == 0 for p in attrs.padding)
        and int(attrs.groups) == 1
    )


def flat_depthwise(op: QuantizedOperator, x_dtype: str) -> bool:
    """Whether ``op`` is a depthwise convolution of stride 1 on 8-bit integers: the
    plain sum then runs over the padded input plane read as one flat row
    (:func:`_flat_depthwise_acc`)."""
    return _depthwise_of_bytes(op, x_dtype) and all(int(s) == 1 for s in op.call.attrs.strides)


def paired_depthwise(op: QuantizedOperator, x_dtype: str) -> bool:
    """Whether ``op`` is a depthwise convolution of 8-bit integers whose columns step
    by 2, undilated: its sum then takes the input's bytes two taps at a time
    (:func:`_tap_groups_acc`)."""
    attrs = op.call.attrs
    return (
        _depthwise_of_bytes(op, x_dtype)
        and int(attrs.strides[1]) == 2
        and int(attrs.dilation[1]) == 1
        and dtype_of(op.exprs["weight"]) in ("uint8", "int8")
    )


#: Column steps whose 16 outputs' windows of four taps lie in 64 bytes of a row.
_QUAD_STEPS = (1, 2, 3, 4)


def quad_depthwise(op: QuantizedOperator, x_dtype: str) -> bool:
    """Whether ``op`` is a depthwise convolution of 8-bit inputs by int8 weights known
    symmetric, its columns a step of 1 to 4 apart and undilated: built for a CPU
    that can (:func:`has_quad_instructions`), its sum takes a kernel row's taps
    four at a time (:func:`_tap_groups_acc`), where it would take them one at
    a time (stride 1, :func:`flat_depthwise`) or two (stride 2,
    :func:`paired_depthwise`)."""
    attrs = op.call.attrs
    return (
        _depthwise_of_bytes(op, x_dtype)
        and int(attrs.strides[1]) in _QUAD_STEPS
        and int(attrs.dilation[1]) == 1
        and dtype_of(op.exprs["weight"]) == "int8"
        and _weight_zero_known(op)
    )


def has_quad_instructions(target: Any = None) -> bool:
    """Whether ``target``'s CPU (None: the ``tvm.target.Target`` of the enclosing
    ``with``; no target: False) has AVX-512 VBMI (``vpermb``, the four taps'
    gather) and VNNI (``vpdpbusd``): :func:`quad_depthwise`'s instructions."""
    from umahub.targets import has_feature

    target = _target_in_effect(target)
    if target is None:
        return False
    return has_feature("avx512vbmi", target) and has_feature("avx512vnni", target)


def _target_in_effect(target: Any) -> Any:
    """``target`` (a ``tvm.target.Target`` or its dict), else the ``tvm.target.Target``
    of the enclosing ``with``; None where there is neither."""
    target = target if target is not None else tvm.target.Target.current(allow_none=True)
    if target is None or isinstance(target, tvm.target.Target):
        return target
    return tvm.target.Target(target)


def _depthwise_of_bytes(op: QuantizedOperator, x_dtype: str) -> bool:
    """Whether ``op`` is a depthwise convolution (one input channel per output
    channel) of an 8-bit input."""
    if op.kind != "conv2d" or x_dtype not in ("uint8", "int8"):
        return False
    w_shape = shape_of(op.call.args[1])
    x_shape = shape_of(op.call.args[0])
    return (
        w_shape is not None
        and x_shape is not None
        and int(w_shape[1]) == 1
        and int(op.call.attrs.groups) == int(x_shape[1]) == int(w_shape[0])
    )


def _plane_less_zero(x: te.Tensor, x_zero: Any, top: int, left: int, kind: str):
    """``(b, c, i, j) ->`` NCHW ``x`` less its zero point ``x_zero``, as ``kind``, padded
    by ``top`` rows and ``left`` columns before (and as many after as the caller's
    shape asks) with zeros: padding holds the zero point, which is 0 less it."""
    h, wd = (int(d) for d in x.shape[2:])

    def value(b: Any, ch: Any, i: Any, j: Any) -> Any:
        inside = tirx.all(i >= top, i < h + top, j >= left, j < wd + left)
        less = (x[b, ch, i - top, j - left].astype("int32") - x_zero).astype(kind)
        return tirx.if_then_else(inside, less, tirx.const(0, kind))

    return value


def _flat_depthwise_acc(op, x, x_zero, w, zw, shape):
    """A depthwise convolution of stride 1 as a sum over its padded plane read flat.

    The input is copied padded, ``[N, C, rows * pitch]``; the output is computed
    as ``shape``, ``[N, C, R, pitch]`` (:func:`flat_plane`: at least the output's
    rows, at least the padded input's row; the positions past the output's are
    computed and dropped), its sums flat, ``[N, C, R * pitch]``. Position ``(y,
    x)`` is ``q = y * pitch + x`` and reads tap ``(ky, kx)`` at ``q + ky * dh *
    pitch + kx * dw`` of the plane. A tile of the schedule is whole rows and
    whole vectors of 16 (:func:`flat_tile_rows`), so every vector of positions
    is whole, however narrow the rows: a row of 7 or 14 in a vector of 16 wasted
    most of it, and a row's part-filled last vector computed its float sums on
    lanes holding the previous kernel's leftovers (as floats, denormals: a
    microcode assist each). The kernel's taps are offsets, each weight broadcast
    once per vector.

    The plane holds the input less its zero point, and the sum runs in float32
    where that is exact (:func:`_exact_in_float`: up to 258 taps of 8-bit
    values), in int32 otherwise; the accumulator is read as int32 either way.
    """
    attrs = op.call.attrs
    dh, dw = (int(d) for d in attrs.dilation)
    top, left, _, _ = (int(p) for p in attrs.padding)
    n, c = (int(d) for d in x.shape[:2])
    _, _, kh, kw = (int(d) for d in w.shape)
    pitch = shape[3]
    reach = (kh - 1) * dh * pitch + (kw - 1) * dw
    rows = _ceil(shape[2] * pitch + reach, pitch)
    # in float32 where that is exact: see the docstring
    kind = "float32" if _exact_in_float(kh * kw, x, w) else "int32"
    plane = te.compute(
        (n, c, rows, pitch), _plane_less_zero(x, x_zero, top, left, kind), name="pad_zero_point"
    )
    xp = te.compute(
        (n, c, rows * pitch),
        lambda b, ch, q: plane[b, ch, q // pitch, q % pitch],
        name="pad_flat",
    )
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")

    def acc(b: Any, o: Any, q: Any) -> Any:
        data = xp[b, o, q + ry * dh * pitch + rx * dw]
        weight = w[o, 0, ry, rx].astype("int32") - at_channel(zw, o, shape[1]).astype("int32")
        return te.sum(data * weight.astype(kind), axis=[ry, rx])

    total = te.compute((n, c, shape[2] * pitch), acc, name="acc_flat")
    return lambda i: total[i[0], i[1], i[2] * pitch + i[3]].astype("int32")


def _tap_groups_acc(op, x, x_zero, w, zw, shape, group):
    """A depthwise convolution's sum over the input's bytes ``group`` taps of a kernel
    row at a time, and the accumulator's per-channel term, as :func:`_packed_acc`
    gives them: pairs (``group`` 2, :func:`paired_depthwise`) or fours (4,
    :func:`quad_depthwise`).

    Output column ``x`` reads padded columns ``s * x + kx``. Pairs (``s`` = 2):
    taps ``2j`` and ``2j + 1`` are the two bytes ``2(x + j)`` and ``2(x + j) + 1``,
    so for 16 consecutive outputs one tap pair is 32 consecutive bytes of the
    row, each pair an int32 lane of 16-bit values; times the pair of weights
    broadcast, one ``vpdpwssd`` (AVX-512 VNNI) for 32 multiply-adds, exact (a
    byte times a weight less its zero point fits 16 bits, two of them 32).
    Fours (``s`` up to 4, weights int8 and known symmetric): the four taps
    ``4j .. 4j + 3`` of 16 consecutive outputs lie in the 64 bytes from ``s * x0
    + 4j``, one ``vpermb`` gathers each output's four into an int32 lane, and one
    ``vpdpbusd`` multiplies them, unsigned, by the four weights, signed (an int8
    input shifted by 128 to be unsigned). A kernel width that is no multiple of
    the group pads its last group with weights of 0. The plane is padded with the
    (shifted) zero point (``x' + zp`` everywhere), so the sum exceeds the exact
    one by ``zp * sum(w')`` per channel: the term returned. ``shape``'s rows are
    whole vectors of 16 positions (the kernel drops those past the output's),
    and the plane's rows reach the bytes the last vector's groups load; the
    plane is read as bytes, where the plain form's copy converts every byte to a
    float.
    """
    attrs = op.call.attrs
    sh, sw_ = (int(s) for s in attrs.strides)
    dh = int(attrs.dilation[0])
    top, left, _, _ = (int(p) for p in attrs.padding)
    n, c, h, wd = (int(d) for d in x.shape)
    _, _, kh, kw = (int(d) for d in w.shape)
    oh, width = shape[2], shape[3]
    groups = _ceil(kw, group)
    kind, weight_dtype = {2: ("pairs", "int16"), 4: ("quads", "int8")}[group]
    shift = 128 if group == 4 and str(x.dtype) == "int8" else 0  # vpdpbusd's bytes unsigned
    zero = x_zero + shift
    fill = zero.astype("uint8" if shift else str(x.dtype))

    def padded(b: Any, ch: Any, i: Any, j: Any) -> Any:
        inside = tirx.all(i >= top, i < h + top, j >= left, j < wd + left)
        return tirx.if_then_else(inside, _as_u8(x[b, ch, i - top, j - left], shift), fill)

    rows = (oh - 1) * sh + (kh - 1) * dh + 1
    columns = sw_ * (width - BLOCK_O) + group * (groups - 1) + group * BLOCK_O
    xp = te.compute((n, c, rows, columns), padded, name="pad_zero_point")

    def weight(o: Any, ry: Any, j: Any, e: Any) -> Any:
        kx = group * j + e
        less = w[o, 0, ry, tirx.min(kx, kw - 1)].astype("int32")
        less = less - at_channel(zw, o, c).astype("int32")
        return tirx.Select(kx < kw, less, tirx.const(0, "int32")).astype(weight_dtype)

    wg = te.compute((c, kh, groups, group), weight, name=f"weight_{kind}")
    sy, sj, se = (
        te.reduce_axis((0, d), name) for d, name in ((kh, "sy"), (groups, "sj"), (group, "se"))
    )
    sums = te.compute(
        (c,),
        lambda o: te.sum(wg[o, sy, sj, se].astype("int32"), axis=[sy, sj, se]),
        name=f"weight_{kind}_sum",
    )
    ry, rj, re = (
        te.reduce_axis((0, d), name) for d, name in ((kh, "ry"), (groups, "rj"), (group, "re"))
    )

    def acc(b: Any, o: Any, y: Any, xx: Any) -> Any:
        data = xp[b, o, y * sh + ry * dh, xx * sw_ + group * rj + re].astype("int32")
        return te.sum(data * wg[o, ry, rj, re].astype("int32"), axis=[ry, rj, re])

    total = te.compute((n, c, oh, width), acc, name=f"acc_{kind}")
    return (lambda i: total[i]), (lambda o: -zero * sums[o])


#: Positions of a flat depthwise tile of several rows: 8 vectors of 16, the sums
#: of each vector a chain of dependent multiply-adds, several in flight.
_TILE_POSITIONS = 8 * BLOCK_O


def flat_tile_rows(rows: int, pitch: int) -> int | None:
    """The rows of one tile of a flat depthwise output of ``rows`` rows of ``pitch``
    (see :func:`_flat_depthwise_acc`), or None where no tile fits.

    A tile is whole rows (its output rows are written out under it, while they
    are in cache) and whole vectors of 16 positions: the most rows that divide
    ``rows`` within 8 vectors, or one row where a row is longer.
    """
    fits = [
        k
        for k in range(1, rows + 1)
        if rows % k == 0 and k * pitch % BLOCK_O == 0 and k * pitch <= _TILE_POSITIONS
    ]
    if fits:
        return max(fits)
    return 1 if pitch % BLOCK_O == 0 else None


def flat_plane(rows: int, width: int) -> tuple[int, int]:
    """``(pitch, R)`` of a flat depthwise output of ``rows`` rows whose padded input
    row is ``width``: the fewest positions ``R * pitch`` with ``pitch >= width``,
    ``R >= rows`` and whole tiles (:func:`flat_tile_rows`), the larger tile on a
    tie.

    A 7x7 output of a 5x5 kernel (rows of 11) takes 8 rows of 12, one tile of 96
    positions; 14x14 of a 3x3 (16) 14 rows of 16 in tiles of 7; 56x56 (58) rows
    of 64, 2 a tile; 112x112 (114) rows of 128. A row rounded up to whole vectors
    costs what its part-filled last vector did.
    """
    best: tuple[int, int, int] | None = None
    for pitch in range(width, width + BLOCK_O):
        for r in range(rows, rows + BLOCK_O):
            k = flat_tile_rows(r, pitch)
            if k is not None:
                key = (r * pitch, -k * pitch, pitch)
                best = key if best is None else min(best, key)
    assert best is not None  # a pitch of whole vectors tiles any number of rows
    return best[2], best[0] // best[2]


#: Integers of float32 that are exact: every one up to 2**24 in magnitude.
_FLOAT_EXACT = 1 << 24


def _exact_in_float(taps: int, x: te.Tensor, w: te.Tensor) -> bool:
    """Whether a convolution's sum of ``taps`` products of an ``x`` and a ``w`` value less
    their zero points (an 8-bit value less one: at most 255 in magnitude) is exact in
    float32: every partial sum is an integer below 2**24 then, whatever the order, so
    it equals the int32 sum. A float multiply-add does in one instruction what int32
    takes a slow 32-bit multiply and an add for (``vpmulld``: half ``vfmadd``'s rate)."""
    span = [(1 << tvm.DataType(str(t.dtype)).bits) - 1 for t in (x, w)]
    return taps * span[0] * span[1] < _FLOAT_EXACT


def pointwise_positions(positions: int) -> int:
    """The flat positions a 1x1 convolution's accumulator computes for ``positions``
    outputs: whole pairs of vectors of :data:`BLOCK_O` (one vector for at most one).

    Its register tile is two vectors of positions by up to twelve channels, whose
    step loads two vectors and broadcasts twelve weights for 24 ``vpdpbusd``; one
    vector by up to 24 channels loads one and broadcasts 24 for as many (the
    broadcasts' loads the limit). 14x14 outputs (13 vectors) computed as 14 took
    0.91 of the time of 13 on resnet50's 1x1 convolutions over them (Intel Xeon).
    """
    pair = 2 * BLOCK_O
    return BLOCK_O if positions <= BLOCK_O else _ceil(positions, pair) * pair


def _pointwise_acc(op, x, x_zero, w, wsum, zw, out_shape, shape, prepacked):
    """A 1x1 convolution's accumulator over flat output positions (``shape``: batch,
    channels, positions rounded up by :func:`pointwise_positions`), as a function
    of that flat index.

    With positions in the lanes, one ``vpdpbusd`` takes sixteen positions' four
    bytes of input (64 contiguous bytes of the copy ``[N, C/4, P, 4]``) by four
    bytes of one output channel's weight, broadcast; the requantization then
    works on positions, contiguous in an NCHW output, where channels in the lanes
    would store each byte a plane apart (for a 1x1 convolution, whose sum is
    short, most of its time).
    """
    shift, zero, wp, wsum = _packed_operands(op, x, x_zero, w, wsum, prepacked)
    sh, sw_ = (int(s) for s in op.call.attrs.strides)
    n, c, _, _ = (int(d) for d in x.shape)
    oh, ow = out_shape[2], out_shape[3]
    cb = int(wp.shape[1])
    fill = zero.astype("uint8")

    def copied(b: Any, cc: Any, p: Any, ci: Any) -> Any:
        ch = cc * BLOCK_K + ci
        inside = tirx.all(p < oh * ow, ch < c)
        value = _as_u8(x[b, ch, (p // ow) * sh, (p % ow) * sw_], shift)
        return tirx.if_then_else(inside, value, fill)

    xp = te.compute((n, cb, shape[2], BLOCK_K), copied, name="pad_zero_point")
    sums = None
    if not _weight_zero_known(op):
        sk = te.reduce_axis((0, c), "sk")
        total = te.compute(
            (n, shape[2]),
            lambda b, p: te.sum(xp[b, sk // BLOCK_K, p, sk % BLOCK_K].astype("int32"), axis=sk),
            name="window_sum",
        )
        sums = lambda i: total[i[0], i[2]]  # noqa: E731
    rc = te.reduce_axis((0, cb), "rc")
    ri = te.reduce_axis((0, BLOCK_K), "ri")

    def dot_value(b: Any, o: Any, p: Any) -> Any:
        data = xp[b, rc, p, ri].astype("int32")
        weight = wp[o // BLOCK_O, rc, 0, 0, o % BLOCK_O, ri].astype("int32")
        return te.sum(data * weight, axis=[rc, ri])

    dot = te.compute(shape, dot_value, name="dot_positions")

    def at(i: Any) -> Any:
        window = sums(i) if sums is not None else None
        return _corrected(dot[i], i[1], window, zero, zw, shape[1], c)

    return at, _less_zero_times_sums(zero, wsum)


def _packed_operands(op, x, x_zero, w, wsum, prepacked):
    """What both packed forms start from: the shift that makes the input unsigned
    (128 for int8), ``x_zp'`` (an int32 expression), the packed weight, and its
    per-channel sums (None where ``x_zp'`` is known 0: the term they correct is)."""
    shift = 128 if str(x.dtype) == "int8" else 0
    zero = x_zero + shift
    wp = w if prepacked else pack_weight_kernel(op, tuple(int(d) for d in w.shape))(w)
    if isinstance(zero, tirx.IntImm) and zero.value == 0:
        wsum = None
    elif wsum is None:
        wsum = weight_sum_kernel()(wp)
    return shift, zero, wp, wsum


def _as_u8(value: Any, shift: int) -> Any:
    """An input byte as the unsigned operand of ``vpdpbusd`` (int8 shifted by 128)."""
    if shift:
        return (value.astype("int32") + shift).astype("uint8")
    return value


def _corrected(value, o, window, zero, zw, channels, reduction):
    """The per-position part of ``sum((x - x_zp) * (w - w_zp))`` from ``sum(x' * w)``
    (``value``, output channel ``o``): less, where the weight's zero points are not
    known 0, ``w_zp * (sum(x') - K * x_zp')`` (``window``: ``sum(x')``, else None).
    The per-channel part, ``- x_zp' * sum(w)``, is :func:`_less_zero_times_sums`'."""
    if window is not None:
        w_zero = at_channel(zw, o, channels).astype("int32")
        value = value - w_zero * (window - zero * reduction)
    return value


def _less_zero_times_sums(zero, wsum):
    """The packed forms' per-channel term ``- x_zp' * sum(w)``, as a function of the
    channel; None where it is 0 (``wsum`` None)."""
    if wsum is None:
        return None
    return lambda o: -(zero * wsum[o])


def _zero_point(params: Any, tensor: te.Tensor, dtype: str) -> Any:
    """A tensor's one zero point: the constant where it is known (a partition's known
    input, :data:`umahub.compiler.lowering.CONSTANT_INPUTS`), else read from ``tensor``."""
    if params.zero_point is not None:
        return tirx.const(int(params.zero_point.reshape(-1)[0]), dtype)
    return at_channel(tensor, 0, 1).astype(dtype)


def _weight_zero_known(op: QuantizedOperator) -> bool:
    return op.weight.zero_point is not None and not bool(op.weight.zero_point.any())


def _packed_acc(op, x, x_zero, w, wsum, zw, out_shape, channels, prepacked):
    """The packed form's accumulator (see :func:`quantized_kernel`), as a function
    of the output index."""
    conv = op.kind == "conv2d"
    shift, zero, wp, wsum = _packed_operands(op, x, x_zero, w, wsum, prepacked)
    fill = zero.astype("uint8")
    if conv:
        attrs = op.call.attrs
        sh, sw_ = (int(s) for s in attrs.strides)
        dh, dw = (int(d) for d in attrs.dilation)
        top, left, bottom, right = (int(p) for p in attrs.padding)
        n, c, h, wd = (int(d) for d in x.shape)
        _, cb, kh, kw, _, _ = (int(d) for d in wp.shape)

        def padded(*at: Any) -> Any:
            b, cc, i, j, ci = at
            ch = cc * BLOCK_K + ci
            inside = tirx.all(i >= top, i < h + top, j >= left, j < wd + left, ch < c)
            return tirx.if_then_else(inside, _as_u8(x[b, ch, i - top, j - left], shift), fill)

        xp = te.compute(
            (n, cb, h + top + bottom, wd + left + right, BLOCK_K), padded, name="pad_zero_point"
        )
        sums = None if _weight_zero_known(op) else _window_sum_conv(xp, c, (kh, kw), op)
        rc = te.reduce_axis((0, cb), "rc")
        ry = te.reduce_axis((0, kh), "ry")
        rx = te.reduce_axis((0, kw), "rx")
        ri = te.reduce_axis((0, BLOCK_K), "ri")
        blocks = _ceil(channels, BLOCK_O)

        def dot_value(*at: Any) -> Any:
            b, ob, y, xx, oi = at
            data = xp[b, rc, y * sh + ry * dh, xx * sw_ + rx * dw, ri].astype("int32")
            weight = wp[ob, rc, ry, rx, oi, ri].astype("int32")
            return te.sum(data * weight, axis=[rc, ry, rx, ri])

        dot = te.compute((n, blocks, out_shape[2], out_shape[3], BLOCK_O), dot_value, name="dot")
        reduction = c * kh * kw

        def dot_at(i: Any) -> Any:
            return dot[i[0], i[1] // BLOCK_O, i[2], i[3], i[1] % BLOCK_O]

    else:
        kdim = int(x.shape[-1])
        kb = int(wp.shape[1])
        lead = [int(d) for d in x.shape[:-1]]

        def padded(*i: Any) -> Any:
            kk = i[-2] * BLOCK_K + i[-1]
            index = (*i[:-2], kk)
            return tirx.if_then_else(kk < kdim, _as_u8(x[index], shift), fill)

        xp = te.compute((*lead, kb, BLOCK_K), padded, name="pad_zero_point")
        batch = len(out_shape) - 1 - len(lead)
        sums = None
        if not _weight_zero_known(op):
            sk = te.reduce_axis((0, kdim), "sk")

            def summed(*i: Any) -> Any:
                index = (*i, sk // BLOCK_K, sk % BLOCK_K)
                return te.sum(xp[index].astype("int32"), axis=sk)

            total = te.compute(tuple(lead), summed, name="window_sum")
            sums = lambda i: total[i[batch:-1]]  # noqa: E731
        rk = te.reduce_axis((0, kb), "rk")
        ri = te.reduce_axis((0, BLOCK_K), "ri")
        blocks = _ceil(channels, BLOCK_O)

        def dot_value(*i: Any) -> Any:
            index = (*i[:-2], rk, ri)
            data = xp[index].astype("int32")
            return te.sum(data * wp[i[-2], rk, i[-1], ri].astype("int32"), axis=[rk, ri])

        dot = te.compute((*lead, blocks, BLOCK_O), dot_value, name="dot")
        reduction = kdim

        def dot_at(i: Any) -> Any:
            row = i[batch:-1]  # x's leading index (numpy broadcasting: x has no fewer dims)
            index = (*row, i[-1] // BLOCK_O, i[-1] % BLOCK_O)
            return dot[index]

    def at(i):
        window = sums(i) if sums is not None else None
        o = i[1] if conv else i[-1]
        return _corrected(dot_at(i), o, window, zero, zw, channels, reduction)

    return at, _less_zero_times_sums(zero, wsum)


def _window_sum_conv(xp, c, kernel, op):
    """Per output position, ``sum(x')`` over its window (the real channels)."""
    attrs = op.call.attrs
    sh, sw_ = (int(s) for s in attrs.strides)
    dh, dw = (int(d) for d in attrs.dilation)
    kh, kw = kernel
    n, _, hp, wp_, _ = (int(d) for d in xp.shape)
    oh = (hp - dh * (kh - 1) - 1) // sh + 1
    ow = (wp_ - dw * (kw - 1) - 1) // sw_ + 1
    sc = te.reduce_axis((0, c), "sc")
    sy = te.reduce_axis((0, kh), "sy")
    sx = te.reduce_axis((0, kw), "sx")

    def value(b, y, xx):
        at = xp[b, sc // BLOCK_K, y * sh + sy * dh, xx * sw_ + sx * dw, sc % BLOCK_K]
        return te.sum(at.astype("int32"), axis=[sc, sy, sx])

    total = te.compute((n, oh, ow), value, name="window_sum")
    return lambda i: total[i[0], i[2], i[3]]


def _conv_acc(op, x, x_zero, w, zw, out_shape, channels):
    attrs = op.call.attrs
    sh, sw_ = (int(s) for s in attrs.strides)
    dh, dw = (int(d) for d in attrs.dilation)
    top, left, bottom, right = (int(p) for p in attrs.padding)
    groups = int(attrs.groups)
    n, c, h, wd = (int(d) for d in x.shape)
    _, cg, kh, kw = (int(d) for d in w.shape)
    per_group = channels // groups
    # the input less its zero point; in float32 where the sums are exact in it
    kind = "float32" if _exact_in_float(cg * kh * kw, x, w) else "int32"
    xp = te.compute(
        (n, c, h + top + bottom, wd + left + right),
        _plane_less_zero(x, x_zero, top, left, kind),
        name="pad_zero_point",
    )
    rc = te.reduce_axis((0, cg), "rc")
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")

    def acc(b: Any, o: Any, y: Any, xx: Any) -> Any:
        data = xp[b, (o // per_group) * cg + rc, y * sh + ry * dh, xx * sw_ + rx * dw]
        weight = w[o, rc, ry, rx].astype("int32") - at_channel(zw, o, channels).astype("int32")
        return te.sum(data * weight.astype(kind), axis=[rc, ry, rx])

    total = te.compute(out_shape, acc, name="acc")
    return lambda i: total[i].astype("int32")


def _matmul_acc(op, a, a_zero, b, zb, out_shape, channels):
    """A matmul's accumulator in the plain sum (a product of two activations, a weight
    the packed form does not take), as a function of the output index.

    Each operand less its zero point is a stage of its own (``a_less_zero``,
    ``b_less_zero``), so the sum is a plain matrix product, which the host's
    matmul rule tiles (:mod:`umahub.host.matmul`); in float32 where that is exact
    (:func:`_exact_in_float`: attention's products of 64 or 128 steps of 8-bit
    values), a multiply-add per step where int32 takes ``vpmulld`` and an add."""
    kdim = int(a.shape[-1])
    rk = te.reduce_axis((0, kdim), "rk")
    batch = len(out_shape) - 2
    kind = "float32" if _exact_in_float(kdim, a, b) else "int32"
    left = te.compute(
        a.shape, lambda *i: (a[i].astype("int32") - a_zero).astype(kind), name="a_less_zero"
    )
    right = te.compute(
        b.shape,
        lambda *i: (b[i].astype("int32") - at_channel(zb, i[-1], channels).astype("int32")).astype(
            kind
        ),
        name="b_less_zero",
    )

    def operand_index(t: te.Tensor, i: tuple) -> list[Any]:
        """``t``'s batch index for output batch index ``i`` (numpy's broadcasting)."""
        dims = [int(d) for d in t.shape[:-2]]
        offset = batch - len(dims)
        return [0 if d == 1 else i[offset + n] for n, d in enumerate(dims)]

    def acc(*i: Any) -> Any:
        row, col = i[-2], i[-1]
        at_a = (*operand_index(left, i[:-2]), row, rk)
        at_b = (*operand_index(right, i[:-2]), rk, col)
        return te.sum(left[at_a] * right[at_b], axis=[rk])

    total = te.compute(out_shape, acc, name="acc")
    return lambda i: total[i].astype("int32")


def operands(op: QuantizedOperator) -> list[Any]:
    """The Relax expressions :func:`quantized_kernel`'s function takes, in order."""
    e = op.exprs
    names = ["data", "data_scale", "data_zp", "weight", "weight_scale", "weight_zp"]
    if op.has_bias:
        names += ["bias", "bias_scale", "bias_zp"] if "bias_scale" in e else ["bias"]
    if op.residual is not None:
        names += ["residual", "residual_scale", "residual_zp"]
    return [e[n] for n in (*names, "output_scale", "output_zp")]


@relax.expr_functor.mutator
class _Lowerer(relax.PyExprMutator):
    """Replaces each quantized operator's final quantize by its integer kernel."""

    def __init__(self, mod: tvm.IRModule, known: Mapping[relax.Var, Any] | None = None):
        super().__init__(mod)
        self.count = 0
        self.known = known or {}
        self.double_pointwise = double_pays_in_pointwise()
        self.quad_taps = has_quad_instructions()

    def _quantization_lookup(self, var: relax.Var) -> Any:
        """A variable's bound value, or the constant a parameter is known to be."""
        found = self.lookup_binding(var)
        return self.known.get(var) if found is None else found

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.quantize"):
            return call
        try:
            op = describe_quantized(call, self._quantization_lookup)
        except ValueError:
            return self._mean(call)
        out_shape = shape_of(call)
        assert out_shape is not None  # describe_quantized refuses dynamic shapes
        args = operands(op)
        w_shape = shape_of(args[3])
        packed = (
            w_shape is not None
            and packed_form(op, tuple(w_shape), dtype_of(args[0]))
            and isinstance(bound_value(args[3], self.lookup_binding), Constant)
        )
        self.count += 1
        if packed:  # a constant weight: packed by its own function, which FoldConstant runs
            assert w_shape is not None
            pack = pack_weight_kernel(op, tuple(w_shape))
            bb = self.builder_
            wp = bb.emit(bb.call_te(pack, args[3], primfunc_name_hint="pack_weight"))
            ws = bb.emit(bb.call_te(weight_sum_kernel(), wp, primfunc_name_hint="weight_sum"))
            args = [*args[:3], wp, ws, *args[4:]]
        kernel = quantized_kernel(
            op,
            out_shape,
            dtype_of(call),
            prepacked=packed,
            double_pointwise=self.double_pointwise,
            quad_taps=self.quad_taps,
        )
        new = self.builder_.call_te(kernel, *args, primfunc_name_hint=f"q{op.kind}")
        # Opaque to FuseOps (TVM's kOpaque): fused with the float operators after it (a
        # residual block's dequantize, add, ReLU, quantize), LLVM rounds those floats
        # differently than where a partition ends the kernel, and a model run on the
        # host alone and one with its quantized operators on an accelerator gave outputs
        # a step apart (resnet18_int8: 119 of 1000).
        gv = new.args[0]
        self.builder_.update_func(gv, self.builder_.get()[gv].with_attr("op_pattern", 8))
        return new

    def _mean(self, call: relax.Call) -> relax.Expr:
        """A quantized mean's kernel in place of its quantize, else ``call`` as it is."""
        try:
            mean = describe_quantized_mean(call, self._quantization_lookup)
        except ValueError:
            return call  # not one umahub computes in integers: TVM's legalization
        out_shape = shape_of(call)
        assert out_shape is not None  # describe_quantized_mean refuses dynamic shapes
        self.count += 1
        kernel = mean_kernel(mean, tuple(int(d) for d in out_shape), dtype_of(call))
        return self.builder_.call_te(kernel, *mean_operands(mean), primfunc_name_hint="qmean")


def lower_quantized(
    mod: tvm.IRModule, known: Mapping[int, Any] | None = None
) -> tuple[tvm.IRModule, int]:
    """``mod`` with the quantized operators of its Relax functions computed in integers
    (see the module's docs), and how many were.

    ``known`` (parameter index of ``main`` -> relax.Constant): parameters whose
    values are known (a partition's constant inputs) where they are a scale or a
    zero point; the kernel still reads them as parameters. The kernels' arithmetic
    is chosen for the CPU of the enclosing ``with tvm.target.Target`` (umahub's
    build enters the model's target; without one, the forms that are fastest on
    most CPUs): the integers are the same on any.
    """
    changed = {}
    lowerer = None
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            params = func.params if name_of(gv) == "main" else []
            values = {params[i]: v for i, v in (known or {}).items() if i < len(params)}
            lowerer = _Lowerer(mod, values) if lowerer is None else lowerer
            lowerer.known = values
            new = lowerer.visit_expr(func)
            changed[gv] = new
    if lowerer is None or not lowerer.count:
        return mod, 0
    out = lowerer.builder_.get()
    for gv, func in changed.items():
        out[gv] = relax.analysis.remove_all_unused(func)
    return out, lowerer.count


def quantized_in_integers(known: Mapping[int, Any] | None = None) -> tvm.transform.Pass:
    """:func:`lower_quantized` as a module pass (before ``LegalizeOps``)."""

    @tvm.transform.module_pass(opt_level=0, name="umahub.QuantizedInIntegers")
    def transform(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        return lower_quantized(mod, known)[0]

    return transform
