"""Stage 5, build: partitions put on their devices, copies inserted, the host part compiled.

Every virtual device gets an index: the host is 0, then each accelerator
instance in use, in accelerator order. ``main`` is rebuilt binding by
binding: a partition call receives its tensors on its device and produces its
output there; wherever a tensor is needed on another device, one
``R.to_vdevice`` copy is inserted (and reused by every later consumer on that
device). The module carries the ``vdevice`` list and ``RealizeVDevice`` does
the rest. The concurrent executor's steps are cut from that ``main``; then,
as every device of this runtime is the host's memory, the VM's ``main`` loses
its copies again (:mod:`umahub.compiler.one_memory`).

Why this module is long: placing the partitions (:class:`DevicePlacer`) is one
walk over ``main`` whose steps (emit a binding, fetch a value onto a device,
record the copy) share its state: where each value lives, the copies made, who
made each value. It is most of the stage; the rest builds on its result.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
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
from umahub.compiler.one_memory import in_one_memory, on_vdevice
from umahub.compiler.tir_phases import PIPELINE_NAME as TIR_PIPELINE
from umahub.compiler.vdevice import VirtualDevice
from umahub.config import HOST
from umahub.errors import CompileError, message_line
from umahub.host import prepack, storage_plan, weight_checks
from umahub.host.lowering import HOST_TARGET, lower_host
from umahub.ir import bindings, node_name, partition_call, partition_calls
from umahub.plugin.context import Copy
from umahub.plugin.memory import tensor_bytes
from umahub.runtime.compiled import Compiled, signature_of
from umahub.runtime.step_functions import with_steps
from umahub.tuning.lookup import recording as tuned_kernels

__all__ = ["DevicePlacer", "count_copies", "load", "place_on_devices", "prepare", "run"]


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


def _device_weights(
    mod: tvm.IRModule, device_of: Mapping[str, str], resident: Mapping[str, Any]
) -> dict[tuple, str]:
    """(constant, device) -> the first partition reading it, for every weight a
    partition on an accelerator reads, in model order (not those of partitions on
    devices of their own: their weights are resident, see ``resident``)."""
    found: dict[tuple, str] = {}  # TVM objects hash by identity
    for binding in bindings(mod["main"]):
        call = partition_call(mod, binding.value)
        if call is None or call[0] not in device_of or call[0] in resident:
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
    resident: Mapping[str, Sequence[int]] | None = None,
    own_memory: Collection[str] = (),
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
        resident: symbol -> for each input, -1 or where it is resident, for the
            partitions on devices of their own
            (:attr:`umahub.runtime.devices.DeviceCall.inputs`): their constant
            inputs are not passed (the runtime holds them on the device from
            load on; each is recorded as a copy at load).
        own_memory: the virtual devices with a memory of their own (a device
            runtime's); a copy between two others is marked ``in_place``.

    Returns:
        The module, the copies (in the order they happen), and the runtime
        device index of each weight parameter.
    """
    return DevicePlacer(
        mod, device_of, devices, copy_kind, lift_weights, resident, own_memory
    ).place(realize)


class DevicePlacer:
    """One walk over ``main`` that rebuilds it with every partition on its device.

    See :func:`place_on_devices`, its entry point, for the arguments. A
    placer places once: its fields are the walk's state, which each binding
    emitted reads and extends (where every value lives, the copies made so
    far, who made each value).
    """

    def __init__(
        self,
        mod: tvm.IRModule,
        device_of: Mapping[str, str],
        devices: Sequence[str],
        copy_kind: Mapping[str, str],
        lift_weights: bool = True,
        resident: Mapping[str, Sequence[int]] | None = None,
        own_memory: Collection[str] = (),
    ) -> None:
        self.mod = mod
        self.resident = dict(resident or {})
        self.own_memory = set(own_memory)
        self.device_of = device_of
        self.copy_kind = copy_kind
        self.vdevices = [VDevice("llvm", i, "global") for i in range(len(devices))]
        #: virtual device name -> runtime device index
        self.index = {name: i for i, name in enumerate(devices)}
        self.main = mod["main"]
        others = {gv: f for gv, f in mod.functions.items() if name_of(gv) != "main"}
        self.bb = relax.BlockBuilder(tvm.IRModule(others, attrs=mod.attrs))
        on_host = [on_vdevice(type_of(p), self.vdevices[0]) for p in self.main.params]
        self.params = [relax.Var(name_of(p), ty) for p, ty in zip(self.main.params, on_host)]
        #: (constant, device) -> the first partition reading it; its keys are the weights
        self.first_reader = _device_weights(mod, device_of, self.resident) if lift_weights else {}
        self.weights = list(self.first_reader)
        self.weight_params = [
            relax.Var(f"umahub_w{i}", on_vdevice(type_of(c), self.vdevices[self.index[d]]))
            for i, (c, d) in enumerate(self.weights)
        ]
        #: variable of the input module -> its variable in the placed one
        self.remap: dict = dict(zip(self.main.params, self.params))
        #: value -> the device it lives on; absent: the host
        self.where: dict = {w: d for w, (_, d) in zip(self.weight_params, self.weights)}
        #: (value, device) -> that value on that device: a copy made before, or a weight parameter
        self.fetched: dict = {}
        #: the copies, in the order they happen
        self.copies: list[Copy] = []
        #: variable -> the operator (node) or partition (symbol) that made it
        self.made_by: dict = {}
        #: the operator or partition being emitted: the consumer of its copies
        self.reader = ""
        #: values a device of its own read back to the host for another of its partitions
        self.read_back: set = set()

    def place(self, realize: bool = True) -> tuple[tvm.IRModule, list[Copy], list[int]]:
        """The placed module, its copies and each weight parameter's device index."""
        self._lift_weights()
        self._emit_main()
        if self.weights:
            with self.bb.function("umahub_weights", []):
                self.bb.emit_func_output(relax.Tuple([c for c, _ in self.weights]))
        placed = self.bb.get()
        for key, value in (self.mod.global_infos or {}).items():
            if key != "vdevice":
                placed.update_global_info(key, value)
        placed.update_global_info("vdevice", self.vdevices)
        if realize:
            placed = relax.transform.RealizeVDevice()(placed)
        return placed, self.copies, [self.index[d] for _, d in self.weights]

    def _lift_weights(self) -> None:
        """Each weight is its parameter on its device, copied once, when the model is loaded."""
        for (constant, device), param in zip(self.weights, self.weight_params):
            self.fetched[(constant, device)] = param
            self._load_copy(constant, device, self.first_reader[(constant, device)])

    def _load_copy(self, constant: relax.Expr, device: str, consumer: str) -> None:
        """Record a weight copied to ``device`` once, when the model is loaded."""
        self.copies.append(
            Copy(
                "weight",
                HOST,
                device,
                tensor_bytes(type_of(constant)),
                self.copy_kind.get(device, "sync"),
                constant=True,
                when="load",
                consumer=consumer,
                in_place=device not in self.own_memory,
            )
        )

    def _emit_main(self) -> None:
        """The new ``main``: every binding emitted in order, its result on the host."""
        main = self.main
        attrs = {str(k): v for k, v in main.attrs.items()} if main.attrs else None
        bb = self.bb
        with bb.function("main", self.params + self.weight_params, attrs=attrs, pure=main.is_pure):
            for block in main.body.blocks:
                if isinstance(block, relax.DataflowBlock):
                    with bb.dataflow():
                        for binding in block.bindings:
                            self._emit(binding, dataflow=True)
                else:  # a plain block (control flow, impure calls): everything on the host
                    for binding in block.bindings:
                        self._emit(binding, dataflow=False)
            bb.emit_func_output(_Substitute(self.remap).visit_expr(main.body.body))

    def fetch(self, expr: relax.Expr, device: str) -> relax.Expr:
        """``expr`` on ``device``: itself where it lives there, else its copy (made once)."""
        if (expr, device) in self.fetched:  # a copy made before, or a weight parameter
            return self.fetched[(expr, device)]
        source = self.where.get(expr, HOST)
        if source == device:
            return expr
        if isinstance(type_of(expr), TupleType):  # a multi-output partition: field by field
            return self._fetch_fields(expr, source, device)
        if not isinstance(type_of(expr), TensorType):
            return expr
        return self._copy(expr, source, device)

    def _fetch_fields(self, expr: relax.Expr, source: str, device: str) -> relax.Expr:
        """A tuple from ``source`` on ``device``: each field fetched, then the tuple again."""
        fields = []
        for i in range(len(type_of(expr).fields)):
            item = self.bb.emit(relax.TupleGetItem(expr, i))
            self.where[item] = source
            self.made_by[item] = self.made_by.get(expr, "")
            fields.append(self.fetch(item, device))
        self.fetched[(expr, device)] = self.bb.emit(relax.Tuple(fields))
        return self.fetched[(expr, device)]

    def _copy(self, expr: relax.Expr, source: str, device: str) -> relax.Expr:
        """A tensor's copy from ``source`` to ``device``, emitted and recorded."""
        key = (expr, device)
        self.fetched[key] = self.bb.emit(
            relax.op.to_vdevice(expr, self.vdevices[self.index[device]])
        )
        accelerator_end = device if device != HOST else source
        self.copies.append(
            Copy(
                tensor=name_of(expr) if isinstance(expr, relax.Var) else "constant",
                src=source,
                dst=device,
                bytes=tensor_bytes(type_of(expr)),
                kind=self.copy_kind.get(accelerator_end, "sync"),
                constant=isinstance(expr, Constant),
                producer=self.made_by.get(expr, ""),
                consumer=self.reader,
                in_place=not self.own_memory & {source, device},
            )
        )
        return self.fetched[key]

    def _through_host(self, expr: relax.Expr, device: str) -> None:
        """Record the crossings of a tensor that a device partition reads where an earlier
        partition on the same device of its own left it: its runtime read it back to the
        host after that partition (once) and writes it to the device again for this one."""
        if self.where.get(expr) != device or not isinstance(type_of(expr), TensorType):
            return
        copy = Copy(
            tensor=name_of(expr) if isinstance(expr, relax.Var) else "constant",
            src=device,
            dst=HOST,
            bytes=tensor_bytes(type_of(expr)),
            kind=self.copy_kind.get(device, "sync"),
            producer=self.made_by.get(expr, ""),
            consumer=self.reader,
        )
        if expr not in self.read_back:
            self.read_back.add(expr)
            self.copies.append(copy)
        self.copies.append(replace(copy, src=HOST, dst=device))

    def _resident_args(self, symbol: str, device: str, args: Sequence[relax.Expr]) -> list:
        """The arguments a device partition is passed: its resident inputs (written to the
        device at load, each recorded as such a copy) left out."""
        where = self.resident[symbol]
        for arg, at in zip(args, where):
            if at >= 0:
                self._load_copy(arg, device, symbol)
        return [a for a, at in zip(args, where) if at < 0]

    def _host_arg(self, arg: relax.Expr) -> relax.Expr | None:
        """An argument of a host call, fetched to the host; None when it nests expressions."""
        if isinstance(arg, relax.Var):
            return self.fetch(self.remap.get(arg, arg), HOST)
        if isinstance(arg, relax.Call | relax.Tuple | relax.TupleGetItem):
            return None  # nested: left to the general substitution below
        return arg  # constants, shapes, prim values

    def _host_value(self, value: relax.Expr) -> relax.Expr:
        """``value`` computed on the host: every variable it reads fetched there."""
        if isinstance(value, relax.Call):  # the common case, without a mutator
            args = [self._host_arg(a) for a in value.args]
            if all(a is not None for a in args):
                return relax.Call(value.op, args, value.attrs, type_args(value), value.span)
        used = relax.analysis.free_vars(value)
        mapping = {v: self.fetch(self.remap.get(v, v), HOST) for v in used}
        return _Substitute(mapping).visit_expr(value) if mapping else value

    def _emit(self, binding: relax.Binding, dataflow: bool) -> None:
        """One binding of ``main``, on the device of its partition, else on the host."""
        bb, where = self.bb, self.where
        value = binding.value
        name = name_of(binding.var)
        call = partition_call(self.mod, value)
        placed_call = call if call is not None and call[0] in self.device_of else None
        self.reader = placed_call[0] if placed_call is not None else node_name(binding)
        if isinstance(binding, relax.MatchCast):  # defines symbolic sizes: kept, on the host
            var = type(binding.var)(name, type_of(binding.var))
            bb.emit_normalized(
                relax.MatchCast(var, bb.normalize(self._host_value(value)), type_of(var))
            )
            self.remap[binding.var] = var
            return
        tuple_value = (
            self.remap.get(value.tuple_value, value.tuple_value)
            if isinstance(value, relax.TupleGetItem)
            else None
        )
        if placed_call is not None:
            symbol, call_args = placed_call
            device = self.device_of[symbol]
            if symbol in self.resident:
                call_args = self._resident_args(symbol, device, call_args)
                for arg in call_args:
                    self._through_host(self.remap.get(arg, arg), device)
            args = [self.fetch(self.remap.get(a, a), device) for a in call_args]
            out_ty = _dps_outputs(on_vdevice(type_of(value), self.vdevices[self.index[device]]))
            new = call_dps_packed(relax.ExternFunc(symbol), relax.Tuple(args), out_ty)
        elif tuple_value is not None and where.get(tuple_value, HOST) != HOST:
            # an output of a multi-output partition stays on its device until read
            device, new = where[tuple_value], relax.TupleGetItem(tuple_value, value.index)
        else:
            device, new = HOST, self._host_value(value)
        if not dataflow or isinstance(binding.var, relax.DataflowVar):
            var = bb.emit(new, name)
            if device != HOST:
                where[var] = device
        else:  # a dataflow block's output lives on the host
            if device != HOST:
                on_device = bb.emit(new, name)
                where[on_device] = device
                self.made_by[on_device], self.reader = self.reader, ""  # read by the model's caller
                new = self.fetch(on_device, HOST)
                self.reader = self.made_by[on_device]
            var = bb.emit_output(new, name)
        self.remap[binding.var] = var
        self.made_by[var] = self.reader


def _virtual_devices(hub: Any, reports: Any, devices: list[str]) -> None:
    """Write each placed partition's :class:`umahub.VirtualDevice` into its report."""
    for r in reports:
        if r.fallback or r.device not in devices:
            continue
        acc = hub.accelerator(r.accelerator)
        scope = acc.pool.scope if acc.pool else None
        # a device of its own runs its runtime's programs, no TVM target: shown as "device"
        target = None if acc.has_device else acc.codegen
        where = VirtualDevice("cpu", devices.index(r.device), target, scope)
        r.virtual_device = where.describe("device" if acc.has_device else None)


def _devices(hub: Any, part: Partitioned) -> tuple[list[str], dict[str, str], dict[str, str]]:
    used = {p.device for p in part.partitions}
    devices = [HOST] + [d for a in hub.accelerators for d in a.devices if d in used]
    device_of = {p.symbol: p.device for p in part.partitions}
    pools = {d: hub.accelerator(d.split(":")[0]).pool for d in devices[1:]}
    kinds = {d: pool.copy if pool else "sync" for d, pool in pools.items()}
    return devices, device_of, kinds


def _own_memory(hub: Any, devices: Sequence[str]) -> set[str]:
    """The devices whose accelerator has a memory of its own (a device runtime's)."""
    return {d for d in devices[1:] if hub.accelerator(d.split(":")[0]).has_device}


def _resident(comp: Compilation) -> dict[str, tuple[int, ...]]:
    """symbol -> where each input is (see :func:`place_on_devices`), for the partitions
    on devices of their own; at ``explain`` (nothing lowered yet), their constant inputs."""
    if comp.device_calls:
        return {s: c.inputs for s, c in comp.device_calls.items()}
    placed = comp.placed()
    accelerator = comp.hub.accelerator
    on_device = {p.symbol for p in placed.partitions if accelerator(p.accelerator).has_device}
    return {
        symbol: tuple(0 if isinstance(a, Constant) else -1 for a in args)
        for symbol, (_, args) in partition_calls(placed.mod).items()
        if symbol in on_device
    }


def count_copies(comp: Compilation) -> None:
    """The devices and copies of ``comp``'s placement, without building (for ``explain``)."""
    placed = comp.placed()
    devices, device_of, kinds = _devices(comp.hub, placed)
    _, comp.copies, _ = place_on_devices(
        placed.mod,
        device_of,
        devices,
        kinds,
        realize=False,
        resident=_resident(comp),
        own_memory=_own_memory(comp.hub, devices),
    )
    comp.devices = devices
    _virtual_devices(comp.hub, comp.reports.values(), devices)


def prepare(
    comp: Compilation, placed: Partitioned, lift_weights: bool = True, one_memory: bool = False
) -> tvm.IRModule:
    """The placed module, ready for TVM's Relax pipeline: partitions replaced by calls
    of their runtime modules (``RunCodegen``), on their devices, with the copies.

    Sets ``comp.devices`` and ``comp.copies``. ``lift_weights``: see
    :func:`place_on_devices`; False keeps ``main``'s signature the model's own
    (what a module handed back to ``tvm.compile`` must do). ``one_memory``:
    ``main`` on the host's device without its copies (:func:`in_one_memory`),
    so that TVM's ``relax.VirtualMachine(executable, tvm.cpu())`` runs it; the
    build does that itself, after it has cut the concurrent executor's steps.
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
            host,
            device_of,
            devices,
            kinds,
            lift_weights=lift_weights,
            resident=_resident(comp),
            own_memory=_own_memory(hub, devices),
        )
        if one_memory:
            host = in_one_memory(host)
    if comp.fallen:
        host = relax.transform.LambdaLift()(host)  # fallen-back composites are local
    comp.devices, comp.copies, comp.weight_devices = devices, copies, weight_devices
    _virtual_devices(hub, comp.reports.values(), devices)
    return host


def _build(comp: Compilation, placed: Partitioned) -> Compiled:
    with comp.clock.stage("build"):
        host = prepare(comp, placed)
        target = comp.target.tvm() if comp.target is not None else tvm.target.Target(HOST_TARGET)
        with tuned_kernels(fresh=False) as host_kernels:
            host, comp.host_functions = lower_host(comp.hub, host, target)
        comp.tuned_kernels.extend(host_kernels)
        # cut after the host's fusion: a step calls the very kernels main calls, so
        # the concurrent executor computes exactly what the VM does (a multiply and
        # the add after it fused in main, but in two steps, rounded differently)
        host = with_steps(host, comp.devices, comp.hub)
        host = in_one_memory(host)  # the VM's main: no copies (the steps keep theirs)
        host = storage_plan.plan_storage(host)  # so TVM's own plan is left out
        with tvm.transform.PassContext(opt_level=3, disabled_pass=storage_plan.REPLACED_PASSES):
            # umahub's TIR pipeline: TVM's default plus umahub's passes (the int8
            # schedules' vpdpbusd, AMX and table steps, the stack scratch, which an
            # older TVM's leaves alone); with TVM's own, the host's marked int8 blocks
            # were lowered as plain loops on TVM 0.25 (right, and slow)
            pipeline = TIR_PIPELINE
            # TVM's Relax pipeline, then the weights' run-time checks left out
            relax_pipeline = tvm.transform.Sequential(
                [
                    relax.get_pipeline("default"),
                    weight_checks.without_weight_checks(len(comp.weight_devices)),
                ]
            )
            executable = tvm.compile(
                host, target=target, relax_pipeline=relax_pipeline, tir_pipeline=pipeline
            )
    with comp.clock.stage("load"):
        try:
            return load(comp, executable)
        except Exception as exc:
            detail = str(exc).strip()
            raise CompileError(
                f"the compiled model cannot be linked or loaded: {type(exc).__name__}: {detail}"
            ) from exc


def load(comp: Compilation, executable: Any, kernels_linked: bool = False) -> Compiled:
    """The runnable model of ``executable``, built from ``comp``'s prepared module.

    ``kernels_linked``: the executable carries its C partitions and the plugins'
    kernel libraries as object files (``relax_pipeline``), which the export
    links without the plugins' include directories and C sources.
    """
    placed = comp.placed()
    used = [comp.hub.accelerator(p.accelerator) for p in placed.partitions]
    kinds_built = {codegen.module_kind(comp.modules[p.symbol]) for p in placed.partitions}
    # C partitions are compiled, and a plugin's kernel library (c_sources) linked, only by
    # an export: an LLVM partition that calls into such a library runs from memory in no
    # process (the JIT finds no symbol of it, and the first call crashes the process)
    linked = "c" in kinds_built or any(acc.c_sources for acc in used)
    return Compiled(
        executable,
        comp.devices,
        signature_of(comp.mod["main"]),
        codegen.export_options([] if kernels_linked else used, native=comp.target is None),
        None,
        comp.weight_devices,
        needs_export=linked,
        target=comp.target,
        device_calls=[
            comp.device_calls[p.symbol] for p in placed.partitions if p.symbol in comp.device_calls
        ],
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
            f"{message_line(exc)}); a symbol missing at load time points "
            "at a plugin's kernel library (c_sources), anything else is a bug to report"
        )
        comp.fail(message, CompileError, exc, then="every partition runs on the host")
        for p in placed.partitions:
            comp.reports[p.symbol].fallback = "the placed model failed to build (see the notes)"
        comp.compiled = _build(comp, comp.placed())
