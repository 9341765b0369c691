"""Quantized operators: the patterns that claim them and what a check reads of them.

A quantized model reaches umahub as ``R.quantize`` / ``R.dequantize`` around
float operators (ONNX's QDQ form, PyTorch's PT2E; see the guide's page on
quantized models). A convolution or a matrix product between them,

.. code-block:: text

    dequantize(x) , dequantize(w)  ->  conv2d / matmul  (+ bias)  (+ ReLU / clip)  ->  quantize

is *one quantized operator*: its inputs and its output are integers, and
umahub computes it in integers, exactly (:func:`requantization`). A plugin
claims it in one line::

    @up.hookimpl(accelerator="my_npu")
    def umahub_patterns():
        return up.quantized("my_npu", "conv2d", check=conv_ok) + up.quantized("my_npu", "matmul")

and a check reads its scales and zero points with :func:`quantized_operator`::

    def conv_ok(ctx):
        op = up.quantized_operator(ctx)
        if op.weight.per_channel:
            return up.Refusal("per-channel weight scales; the array takes one scale per tensor")
        return True

An elementwise function of the quantized operator's 8-bit output that umahub
has made a table of 256 entries (a SiLU, a sigmoid, a GELU between two
quantized operators: ``take(table, y)``, see the guide's page on quantized
models) can be claimed with it, ``quantized(..., tables=True)``: the kernel
reads the table per element of its output, in its epilogue, and the output
never leaves the accelerator for the host's lookup. :func:`table_lookup` is
that pattern alone, for an accelerator that reads tables after any operator.

A quantized operator is claimed whole or not at all: umahub refuses any other
pattern's match that holds part of one, or its end without the rest (a float
``conv2d`` pattern would otherwise take the convolution out of its integer
operator and compute it in float32), and any match of one that umahub does
not compute in integers (that runs on the host, as written). What no
accelerator claims, the host computes with the same integer arithmetic, so
every path gives the same integers, bit for bit.

The arithmetic, defined once (the host's lowering, the kit's reference and a
plugin's kernels all follow it):

1. ``acc = sum((x - x_zp) * (w - w_zp))`` in int32, over the reduction of the
   convolution or product; a convolution's padding is ``x_zp`` (a float 0).
2. ``acc += bias_q``: an int32 bias whose scale is ``x_scale * w_scale`` (as
   float32, the scale ONNX Runtime's quantizer gives it) and zero point 0 is
   added as it is; any other bias (a float one, as PT2E leaves it) is first
   rounded to those units, ``nearbyint(f64(b) / (f64(x_scale) * f64(w_scale)))``.
3. ``M = f64(x_scale) * f64(w_scale) / f64(y_scale)`` (per output channel),
   as a fixed-point ``m * 2**-k`` (:func:`requantization`): ``m`` is the top 31
   bits of M's significand, truncated.
4. ``y = round_half_to_even(acc * m / 2**k) + y_zp``, in int64, then clamped
   to the activation's bounds (ReLU: ``y_zp``; clip: its bounds quantized as
   ``QuantizeLinear`` does it) and saturated to the output type. With a
   residual ``r`` added before the activation (``conv -> + dequantize(r) ->
   ReLU -> quantize``, as PyTorch's X86 quantizer fuses a residual block's
   sum): ``y = round_half_to_even((acc * m + ((r - r_zp) * m_r << (k - k_r)))
   / 2**k) + y_zp``, ``(m_r, k_r)`` the fixed point of ``r_scale / y_scale``
   (``0 <= k - k_r <= 22``, else it is not computed in integers). Without a
   residual, ``nearbyint(f64(acc) * (m * 2**-k))`` is the same integer wherever
   ``k <= 52 - bits`` of the output type (44 for 8 bits): umahub's flat
   depthwise kernel computes it so where the scales are constants
   (:func:`umahub.host.quantized.requantizes_in_double` says why it is exact).

A mean of a dequantized 8-bit tensor, quantized (``quantize(mean(dequantize(x)))``,
a global average pooling in QDQ form, one output scale, the input's one scale or
one per channel of an axis the mean keeps: a *quantized mean*,
:mod:`umahub.plugin.integer_mean`) is computed in the same integers:
``acc = sum(x - x_zp)`` in int32 over the mean's ``n`` elements, then steps 3
and 4 with ``M = f64(x_scale) / (f64(y_scale) * n)``. A float32 sum
would give a different last bit for every order a kernel adds in.

Why this module is long: the arithmetic, the patterns and what a check reads of
a match are one definition, which plugins, the host and the kit share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# TVM is imported inside the functions (see umahub.plugin.patterns).

__all__ = [
    "KINDS",
    "QuantParams",
    "QuantizedOperator",
    "bound_value",
    "dequantized",
    "describe_quantized",
    "quantized",
    "quantized_operator",
    "requantization",
    "requantize",
    "table_lookup",
    "table_of",
]

#: The operators :func:`quantized` makes patterns for.
KINDS = ("conv2d", "matmul")

#: How many bits a residual's term may be shifted left to meet the accumulator's
#: (step 4): ``(r - r_zp) * m_r`` has 40 bits, the int64 sum room for 62.
RESIDUAL_SHIFT_MAX = 22

#: The activations a quantized operator takes: both are a clamp of its integers.
QUANTIZED_ACTIVATIONS = ("relax.nn.relu", "relax.clip")


# ------------------------------------------------------------------ the arithmetic


def requantization(multiplier: Any) -> tuple[Any, Any]:
    """``(m, k)`` int64 arrays with ``multiplier ~= m * 2**-k`` (step 3 of the module's docs).

    ``m`` is the top 31 bits of each float64 multiplier's significand
    (``2**30 <= m < 2**31``), truncated. A multiplier below ``2**-32`` gives
    ``m = 0, k = 62`` (every int32 product of it rounds to 0); one of ``2**30``
    or more cannot be represented and raises ValueError.
    """
    import numpy as np

    value = np.ascontiguousarray(np.asarray(multiplier, dtype=np.float64))
    if np.any(~np.isfinite(value)) or np.any(value < 0) or np.any(value >= 2.0**30):
        raise ValueError(f"a requantization multiplier out of range: {value.ravel()[:4]}")
    bits = value.view(np.int64)
    exponent = (bits >> 52) & 0x7FF
    m = ((bits & ((1 << 52) - 1)) | (1 << 52)) >> 22
    k = 1053 - exponent
    tiny = k > 62
    return np.where(tiny, 0, m).astype(np.int64), np.where(tiny, 62, k).astype(np.int64)


def requantize(acc: Any, multiplier: Any, zero_point: int, low: int, high: int, dtype: str) -> Any:
    """Step 4 in numpy: the int32 accumulators ``acc`` as integers of ``dtype``.

    ``multiplier`` broadcasts against ``acc`` (per output channel: shaped to
    its axis); ``low``/``high`` are the activation's bounds. The reference a
    kernel is checked against.
    """
    import numpy as np

    m, k = requantization(multiplier)
    p = np.asarray(acc, dtype=np.int64) * m
    rounded = (p + (np.int64(1) << (k - 1)) - 1 + ((p >> k) & 1)) >> k
    info = np.iinfo(dtype)
    low, high = max(low, int(info.min)), min(high, int(info.max))
    return np.clip(rounded + zero_point, low, high).astype(dtype)


# ------------------------------------------------------------------ the patterns


def dequantized(data: Any = None) -> Any:
    """``dequantize(data, scale, zero_point)`` with constant scale and zero point;
    ``data`` any tensor unless given (``is_const()`` for a weight)."""
    from tvm.relax.dpl import is_const, is_op, wildcard

    return is_op("relax.dequantize")(
        data if data is not None else wildcard(), is_const(), is_const()
    )


def table_lookup(data: Any = None) -> Any:
    """``take(table, data)``: 8-bit integers read through a constant table, as umahub
    writes an elementwise function of one 8-bit tensor (a table of its 256 values);
    an int8 ``data`` is read by its bits, ``take(table, astype(data, "uint8"))``.
    ``data`` any tensor unless given. A check reads the match with :func:`table_of`
    (which refuses an index that could fall outside the table)."""
    from tvm.relax.dpl import is_const, is_op, wildcard

    data = data if data is not None else wildcard()
    as_bytes = is_op("relax.astype")(data)
    return is_op("relax.take")(is_const(), data) | is_op("relax.take")(is_const(), as_bytes)


def table_of(root: Any, lookup: Any) -> tuple[Any, Any]:
    """``(table, data)`` of a :func:`table_lookup` ``root`` (a ``relax.take`` call):
    the table (a ``relax.Constant``) and the tensor it is indexed by (before the
    ``astype``); ``lookup(var)`` gives a variable's bound value.

    Raises ValueError, with the reason, when the lookup could read outside the
    table: an index not uint8 (an int8 read as itself), a table not one axis of
    at least 256 entries, a take along another axis.
    """
    from umahub._tvm import Constant, constant_value
    from umahub.plugin.patterns import dtype_of

    take = _call(root, lookup, "relax.take")
    if take is None:
        raise ValueError("it is no table lookup (take)")
    table, index = bound_value(take.args[0], lookup), take.args[1]
    if not isinstance(table, Constant):
        raise ValueError("a lookup in a table that is not a constant")
    entries = constant_value(table).shape
    if len(entries) != 1 or int(entries[0]) < 256:
        raise ValueError(f"a lookup in a table of shape {tuple(entries)}, not 256 entries")
    if take.attrs.axis is not None and int(take.attrs.axis) != 0:
        raise ValueError("a lookup along an axis other than the table's")
    if dtype_of(index) != "uint8":
        raise ValueError(f"a lookup indexed by {dtype_of(index)} (uint8 indexes 256 entries)")
    data = index
    cast = _call(index, lookup, "relax.astype")
    if cast is not None:
        if dtype_of(cast.args[0]) not in ("int8", "uint8"):
            raise ValueError(f"a lookup indexed by {dtype_of(cast.args[0])} read as uint8")
        data = cast.args[0]
    return table, data


def _producer(kind: str) -> Any:
    from tvm.relax.dpl import is_const, is_op

    if kind == "conv2d":
        return is_op("relax.nn.conv2d")(dequantized(), dequantized(is_const()))
    if kind == "matmul":
        return is_op("relax.matmul")(dequantized(), dequantized())
    raise ValueError(f"no quantized pattern for {kind!r}; the kinds are {', '.join(KINDS)}")


def quantized(
    accelerator: str, kind: str, check: Any = None, tables: bool = False
) -> list[tuple[str, Any, dict, Any]]:
    """The quantized ``kind`` (``"conv2d"`` or ``"matmul"``) with its epilogues, as
    named patterns, largest match first (see the module's docs for the form).

    Names: ``"<accelerator>.q<kind>"`` plus ``_bias_residual_act``,
    ``_bias_residual``, ``_residual_act``, ``_residual``, ``_bias_act``,
    ``_bias``, ``_act`` or nothing (a residual: a dequantized tensor computed
    at run time, added before the activation). A convolution's weight is a
    constant (a matmul's second operand may be computed: attention). The bias
    is a constant, int32 under a dequantize or float; the activation ReLU or a
    clip. Each pattern has ``check``: umahub's own conditions (:func:`describe_quantized`: one scale
    for the input, per-tensor or per-output-channel for the weight and the
    output...) are checked before it.

    With ``tables``, each form also with its output read through a table
    (:func:`table_lookup`), named with ``_table`` after the form's name and
    tried before every form without one: the accelerator's kernel then reads
    the table in its epilogue (:attr:`QuantizedOperator.table` says which).
    """
    from tvm.relax.dpl import is_const, is_op, wildcard

    producer = _producer(kind)
    bias_value = dequantized(is_const()) | is_const()
    biased = is_op("relax.add")(producer, bias_value) | is_op("relax.add")(bias_value, producer)

    def activated(x: Any) -> Any:
        return is_op("relax.nn.relu")(x) | is_op("relax.clip")(x, wildcard(), wildcard())

    def out(x: Any) -> Any:
        return is_op("relax.quantize")(x, is_const(), is_const())

    def residual(x: Any) -> Any:
        added = dequantized(~is_const())
        return is_op("relax.add")(x, added) | is_op("relax.add")(added, x)

    name = f"{accelerator}.q{kind}"
    checked = _exact_first(check)
    forms = [
        (f"{name}_bias_residual_act", out(activated(residual(biased)))),
        (f"{name}_bias_residual", out(residual(biased))),
        (f"{name}_residual_act", out(activated(residual(producer)))),
        (f"{name}_residual", out(residual(producer))),
        (f"{name}_bias_act", out(activated(biased))),
        (f"{name}_bias", out(biased)),
        (f"{name}_act", out(activated(producer))),
        (name, out(producer)),
    ]
    looked_up = [(f"{n}_table", table_lookup(p)) for n, p in forms] if tables else []
    return [(n, p, {}, checked) for n, p in looked_up + forms]


def _exact_first(check: Any) -> Any:
    """``check`` behind umahub's own: a match umahub cannot compute exactly is refused first."""
    from umahub.plugin.patterns import Refusal

    def checked(ctx: Any) -> Any:
        try:
            quantized_operator(ctx)
        except ValueError as exc:
            return Refusal(str(exc))
        return True if check is None else check(ctx)

    checked.__doc__ = getattr(check, "__doc__", None)
    checked.__name__ = getattr(check, "__name__", "quantized_ok")
    return checked


# ------------------------------------------------------------------ what a check reads


@dataclass(frozen=True)
class QuantParams:
    """How one tensor of a quantized operator is quantized.

    Attributes:
        dtype: the integer type (``"int8"``, ``"uint8"``...).
        scale: float32 numpy array: one value, or one per channel of ``axis``
            (None where it is not a constant: a partition's parameter, when
            its function is lowered).
        zero_point: int numpy array shaped like ``scale`` (None likewise).
        axis: the tensor's axis that ``scale`` runs along (None: one scale).
    """

    dtype: str
    scale: Any
    zero_point: Any
    axis: int | None

    @property
    def per_channel(self) -> bool:
        """Whether there is a scale per channel (not one for the tensor)."""
        return self.axis is not None

    @property
    def symmetric(self) -> bool:
        """Whether every zero point is 0 (False where they are not known)."""
        return self.zero_point is not None and not bool(self.zero_point.any())


@dataclass(frozen=True)
class QuantizedOperator:
    """A quantized operator as a check (or a lowering) reads it.

    Attributes:
        kind: ``"conv2d"`` or ``"matmul"``.
        call: the float ``relax.nn.conv2d`` / ``relax.matmul`` call (its attributes).
        data: the first operand's quantization (one scale).
        weight: the second operand's (per-tensor or per output channel).
        output: the result's (one scale).
        weight_constant: whether the second operand is a constant.
        has_bias: whether a bias is added.
        bias_exact: whether the bias is known to be int32 in the units of
            ``data.scale * weight.scale`` (added as it is); else it is rounded
            to them (a kernel decides per channel where the scales are not
            constants).
        activation: None, ``"relu"`` or ``("clip", low, high)`` (float bounds).
        residual: the quantization of a tensor added before the activation (a
            residual block's input, as PyTorch's X86 quantizer fuses it), or None.
        table: the constant table its output is read through (a ``relax.Constant``
            of at least 256 entries, indexed by the output's bits as uint8: a
            match of ``quantized(..., tables=True)``'s ``_table`` patterns), or None.
        exprs: the Relax expressions of the operands, by role: ``data``,
            ``data_scale``, ``data_zp``, ``weight``, ``weight_scale``,
            ``weight_zp``, ``bias`` (with ``bias_scale``, ``bias_zp`` when it is
            dequantized), ``residual``, ``residual_scale``, ``residual_zp``,
            ``output_scale``, ``output_zp``.
    """

    kind: str
    call: Any
    data: QuantParams
    weight: QuantParams
    output: QuantParams
    weight_constant: bool
    has_bias: bool
    bias_exact: bool
    activation: Any
    exprs: dict
    residual: QuantParams | None = None
    table: Any = None

    @property
    def multiplier(self) -> Any:
        """``data.scale * weight.scale / output.scale`` in float64 (step 3), per output channel."""
        import numpy as np

        return (
            np.float64(self.data.scale.reshape(()))
            * self.weight.scale.astype(np.float64)
            / np.float64(self.output.scale.reshape(()))
        )


def _constant(expr: Any, lookup: Any) -> Any:
    """The numpy value of ``expr`` if it is a constant (through variable bindings), else None."""
    from umahub._tvm import Constant, constant_value

    expr = bound_value(expr, lookup)
    return constant_value(expr).numpy() if isinstance(expr, Constant) else None


def bound_value(expr: Any, lookup: Any) -> Any:
    """``expr`` followed through variable bindings (``lookup(var)`` gives a variable's
    value, None for a parameter): the value it names, a Constant where it is one."""
    from tvm import relax

    seen = 0
    while isinstance(expr, relax.Var) and seen < 64:
        bound = lookup(expr)
        if bound is None:
            break
        expr, seen = bound, seen + 1
    return expr


def _parameter(expr: Any, lookup: Any) -> bool:
    """Whether ``expr`` is a function's parameter (bound to nothing): a partition's
    constant, when its function is lowered."""
    from tvm import relax

    expr = bound_value(expr, lookup)
    return isinstance(expr, relax.Var) and lookup(expr) is None


def _bound(expr: Any) -> float | None:
    """A clip bound's value: a PrimValue or an immediate (they differ by TVM version)."""
    value = getattr(expr, "value", None)
    value = getattr(value, "value", value)
    return float(value) if isinstance(value, (int, float)) else None


def _call(expr: Any, lookup: Any, *names: str) -> Any:
    import tvm
    from tvm import relax

    value = bound_value(expr, lookup)
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in names:
        return value
    return None


def _is_producer(expr: Any, lookup: Any) -> bool:
    """Whether ``expr`` is a convolution or matmul, or one plus a bias."""
    if _call(expr, lookup, "relax.nn.conv2d", "relax.matmul") is not None:
        return True
    add = _call(expr, lookup, "relax.add")
    return add is not None and any(
        _call(a, lookup, "relax.nn.conv2d", "relax.matmul") is not None for a in add.args
    )


def _params(call: Any, lookup: Any, role: str, rank: int) -> QuantParams:
    """The QuantParams of a quantize or dequantize ``call`` on a tensor of ``rank`` dimensions.

    Scale and zero point that are not constants here (a partition's parameters,
    when its function is lowered) give ``scale = zero_point = None``; the rest
    comes from their types.
    """
    import numpy as np

    from umahub.plugin.patterns import dtype_of, shape_of

    scale, zero = _constant(call.args[1], lookup), _constant(call.args[2], lookup)
    integer = dtype_of(call.args[0]) if call.op.name == "relax.dequantize" else dtype_of(call)
    if not integer.startswith(("int", "uint")):
        raise ValueError(f"the {role} is {integer}, not an integer type")
    if scale is None or zero is None:
        size = int(np.prod(shape_of(call.args[1]) or (1,)))
        axis = int(call.attrs.axis) % max(rank, 1) if size > 1 else None
        return QuantParams(integer, None, None, axis)
    scale = np.asarray(scale, dtype=np.float32).reshape(-1)
    zero = np.asarray(zero).astype(np.int64).reshape(-1)
    if zero.size not in (1, scale.size):
        raise ValueError(f"the {role} has {scale.size} scales and {zero.size} zero points")
    if scale.size == 1 and zero.size == 1:
        return QuantParams(integer, scale.reshape(()), zero.reshape(()), None)
    axis = int(call.attrs.axis) % max(rank, 1)
    return QuantParams(integer, scale, np.broadcast_to(zero, scale.shape).copy(), axis)


def _same_values(a: Any, b: Any) -> bool:
    """Whether two arrays hold the same values where broadcast against each other (a
    bias scale per channel against a weight scale per tensor is compared channel by
    channel, not refused)."""
    import numpy as np

    try:
        left, right = np.broadcast_arrays(np.asarray(a), np.asarray(b))
    except ValueError:
        return False
    return bool(np.array_equal(left, right))


def describe_quantized(root: Any, lookup: Any) -> QuantizedOperator:
    """The quantized operator whose final ``relax.quantize`` call is ``root``.

    ``lookup(var)`` gives the value bound to a Relax variable (None for a
    parameter). ``root`` may also be a table lookup of that quantize's output
    (:func:`table_lookup`): the operator's ``table`` is then that table.
    Raises ValueError, with a reason that completes "umahub cannot compute it
    in integers: ...", when ``root`` ends no quantized operator umahub
    computes exactly (a per-channel scale on the input, a weight scale along
    another axis than the output channels, a layout other than NCHW/OIHW...,
    a table lookup that could read outside its table).
    """
    import numpy as np

    from umahub.plugin.patterns import dtype_of, shape_of

    table = None
    if _call(root, lookup, "relax.take") is not None:
        table, root = table_of(root, lookup)
    quantize = _call(root, lookup, "relax.quantize")
    if quantize is None:
        raise ValueError("it does not end in a quantize")
    value = quantize.args[0]
    activation: Any = None
    act = _call(value, lookup, "relax.nn.relu", "relax.clip")
    if act is not None:
        if act.op.name == "relax.nn.relu":
            activation = "relu"
        else:
            bounds = [_bound(bound_value(a, lookup)) for a in act.args[1:]]
            if None in bounds:
                raise ValueError("a clip whose bounds are not constants")
            activation = ("clip", *bounds)
        value = act.args[0]
    residual_dq = None
    add = _call(value, lookup, "relax.add")
    if add is not None:
        for i in (0, 1):
            # a residual is a whole tensor of the output's shape (a bias: one value per
            # channel), computed at run time (in a partition every operand is a parameter)
            other = _call(add.args[i], lookup, "relax.dequantize")
            whole = other is not None and shape_of(other) == shape_of(quantize)
            if whole and _constant(other.args[0], lookup) is None:
                if _is_producer(add.args[1 - i], lookup):
                    residual_dq, value = other, add.args[1 - i]
                    break
    bias_expr, bias_dq = None, None
    add = _call(value, lookup, "relax.add")
    if add is not None:
        for i in (0, 1):
            if _call(add.args[i], lookup, "relax.nn.conv2d", "relax.matmul") is not None:
                value, bias_expr = add.args[i], add.args[1 - i]
                break
        else:
            raise ValueError("an add that is not a bias of a convolution or matmul")
        bias_dq = _call(bias_expr, lookup, "relax.dequantize")
        raw = bias_dq.args[0] if bias_dq is not None else bias_expr
        if _constant(raw, lookup) is None and not _parameter(raw, lookup):
            raise ValueError("a bias that is not a constant")
    producer = _call(value, lookup, "relax.nn.conv2d", "relax.matmul")
    if producer is None:
        raise ValueError("no convolution or matmul before the quantize")
    kind = "conv2d" if producer.op.name == "relax.nn.conv2d" else "matmul"
    operands = [_call(a, lookup, "relax.dequantize") for a in producer.args]
    if any(o is None for o in operands):
        raise ValueError(f"a {kind} operand that is not dequantized")
    dq_x, dq_w = operands
    shape_x, shape_w, shape_y = shape_of(dq_x), shape_of(dq_w), shape_of(quantize)
    if shape_x is None or shape_w is None or shape_y is None:
        raise ValueError("a tensor whose shape is known only at run time")
    if any(dtype_of(e) != "float32" for e in (dq_x, dq_w, quantize.args[0])):
        raise ValueError("a dequantized tensor that is not float32")
    data = _params(dq_x, lookup, "input", len(shape_x))
    weight = _params(dq_w, lookup, "weight", len(shape_w))
    output = _params(quantize, lookup, "output", len(shape_y))
    wide = [p.dtype for p in (data, weight) if p.dtype not in ("int8", "uint8")]
    if wide:
        raise ValueError(f"{wide[0]} operands (8-bit ones are computed in integers)")
    if data.per_channel:
        raise ValueError("a scale per channel on the input (one for the tensor is needed)")
    if output.per_channel:
        raise ValueError("a scale per channel on the output (one for the tensor is needed)")
    if kind == "conv2d":
        attrs = producer.attrs
        layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout))
        if layouts[:2] != ("NCHW", "OIHW") or layouts[2] not in ("NCHW", ""):
            raise ValueError(f"layout {'/'.join(layouts[:2])} (NCHW/OIHW is computed)")
        channel_axis, channels = 0, shape_w[0]
    else:
        if len(shape_w) < 2 or len(shape_x) < 2:
            raise ValueError("a matrix-vector product (1-D operand)")
        channel_axis, channels = len(shape_w) - 1, shape_w[-1]
    if weight.per_channel and weight.axis != channel_axis:
        raise ValueError(
            f"weight scales along axis {weight.axis}, not along the output channels "
            f"(axis {channel_axis})"
        )
    known = all(p.scale is not None for p in (data, weight, output))
    if known and not all(np.all(p.scale > 0) for p in (data, weight, output)):
        raise ValueError("a scale that is not positive")
    exprs = {
        "data": dq_x.args[0],
        "data_scale": dq_x.args[1],
        "data_zp": dq_x.args[2],
        "weight": dq_w.args[0],
        "weight_scale": dq_w.args[1],
        "weight_zp": dq_w.args[2],
        "output_scale": quantize.args[1],
        "output_zp": quantize.args[2],
    }
    bias_exact = False
    if bias_expr is not None:
        if bias_dq is not None:
            exprs.update(bias=bias_dq.args[0], bias_scale=bias_dq.args[1], bias_zp=bias_dq.args[2])
            bias = _params(bias_dq, lookup, "bias", len(shape_of(bias_dq) or ()))
            if known and bias.scale is not None:
                units = np.float32(data.scale.reshape(())) * weight.scale.astype(np.float32)
                bias_exact = (
                    bias.dtype == "int32" and bias.symmetric and _same_values(bias.scale, units)
                )
        else:
            exprs["bias"] = bias_expr
        if int(np.prod(shape_of(exprs["bias"]) or (1,))) not in (1, channels):
            raise ValueError("a bias that is not one value per output channel")
    residual = None
    if residual_dq is not None:
        if shape_of(residual_dq) != shape_y:
            raise ValueError("a residual that is not of the output's shape")
        residual = _params(residual_dq, lookup, "residual", len(shape_y))
        if residual.per_channel:
            raise ValueError("a scale per channel on the residual (one for the tensor is needed)")
        exprs.update(
            residual=residual_dq.args[0],
            residual_scale=residual_dq.args[1],
            residual_zp=residual_dq.args[2],
        )
    if known:
        multiplier = (
            np.float64(data.scale) * weight.scale.astype(np.float64) / np.float64(output.scale)
        )
        if np.any(multiplier >= 2.0**30):
            raise ValueError("a requantization multiplier of 2**30 or more")
        if residual is not None and residual.scale is not None:
            _, k = requantization(multiplier)
            _, k_r = requantization(np.float64(residual.scale) / np.float64(output.scale))
            shift = k - k_r
            if np.any(shift < 0) or np.any(shift > RESIDUAL_SHIFT_MAX):
                raise ValueError(
                    "a residual whose scale is too far from the convolution's "
                    f"(a shift of {int(np.max(np.abs(shift)))} bits; 0 to {RESIDUAL_SHIFT_MAX})"
                )
    return QuantizedOperator(
        kind=kind,
        call=producer,
        data=data,
        weight=weight,
        output=output,
        weight_constant=_constant(dq_w.args[0], lookup) is not None,
        has_bias=bias_expr is not None,
        bias_exact=bool(bias_exact),
        activation=activation,
        exprs=exprs,
        residual=residual,
        table=table,
    )


def quantized_operator(ctx: Any) -> QuantizedOperator:
    """The quantized operator a pattern of :func:`quantized` matched, from its check's
    ``ctx`` (a ``PatternCheckContext``). Raises ValueError when umahub cannot
    compute it exactly (umahub's check refuses such a match before the plugin's)."""
    return describe_quantized(ctx.matched_expr, match_lookup(ctx))


def match_lookup(ctx: Any) -> Any:
    """``lookup(var)``: the value a variable of a pattern's match is bound to, from
    its check's ``ctx`` (a ``PatternCheckContext``); None for one bound outside it."""
    bound = dict(ctx.matched_bindings.items())
    by_value = {}
    try:
        by_value = {v: k for k, v in ctx.value_to_bound_var.items()}
    except AttributeError:
        pass

    def lookup(var: Any) -> Any:
        value = bound.get(var)
        return value if value is not None else by_value.get(var)

    return lookup
