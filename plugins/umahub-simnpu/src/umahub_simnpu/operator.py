"""A partition's quantized operator as the simnpu computes it: every integer fixed at
compile time.

:func:`plan` reads the partition (one quantized convolution or matmul, see
:mod:`umahub.plugin.quantization`) with the values of its constant inputs
(``CompileContext.constants``) and gives an :class:`OperatorPlan`: shapes,
which parameter is the input, the residual and the output, and the per
output channel tables the vector unit reads: the bias in accumulator units
(with the input's zero point folded in), the fixed-point multiplier and shift,
and the residual's shift. Each value is computed as the host's integer
lowering (:mod:`umahub.host.quantized`) computes it, bit for bit.

How the arithmetic maps onto an int8 machine:

* ``acc = sum((x - x_zp) * (w - w_zp))``. The weight's zero point is folded
  into the weight at compile time (``w' = w - w_zp``, which must fit int8); a
  uint8 input is made int8 by the load (``x' = x - 128``, ``x_zp' = x_zp -
  128``), an int8 one is taken as it is (``x' = x``). Padding is ``x_zp'``,
  so ``acc = sum(x' * w') - x_zp' * sum(w')``: the matrix core computes the
  first term, the second is a per-channel constant folded into the bias.
* ``bias``: the host's ``bias_q`` (exact int32 or rounded to accumulator
  units), minus ``x_zp' * sum(w')``, in int32 (wrapping, as the host's does).
* requantization ``(m, k)`` per channel, the residual's ``(m_r, k_r)``, the
  output's zero point and clamp: :func:`umahub.plugin.requantization` and
  the host's float32 quantization of a clip's bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

import umahub.plugin as up

__all__ = [
    "OperatorPlan",
    "Unsupported",
    "composite_of",
    "plan",
    "plan_group",
    "weight_values",
]

_INT32_MAX = 2**31 - 1


class Unsupported(up.Unsupported, ValueError):
    """A partition the simnpu does not compute (the message says why): its lowering
    raises it, and umahub puts the partition back on the host with that message
    (a refusal, :class:`umahub.plugin.Unsupported`, not a failure)."""


@dataclass(frozen=True)
class OperatorPlan:
    """One quantized operator, in the integers the simnpu computes it with.

    Attributes:
        kind: ``"conv2d"`` or ``"matmul"``.
        data: index of the input among the PrimFunc's parameters.
        residual: index of the residual, or None.
        output: index of the output (the last parameter).
        x_shape, y_shape: shapes of the input and the output.
        x_dtype, y_dtype: ``"int8"``/``"uint8"``.
        x_zero: the input's zero point in the machine's int8 (``x_zp'``).
        weight: ``w - w_zp`` as int8, OIHW (conv2d) or [K, N] (matmul).
        bias: int32 per output channel, ``x_zp' * sum(w')`` subtracted.
        multiplier, shift: the requantization ``(m, k)`` per output channel.
        residual_dtype: the residual's type, or None.
        residual_zero: its zero point.
        residual_multiplier: ``m_r``.
        residual_shift: ``k - k_r`` per output channel.
        y_zero: the output's zero point.
        low, high: the output's clamp (activation and type).
        strides, padding, dilation: a convolution's (``padding`` top, left, bottom, right).
    """

    kind: str
    data: int
    residual: int | None
    output: int
    x_shape: tuple[int, ...]
    y_shape: tuple[int, ...]
    x_dtype: str
    y_dtype: str
    x_zero: int
    weight: Any
    bias: Any
    multiplier: Any
    shift: Any
    residual_dtype: str | None
    residual_zero: int
    residual_multiplier: int
    residual_shift: Any
    y_zero: int
    low: int
    high: int
    strides: tuple[int, int] = (1, 1)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)
    dilation: tuple[int, int] = (1, 1)

    @property
    def channels(self) -> int:
        """Output channels."""
        return int(self.weight.shape[0] if self.kind == "conv2d" else self.weight.shape[1])


def composite_of(function: Any) -> tuple[Any, list[int]]:
    """The one composite function a partition calls, and for each of its parameters the
    index of the partition's parameter passed to it.

    Raises:
        Unsupported: the partition is not one call of one composite on its parameters.
    """
    from tvm import relax

    calls = []
    bound: dict[Any, Any] = {}
    for block in function.body.blocks:
        for binding in block.bindings:
            bound[binding.var] = binding.value
            if isinstance(binding.value, relax.Call):
                calls.append(binding.value)
    found = []
    for call in calls:
        callee = bound.get(call.op, call.op)
        if isinstance(callee, relax.Function) and callee.attrs and "Composite" in callee.attrs:
            found.append((call, callee))
    if len(found) != 1:
        raise Unsupported(f"a partition of {len(found)} composite functions (one is computed)")
    call, composite = found[0]
    params = list(function.params)
    where = []
    for arg in call.args:
        matches = [i for i, p in enumerate(params) if arg.same_as(p)]
        if not matches:
            raise Unsupported("a composite argument that is not one of the partition's inputs")
        where.append(matches[0])
    return composite, where


def _lookup(composite: Any, where: list[int], constants: dict[int, Any]):
    """``lookup(var)`` for :func:`umahub.plugin.describe_quantized` over ``composite``:
    its bindings, and each parameter that is a constant input bound to its value."""
    from tvm import relax

    bound: dict[Any, Any] = {}
    for block in composite.body.blocks:
        for binding in block.bindings:
            bound[binding.var] = binding.value
    for param, index in zip(composite.params, where):
        if index in constants:
            bound[param] = relax.const(constants[index])
    return bound.get


def _root(composite: Any) -> Any:
    """The composite's result: the variable its final quantize is bound to."""
    return composite.body.body


def _constant(expr: Any) -> Any:
    """The numpy value of a Relax constant (its class and field moved between TVM
    versions: ``relax.Constant.data`` before 0.27, ``ir.Constant.value`` in it), or None."""
    if not any(t.__name__ == "Constant" for t in type(expr).__mro__):
        return None
    value = getattr(expr, "data", None)
    value = value if value is not None else expr.value
    return value.numpy()


def weight_values(op: Any, lookup: Any) -> Any:
    """The weight's value (numpy), or None where it is not a constant."""
    return _constant(up.bound_value(op.exprs["weight"], lookup))


def _value(expr: Any, lookup: Any) -> Any:
    value = _constant(up.bound_value(expr, lookup))
    if value is None:
        raise Unsupported("a scale, zero point, weight or bias that is not a constant")
    return value


def _per_channel(value: Any, channels: int) -> Any:
    """A scalar, a per-channel vector or a bias broadcast against the output, per channel."""
    flat = np.asarray(value).reshape(-1)
    if flat.size == 1:
        return np.broadcast_to(flat, (channels,)).copy()
    if flat.size != channels:
        raise Unsupported(f"{flat.size} values for {channels} output channels")
    return flat.copy()


def _bias(op: Any, lookup: Any, sx: Any, sw: Any, channels: int) -> Any:
    """The host's ``bias_q`` (:func:`umahub.host.quantized._bias`), per channel, in numpy."""
    raw_value = _value(op.exprs["bias"], lookup)
    raw = _per_channel(raw_value, channels)
    units = np.float64(sx) * sw.astype(np.float64)
    exact = None
    if "bias_scale" in op.exprs:
        scale = _per_channel(_value(op.exprs["bias_scale"], lookup), channels).astype(np.float32)
        zero = _per_channel(_value(op.exprs["bias_zp"], lookup), channels).astype(np.int32)
        with np.errstate(over="ignore"):
            as_float = (raw.astype(np.int32) - zero).astype(np.float32) * scale
        exact = (zero == 0) & (scale == np.float32(sx) * sw.astype(np.float32))
    else:
        as_float = raw
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = np.rint(as_float.astype(np.float64) / units)
    rounded = np.maximum(np.minimum(rounded, float(_INT32_MAX)), float(-_INT32_MAX))
    rounded = rounded.astype(np.int32)
    if exact is None or np.asarray(raw_value).dtype != np.int32:
        return rounded
    return np.where(exact, raw.astype(np.int32), rounded)


def _bounds(op: Any, sy: Any, zy: int, dtype: str) -> tuple[int, int]:
    """The host's clamp (:func:`umahub.host.quantized._bounds`)."""
    info = np.iinfo(dtype)
    low, high = int(info.min), int(info.max)
    if op.activation == "relu":
        return max(low, min(high, zy)), high
    if isinstance(op.activation, tuple):
        _, lo, hi = op.activation

        def quantized(bound: float) -> int:
            return int(np.rint(np.float32(bound) / np.float32(sy))) + zy

        if math.isfinite(lo):
            low = max(low, min(high, quantized(lo)))
        if math.isfinite(hi):
            high = min(high, max(low, quantized(hi)))
    return low, high


def plan(function: Any, constants: dict[int, Any]) -> OperatorPlan:
    """The :class:`OperatorPlan` of a partition ``function`` whose constant inputs have
    the values ``constants`` (by parameter index; numpy arrays or TVM tensors).

    Raises:
        Unsupported: what the simnpu does not compute (the reason).
    """
    values = {
        i: (v.numpy() if hasattr(v, "numpy") else np.asarray(v)) for i, v in constants.items()
    }
    composite, where = composite_of(function)
    return _plan(composite, where, values, len(function.params))


def plan_group(function: Any) -> OperatorPlan:
    """The :class:`OperatorPlan` of a candidate group as placement by cost gives it to
    ``umahub_cost``: the composite's body alone, its constants bound.

    Raises:
        Unsupported: what the simnpu does not compute (the reason).
    """
    return _plan(function, list(range(len(function.params))), {}, len(function.params))


def _plan(
    composite: Any, where: list[int], values: dict[int, Any], outputs_at: int
) -> OperatorPlan:
    """The plan of ``composite``, whose parameter ``i`` is the partition's parameter
    ``where[i]``, constants ``values`` by partition parameter, output at ``outputs_at``."""
    lookup = _lookup(composite, where, values)
    try:
        op = up.describe_quantized(_root(composite), lookup)
    except ValueError as exc:
        raise Unsupported(str(exc)) from exc
    refusal = refusal_of(op, lookup)
    if refusal:
        raise Unsupported(refusal)
    index = {p: where[i] for i, p in enumerate(composite.params)}

    def parameter(role: str) -> int:
        expr = op.exprs[role]
        if expr not in index:
            raise Unsupported(f"the {role} is not one of the partition's inputs")
        return index[expr]

    x_shape = tuple(int(d) for d in up.shape_of(op.exprs["data"]))
    y_shape = tuple(int(d) for d in up.shape_of(_root(composite)))
    weight = weight_values(op, lookup)
    channels = int(weight.shape[0] if op.kind == "conv2d" else weight.shape[-1])
    sx = np.float32(op.data.scale.reshape(()))
    sw = _per_channel(op.weight.scale, channels).astype(np.float32)
    sy = np.float32(op.output.scale.reshape(()))
    w_zero = _per_channel(op.weight.zero_point, channels).astype(np.int64)
    axis = (
        (slice(None),) + (None,) * (weight.ndim - 1) if op.kind == "conv2d" else (None, slice(None))
    )
    folded = weight.astype(np.int64) - w_zero[axis]
    x_zero = int(op.data.zero_point.reshape(())) - (128 if op.data.dtype == "uint8" else 0)
    reduce_axes = tuple(range(1, weight.ndim)) if op.kind == "conv2d" else (0,)
    weight_sum = folded.sum(axis=reduce_axes)
    bias_q = (
        _bias(op, lookup, sx, sw, channels).astype(np.int64)
        if op.has_bias
        else np.zeros(channels, np.int64)
    )
    bias = _wrap32(bias_q - x_zero * weight_sum)
    m, k = up.requantization(op.multiplier)
    m, k = _per_channel(m, channels), _per_channel(k, channels)
    y_zero = int(op.output.zero_point.reshape(()))
    low, high = _bounds(op, sy, y_zero, op.output.dtype)
    residual = residual_dtype = None
    residual_zero = residual_m = 0
    residual_shift = np.zeros(channels, np.int64)
    if op.residual is not None:
        residual = parameter("residual")
        residual_dtype = op.residual.dtype
        residual_zero = int(op.residual.zero_point.reshape(()))
        m_r, k_r = up.requantization(
            np.float64(op.residual.scale.reshape(())) / np.float64(op.output.scale.reshape(()))
        )
        residual_m = int(np.asarray(m_r).reshape(-1)[0])
        residual_shift = k - int(np.asarray(k_r).reshape(-1)[0])
    conv = {}
    if op.kind == "conv2d":
        attrs = op.call.attrs
        conv = {
            "strides": tuple(int(s) for s in attrs.strides),
            "padding": tuple(int(p) for p in attrs.padding),
            "dilation": tuple(int(d) for d in attrs.dilation),
        }
    return OperatorPlan(
        kind=op.kind,
        data=parameter("data"),
        residual=residual,
        output=outputs_at,
        x_shape=x_shape,
        y_shape=y_shape,
        x_dtype=op.data.dtype,
        y_dtype=op.output.dtype,
        x_zero=x_zero,
        weight=folded.astype(np.int8),
        bias=bias,
        multiplier=m.astype(np.int64),
        shift=k.astype(np.int64),
        residual_dtype=residual_dtype,
        residual_zero=residual_zero,
        residual_multiplier=residual_m,
        residual_shift=np.asarray(residual_shift, np.int64),
        y_zero=y_zero,
        low=low,
        high=high,
        **conv,
    )


def _wrap32(values: Any) -> Any:
    """int64 values as int32, wrapping (two's complement), as the host's int32 adds do."""
    return ((np.asarray(values, np.int64) + 2**31) % 2**32 - 2**31).astype(np.int32)


def refusal_of(op: Any, lookup: Any) -> str:
    """Why the simnpu does not compute ``op`` exactly ("" when it does)."""
    roles = [("input", op.data), ("weight", op.weight), ("output", op.output)]
    if op.residual is not None:
        roles.append(("residual", op.residual))
    for role, params in roles:
        if params.dtype not in ("int8", "uint8"):
            return f"a {params.dtype} {role}; the simnpu's datapath is 8-bit"
    if not op.weight_constant:
        return "a weight computed at run time; the simnpu's weights are constants"
    if op.kind == "conv2d":
        attrs = op.call.attrs
        groups = int(attrs.groups)
        if groups != 1:
            return (
                f"a grouped convolution ({groups} groups, depthwise included); the simnpu's "
                "matrix core computes dense convolutions only"
            )
        if any(int(p) > 255 for p in attrs.padding):
            return "padding of more than 255"
    else:
        w_shape = up.shape_of(op.exprs["weight"]) or ()
        if len(w_shape) != 2:
            return f"a {len(w_shape)}-D weight; the simnpu takes a 2-D matmul weight"
    weight = weight_values(op, lookup)
    if weight is not None and op.weight.zero_point is not None:
        axis = 0 if op.kind == "conv2d" else weight.ndim - 1
        zero = np.asarray(op.weight.zero_point, np.int64).reshape(-1)
        shape = [1] * weight.ndim
        if zero.size > 1:
            shape[axis] = zero.size
        folded = weight.astype(np.int64) - zero.reshape(shape)
        if folded.min(initial=0) < -128 or folded.max(initial=0) > 127:
            return (
                "weights minus their zero point leave int8 (the simnpu folds the weight's "
                "zero point into int8 weights)"
            )
    return ""
