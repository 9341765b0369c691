"""Weights in the layout a kernel reads them: packed once, at compile time.

A fast kernel rarely reads a weight the way the model stores it: a matrix
engine wants the columns of ``B`` in panels as wide as its vectors, a
convolution its filters grouped by output-channel block. Packed inside the
kernel, that costs a pass over the weight at every inference (for a tiled
kernel, one per tile). A schedule moves the packing out of the kernel with
TVM's own convention, the one MetaSchedule's layout rewrite uses: a block at
the root that copies the parameter into the new layout, annotated
``meta_schedule.layout_rewrite_preproc``. :func:`pack_weight` makes it::

    def umahub_schedule(accelerator, schedule, context):
        block = schedule.get_sblock("matmul")
        if 1 in context.weights:  # B is a constant: pack it at compile time
            pack_weight(schedule, block, 1, lambda k, j: (j // 16, k, j % 16))

Where the partition's call passes a constant for that parameter (a weight;
``CompileContext.weights`` lists them), umahub splits the block off the kernel
(``relax.transform.SplitLayoutRewritePreproc``), runs it once at compile time
on the constant, and the built model holds the packed weight instead: the
kernel receives it as its parameter and never packs. Where some packed
parameter is not a constant (an activation, a weight the user passes in), the
kernel is kept whole: the block runs at every call, once (:func:`split`).

Verification compares a partition against the host on the model's own
weight: :func:`fold` keeps the originals for it (``Packers.originals``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax

from umahub._tvm import Constant, TupleType, constant_value, name_of, ret_type, type_args, type_of
from umahub.errors import CompileError, PluginOutputError
from umahub.host.constant_stages import ConstantStages, compute
from umahub.ir import bindings, partition_call, partition_calls
from umahub.plugin.compat import SBlock, nodes_in

__all__ = [
    "ANNOTATION",
    "Packers",
    "Packing",
    "describe",
    "fold",
    "pack_weight",
    "split",
    "weights_of",
]

#: The block annotation (TVM's) that marks a layout transform of a parameter.
ANNOTATION = "meta_schedule.layout_rewrite_preproc"


def pack_weight(sch: Any, block: Any, read_index: int, index_map: Callable[..., Any]) -> Any:
    """Make ``block``'s ``read_index``-th read a copy in the layout ``index_map``,
    computed at the root and annotated for packing at compile time.

    Call it before tiling ``block``: the copy is one stage at the root of the
    PrimFunc. Returns the copy's block.
    """
    packed = sch.cache_read(block, read_index, "global")
    sch.transform_layout(packed, ("write", 0), index_map)
    sch.annotate(packed, ANNOTATION, True)
    return packed


@dataclass(frozen=True)
class Packing:
    """How one input of a kernel is packed: the PrimFunc that packs it, and its result's type."""

    prim: Any
    out_type: Any


@dataclass
class Packers:
    """What :func:`split` took out of the kernels, by partition.

    Attributes:
        packings: symbol -> {input index: how that input is packed}.
        originals: (after :func:`fold`) symbol -> {input index: the weight
            before packing}, for verification.
        stages: symbol -> the kernel's stages computed at compile time
            (:mod:`umahub.host.constant_stages`), whose results :func:`fold`
            passes to each call after its inputs.
    """

    packings: dict[str, dict[int, Packing]] = field(default_factory=dict)
    originals: dict[str, dict[int, np.ndarray]] = field(default_factory=dict)
    stages: dict[str, ConstantStages] = field(default_factory=dict)


def _annotated(prim: Any) -> bool:
    return any(ANNOTATION in block.annotations for block in nodes_in(prim.body, SBlock))


def _wrapper(prim: Any, symbol: str, function: relax.Function) -> tvm.IRModule:
    """A Relax ``main`` that calls ``prim`` as the host calls the partition."""
    bb = relax.BlockBuilder()
    kernel = bb.add_func(prim, symbol)
    params = [relax.Var(f"arg{i}", type_of(p)) for i, p in enumerate(function.params)]
    out = ret_type(function)
    outs = list(out.fields) if isinstance(out, TupleType) else out
    with bb.function("main", params):
        with bb.dataflow():
            result = bb.emit_output(relax.call_tir(kernel, params, outs))
        bb.emit_func_output(result)
    return bb.get()


def split(
    mod: tvm.IRModule, symbol: str, function: relax.Function, weights: frozenset[int]
) -> tuple[tvm.IRModule, dict[int, Packing]]:
    """The kernel ``symbol`` of ``mod`` without its packing blocks, and those blocks.

    Args:
        mod: the scheduled module; ``mod[symbol]`` is the partition's kernel.
        function: the partition's Relax function (its inputs and outputs).
        weights: indices of the inputs that the call passes as constants.

    Returns:
        The module with the kernel taking the packed inputs, and input index ->
        how it is packed; or ``mod`` unchanged and ``{}`` when the kernel packs
        nothing, or packs an input that is not a constant.
    """
    prim = mod[symbol]
    if not isinstance(prim, tvm.tirx.PrimFunc) or not _annotated(prim):
        return mod, {}
    try:
        compute, packings = _split(prim, symbol, function)
    except Exception as exc:
        said = str(exc).strip().splitlines()  # TVM's check is the first line, IR follows
        raise PluginOutputError(
            f"the blocks annotated {ANNOTATION} in {symbol} cannot be split off the kernel "
            f"({type(exc).__name__}: {said[0] if said else ''}): such a block must be at the "
            "root and copy one parameter into a new layout (see umahub.plugin.pack_weight)"
        ) from exc
    if not packings or not set(packings) <= weights:
        return mod, {}
    out = tvm.IRModule({gv: f for gv, f in mod.functions.items() if name_of(gv) != symbol})
    for key, value in (prim.attrs or {}).items():
        compute = compute.with_attr(str(key), value)
    out[symbol] = compute
    return out, packings


def _split(prim: Any, symbol: str, function: relax.Function) -> tuple[Any, dict[int, Packing]]:
    """TVM's SplitLayoutRewritePreproc on ``prim``: the kernel, and its packings by input."""
    wrapped = relax.transform.SplitLayoutRewritePreproc()(_wrapper(prim, symbol, function))
    main = wrapped["main"]
    values = [b.value for block in main.body.blocks for b in block.bindings]
    calls = [v for v in values if isinstance(v, relax.Call) and v.op.name == "relax.call_tir"]
    *packing, kernel = calls
    packings = {}
    for call in packing:
        (source,) = call.args[1].fields
        index = next(i for i, p in enumerate(main.params) if p.same_as(source))
        packings[index] = Packing(wrapped[call.args[0]], type_of(call))
    return wrapped[kernel.args[0]], packings


def _packed(packers: Packers, calls: list[tuple[str, list]]) -> dict[tuple, Any]:
    """(symbol, input index, constant) -> the packed constant, all computed with
    one LLVM build (TVM objects hash by identity: a partition called twice with
    different weights gets each packed)."""
    if not calls:
        return {}
    todo: dict[tuple, Any] = {}
    funcs: dict[str, Any] = {}
    for symbol, args in calls:
        for index, packing in packers.packings[symbol].items():
            if not isinstance(args[index], Constant):
                raise CompileError(
                    f"partition {symbol} packs its input {index} at compile time, but the model "
                    "passes it no constant: this is a bug in umahub"
                )
            name = f"umahub_pack_{len(funcs)}"
            funcs[name] = packing.prim.with_attr("global_symbol", name)
            todo[(symbol, index, args[index])] = (name, packing.out_type)
    built = tvm.tirx.build(tvm.IRModule(funcs), target="llvm")
    values = {}
    for (symbol, index, constant), (name, ty) in todo.items():
        packed = tvm.runtime.empty([int(d) for d in ty.shape], ty.dtype, tvm.cpu())
        original = constant_value(constant)
        built[name](original, packed)
        packers.originals.setdefault(symbol, {})[index] = original.numpy()
        values[(symbol, index, constant)] = relax.const(packed)
    return values


def _staged(packers: Packers, calls: list[tuple[str, list]]) -> dict[tuple, list[Any]]:
    """(symbol, the call's constants) -> the results of the kernel's constant stages
    on them (``calls``' arguments already packed), all computed with one LLVM build."""
    todo: dict[tuple, tuple[ConstantStages, list[Any]]] = {}
    for symbol, args in calls:
        stages = packers.stages.get(symbol)
        if stages is None:
            continue
        used = tuple(args[i] for i in stages.inputs)
        if not all(isinstance(a, Constant) for a in used):
            raise CompileError(
                f"partition {symbol} computes stages from its inputs {list(stages.inputs)} at "
                "compile time, but the model passes no constant for some: this is a bug in umahub"
            )
        values = [None] * len(args)
        for i, a in zip(stages.inputs, used):
            values[i] = constant_value(a)
        todo[(symbol, used)] = (stages, values)
    results = compute(list(todo.values()))
    return {key: [relax.const(r) for r in got] for key, got in zip(todo, results)}


def fold(mod: tvm.IRModule, packers: Packers) -> tvm.IRModule:
    """``mod`` (after ``RunCodegen``) with each packed weight of a partition call
    replaced by its packed value, computed at compile time, and the results of its
    kernel's constant stages passed after its inputs; ``packers.originals``
    filled."""
    if not any(packers.packings.values()) and not packers.stages:
        return mod
    calls = [
        call
        for binding in bindings(mod["main"])
        if (call := partition_call(mod, binding.value))
        and (packers.packings.get(call[0]) or call[0] in packers.stages)
    ]
    values = _packed(packers, [c for c in calls if packers.packings.get(c[0])])
    packed_calls = [
        (symbol, [values.get((symbol, i, a), a) for i, a in enumerate(args)])
        for symbol, args in calls
    ]
    staged = _staged(packers, packed_calls)

    @relax.expr_functor.mutator
    class Replace(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            found = partition_call(mod, call)
            if found is None or not (packers.packings.get(found[0]) or found[0] in packers.stages):
                return call
            symbol, args = found
            args = [values.get((symbol, i, a), a) for i, a in enumerate(args)]
            stages = packers.stages.get(symbol)
            if stages is not None:
                args += staged[(symbol, tuple(args[i] for i in stages.inputs))]
            return relax.Call(
                call.op, [call.args[0], relax.Tuple(args)], call.attrs, type_args(call), call.span
            )

    out = mod.clone()
    out["main"] = Replace().visit_expr(mod["main"])
    return out


def describe(function: relax.Function, index: int, packing: Packing) -> str:
    """``"weight 1 (64x32 -> 2x64x16)"``: what the report says of a packed input."""

    def dims(ty: Any) -> str:
        return "x".join(str(int(d)) for d in ty.shape)

    return f"weight {index} ({dims(type_of(function.params[index]))} -> {dims(packing.out_type)})"


def constants_of(mod: tvm.IRModule) -> dict[str, dict[int, Any]]:
    """symbol -> the values of the constants ``main``'s call of the partition passes,
    by input index (``mod`` before codegen)."""
    return {
        symbol: {i: constant_value(a) for i, a in enumerate(args) if isinstance(a, Constant)}
        for symbol, (_, args) in partition_calls(mod).items()
    }


def weights_of(mod: tvm.IRModule) -> dict[str, frozenset[int]]:
    """symbol -> indices of the inputs that ``main``'s call of the partition passes
    as constants (``mod`` before codegen)."""
    return {
        symbol: frozenset(i for i, a in enumerate(args) if isinstance(a, Constant))
        for symbol, (_, args) in partition_calls(mod).items()
    }
