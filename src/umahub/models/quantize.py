"""Static post-training quantization of a Relax model into QDQ form, as ONNX Runtime writes it.

:func:`quantize_static` is ONNX Runtime's ``quantize_static`` (QDQ format,
MinMax calibration) for Relax modules whose weights are bound as constants,
as the zoo and umahub's frontends bind them, without ONNX Runtime:

- the float model runs on every calibration sample (``tvm.compile`` for the
  host, Relax VM); the smallest and largest value of each tensor to be
  quantized over all samples is its range;
- a quantized tensor ``t`` is followed by ``R.quantize(t, scale, zp)`` and
  ``R.dequantize`` of that, and every reader of ``t`` reads the dequantized
  tensor (one pair per tensor, shared by its readers);
- ``R.nn.conv2d`` with a constant weight and ``R.matmul``, each with the bias
  add and the ReLU or clip that follow it (when nothing else reads the
  intermediate tensors), are one quantized operator: its activation inputs
  and its output (after the activation, as ONNX Runtime quantizes a Conv's
  fused Relu) are quantized, the weight is an int8 constant under
  ``R.dequantize(w, w_scale, 0, axis=<output channel>)`` and the bias an
  int32 constant under ``R.dequantize(b, x_scale * w_scale, 0)``;
- an ``R.add`` of two quantized tensors (a residual), with a ReLU or clip
  after it, has its output quantized; so have ``R.mean`` and the average
  pools and ``R.nn.softmax`` of a quantized tensor (ONNX Runtime's
  GlobalAveragePool, AveragePool, Softmax);
- ``R.reshape``, ``R.permute_dims`` and ``R.nn.max_pool2d`` of a quantized
  tensor give a tensor quantized with the same scale and zero point as their
  input (ONNX Runtime's Reshape, Transpose, MaxPool);
- every other operator computes in float on dequantized inputs (layer norm,
  GELU, a division, an add with a tensor that is not quantized).

Scales and zero points follow ONNX Runtime: the range is widened to include
0; activations asymmetric (``uint8``, ONNX Runtime's default, zero point in
0..255; or ``int8``, -128..127); weights int8 symmetric in -127..127 (zero
point 0), per output channel by default; a scale below float32's smallest
normal number (a tensor that is zero on every sample) becomes 1 with zero
point 0, so that every scale is positive and finite. Quantization is ONNX
QuantizeLinear's: ``saturate(round_half_to_even(x / scale) + zero_point)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax

from umahub._tvm import Constant, constant_value, name_of, type_args, type_of

from ..errors import UmahubError

__all__ = [
    "ACTIVATION_DTYPES",
    "QParams",
    "QuantizationError",
    "activation_params",
    "calibrate",
    "quantization_params",
    "quantize_static",
    "weight_params",
]

#: The dtypes a quantized activation may have: ``uint8`` (default) or ``int8``, both asymmetric.
ACTIVATION_DTYPES = ("uint8", "int8")

_QRANGE = {"uint8": (0, 255), "int8": (-128, 127)}
_WEIGHT_QMAX = 127  # int8 symmetric weights use -127..127, as ONNX Runtime does
_TINY = float(np.finfo(np.float32).tiny)

_CONV, _MATMUL, _ADD = "relax.nn.conv2d", "relax.matmul", "relax.add"
_ACTIVATIONS = {"relax.nn.relu", "relax.clip"}
_SAME_AS_INPUT = {"relax.reshape", "relax.permute_dims", "relax.nn.max_pool2d"}
_OWN_PARAMS = {
    "relax.mean",
    "relax.nn.avg_pool2d",
    "relax.nn.adaptive_avg_pool2d",
    "relax.nn.softmax",
}


class QuantizationError(UmahubError, ValueError):
    """A model or calibration set that :func:`quantize_static` cannot quantize; says why."""


@dataclass(frozen=True)
class QParams:
    """Scale and zero point of one quantized tensor.

    Attributes:
        scale: float32, a scalar (per tensor) or one per channel of ``axis``.
        zero_point: of the quantized dtype, shaped as ``scale``.
        axis: the channel axis of a per-channel ``scale``; -1 for a scalar.
    """

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int = -1

    @property
    def dtype(self) -> str:
        """The quantized dtype (``uint8``, ``int8`` or ``int32``)."""
        return str(self.zero_point.dtype)


def activation_params(low: float, high: float, dtype: str = "uint8") -> QParams:
    """Asymmetric per-tensor scale and zero point of an activation with range [low, high].

    The range is widened to include 0 (so that 0 is exact, as padding needs);
    a range too narrow for a float32 scale (an all-zero tensor) gives scale 1
    and zero point 0 (ONNX Runtime's rule).

    Raises:
        QuantizationError: a non-finite bound, or a dtype not in :data:`ACTIVATION_DTYPES`.
    """
    if dtype not in _QRANGE:
        raise QuantizationError(
            f"activation dtype {dtype!r} is not supported: use one of {', '.join(_QRANGE)}"
        )
    if not (np.isfinite(low) and np.isfinite(high)):
        raise QuantizationError(
            f"range [{low}, {high}] is not finite: calibrate on inputs the float model "
            "computes finite values for"
        )
    qmin, qmax = _QRANGE[dtype]
    low, high = min(float(low), 0.0), max(float(high), 0.0)
    scale = np.float32((high - low) / (qmax - qmin))
    if not scale >= _TINY:
        return QParams(np.float32(1.0), np.array(0, dtype=dtype))
    zero_point = np.clip(np.round(qmin - low / float(scale)), qmin, qmax)
    return QParams(scale, np.array(zero_point, dtype=dtype))


def weight_params(weight: np.ndarray, axis: int | None) -> QParams:
    """Symmetric int8 scale (zero point 0) of a weight: per channel of ``axis``, or per tensor.

    ``scale = max|w| / 127`` over the channel (or the tensor); an all-zero
    channel gets scale 1.
    """
    w = np.abs(np.asarray(weight, dtype=np.float64))
    if axis is None:
        peak = np.array(w.max() if w.size else 0.0)
    else:
        peak = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1).max(axis=1)
    scale = (peak / _WEIGHT_QMAX).astype(np.float32)
    scale = np.where(scale >= _TINY, scale, np.float32(1.0)).astype(np.float32)
    return QParams(scale, np.zeros(scale.shape, np.int8), -1 if axis is None else axis)


def _quantize_array(value: np.ndarray, params: QParams, qmin: int, qmax: int, dtype: str):
    """ONNX QuantizeLinear of a constant, in float32 as the host computes it."""
    scale = params.scale
    if scale.ndim:
        shape = [1] * value.ndim
        shape[params.axis] = -1
        scale = scale.reshape(shape)
    q = np.rint(value.astype(np.float32) / scale) + params.zero_point.reshape(np.shape(scale))
    return np.clip(q, qmin, qmax).astype(dtype)


# ---------------------------------------------------------------------- analysis


def _op(value: Any) -> str | None:
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return str(value.op.name)
    return None


def _const(value: Any) -> np.ndarray:
    return constant_value(value).numpy()


@dataclass
class _Group:
    """One quantized operator: a root binding, maybe a bias add and an activation after it."""

    kind: str  # "weighted", "add", "same" (params of its input), "own" (calibrated)
    root: int
    out: relax.Var
    inputs: list[relax.Var]
    bias: int | None = None
    weight_axis: int = 0


@dataclass
class _Plan:
    """What to quantize in ``main``: its groups and its quantized tensors, in binding order."""

    mod: tvm.IRModule
    func: relax.Function
    bindings: list[relax.Binding]
    groups: dict[int, _Group] = field(default_factory=dict)  # by root index
    # quantized tensor -> None (calibrated) or the quantized tensor whose params it shares
    tensors: dict[relax.Var, relax.Var | None] = field(default_factory=dict)

    def mark(self, var: relax.Var, same_as: relax.Var | None = None) -> None:
        if var not in self.tensors:
            self.tensors[var] = same_as


def _main_bindings(mod: tvm.IRModule) -> tuple[relax.Function, list[relax.Binding]]:
    if "main" not in [name_of(gv) for gv in mod.get_global_vars()]:
        raise QuantizationError("the module has no function 'main': quantize_static needs one")
    func = mod["main"]
    blocks = list(func.body.blocks)
    if len(blocks) != 1 or not isinstance(blocks[0], relax.DataflowBlock):
        raise QuantizationError(
            "main must be one dataflow block, as the zoo and umahub's frontends build it; "
            f"it has {len(blocks)} block(s): run relax.transform.ConvertToDataflow first"
        )
    return func, list(blocks[0].bindings)


def _plan(mod: tvm.IRModule) -> _Plan:
    func, bindings = _main_bindings(mod)
    plan = _Plan(mod, func, bindings)
    index = {b.var: i for i, b in enumerate(bindings)}
    readers: dict[relax.Var, list[int]] = {}
    for i, b in enumerate(bindings):
        for arg in b.value.args if isinstance(b.value, relax.Call) else [b.value]:
            if isinstance(arg, relax.Var):
                readers.setdefault(arg, []).append(i)
    absorbed: set[int] = set()

    def only_reader(var: relax.Var) -> int | None:
        users = readers.get(var, [])
        return users[0] if len(users) == 1 else None

    def absorb_activation(tail: relax.Var) -> relax.Var:
        j = only_reader(tail)
        if j is not None and _op(bindings[j].value) in _ACTIVATIONS:
            if bindings[j].value.args[0].same_as(tail):
                absorbed.add(j)
                return bindings[j].var
        return tail

    for i, b in enumerate(bindings):
        op = _op(b.value)
        if i in absorbed or op is None:
            continue
        args = list(b.value.args)
        if (op == _CONV and isinstance(args[1], Constant)) or op == _MATMUL:
            activations = [a for a in args[:2] if isinstance(a, relax.Var)]
            group = _Group("weighted", i, b.var, activations)
            weight = args[1]
            if isinstance(weight, Constant):
                shape = _const(weight).shape
                if op == _MATMUL and len(shape) != 2:
                    raise QuantizationError(
                        f"{name_of(b.var)}: a matmul's constant weight must be 2-D (in, out), "
                        f"not {shape}"
                    )
                group.weight_axis = 0 if op == _CONV else 1
                channels = shape[group.weight_axis]
                j = only_reader(b.var)
                if j is not None and _op(bindings[j].value) == _ADD:
                    lhs, rhs = bindings[j].value.args
                    bias = rhs if lhs.same_as(b.var) else lhs
                    if (
                        isinstance(bias, Constant)
                        and _bias_axis(_const(bias).shape, channels, op) is not None
                    ):
                        group.bias = j
                        absorbed.add(j)
                        group.out = bindings[j].var
            group.out = absorb_activation(group.out)
        elif op == _ADD and all(isinstance(a, relax.Var) and a in plan.tensors for a in args):
            group = _Group("add", i, absorb_activation(b.var), args)
        elif op in _SAME_AS_INPUT and isinstance(args[0], relax.Var) and args[0] in plan.tensors:
            group = _Group("same", i, b.var, [args[0]])
        elif op in _OWN_PARAMS and isinstance(args[0], relax.Var) and args[0] in plan.tensors:
            group = _Group("own", i, b.var, [args[0]])
        else:
            continue
        for var in group.inputs:
            if var not in index and var not in func.params:
                continue
            plan.mark(var)
        plan.mark(group.out, group.inputs[0] if group.kind == "same" else None)
        plan.groups[i] = group
    return plan


def _bias_axis(shape: tuple[int, ...], channels: int, op: str) -> int | None:
    """The channel axis of a bias constant of this shape, or None if it is not a bias."""
    if int(np.prod(shape)) != channels or not shape:
        return None
    if op == _MATMUL:
        return len(shape) - 1
    if len(shape) == 4 and shape[1] == channels:
        return 1
    if len(shape) == 3 and shape[0] == channels:
        return 0
    return None


# ---------------------------------------------------------------------- calibration


def _rebuild(
    plan: _Plan,
    emit_extra: Any = None,
    outputs: Sequence[relax.Var] = (),
) -> tvm.IRModule:
    """``main`` re-emitted binding by binding; ``emit_extra(bb, i, binding, env)`` may
    replace a binding's emission; ``outputs`` are returned after the model's output."""
    func = plan.func
    bb = relax.BlockBuilder()
    params = [relax.Var(name_of(p), type_of(p)) for p in func.params]
    env: dict[relax.Var, relax.Expr] = dict(zip(func.params, params, strict=True))
    attrs = {k: v for k, v in func.attrs.items()} if func.attrs else None
    with bb.function("main", params, attrs=attrs):
        with bb.dataflow():
            if emit_extra is not None:
                emit_extra(bb, -1, None, env)
            for i, b in enumerate(plan.bindings):
                if emit_extra is not None and emit_extra(bb, i, b, env):
                    continue
                value = _substitute(b.value, env)
                name = name_of(b.var)
                emit = bb.emit if isinstance(b.var, relax.DataflowVar) else bb.emit_output
                env[b.var] = emit(value, name_hint=name)
            result = _substitute(func.body.body, env)
            if outputs:
                extra = [bb.emit_output(env[v]) for v in outputs]
                result = bb.emit_output(relax.Tuple([result, *extra]))
        bb.emit_func_output(result)
    out = tvm.IRModule(dict(plan.mod.functions_items()), attrs=plan.mod.attrs)
    out["main"] = bb.get()["main"]
    return out


def _substitute(value: Any, env: dict[relax.Var, relax.Expr]) -> Any:
    if isinstance(value, relax.Var):
        return env.get(value, value)
    if isinstance(value, relax.Tuple):
        return relax.Tuple([_substitute(f, env) for f in value.fields])
    if isinstance(value, relax.Call):
        args = [_substitute(a, env) for a in value.args]
        return relax.Call(value.op, args, value.attrs, type_args(value))
    return value


def _run_all(mod: tvm.IRModule, samples: Sequence[Sequence[np.ndarray]]) -> list[list[np.ndarray]]:
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    runs = []
    for sample in samples:
        out = vm["main"](*[tvm.runtime.tensor(np.asarray(a)) for a in sample])
        runs.append([o.numpy() for o in out])
    return runs


def calibrate(
    mod: tvm.IRModule, samples: Sequence[Sequence[np.ndarray]]
) -> dict[str, tuple[float, float]]:
    """The range (min, max over all samples) of every tensor :func:`quantize_static` calibrates.

    Keyed by the name of the tensor's binding (a model input by its parameter name).

    Raises:
        QuantizationError: no sample, or a model :func:`quantize_static` cannot take.
    """
    plan = _plan(mod)
    ranges = _ranges(plan, samples)
    return {name_of(v): r for v, r in ranges.items()}


def _ranges(
    plan: _Plan, samples: Sequence[Sequence[np.ndarray]]
) -> dict[relax.Var, tuple[float, float]]:
    if not samples:
        raise QuantizationError("no calibration sample: give at least one list of inputs")
    wanted = [v for v, same in plan.tensors.items() if same is None]
    params = [v for v in wanted if v in plan.func.params]
    inner = [v for v in wanted if v not in plan.func.params]
    runs = _run_all(_rebuild(plan, outputs=inner), samples)
    ranges: dict[relax.Var, tuple[float, float]] = {}
    for var in [*params, *inner]:
        if var in plan.func.params:
            position = list(plan.func.params).index(var)
            values = [np.asarray(s[position]) for s in samples]
        else:
            values = [run[1 + inner.index(var)] for run in runs]
        low = min(float(v.min()) for v in values)
        high = max(float(v.max()) for v in values)
        ranges[var] = (low, high)
    return ranges


# ---------------------------------------------------------------------- quantization


def quantize_static(
    mod: tvm.IRModule,
    calibration: Sequence[Sequence[np.ndarray]],
    *,
    activation_dtype: str = "uint8",
    per_channel: bool = True,
) -> tvm.IRModule:
    """``mod`` with QDQ inserted as ONNX Runtime's static quantizer writes it (see the module).

    Args:
        mod: a Relax module whose ``main`` is one dataflow block with the
            weights bound as constants (a zoo model, an imported ONNX or
            PyTorch model).
        calibration: the calibration set: samples, each the list of ``main``'s
            inputs in order. The float model runs on every one (compiled for
            the host); ranges are min and max over all of them.
        activation_dtype: ``"uint8"`` (ONNX Runtime's default) or ``"int8"``,
            asymmetric either way.
        per_channel: weights get one scale per output channel (axis 0 of a
            conv's OIHW weight, axis 1 of a matmul's (in, out) weight); False
            for one scale per weight.

    Returns:
        A new module; ``main`` takes and returns what ``mod``'s does (float
        inputs, the output dequantized when it is a quantized tensor).

    Raises:
        QuantizationError: a module of another shape, no sample, a tensor with
            non-finite values on the calibration set, an unknown dtype.
    """
    if activation_dtype not in ACTIVATION_DTYPES:
        raise QuantizationError(
            f"activation_dtype={activation_dtype!r}: use one of {', '.join(ACTIVATION_DTYPES)}"
        )
    plan = _plan(mod)
    ranges = _ranges(plan, calibration)
    qparams: dict[relax.Var, QParams] = {}
    for var, same in plan.tensors.items():
        if same is None:
            low, high = ranges[var]
            try:
                qparams[var] = activation_params(low, high, activation_dtype)
            except QuantizationError as exc:
                raise QuantizationError(f"tensor {name_of(var)!r}: {exc}") from None
        else:
            qparams[var] = qparams[same]
    return _rebuild(plan, _Emitter(plan, qparams, per_channel))


class _Emitter:
    """Emits the quantized ``main``: Q/DQ after quantized tensors, int weights and biases."""

    def __init__(self, plan: _Plan, qparams: dict[relax.Var, QParams], per_channel: bool):
        self.plan = plan
        self.qparams = qparams
        self.per_channel = per_channel
        self.dq: dict[relax.Var, relax.Var] = {}
        self.weight_scales: dict[int, np.ndarray] = {}
        self.bias_of = {g.bias: g for g in plan.groups.values() if g.bias is not None}

    def __call__(self, bb: relax.BlockBuilder, i: int, b: Any, env: dict) -> bool:
        if i < 0:
            for p in self.plan.func.params:
                if p in self.qparams:
                    self._qdq(bb, p, env[p])
            return False

        def read(arg: Any) -> Any:
            if isinstance(arg, relax.Var) and arg in self.dq:
                return self.dq[arg]
            return _substitute(arg, env)

        value, name = b.value, name_of(b.var)
        if isinstance(value, relax.Call):
            args = [read(a) for a in value.args]
            group = self.plan.groups.get(i)
            if group is not None and group.kind == "weighted" and isinstance(args[1], Constant):
                args[1] = self._weight(bb, group, args[1], name)
            if i in self.bias_of:
                self._bias(bb, self.bias_of[i], args)
            value = relax.Call(value.op, args, value.attrs, type_args(value))
        else:
            value = read(value)
        emit = bb.emit if isinstance(b.var, relax.DataflowVar) else bb.emit_output
        env[b.var] = emit(value, name_hint=name)
        if b.var in self.qparams:
            self._qdq(bb, b.var, env[b.var])
        return True

    def _qdq(self, bb: relax.BlockBuilder, var: relax.Var, value: relax.Expr) -> None:
        p, name = self.qparams[var], name_of(var)
        scale, zp = relax.const(p.scale, "float32"), relax.const(p.zero_point, p.dtype)
        q = bb.emit(relax.op.quantize(value, scale, zp, out_dtype=p.dtype), name_hint=f"{name}_q")
        self.dq[var] = bb.emit(relax.op.dequantize(q, scale, zp), name_hint=f"{name}_dq")

    def _weight(self, bb: relax.BlockBuilder, group: _Group, weight: Any, name: str) -> relax.Var:
        w = _const(weight)
        p = weight_params(w, group.weight_axis if self.per_channel else None)
        self.weight_scales[group.root] = p.scale
        q = _quantize_array(w, p, -_WEIGHT_QMAX, _WEIGHT_QMAX, "int8")
        dq = relax.op.dequantize(
            relax.const(q),
            relax.const(p.scale, "float32"),
            relax.const(p.zero_point, "int8"),
            axis=p.axis,
        )
        return bb.emit(dq, name_hint=f"{name}_weight")

    def _bias(self, bb: relax.BlockBuilder, group: _Group, args: list) -> None:
        """Replace the bias constant among ``args`` by int32 under ``x_scale * w_scale``."""
        x_scale = self.qparams[group.inputs[0]].scale
        scale = (np.float32(x_scale) * self.weight_scales[group.root]).astype(np.float32)
        # An underflowing product would make the int32 bias infinite: floor it.
        scale = np.where(scale >= _TINY, scale, np.float32(_TINY)).astype(np.float32)
        position = next(k for k, a in enumerate(args) if isinstance(a, Constant))
        bias = _const(args[position])
        op = _CONV if bias.ndim >= 3 else _MATMUL
        axis = _bias_axis(bias.shape, int(bias.size), op) if scale.ndim else -1
        p = QParams(scale, np.zeros(scale.shape, np.int32), -1 if axis is None else axis)
        info = np.iinfo(np.int32)
        q = _quantize_array(bias, p, info.min, info.max, "int32")
        dq = relax.op.dequantize(
            relax.const(q), relax.const(p.scale, "float32"), relax.const(p.zero_point), axis=p.axis
        )
        root = name_of(self.plan.bindings[group.root].var)
        args[position] = bb.emit(dq, name_hint=f"{root}_bias")


# ---------------------------------------------------------------------- reading


def quantization_params(mod: tvm.IRModule) -> dict[str, QParams]:
    """The scale and zero point of every ``R.quantize`` and ``R.dequantize`` of ``main``.

    Keyed by the name of the binding; for the zoo's int8 models ``"<t>_q"``
    quantizes tensor ``t``, ``"<op>_weight"`` and ``"<op>_bias"`` dequantize
    the weight and bias of operator ``op``. Only constant scales and zero
    points are read.
    """
    _, bindings = _main_bindings(mod)
    found: dict[str, QParams] = {}
    for b in bindings:
        if _op(b.value) in ("relax.quantize", "relax.dequantize"):
            _, scale, zp = b.value.args
            if isinstance(scale, Constant) and isinstance(zp, Constant):
                found[name_of(b.var)] = QParams(_const(scale), _const(zp), int(b.value.attrs.axis))
    return found
