"""Stage 5, build: partitions put on their devices, copies inserted, the host part compiled.

Every virtual device gets a runtime device index: the host is 0, then each
accelerator instance in use, in accelerator order (on this CPU-only runtime,
``tvm.cpu(i)``). ``main`` is rebuilt binding by binding: a partition call
receives its tensors on its device and produces its output there; wherever a
tensor is needed on another device, one ``R.to_vdevice`` copy is inserted (and
reused by every later consumer on that device). The module carries the
``vdevice`` list; ``RealizeVDevice`` and the VM, made with the device list, do
the rest.

Why this module is long: :func:`place_on_devices` rebuilds ``main`` binding by
binding, and its closures (fetch a value onto a device, record the copy) share
that walk's state; split up, they would pass half a dozen maps to each other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tvm
from tvm import relax

from umahub._tvm import (
    Constant,
    TensorType,
    TupleType,
    VDevice,
    call_dps_packed,
    name_of,
    type_args,
    type_of,
)
from umahub.compiler import codegen
from umahub.compiler.compilation import Compilation, Partitioned
from umahub.compiler.tir_phases import PIPELINE_NAME as TIR_PIPELINE
from umahub.compiler.vdevice import VirtualDevice
from umahub.config import HOST
from umahub.errors import CompileError, last_line
from umahub.host import prepack, scratch, storage_plan
from umahub.host.lowering import HOST_TARGET, lower_host
from umahub.ir import bindings, node_name, partition_call
from umahub.plugin.context import Copy
from umahub.plugin.memory import tensor_bytes
from umahub.runtime.compiled import Compiled, signature_of
from umahub.runtime.step_functions import with_steps

__all__ = ["count_copies", "load", "place_on_devices", "prepare", "run"]


@relax.expr_functor.mutator
class _Substitute(relax.PyExprMutator):
    def __init__(self, mapping: dict) -> None:
        super().__init__()
        self.mapping = mapping

    # Variables bound inside the expression (an If's branches) may be re-created
    # by the mutator as it goes: those are left to it.
    def visit_var_(self, var):
        return self.mapping[var] if var in self.mapping else super().visit_var_(var)

    def visit_dataflow_var_(self, var):
        return self.mapping[var] if var in self.mapping else super().visit_dataflow_var_(var)


def _on(ty, vdevice):
    """A tensor type (or a tuple of them) placed on ``vdevice``; other types as they are."""
    if isinstance(ty, TensorType):
        return TensorType(ty.shape, ty.dtype, vdevice)
    if isinstance(ty, TupleType):
        return TupleType([_on(f, vdevice) for f in ty.fields])
    return ty


def _dps_outputs(ty):
    """The output types ``call_dps_packed`` takes: one tensor type, or a list for a tuple.

    A partition returns a tuple when a value computed inside it is also read
    outside (MergeCompositeFunctions gives it one output per such value).
    """
    if isinstance(ty, TupleType):
        if not all(isinstance(f, TensorType) for f in ty.fields):
            raise CompileError(f"a partition must return tensors or a flat tuple of them, not {ty}")
        return list(ty.fields)
    return ty


def _device_weights(mod: tvm.IRModule, device_of: Mapping[str, str]) -> dict[tuple, str]:
    """(constant, device) -> the first partition reading it, for every weight a
    partition on an accelerator reads, in model order."""
    found: dict[tuple, str] = {}  # TVM objects hash by identity
    for binding in bindings(mod["main"]):
        call = partition_call(mod, binding.value)
        if call is None or call[0] not in device_of:
            continue
        for arg in call[1]:
            if isinstance(arg, Constant) and isinstance(type_of(arg), TensorType):
                found.setdefault((arg, device_of[call[0]]), call[0])
    return found


def place_on_devices(
    mod: tvm.IRModule,
    device_of: Mapping[str, str],
    devices: Sequence[str],
    copy_kind: Mapping[str, str],
    realize: bool = True,
    lift_weights: bool = True,
) -> tuple[tvm.IRModule, list[Copy], list[int]]:
    """Put each partition (by symbol) on its device and insert the copies.

    Weights (constants) that partitions read are not copied at every
    inference: they become extra parameters of ``main``, placed on their
    device, and the function ``umahub_weights`` returns their values, so that
    the runner copies them to their devices once, when the model is loaded.

    Args:
        mod: the module after ``RunCodegen`` (partitions are ``call_dps_packed``).
        device_of: partition symbol -> virtual device name (``"npu:0"``).
        devices: virtual device names; index = runtime device index; [0] is the host.
        copy_kind: virtual device -> "sync" or "async" (how its pool is filled).
        realize: run ``RealizeVDevice`` (needed to build; not to count copies).
        lift_weights: make weights parameters copied at load; False copies
            them at every inference and keeps ``main``'s parameters as they are.

    Returns:
        The module, the copies (in the order they happen), and the runtime
        device index of each weight parameter.
    """
    vdevices = [VDevice("llvm", i, "global") for i in range(len(devices))]
    index = {name: i for i, name in enumerate(devices)}
    main = mod["main"]
    others = {gv: f for gv, f in mod.functions.items() if name_of(gv) != "main"}
    bb = relax.BlockBuilder(tvm.IRModule(others, attrs=mod.attrs))
    params = [relax.Var(name_of(p), _on(type_of(p), vdevices[0])) for p in main.params]
    first_reader = _device_weights(mod, device_of) if lift_weights else {}
    weights = list(first_reader)
    weight_params = [
        relax.Var(f"umahub_w{i}", _on(type_of(c), vdevices[index[d]]))
        for i, (c, d) in enumerate(weights)
    ]
    remap: dict = dict(zip(main.params, params))
    where: dict = {w: d for w, (_, d) in zip(weight_params, weights)}
    fetched: dict = {}
    copies: list[Copy] = []
    made_by: dict = {}  # variable -> the operator (node) or partition (symbol) that made it
    reader = [""]  # the operator or partition being emitted: the consumer of its copies
    for (constant, device), param in zip(weights, weight_params):
        fetched[(constant, device)] = param
        copies.append(
            Copy(
                "weight",
                HOST,
                device,
                tensor_bytes(type_of(constant)),
                copy_kind.get(device, "sync"),
                constant=True,
                when="load",
                consumer=first_reader[(constant, device)],
            )
        )

    def fetch(expr: relax.Expr, device: str) -> relax.Expr:
        if (expr, device) in fetched:  # a copy made before, or a weight parameter
            return fetched[(expr, device)]
        source = where.get(expr, HOST)
        if source == device:
            return expr
        key = (expr, device)
        if isinstance(type_of(expr), TupleType):  # a multi-output partition: field by field
            fields = []
            for i in range(len(type_of(expr).fields)):
                item = bb.emit(relax.TupleGetItem(expr, i))
                where[item] = source
                made_by[item] = made_by.get(expr, "")
                fields.append(fetch(item, device))
            fetched[key] = bb.emit(relax.Tuple(fields))
            return fetched[key]
        if not isinstance(type_of(expr), TensorType):
            return expr
        if key not in fetched:
            fetched[key] = bb.emit(relax.op.to_vdevice(expr, vdevices[index[device]]))
            accelerator_end = device if device != HOST else source
            copies.append(
                Copy(
                    tensor=name_of(expr) if isinstance(expr, relax.Var) else "constant",
                    src=source,
                    dst=device,
                    bytes=tensor_bytes(type_of(expr)),
                    kind=copy_kind.get(accelerator_end, "sync"),
                    constant=isinstance(expr, Constant),
                    producer=made_by.get(expr, ""),
                    consumer=reader[0],
                )
            )
        return fetched[key]

    def host_arg(arg: relax.Expr) -> relax.Expr | None:
        if isinstance(arg, relax.Var):
            return fetch(remap.get(arg, arg), HOST)
        if isinstance(arg, relax.Call | relax.Tuple | relax.TupleGetItem):
            return None  # nested: left to the general substitution below
        return arg  # constants, shapes, prim values

    def host_value(value: relax.Expr) -> relax.Expr:
        if isinstance(value, relax.Call):  # the common case, without a mutator
            args = [host_arg(a) for a in value.args]
            if all(a is not None for a in args):
                return relax.Call(value.op, args, value.attrs, type_args(value), value.span)
        used = relax.analysis.free_vars(value)
        mapping = {v: fetch(remap.get(v, v), HOST) for v in used}
        return _Substitute(mapping).visit_expr(value) if mapping else value

    attrs = {str(k): v for k, v in main.attrs.items()} if main.attrs else None

    def emit(binding: relax.Binding, dataflow: bool) -> None:
        value = binding.value
        name = name_of(binding.var)
        call = partition_call(mod, value)
        placed_call = call is not None and call[0] in device_of
        reader[0] = call[0] if placed_call else node_name(binding)
        if isinstance(binding, relax.MatchCast):  # defines symbolic sizes: kept, on the host
            var = type(binding.var)(name, type_of(binding.var))
            bb.emit_normalized(relax.MatchCast(var, bb.normalize(host_value(value)), type_of(var)))
            remap[binding.var] = var
            return
        tuple_value = (
            remap.get(value.tuple_value, value.tuple_value)
            if isinstance(value, relax.TupleGetItem)
            else None
        )
        if placed_call:
            symbol, call_args = call
            device = device_of[symbol]
            args = [fetch(remap.get(a, a), device) for a in call_args]
            out_ty = _dps_outputs(_on(type_of(value), vdevices[index[device]]))
            new = call_dps_packed(relax.ExternFunc(symbol), relax.Tuple(args), out_ty)
        elif tuple_value is not None and where.get(tuple_value, HOST) != HOST:
            # an output of a multi-output partition stays on its device until read
            device, new = where[tuple_value], relax.TupleGetItem(tuple_value, value.index)
        else:
            device, new = HOST, host_value(value)
        if not dataflow or isinstance(binding.var, relax.DataflowVar):
            var = bb.emit(new, name)
            if device != HOST:
                where[var] = device
        else:  # a dataflow block's output lives on the host
            if device != HOST:
                on_device = bb.emit(new, name)
                where[on_device] = device
                made_by[on_device], reader[0] = reader[0], ""  # read by the model's caller
                new = fetch(on_device, HOST)
                reader[0] = made_by[on_device]
            var = bb.emit_output(new, name)
        remap[binding.var] = var
        made_by[var] = reader[0]

    with bb.function("main", params + weight_params, attrs=attrs, pure=main.is_pure):
        for block in main.body.blocks:
            if isinstance(block, relax.DataflowBlock):
                with bb.dataflow():
                    for binding in block.bindings:
                        emit(binding, dataflow=True)
            else:  # a plain block (control flow, impure calls): everything on the host
                for binding in block.bindings:
                    emit(binding, dataflow=False)
        bb.emit_func_output(_Substitute(remap).visit_expr(main.body.body))
    if weights:
        with bb.function("umahub_weights", []):
            bb.emit_func_output(relax.Tuple([c for c, _ in weights]))
    placed = bb.get()
    for key, value in (mod.global_infos or {}).items():
        if key != "vdevice":
            placed.update_global_info(key, value)
    placed.update_global_info("vdevice", vdevices)
    if realize:
        placed = relax.transform.RealizeVDevice()(placed)
    return placed, copies, [index[d] for _, d in weights]


def _virtual_devices(hub: Any, reports: Any, devices: list[str]) -> None:
    """Write each placed partition's :class:`umahub.VirtualDevice` into its report."""
    for r in reports:
        if r.fallback or r.device not in devices:
            continue
        acc = hub.accelerator(r.accelerator)
        scope = acc.pool.scope if acc.pool else None
        r.virtual_device = str(VirtualDevice("cpu", devices.index(r.device), acc.codegen, scope))


def _devices(hub: Any, part: Partitioned) -> tuple[list[str], dict[str, str], dict[str, str]]:
    used = {p.device for p in part.partitions}
    devices = [HOST] + [d for a in hub.accelerators for d in a.devices if d in used]
    device_of = {p.symbol: p.device for p in part.partitions}
    pools = {d: hub.accelerator(d.split(":")[0]).pool for d in devices[1:]}
    kinds = {d: pool.copy if pool else "sync" for d, pool in pools.items()}
    return devices, device_of, kinds


def count_copies(comp: Compilation) -> None:
    """The devices and copies of ``comp``'s placement, without building (for ``explain``)."""
    placed = comp.placed()
    devices, device_of, kinds = _devices(comp.hub, placed)
    _, comp.copies, _ = place_on_devices(placed.mod, device_of, devices, kinds, realize=False)
    comp.devices = devices
    _virtual_devices(comp.hub, comp.reports.values(), devices)


def prepare(comp: Compilation, placed: Partitioned, lift_weights: bool = True) -> tvm.IRModule:
    """The placed module, ready for TVM's Relax pipeline: partitions replaced by calls
    of their runtime modules (``RunCodegen``), on their devices, with the copies.

    Sets ``comp.devices`` and ``comp.copies``. ``lift_weights``: see
    :func:`place_on_devices`; False keeps ``main``'s signature the model's own
    (what a module handed back to ``tvm.compile`` must do).
    """
    hub = comp.hub
    devices, device_of, kinds = _devices(hub, placed)
    copies: list[Copy] = []
    weight_devices: list[int] = []
    host = placed.mod
    if placed.partitions:
        for acc in hub.accelerators:
            codegen.register_ext_codegen(acc)
        with codegen.serving(comp.modules):
            host = relax.transform.RunCodegen()(host)
        host = prepack.fold(host, comp.packers)
        host, copies, weight_devices = place_on_devices(
            host, device_of, devices, kinds, lift_weights=lift_weights
        )
    if comp.fallen:
        host = relax.transform.LambdaLift()(host)  # fallen-back composites are local
    comp.devices, comp.copies, comp.weight_devices = devices, copies, weight_devices
    _virtual_devices(hub, comp.reports.values(), devices)
    return host


def _build(comp: Compilation, placed: Partitioned) -> Compiled:
    with comp.clock.stage("build"):
        host = prepare(comp, placed)
        target = comp.target.tvm() if comp.target is not None else tvm.target.Target(HOST_TARGET)
        host, comp.host_schedules = lower_host(comp.hub, host, target)
        # cut after the host's fusion: a step calls the very kernels main calls, so
        # the concurrent executor computes exactly what the VM does (a multiply and
        # the add after it fused in main, but in two steps, rounded differently)
        host = with_steps(host, comp.devices, comp.hub)
        host = storage_plan.plan_storage(host)  # so TVM's own plan is left out
        with tvm.transform.PassContext(opt_level=3, disabled_pass=storage_plan.REPLACED_PASSES):
            # umahub's TIR pipeline is TVM's default plus the stack scratch pass:
            # with an older TVM, which the pass leaves alone, TVM's own
            pipeline = TIR_PIPELINE if scratch.SUPPORTED else "default"
            executable = tvm.compile(host, target=target, tir_pipeline=pipeline)
    with comp.clock.stage("load"):
        try:
            return load(comp, executable)
        except Exception as exc:
            detail = str(exc).strip()
            raise CompileError(
                f"the compiled model cannot be linked or loaded: {type(exc).__name__}: {detail}"
            ) from exc


def load(comp: Compilation, executable: Any) -> Compiled:
    """The runnable model of ``executable``, built from ``comp``'s prepared module."""
    placed = comp.placed()
    used = [comp.hub.accelerator(p.accelerator) for p in placed.partitions]
    kinds_built = {codegen.module_kind(comp.modules[p.symbol]) for p in placed.partitions}
    return Compiled(
        executable,
        comp.devices,
        signature_of(comp.mod["main"]),
        codegen.export_options(used),
        None,
        comp.weight_devices,
        needs_export="c" in kinds_built,
        target=comp.target,
    )


def run(comp: Compilation) -> None:
    """Stage 5: build the host part with the partitions that did not fall back, and load it.

    A failure here is umahub's or TVM's, not one partition's: with ``on-error
    = "fallback"`` the model is built again with every partition on the host
    (never worse than plain TVM), with a warning and a note; with ``"error"``
    the compile stops.
    """
    placed = comp.placed()
    try:
        comp.compiled = _build(comp, placed)
    except Exception as exc:
        if not placed.partitions:
            raise
        message = (
            f"building the model with its partitions placed failed ({type(exc).__name__}: "
            f"{last_line(exc)}); a symbol missing at load time points "
            "at a plugin's kernel library (c_sources), anything else is a bug to report"
        )
        comp.fail(message, CompileError, exc, then="every partition runs on the host")
        for p in placed.partitions:
            comp.reports[p.symbol].fallback = "the placed model failed to build (see the notes)"
        comp.compiled = _build(comp, comp.placed())
