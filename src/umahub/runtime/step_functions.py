"""Cutting a placed ``main`` into the steps of a :class:`~umahub.runtime.steps.StepGraph`.

After the build stage has put every partition on its device and inserted the
copies (:func:`umahub.compiler.stages.build.place_on_devices`), ``main`` is a sequence
of bindings of four kinds: a partition call on an accelerator instance, an
``R.to_vdevice`` copy, a tuple or variable alias, and host code. The
sequential executor is TVM's Relax VM running ``main``; the concurrent
executor (:mod:`umahub.runtime.executor`) runs the same model as a dependency graph,
and this module makes that graph:

* a **call** step is a Relax function of its own, compiled into the same
  library as ``main`` (``umahub_step_<i>``) and called through the VM by name:
  one partition call, or a group of host bindings. Its parameters are the
  values it reads from other steps, and it returns a tuple of the values other
  steps (or the model's caller) read from it.
* a **copy** step is one ``R.to_vdevice``: the executor copies the tensor
  itself (``Tensor.copyto``), on the copy worker of an ``async`` pool or on
  the worker of the device that does a ``sync`` copy.
* an **alias** step (``a = b``, ``t[i]``, ``(a, b)``) moves no data; the
  executor resolves it in Python as soon as its inputs are there.

The graph is cut after the host's part is fused and scheduled
(:func:`umahub.host.lowering.lower_host`): a host binding is a call of a
kernel ``main`` calls too, so the steps compute exactly what the VM does (cut
before, a multiply and the add after it that ``main`` fused, and LLVM
contracted into one multiply-add, could land in two steps and round
differently). Host bindings are grouped so that the graph stays small (one VM
call for a run of host kernels) and still lets devices overlap: a host
binding joins a host group that one of its inputs comes from, in the same
block, when no other step has read from that group yet (a group read by a
partition is closed, so the partition does not wait for host code it does
not need) and the group already waits for every other step the binding reads
from (a new input would hold the whole group back, and the graph stays free
of cycles).

Why Relax functions in the library rather than the partitions' packed
functions called from Python: host code between partitions must be compiled
anyway, the VM allocates each output on its device exactly as ``main`` does,
and an exported library then carries everything the executor needs. The graph
itself travels in the library too, as JSON returned by the Relax function
``umahub_steps``, so a library loaded without the plugins (and without
umahub's trailer knowing anything of it) runs concurrently as well.

What is not cut into steps (``umahub_steps`` then says why and the model runs
on the VM): sizes known only at run time (each step function would have to
re-derive them), and control flow (``R.If``) in ``main``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from umahub.errors import last_line
from umahub.lanes import accelerator_end, copy_label
from umahub.runtime.steps import GRAPH_FUNCTION, Step, StepGraph

__all__ = ["add_step_functions", "cut", "with_steps"]

_PREFIX = "umahub_step_"


class _Unsupported(Exception):
    pass


@dataclass
class _Draft:
    """A step being cut: its bindings (call) and the ids it reads and defines."""

    kind: str
    device: str
    bindings: list[Any] = field(default_factory=list)
    dataflow: bool = True
    block: int = 0
    inputs: list[int] = field(default_factory=list)
    defined: list[int] = field(default_factory=list)
    closed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def _device_index(ty: Any) -> int:
    vdevice = getattr(ty, "vdevice", None)
    return int(vdevice.vdevice_id) if vdevice is not None and vdevice.vdevice_id >= 0 else 0


def _static(ty: Any) -> bool:
    from umahub._tvm import TensorType, TupleType

    if isinstance(ty, TupleType):
        return all(_static(f) for f in ty.fields)
    if isinstance(ty, TensorType):
        values = getattr(ty.shape, "values", None) if ty.shape is not None else None
        return values is not None and all(getattr(d, "value", None) is not None for d in values)
    return True


def cut(main: Any, devices: Sequence[str], copy_kind: Mapping[str, str]) -> StepGraph:
    """The step graph of a placed ``main`` (after ``RealizeVDevice``), without its functions.

    :func:`add_step_functions` makes the functions too; this is the part that
    decides the steps. A ``main`` that cannot be cut gives a graph whose
    ``unsupported`` says why.
    """
    try:
        graph, _ = _cut(main, tuple(devices), dict(copy_kind))
    except _Unsupported as exc:
        return StepGraph(tuple(devices), unsupported=str(exc))
    return graph


def _cut(main: Any, devices: tuple[str, ...], copy_kind: dict[str, str]):
    from tvm import relax

    from umahub._tvm import name_of, type_of

    ids: dict[Any, int] = {}  # relax Var -> value id
    where: dict[int, str] = {}  # value id -> device
    maker: dict[int, int] = {}  # value id -> draft index
    ancestors: list[set[int]] = []
    drafts: list[_Draft] = []
    names: list[str] = []
    for p in main.params:
        if not _static(type_of(p)):
            raise _Unsupported(f"input {name_of(p)} has a size known only at run time")
        ids[p] = len(ids)
        names.append(name_of(p))
        where[ids[p]] = devices[_device_index(type_of(p))]

    def new_value(var: Any, device: str, draft: int) -> int:
        ids[var] = value = len(names)
        names.append(name_of(var))
        where[value], maker[value] = device, draft
        return value

    def read(expr: Any) -> list[int]:
        found = []
        for v in relax.analysis.free_vars(expr):
            if v not in ids:
                raise _Unsupported(f"{name_of(v)} is used before it is defined")
            found.append(ids[v])
        return list(dict.fromkeys(found))

    def open_step(draft: _Draft, reads: list[int]) -> int:
        index = len(drafts)
        draft.inputs = reads
        before = {maker[v] for v in reads if v in maker}
        ancestors.append(set().union(*[ancestors[t] | {t} for t in before]) if before else set())
        for t in before:
            drafts[t].closed = True
        drafts.append(draft)
        return index

    def host_group(reads: list[int], block: int) -> int | None:
        """A host group the binding can join without a cycle, or None."""
        producers = {maker[v] for v in reads if v in maker}
        for s in sorted(producers, reverse=True):
            d = drafts[s]
            if d.kind != "call" or d.device != devices[0] or d.closed or d.block != block:
                continue
            # Only inputs the group already waits for: a new one would hold all of it back.
            if all(t in ancestors[s] for t in producers - {s}):
                return s
        return None

    op_to_vdevice = "relax.to_vdevice"
    for block_index, block in enumerate(main.body.blocks):
        dataflow = isinstance(block, relax.DataflowBlock)
        for binding in block.bindings:
            var, value = binding.var, binding.value
            if not _static(type_of(var)):
                raise _Unsupported(f"{name_of(var)} has a size known only at run time")
            if isinstance(value, relax.If):
                raise _Unsupported("main has control flow (R.If)")
            reads = read(value)
            kind, device, extra = _classify(value, ids, where, devices, type_of(var), op_to_vdevice)
            joined = host_group(reads, block_index) if device == devices[0] else None
            if kind == "alias" and reads and joined is not None:
                kind = "host"  # an alias of host values inside a host group is host code
            if kind == "host" and joined is not None:
                d = drafts[joined]
                producers = {maker[v] for v in reads if v in maker} - {joined}
                for t in producers:
                    ancestors[joined] |= ancestors[t] | {t}
                    drafts[t].closed = True
                d.bindings.append(binding)
                d.inputs += [v for v in reads if maker.get(v) != joined and v not in d.inputs]
                d.defined.append(new_value(var, device, joined))
                continue
            draft = _Draft("call" if kind in ("host", "partition") else kind, device, [binding])
            draft.dataflow, draft.block, draft.extra = dataflow, block_index, extra
            if kind == "copy":
                extra["src"] = where[reads[0]]
                end = accelerator_end(extra["src"], device)
                extra["mode"] = copy_kind.get(end, "sync")
                draft.device = end
            index = open_step(draft, reads)
            draft.defined.append(new_value(var, device, index))
    output = _structure(main.body.body, ids)
    for v in _flat(output):
        if v in maker:
            drafts[maker[v]].closed = True
    return _finish(drafts, names, ids, where, devices, copy_kind, output, len(main.params))


def _classify(value, ids, where, devices, ty, op_to_vdevice) -> tuple[str, str, dict]:
    """(kind, device of the value, details) of one binding's value."""
    import tvm
    from tvm import relax

    if isinstance(value, relax.Var):
        return "alias", where[ids[value]], {"mode": "same"}
    if isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var):
        return "alias", where[ids[value.tuple_value]], {"mode": "get", "field": int(value.index)}
    if isinstance(value, relax.Tuple) and all(isinstance(f, relax.Var) for f in value.fields):
        fields = [ids[f] for f in value.fields]  # a value may be two fields: read lists it once
        places = {where[v] for v in fields}
        device = places.pop() if len(places) == 1 else devices[0]
        return "alias", device, {"mode": "tuple", "fields": fields}
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        if value.op.name == op_to_vdevice:
            if not isinstance(value.args[0], relax.Var):
                raise _Unsupported("a copy of something other than a variable")
            return "copy", devices[_device_index(ty)], {}
        if value.op.name == "relax.call_dps_packed" and isinstance(value.args[0], relax.ExternFunc):
            device = devices[_device_index(ty)]
            if device != devices[0]:
                return "partition", device, {"partition": str(value.args[0].global_symbol)}
    return "host", devices[0], {}


def _structure(expr: Any, ids: dict) -> Any:
    from tvm import relax

    if isinstance(expr, relax.Var) and expr in ids:
        return ids[expr]
    if isinstance(expr, relax.Tuple):
        return [_structure(f, ids) for f in expr.fields]
    raise _Unsupported("main returns something other than its variables")


def _flat(output: Any) -> list[int]:
    if isinstance(output, list):
        return [v for o in output for v in _flat(o)]
    return [output]


def _finish(drafts, names, ids, where, devices, copy_kind, output, params):
    """Outputs of every draft (the values that other steps or the caller read), then steps."""
    read_elsewhere: set[int] = set(_flat(output))
    maker = {v: i for i, d in enumerate(drafts) for v in d.defined}
    for i, d in enumerate(drafts):
        read_elsewhere |= {v for v in d.inputs if maker.get(v) != i}
    steps: list[Step] = []
    calls = 0
    for d in drafts:
        outputs = tuple(v for v in d.defined if v in read_elsewhere)
        if d.kind == "call":
            function = f"{_PREFIX}{calls}"
            calls += 1
            partition = d.extra.get("partition", "")
            label = partition or "host: " + ", ".join(names[v] for v in d.defined)
            steps.append(
                Step("call", d.device, tuple(d.inputs), outputs, function, label, partition)
            )
        elif d.kind == "copy":
            v = d.defined[0]
            dst = where[v]
            label = copy_label(names[d.inputs[0]], d.extra["src"], dst)
            steps.append(
                Step("copy", d.device, tuple(d.inputs), (v,), label=label, mode=d.extra["mode"],
                     src=d.extra["src"], dst=dst, dst_index=devices.index(dst))
            )  # fmt: skip
        else:
            steps.append(
                Step("alias", d.device, tuple(d.inputs), tuple(d.defined), mode=d.extra["mode"],
                     field=d.extra.get("field", 0), fields=tuple(d.extra.get("fields", ())),
                     label=f"{names[d.defined[0]]}")
            )  # fmt: skip
    graph = StepGraph(devices, params, len(names), tuple(steps), output, dict(copy_kind))
    return graph, drafts


# ---------------------------------------------------------------------- functions


def _substitute(expr: Any, mapping: dict) -> Any:
    """``expr`` with the variables of ``mapping`` replaced."""
    from tvm import relax

    @relax.expr_functor.mutator
    class Replace(relax.PyExprMutator):
        def visit_var_(self, var):
            return mapping[var] if var in mapping else super().visit_var_(var)

        def visit_dataflow_var_(self, var):
            return mapping[var] if var in mapping else super().visit_dataflow_var_(var)

    return Replace().visit_expr(expr)


def _string(text: str) -> Any:
    from tvm import relax

    string = getattr(relax, "StringImm", None) or relax.expr.String  # renamed in 0.26
    return string(text)


def add_step_functions(mod: Any, devices: Sequence[str], copy_kind: Mapping[str, str]) -> Any:
    """``mod`` with a Relax function per call step and ``umahub_steps`` (the graph as JSON).

    ``mod`` is the placed module (its ``main`` after ``RealizeVDevice``). A
    model on the host alone is returned as it is: it has nothing to overlap.
    When ``main`` cannot be cut, only ``umahub_steps`` is added, saying why.
    """
    if len(devices) < 2:
        return mod
    try:
        out = _with_functions(mod, tuple(devices), dict(copy_kind))
        if out is not None:
            return out
        reason = "its step functions are not well formed (a bug to report)"
    except Exception as exc:  # never let the concurrent executor's part break a build
        reason = f"cutting main into steps failed ({type(exc).__name__}: {last_line(exc)})"
    return _graph_only(mod, StepGraph(tuple(devices), unsupported=reason))


def _graph_only(mod: Any, graph: StepGraph) -> Any:
    from tvm import relax

    bb = relax.BlockBuilder(mod)
    with bb.function(GRAPH_FUNCTION, [], private=False):
        bb.emit_func_output(_string(graph.to_json()))
    return bb.get()


def _with_functions(mod: Any, devices: tuple[str, ...], copy_kind: dict[str, str]) -> Any:
    """``mod`` with the step functions and the graph, or None when not well formed."""
    from tvm import relax

    from umahub._tvm import name_of, type_of, well_formed

    main = mod["main"]
    try:
        graph, drafts = _cut(main, tuple(devices), dict(copy_kind))
    except _Unsupported as exc:
        graph, drafts = StepGraph(tuple(devices), unsupported=str(exc)), []
    bb = relax.BlockBuilder(mod)
    var_of = {v: k for k, v in _ids(main, drafts).items()}
    calls = [s for s in graph.steps if s.kind == "call"]
    for step, draft in zip(calls, [d for d in drafts if d.kind == "call"]):
        params = [relax.Var(name_of(var_of[v]), type_of(var_of[v])) for v in step.inputs]
        mapping = {var_of[v]: p for v, p in zip(step.inputs, params)}
        pure = bool(main.is_pure) or draft.dataflow
        with bb.function(step.function, params, pure=pure, private=False):
            frame = bb.dataflow() if draft.dataflow else contextlib.nullcontext()
            with frame:
                for binding in draft.bindings:
                    value = _substitute(binding.value, mapping)
                    if isinstance(binding, relax.MatchCast):
                        new = bb.match_cast(value, type_of(binding.var), name_of(binding.var))
                    else:
                        new = bb.emit(value, name_of(binding.var))
                    mapping[binding.var] = new
                outs = [mapping[var_of[v]] for v in step.outputs]
                if draft.dataflow:
                    outs = [bb.emit_output(o) for o in outs]
            bb.emit_func_output(relax.Tuple(outs))
    with bb.function(GRAPH_FUNCTION, [], private=False):
        bb.emit_func_output(_string(graph.to_json()))
    out = bb.get()
    return out if not calls or well_formed(out) else None


def _ids(main: Any, drafts: list[_Draft]) -> dict[Any, int]:
    """relax Var -> value id, as :func:`_cut` numbered them (parameters, then bindings)."""
    ids = {p: i for i, p in enumerate(main.params)}
    order = sorted(
        ((v, b.var) for d in drafts for v, b in zip(d.defined, d.bindings)), key=lambda x: x[0]
    )
    for v, var in order:
        ids[var] = v
    return ids


def with_steps(mod: Any, devices: Sequence[str], hub: Any) -> Any:
    """:func:`add_step_functions` with each accelerator's copy kind taken from its first pool."""
    kinds = {}
    for device in devices[1:]:
        pool = hub.accelerator(device.split(":")[0]).pool
        kinds[device] = pool.copy if pool else "sync"
    return add_step_functions(mod, devices, kinds)
