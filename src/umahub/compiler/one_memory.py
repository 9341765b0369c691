"""``main`` in one memory: the copies between devices that share the host's memory left out.

The build places every partition on its virtual device and puts an
``R.to_vdevice`` copy wherever a tensor is read on another device
(:mod:`umahub.compiler.stages.build`). On this runtime every virtual device is
the host's CPU: an accelerator's partition is host code, or a stub through
which its device runtime writes the device's own memory and reads it back
within the call (:mod:`umahub.runtime.devices`). A copy in ``main`` is then a
``memcpy`` from host memory to host memory, and TVM's VM made one at every
call of the model (6-10% of a small model's time: SqueezeNet, BERT).

:func:`in_one_memory` rewrites ``main`` so that every tensor in it is typed
on the host's virtual device and every copy is gone: a reader reads the
tensor where its producer wrote it. TVM's memory plan then pools the
storages of all devices together. The runtime gives every virtual device the
same runtime device, ``tvm.cpu(0)`` (:func:`umahub.runtime.running.runtime_devices`),
as TVM's kernels require all the tensors of one call to be on one device.

What stays as it was:

* the placement and its copies as data: the report's copies are the
  crossings between devices, which a device runtime still makes at a
  partition's boundary;
* the concurrent executor's step functions, cut from ``main`` before this
  rewrite (:mod:`umahub.runtime.step_functions`): its copy steps are how an
  accelerator's copy engine (an ``async`` pool) overlaps the host.

A module with a virtual device that is not a CPU (none today: every target
of an accelerator is ``llvm`` or ``c``) is left as it is.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

from umahub._tvm import TensorType, TupleType, name_of, remap_var, type_args, type_of

__all__ = ["in_one_memory", "on_vdevice"]

_CPU = 1  # DLPack's kDLCPU


def on_vdevice(ty: Any, vdevice: Any) -> Any:
    """A tensor type (or a tuple of them) placed on ``vdevice``; other types as they are."""
    if isinstance(ty, TensorType):
        return TensorType(ty.shape, ty.dtype, vdevice)
    if isinstance(ty, TupleType):
        return TupleType([on_vdevice(f, vdevice) for f in ty.fields])
    return ty


def _all_cpus(vdevices: Any) -> bool:
    return all(int(v.target.get_target_device_type()) == _CPU for v in vdevices)


def in_one_memory(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with its ``main`` on the host's virtual device alone, without copies.

    The other functions (partitions, kernels, step functions) are unchanged.
    A module without virtual devices, or with one that is not a CPU, is
    returned as it is.
    """
    vdevices = list((mod.global_infos or {}).get("vdevice", []))
    if len(vdevices) < 2 or not _all_cpus(vdevices):
        return mod
    main_gv = mod.get_global_var("main")
    rewritten = _OneMemory(mod, vdevices[0]).rewrite(mod[main_gv])
    functions = {gv: f for gv, f in mod.functions.items() if gv != main_gv}
    out = tvm.IRModule({**functions, main_gv: rewritten}, attrs=mod.attrs)
    for key, value in mod.global_infos.items():
        out.update_global_info(key, value)
    return out


@relax.expr_functor.mutator
class _OneMemory(relax.PyExprMutator):
    """Types every tensor on ``host`` and turns each copy into an alias of its source."""

    def __init__(self, mod: tvm.IRModule, host: Any) -> None:
        super().__init__(mod)
        self.host = host
        self.to_vdevice = tvm.ir.Op.get("relax.to_vdevice")

    def rewrite(self, main: relax.Function) -> relax.Function:
        """``main`` with its parameters, calls and casts on the host, its copies aliases."""
        params = []
        for p in main.params:
            new = relax.Var(name_of(p), on_vdevice(type_of(p), self.host))
            remap_var(self, p, new)
            params.append(new)
        body = self.visit_expr(main.body)
        ret = on_vdevice(type_of(body), self.host)
        return relax.Function(params, body, ret, main.is_pure, main.attrs, main.span)

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = binding.value
        if not (isinstance(value, relax.Call) and value.op.same_as(self.to_vdevice)):
            super().visit_var_binding_(binding)
            return
        source = self.visit_expr(value.args[0])
        outlives = not isinstance(binding.var, relax.DataflowVar)
        scoped = isinstance(source, relax.DataflowVar)  # not to be read outside its block
        if isinstance(source, relax.Var) and not (outlives and scoped):
            remap_var(self, binding.var, source)  # its readers read the source
            return
        # a constant (a weight in a module for tvm.compile), or a block's output bound
        # to a variable of the block: the same kind of variable, bound to the source
        kind = relax.Var if outlives else relax.DataflowVar
        alias = kind(name_of(binding.var), type_of(source))
        self.builder_.emit_normalized(relax.VarBinding(alias, source))
        remap_var(self, binding.var, alias)

    def visit_match_cast_(self, binding: relax.MatchCast) -> None:
        cast = getattr(binding, "struct_info", None) or binding.ty
        super().visit_match_cast_(
            relax.MatchCast(binding.var, binding.value, on_vdevice(cast, self.host))
        )

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        args = type_args(call)
        if not args:
            return call
        return relax.Call(
            call.op, call.args, call.attrs, [on_vdevice(a, self.host) for a in args], call.span
        )
