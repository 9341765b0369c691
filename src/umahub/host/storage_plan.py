"""Relax's static memory plan, kept apart by device.

Relax's ``StaticPlanBlockMemory`` lets a tensor reuse the storage of one that
is dead, and so turns a model's ``alloc_tensor`` per intermediate tensor into
a few storages allocated at the top of the function. It pools storages by
memory scope and dtype, not by device: with the npu's tensors on device 1 and
the host's on device 0, both ``"global"``, a tensor of one would be put in the
storage of the other (apache-tvm 0.25-0.27), and the runtime refuses the call
("Mismatched ... device_id"). Turning the plan off for a model on more than
one device is no way out: the VM would then allocate every intermediate
tensor's storage at every call.

:func:`plan_storage` runs the plan with each device in a pool of its own:
every allocation's scope is given its device for the plan's sake
(``"global"`` on device 2 is planned as ``"global@umahub.device2"``), and the
storages the plan makes get their real scope back. Within a device the plan
is TVM's own. :func:`plan_storage` runs the first passes of TVM's default
Relax pipeline itself, up to ``CallTIRRewrite`` (which makes the
allocations), then the plan; the build runs TVM's pipeline with
:data:`REPLACED_PASSES` disabled, which have run already. ``LegalizeOps`` is
one: run again after ``RewriteDataflowReshape``, it would turn the reshapes
that became views back into copies.

The plan is safe for the concurrent executor too: it reuses storage only
within one Relax function, whose bindings run one after another, and the
executor's steps are functions of their own (:mod:`umahub.runtime.step_functions`).
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

from umahub._tvm import StringImm, type_args

__all__ = ["REPLACED_PASSES", "plan_storage"]

#: TVM's passes that :func:`plan_storage` runs in place of those in its pipeline
#: (the others it runs do nothing the second time).
REPLACED_PASSES = ["LegalizeOps", "StaticPlanBlockMemory"]

_TAG = "@umahub.device"


@relax.expr_functor.mutator
class _Scopes(relax.PyExprMutator):
    """Tags (``tag=True``) the scope of every ``alloc_tensor`` with its device, or
    takes the tag off every scope (``tag=False``: the plan's storages too)."""

    def __init__(self, mod: tvm.IRModule, tag: bool) -> None:
        super().__init__(mod)
        self.tag = tag
        self.alloc_tensor = tvm.ir.Op.get("relax.builtin.alloc_tensor")

    def visit_call_(self, call: Any) -> Any:
        call = super().visit_call_(call)
        if self.tag and call.op.same_as(self.alloc_tensor):
            # args: shape, dtype, runtime device index, storage scope
            device, scope = call.args[2], call.args[3]
            index = getattr(device, "value", None)
            if isinstance(scope, StringImm) and index is not None:
                return self._with_scope(call, 3, f"{scope.value}{_TAG}{int(index)}")
        if not self.tag:
            for i, arg in enumerate(call.args):
                if isinstance(arg, StringImm) and _TAG in arg.value:
                    return self._with_scope(call, i, arg.value.split(_TAG)[0])
        return call

    @staticmethod
    def _with_scope(call: Any, i: int, scope: str) -> Any:
        args = list(call.args)
        args[i] = StringImm(scope)
        return relax.Call(call.op, args, call.attrs, type_args(call), call.span)

    def run(self) -> tvm.IRModule:
        """The module with every Relax function's allocations (un)tagged."""
        for gv, func in self.builder_.get().functions.items():
            if isinstance(func, relax.Function):
                self.builder_.update_func(gv, self.visit_expr(func))
        return self.builder_.get()


def _lower_calls() -> list[Any]:
    """TVM's default pipeline up to the allocations of call results."""
    t = relax.transform
    return [
        t.LegalizeOps(),
        t.RewriteDataflowReshape(),
        t.ToNonDataflow(),
        t.RemovePurityChecking(),
        t.CallTIRRewrite(),
    ]


def plan_storage(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with its calls' results allocated (``CallTIRRewrite``) and
    planned by Relax's ``StaticPlanBlockMemory``, each device apart.

    Build the result with :data:`REPLACED_PASSES` disabled: the plan would plan
    the remaining allocations again, devices mixed.
    """
    mod = tvm.transform.Sequential(_lower_calls())(mod)
    mod = _Scopes(mod, tag=True).run()
    mod = relax.transform.StaticPlanBlockMemory()(mod)
    return _Scopes(mod, tag=False).run()
