"""No run-time checks of the weights umahub itself passes (the build stage's pass).

Weights that partitions read on accelerators are extra parameters of ``main``
(:func:`umahub.compiler.stages.build.place_on_devices`), and of the step
functions that read them (:mod:`umahub.runtime.step_functions`): the runner
copies them to their devices once and passes the same tensors to every call.
TVM's ``VMShapeLower`` checks every parameter of a function at every call, its
dtype and rank (``vm.builtin.check_tensor_info``) and each of its dimensions
(``vm.builtin.match_shape``): two builtin calls per weight. On a small model
with many weights they are most of the VM's calls (mobilenet_v3_small: 270 of
433 per inference). The weights come from the library itself
(``umahub_weights``), so their checks cannot fail: this pass, run after TVM's
Relax pipeline, drops them. The model's own inputs keep theirs.
"""

from __future__ import annotations

import tvm
from tvm import relax

from umahub._tvm import name_of
from umahub.ir import with_blocks

__all__ = ["CHECKS", "without_weight_checks"]

#: The builtins ``VMShapeLower`` checks a parameter with.
CHECKS = ("vm.builtin.check_tensor_info", "vm.builtin.match_shape")

#: ``vm.builtin.match_shape``'s code for "assert this dimension equals this
#: number" (the other codes store a symbolic dimension, which later code reads).
_ASSERT_EQUAL_TO_IMM = 0


def without_weight_checks(weights: int) -> tvm.transform.Pass:
    """A module pass dropping, after ``VMShapeLower``, the checks of the last
    ``weights`` parameters of ``main`` and of the parameters of the same names
    in the module's other functions (the step functions that read them). A
    ``match_shape`` that binds a symbolic dimension is kept: later code reads
    what it stores."""

    @tvm.transform.module_pass(opt_level=0, name="UmahubWithoutWeightChecks")
    def transform(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        main = mod["main"] if "main" in [gv.name_hint for gv in mod.get_global_vars()] else None
        if weights <= 0 or not isinstance(main, relax.Function) or len(main.params) < weights:
            return mod
        names = {name_of(p) for p in main.params[len(main.params) - weights :]}
        funcs = dict(mod.functions)  # keyed by GlobalVar: the calls between them stay bound
        for gv, func in mod.functions.items():
            if isinstance(func, relax.Function):
                trusted = [p for p in func.params if name_of(p) in names]
                if trusted:
                    funcs[gv] = _without_checks(func, trusted)
        return tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)

    return transform


def _without_checks(func: relax.Function, trusted: list) -> relax.Function:
    blocks = [
        type(block)([b for b in block.bindings if not _checks_one_of(b, trusted)])
        for block in func.body.blocks
    ]
    return with_blocks(func, blocks)


def _checks_one_of(binding, trusted: list) -> bool:
    """Whether ``binding`` is a check of one of the ``trusted`` parameters only."""
    call = getattr(binding, "value", None)
    if not isinstance(call, relax.Call) or not isinstance(call.op, relax.ExternFunc):
        return False
    name = str(call.op.global_symbol)
    if name not in CHECKS or not call.args or not any(call.args[0].same_as(p) for p in trusted):
        return False
    if name == "vm.builtin.match_shape":
        # (value, heap, ndim, code_0, value_0, ..., code_n, value_n, error context)
        return all(_integer(c) == _ASSERT_EQUAL_TO_IMM for c in call.args[3:-1:2])
    return True


def _integer(arg) -> int | None:
    """The number an argument of a builtin call holds: an ``IntImm`` (TVM 0.27) or
    a ``PrimValue`` of one (before); None for anything else."""
    value = getattr(arg, "value", None)
    value = getattr(value, "value", value)
    return value if isinstance(value, int) else None
