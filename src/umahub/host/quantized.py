"""Quantized operators in integers: the host's lowering, and every partition's by default.

TVM legalizes ``dequantize -> conv2d -> quantize`` as it is written: the
integers become float32, the convolution runs in float32 and its result is
rounded back. That is four times the memory traffic of the integers, and the
float sums round differently on every kernel that orders them differently, so
two devices would not give the same integers. :func:`lower_quantized`
replaces each quantized operator (:func:`umahub.plugin.describe_quantized`)
by one kernel that computes it as :mod:`umahub.plugin.quantized` defines:
int32 accumulation, a bias in the accumulator's units, a fixed-point
requantization rounded half to even. The host's part of a model goes through
it before TVM's legalization (:mod:`umahub.host.lowering`), and so does every
partition that :func:`umahub.plugin.default_relax_to_tir` lowers: the npu, a
plugin's C kernels and the host give the same integers.

The kernel reads scales and zero points as tensors, so the same code serves
the host (where they are constants) and a partition (where they are its
parameters): the fixed-point multiplier, the bias in accumulator units and the
clamp are computed per output channel, in a stage of their own.
"""

from __future__ import annotations

import math
from typing import Any

import tvm
from tvm import relax, te, tirx

from umahub.plugin.patterns import dtype_of, shape_of
from umahub.plugin.quantized import QuantizedOperator, describe_quantized

__all__ = [
    "lower_quantized",
    "operands",
    "quantized_in_integers",
    "quantized_kernel",
]

_INT32_MAX = 2**31 - 1


def _int64(value: int) -> Any:
    return tirx.const(value, "int64")


def _read(t: te.Tensor, channel: Any, channels: int) -> Any:
    """``t`` (a scale or zero point: one value, or one per channel) at ``channel``."""
    size = 1
    for d in t.shape:
        size *= int(d)
    if size == 1:
        return t[tuple([0] * len(t.shape))]
    return t[channel] if len(t.shape) == 1 else t[tuple(_channel_index(t, channel, channels))]


def _channel_index(t: te.Tensor, channel: Any, channels: int) -> list[Any]:
    """The index of ``t`` (a bias broadcast against the output) for one output channel."""
    return [channel if int(d) == channels and int(d) != 1 else 0 for d in t.shape]


def _requantizer(op: QuantizedOperator, sx: Any, sw: Any, sy: Any, channels: int):
    """Per output channel: (m, k), the fixed-point multiplier of step 3."""

    def multiplier(o: Any) -> Any:
        value = (
            _read(sx, o, channels).astype("float64")
            * _read(sw, o, channels).astype("float64")
            / _read(sy, o, channels).astype("float64")
        )
        return tirx.reinterpret("int64", value)

    bits = te.compute((channels,), multiplier, name="requant_bits")
    i64 = _int64
    exponent = te.compute(
        (channels,), lambda o: (bits[o] >> i64(52)) & i64(0x7FF), name="requant_exp"
    )

    def m_of(o: Any) -> Any:
        significand = (bits[o] & i64((1 << 52) - 1)) | i64(1 << 52)
        return tirx.Select(exponent[o] < i64(991), i64(0), significand >> i64(22))

    def k_of(o: Any) -> Any:
        return tirx.Select(exponent[o] < i64(991), i64(62), i64(1053) - exponent[o])

    return te.compute((channels,), m_of, name="requant_m"), te.compute(
        (channels,), k_of, name="requant_k"
    )


def _bias(op: QuantizedOperator, bias: list, sx: Any, sw: Any, channels: int) -> te.Tensor:
    """The bias in accumulator units (int32), per output channel (step 2)."""
    b = bias[0]

    def value(o: Any) -> Any:
        raw = b[tuple(_channel_index(b, o, channels))]
        units = _read(sx, o, channels).astype("float64") * _read(sw, o, channels).astype("float64")
        if len(bias) == 3:  # dequantized: (b - zp) * scale in float32, as the graph says
            scale, zero = bias[1], bias[2]
            zp = _read(zero, o, channels).astype("int32")
            as_float = (raw.astype("int32") - zp).astype("float32") * _read(scale, o, channels)
            exact = tirx.all(
                zp == 0,
                _read(scale, o, channels)
                == _read(sx, o, channels).astype("float32") * _read(sw, o, channels),
            )
        else:
            as_float, exact = raw, None
        rounded = tirx.nearbyint(as_float.astype("float64") / units)
        rounded = tirx.max(tirx.min(rounded, float(_INT32_MAX)), float(-_INT32_MAX)).astype("int32")
        if exact is None or str(b.dtype) != "int32":
            return rounded
        return tirx.Select(exact, raw, rounded)

    return te.compute((channels,), value, name="bias_q")


def _bounds(op: QuantizedOperator, sy: Any, zy: Any, dtype: str) -> tuple[Any, Any]:
    """The output's clamp: its type's range, narrowed by the activation (in output units)."""
    low = tirx.const(int(tvm.tirx.min_value(dtype).value), "int64")
    high = tirx.const(int(tvm.tirx.max_value(dtype).value), "int64")
    zero = _read(zy, 0, 1).astype("int64")
    if op.activation == "relu":
        return tirx.max(low, tirx.min(high, zero)), high
    if isinstance(op.activation, tuple):
        _, lo, hi = op.activation

        def quantized(bound: float) -> Any:
            step = tirx.nearbyint(tirx.const(bound, "float32") / _read(sy, 0, 1))
            return step.astype("int64") + zero

        if math.isfinite(lo):
            low = tirx.max(low, tirx.min(high, quantized(lo)))
        if math.isfinite(hi):
            high = tirx.min(high, tirx.max(low, quantized(hi)))
    return low, high


def quantized_kernel(op: QuantizedOperator, out_shape: tuple[int, ...], out_dtype: str):
    """The TE function computing ``op`` exactly, for ``BlockBuilder.call_te``.

    Its arguments, in order: the input, its scale and zero point; the weight,
    its scale and zero point; the bias (and, dequantized, its scale and zero
    point) if there is one; the output's scale and zero point (see
    :func:`operands`).
    """
    conv = op.kind == "conv2d"
    channels = out_shape[1] if conv else out_shape[-1]

    def kernel(x: te.Tensor, sx: Any, zx: Any, w: te.Tensor, sw: Any, zw: Any, *rest: Any):
        bias = list(rest[:-2])
        sy, zy = rest[-2:]
        x_zero = _read(zx, 0, 1).astype("int32")

        if conv:
            acc = _conv_acc(op, x, x_zero, w, zw, out_shape, channels)
        else:
            acc = _matmul_acc(op, x, x_zero, w, zw, out_shape, channels)
        m, k = _requantizer(op, sx, sw, sy, channels)
        bias_q = _bias(op, bias, sx, sw, channels) if bias else None
        low, high = _bounds(op, sy, zy, out_dtype)
        zero = _read(zy, 0, 1).astype("int64")

        def out(*i: Any) -> Any:
            o = i[1] if conv else i[-1]
            a = acc[i] if bias_q is None else acc[i] + bias_q[o]
            p = a.astype("int64") * m[o]
            one = _int64(1)
            rounded = (p + (one << (k[o] - one)) - one + ((p >> k[o]) & one)) >> k[o]
            return tirx.max(low, tirx.min(high, rounded + zero)).astype(out_dtype)

        return te.compute(out_shape, out, name="requantized")

    return kernel


def _conv_acc(op, x, x_zero, w, zw, out_shape, channels):
    attrs = op.call.attrs
    sh, sw_ = (int(s) for s in attrs.strides)
    dh, dw = (int(d) for d in attrs.dilation)
    top, left, bottom, right = (int(p) for p in attrs.padding)
    groups = int(attrs.groups)
    n, c, h, wd = (int(d) for d in x.shape)
    _, cg, kh, kw = (int(d) for d in w.shape)
    per_group = channels // groups
    fill = x_zero.astype(x.dtype)

    def padded(b: Any, ch: Any, i: Any, j: Any) -> Any:
        inside = tirx.all(i >= top, i < h + top, j >= left, j < wd + left)
        return tirx.if_then_else(inside, x[b, ch, i - top, j - left], fill)

    xp = te.compute((n, c, h + top + bottom, wd + left + right), padded, name="pad_zero_point")
    rc = te.reduce_axis((0, cg), "rc")
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")

    def acc(b: Any, o: Any, y: Any, xx: Any) -> Any:
        data = xp[b, (o // per_group) * cg + rc, y * sh + ry * dh, xx * sw_ + rx * dw]
        weight = w[o, rc, ry, rx].astype("int32") - _read(zw, o, channels).astype("int32")
        return te.sum((data.astype("int32") - x_zero) * weight, axis=[rc, ry, rx])

    return te.compute(out_shape, acc, name="acc")


def _matmul_acc(op, a, a_zero, b, zb, out_shape, channels):
    kdim = int(a.shape[-1])
    rk = te.reduce_axis((0, kdim), "rk")
    batch = len(out_shape) - 2

    def operand_index(t: te.Tensor, i: tuple) -> list[Any]:
        """``t``'s batch index for output batch index ``i`` (numpy's broadcasting)."""
        dims = [int(d) for d in t.shape[:-2]]
        offset = batch - len(dims)
        return [0 if d == 1 else i[offset + n] for n, d in enumerate(dims)]

    def acc(*i: Any) -> Any:
        row, col = i[-2], i[-1]
        left = a[tuple([*operand_index(a, i[:-2]), row, rk])].astype("int32") - a_zero
        right = b[tuple([*operand_index(b, i[:-2]), rk, col])].astype("int32") - _read(
            zb, col, channels
        ).astype("int32")
        return te.sum(left * right, axis=[rk])

    return te.compute(out_shape, acc, name="acc")


def operands(op: QuantizedOperator) -> list[Any]:
    """The Relax expressions :func:`quantized_kernel`'s function takes, in order."""
    e = op.exprs
    names = ["data", "data_scale", "data_zp", "weight", "weight_scale", "weight_zp"]
    if op.has_bias:
        names += ["bias", "bias_scale", "bias_zp"] if "bias_scale" in e else ["bias"]
    return [e[n] for n in (*names, "output_scale", "output_zp")]


@relax.expr_functor.mutator
class _Lowerer(relax.PyExprMutator):
    """Replaces each quantized operator's final quantize by its integer kernel."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.count = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.quantize"):
            return call
        try:
            op = describe_quantized(call, self.lookup_binding)
        except ValueError:
            return call  # not one umahub computes in integers: TVM's legalization
        out_shape = shape_of(call)
        assert out_shape is not None  # describe_quantized refuses dynamic shapes
        kernel = quantized_kernel(op, out_shape, dtype_of(call))
        self.count += 1
        return self.builder_.call_te(kernel, *operands(op), primfunc_name_hint=f"q{op.kind}")


def lower_quantized(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """``mod`` with the quantized operators of its Relax functions computed in integers
    (see the module's docs), and how many were."""
    lowerer = _Lowerer(mod)
    changed = {}
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            new = lowerer.visit_expr(func)
            changed[gv] = new
    if not lowerer.count:
        return mod, 0
    out = lowerer.builder_.get()
    for gv, func in changed.items():
        out[gv] = relax.analysis.remove_all_unused(func)
    return out, lowerer.count


def quantized_in_integers() -> tvm.transform.Pass:
    """:func:`lower_quantized` as a module pass (before ``LegalizeOps``)."""

    @tvm.transform.module_pass(opt_level=0, name="umahub.QuantizedInIntegers")
    def transform(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        return lower_quantized(mod)[0]

    return transform
