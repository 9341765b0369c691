"""The host's part of a placed model, fused and scheduled before TVM builds it.

What no accelerator took runs on the host. ``tvm.compile`` with its default
Relax pipeline neither fuses nor schedules for a CPU: every operator would be
a loop nest of its own, on one thread, without vectors. So the build stage
first lowers the host's part here, as TVM's CPU pipeline does
(``LegalizeOps``, ``AnnotateTIROpPattern``, ``FoldConstant``, ``FuseOps``,
``FuseTIR``), its quantized operators first computed in integers
(:mod:`umahub.host.quantized`), then schedules each resulting PrimFunc: with
its tuned schedule where ``[tool.umahub] tuning-database`` says it measured
faster (:mod:`umahub.tuning.lookup`), else through the hook
``umahub_host_schedule`` (a plugin may take any function), else with
:func:`umahub.host.schedules.default_schedule`. The partitions are already
calls of their runtime modules by then; only host code is touched.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax, s_tir, tirx

from umahub.errors import PluginFailure, warn
from umahub.host.quantized import quantized_in_integers
from umahub.host.schedules import default_schedule
from umahub.hub.tracing import last_returned, recording
from umahub.targets import host_target
from umahub.tuning.lookup import tuned_schedule

__all__ = ["HOST_TARGET", "hook_schedule", "lower_host", "max_pool2d"]


#: The target the host's part is built for, unless the compile names one (a cross
#: build): this machine's CPU.
HOST_TARGET = host_target()


def _tvm_legalization(bb: Any, call: Any) -> Any:
    """``call`` legalized as TVM does it: where the host's own legalization does not apply."""
    return tvm.ir.Op.get(call.op.name).get_attr("FLegalize")(bb, call)


def _batch_norm(bb: Any, call: Any) -> Any:
    """An inference batch norm as ``x * scale[c] + shift[c]``.

    TVM's legalization divides by ``sqrt(var + eps)`` at every element; the
    per-channel ``scale = gamma / sqrt(var + eps)`` and ``shift = beta -
    mean * scale`` here are constants that ``FoldConstant`` computes at
    compile time when the statistics are weights.
    """
    from tvm import te

    from umahub.plugin.patterns import shape_of

    attrs = call.attrs
    data = call.args[0]
    shape = shape_of(data)
    if bool(attrs.training) or shape is None or int(attrs.axis) not in (1, 1 - len(shape)):
        return _tvm_legalization(bb, call)
    eps, scaled, centered = float(attrs.epsilon), bool(attrs.scale), bool(attrs.center)

    def affine(gamma, beta, mean, var):
        scale = te.compute(
            (shape[1],),
            lambda c: (gamma[c] if scaled else 1.0) / te.sqrt(var[c] + eps),
            name="bn_scale",
        )
        shift = te.compute(
            (shape[1],),
            lambda c: (beta[c] if centered else 0.0) - mean[c] * scale[c],
            name="bn_shift",
        )
        return [scale, shift]

    params = bb.emit(bb.call_te(affine, *call.args[1:], primfunc_name_hint="batch_norm_affine"))
    scale = bb.emit(relax.TupleGetItem(params, 0))
    shift = bb.emit(relax.TupleGetItem(params, 1))

    def apply(x, s, b):
        def value(n, c, *rest):
            index = (n, c, *rest)
            return x[index] * s[c] + b[c]

        return te.compute(x.shape, value, name="batch_norm")

    out = bb.emit(bb.call_te(apply, data, scale, shift, primfunc_name_hint="batch_norm"))
    # the running statistics, unchanged in inference: the call's own inputs
    return relax.Tuple([out, call.args[3], call.args[4]])


def _float32(call: Any) -> bool:
    from umahub.plugin.patterns import dtype_of

    return dtype_of(call) == "float32"


def _vector_math(compute: Any, name: str) -> Any:
    """A legalization computing ``compute(x)`` with TVM's polynomial transcendental
    functions, for float32 (others: TVM's own legalization)."""

    def legalize(bb: Any, call: Any) -> Any:
        if not _float32(call):
            return _tvm_legalization(bb, call)
        return bb.call_te(compute, call.args[0], primfunc_name_hint=name)

    return legalize


def _gelu(x: Any) -> Any:
    from tvm import topi

    return x * (0.5 + 0.5 * topi.fast_erf(x * 0.7071067811865476))


def _gelu_tanh(x: Any) -> Any:
    from tvm import topi

    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return 0.5 * x * (1.0 + topi.fast_tanh(inner))


def _sigmoid(x: Any) -> Any:
    from tvm import te, topi

    e = topi.fast_exp(topi.negative(x))
    return te.compute(x.shape, lambda *i: 1.0 / (1.0 + e(*i)), name="sigmoid")


def _softmax(bb: Any, call: Any) -> Any:
    from tvm import topi

    if not _float32(call):
        return _tvm_legalization(bb, call)
    return bb.call_te(topi.nn.fast_softmax, call.args[0], int(call.attrs.axis))


def max_pool2d(bb: Any, call: Any) -> Any:
    """A 2-D max pooling as two 1-D ones: each window's rows reduced into a row of
    column maxima, then that row's windows reduced. 3 + 3 comparisons per output
    instead of 9, and each input row read once, in order (scheduled by
    :func:`umahub.host.schedules.schedule_pooling`). NCHW, dilation 1; others:
    TVM's legalization. Public for plugins: a legalization for
    :func:`umahub.plugin.default_relax_to_tir`."""
    from tvm import te

    from umahub.plugin.patterns import shape_of

    attrs = call.attrs
    shape, out = shape_of(call.args[0]), shape_of(call)
    if (
        shape is None
        or out is None
        or len(shape) != 4
        or str(attrs.layout) != "NCHW"
        or str(attrs.out_layout) not in ("NCHW", "")
        or any(int(d) != 1 for d in attrs.dilation)
    ):
        return _tvm_legalization(bb, call)
    (kh, kw), (sh, sw) = (int(k) for k in attrs.pool_size), (int(s) for s in attrs.strides)
    top, left = int(attrs.padding[0]), int(attrs.padding[1])
    height, width = shape[2], shape[3]

    def pool(x: Any) -> Any:
        lowest = tvm.tirx.min_value(x.dtype)
        ky = te.reduce_axis((0, kh), "ky")

        def column_max(n: Any, c: Any, oy: Any, ix: Any) -> Any:
            iy = oy * sh + ky - top
            inside = tvm.tirx.all(iy >= 0, iy < height)
            return te.max(te.if_then_else(inside, x[n, c, iy, ix], lowest), axis=ky)

        rows = te.compute((*out[:3], width), column_max, name="pool_rows")
        kx = te.reduce_axis((0, kw), "kx")

        def window_max(n: Any, c: Any, oy: Any, ox: Any) -> Any:
            ix = ox * sw + kx - left
            inside = tvm.tirx.all(ix >= 0, ix < width)
            return te.max(te.if_then_else(inside, rows[n, c, oy, ix], lowest), axis=kx)

        return te.compute(tuple(out), window_max, name="pool_max")

    return bb.call_te(pool, call.args[0], primfunc_name_hint="max_pool2d")


#: The host's own legalizations, by operator (the rest: TVM's). LLVM has no
#: vector ``exp``, ``erf`` or ``tanh``: TVM's legalizations call the C
#: library's scalar function per element (a GELU then costs more than the
#: matmul before it; an ``erf`` on its own, as ONNX writes a GELU, likewise),
#: these use TVM's polynomials (``fast_exp``, ``fast_erf``,
#: ``fast_tanh``; relative error below 1e-6), which vectorize. A max pooling
#: is two 1-D ones (:func:`max_pool2d`).
LEGALIZE = {
    "relax.nn.batch_norm": _batch_norm,
    "relax.nn.gelu": _vector_math(_gelu, "gelu"),
    "relax.nn.gelu_tanh": _vector_math(_gelu_tanh, "gelu_tanh"),
    "relax.sigmoid": _vector_math(_sigmoid, "sigmoid"),
    "relax.tanh": _vector_math(lambda x: tvm.topi.fast_tanh(x), "tanh"),
    "relax.exp": _vector_math(lambda x: tvm.topi.fast_exp(x), "exp"),
    "relax.erf": _vector_math(lambda x: tvm.topi.fast_erf(x), "erf"),
    "relax.nn.softmax": _softmax,
    "relax.nn.max_pool2d": max_pool2d,
}

_FUSION = (
    quantized_in_integers,
    lambda: relax.transform.LegalizeOps(LEGALIZE),
    relax.transform.AnnotateTIROpPattern,
    relax.transform.FoldConstant,
    relax.transform.FuseOps,
    relax.transform.FuseTIR,
)


def _by_plugin(hub: Any, func: tirx.PrimFunc, target: Any, name: str) -> tuple[Any, str] | None:
    """``umahub_host_schedule`` on ``func``: (scheduled function, what) or None."""
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    try:
        said = hub.traced_hook.umahub_host_schedule(schedule=sch, target=target)
    except Exception as exc:
        failure = PluginFailure.of(exc, "?", "umahub_host_schedule")
        cause = failure.cause
        warn(
            f"plugin '{failure.plugin}' failed in umahub_host_schedule for the host function "
            f"'{name}': {type(cause).__name__}: {cause}; umahub's own schedule is used instead"
        )
        return None
    if said is None:
        return None
    plugin = last_returned("umahub_host_schedule") or "a plugin"
    return sch.mod["main"], f"{plugin}: {said}"


def hook_schedule(hub: Any, func: tirx.PrimFunc, target: Any, name: str) -> tuple[Any, str]:
    """``func`` scheduled without tuning: by ``umahub_host_schedule``, else by
    :func:`umahub.host.schedules.default_schedule`; and how."""
    with recording():
        done = _by_plugin(hub, func, target, name)
    return done or default_schedule(func, target)


def lower_host(
    hub: Any, mod: tvm.IRModule, target: Any = None
) -> tuple[tvm.IRModule, dict[str, str]]:
    """``mod`` with its host part fused and scheduled; each host function's name and
    how it was scheduled (a rule of :func:`~umahub.host.schedules.default_schedule`,
    ``"unscheduled"``, or ``"<plugin>: <what it said>"``), by name.

    ``target``: what the host part is built for (a ``tvm.target.Target``; a
    cross build's, whose vector width the schedules take); None: :data:`HOST_TARGET`.
    """
    target = target if target is not None else tvm.target.Target(HOST_TARGET)
    with target:
        mod = tvm.transform.Sequential([make() for make in _FUSION])(mod)
    functions: dict[str, str] = {}
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, tirx.PrimFunc):
            continue
        name = gv.name_hint
        # a kernel tuned faster than its hook's schedule (tuning-database), else the hook's
        tuned = tuned_schedule(hub, func, target, name)
        new, how = tuned or hook_schedule(hub, func, target, name)
        if new is not func:
            mod.update_func(gv, new.with_attr("global_symbol", name) if _named(func) else new)
        functions[name] = how
    return mod, dict(sorted(functions.items()))


def _named(func: tirx.PrimFunc) -> bool:
    return func.attrs is not None and "global_symbol" in func.attrs
