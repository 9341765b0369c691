"""The work of :func:`umahub.models.quantize.quantize_static`: what to quantize, calibration
runs, and the quantized ``main`` emitted binding by binding."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax

from umahub._tvm import Constant, constant_value, name_of, type_args, type_of

from ._qparams import TINY, WEIGHT_QMAX, QParams, QuantizationError, quantize_array, weight_params

_CONV, _MATMUL, _ADD = "relax.nn.conv2d", "relax.matmul", "relax.add"
_ACTIVATIONS = {"relax.nn.relu", "relax.clip"}
_SAME_AS_INPUT = {"relax.reshape", "relax.permute_dims", "relax.nn.max_pool2d"}
_OWN_PARAMS = {
    "relax.mean",
    "relax.nn.avg_pool2d",
    "relax.nn.adaptive_avg_pool2d",
    "relax.nn.softmax",
}


# ---------------------------------------------------------------------- analysis


def op_name(value: Any) -> str | None:
    """The name of the operator a binding's value calls, None for anything else."""
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return str(value.op.name)
    return None


def const_value(value: Any) -> np.ndarray:
    """The numpy array of a Relax constant."""
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
class Plan:
    """What to quantize in ``main``: its groups and its quantized tensors, in binding order."""

    mod: tvm.IRModule
    func: relax.Function
    bindings: list[relax.Binding]
    groups: dict[int, _Group] = field(default_factory=dict)  # by root index
    # quantized tensor -> None (calibrated) or the quantized tensor whose params it shares
    tensors: dict[relax.Var, relax.Var | None] = field(default_factory=dict)

    def mark(self, var: relax.Var, same_as: relax.Var | None = None) -> None:
        """Quantize ``var``: calibrated, or with the parameters of ``same_as``."""
        if var not in self.tensors:
            self.tensors[var] = same_as


def main_bindings(mod: tvm.IRModule) -> tuple[relax.Function, list[relax.Binding]]:
    """``main`` and the bindings of its one dataflow block; QuantizationError otherwise."""
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


def plan_of(mod: tvm.IRModule) -> Plan:
    """The quantized operators of ``mod`` and the tensors to quantize (see quantize)."""
    func, bindings = main_bindings(mod)
    plan = Plan(mod, func, bindings)
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
        if j is not None and op_name(bindings[j].value) in _ACTIVATIONS:
            if bindings[j].value.args[0].same_as(tail):
                absorbed.add(j)
                return bindings[j].var
        return tail

    for i, b in enumerate(bindings):
        op = op_name(b.value)
        if i in absorbed or op is None:
            continue
        args = list(b.value.args)
        if (op == _CONV and isinstance(args[1], Constant)) or op == _MATMUL:
            activations = [a for a in args[:2] if isinstance(a, relax.Var)]
            group = _Group("weighted", i, b.var, activations)
            weight = args[1]
            if isinstance(weight, Constant):
                shape = const_value(weight).shape
                if op == _MATMUL and len(shape) != 2:
                    raise QuantizationError(
                        f"{name_of(b.var)}: a matmul's constant weight must be 2-D (in, out), "
                        f"not {shape}"
                    )
                group.weight_axis = 0 if op == _CONV else 1
                channels = shape[group.weight_axis]
                j = only_reader(b.var)
                if j is not None and op_name(bindings[j].value) == _ADD:
                    lhs, rhs = bindings[j].value.args
                    bias = rhs if lhs.same_as(b.var) else lhs
                    if (
                        isinstance(bias, Constant)
                        and _bias_axis(const_value(bias).shape, channels, op) is not None
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


def rebuild(
    plan: Plan,
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


def calibrated_ranges(
    plan: Plan, samples: Sequence[Sequence[np.ndarray]]
) -> dict[relax.Var, tuple[float, float]]:
    """(min, max) over ``samples`` of every tensor the plan calibrates."""
    if not samples:
        raise QuantizationError("no calibration sample: give at least one list of inputs")
    wanted = [v for v, same in plan.tensors.items() if same is None]
    params = [v for v in wanted if v in plan.func.params]
    inner = [v for v in wanted if v not in plan.func.params]
    runs = _run_all(rebuild(plan, outputs=inner), samples)
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


class Emitter:
    """Emits the quantized ``main``: Q/DQ after quantized tensors, int weights and biases."""

    def __init__(self, plan: Plan, qparams: dict[relax.Var, QParams], per_channel: bool):
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
        w = const_value(weight)
        p = weight_params(w, group.weight_axis if self.per_channel else None)
        self.weight_scales[group.root] = p.scale
        q = quantize_array(w, p, -WEIGHT_QMAX, WEIGHT_QMAX, "int8")
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
        scale = np.where(scale >= TINY, scale, np.float32(TINY)).astype(np.float32)
        position = next(k for k, a in enumerate(args) if isinstance(a, Constant))
        bias = const_value(args[position])
        op = _CONV if bias.ndim >= 3 else _MATMUL
        axis = _bias_axis(bias.shape, int(bias.size), op) if scale.ndim else -1
        p = QParams(scale, np.zeros(scale.shape, np.int32), -1 if axis is None else axis)
        info = np.iinfo(np.int32)
        q = quantize_array(bias, p, info.min, info.max, "int32")
        dq = relax.op.dequantize(
            relax.const(q), relax.const(p.scale, "float32"), relax.const(p.zero_point), axis=p.axis
        )
        root = name_of(self.plan.bindings[group.root].var)
        args[position] = bb.emit(dq, name_hint=f"{root}_bias")
