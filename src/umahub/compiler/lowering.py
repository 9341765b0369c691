"""Stage 3, Relax to TIR: the default lowering of a partition to one PrimFunc.

A partition may hold several composites (kernels). The default lowering
legalizes every operator to TIR and then fuses *all* of them into one PrimFunc
named by the partition's symbol (a quantized operator computed in integers
first, :mod:`umahub.host.quantized`, so that every device gives the host's
integers): the partition's function is marked
``Primitive`` and ``FuseTIR`` concatenates its kernels, intermediates becoming
buffers local to the PrimFunc. The PrimFunc takes the partition's inputs and
then its output(s), in destination-passing style, which is how the host calls
it (``R.call_dps_packed``).

A partition's parameters are its inputs, but where the model passes a small
constant (a scale, a zero point, a bias), its value is known when the
partition is lowered: the partition function carries those values in its
attribute :data:`CONSTANT_INPUTS` (:func:`with_constant_inputs`), and the
default lowering reads them, so that a quantized operator is lowered as
exactly as on the host (a weight known symmetric needs no per-window sums).
The PrimFunc still takes every input: the values only inform its structure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import tvm
from tvm import relax

from umahub._tvm import name_of, type_of
from umahub.errors import UnsupportedOperatorError
from umahub.host.quantized import quantized_in_integers
from umahub.ir import node_name

__all__ = [
    "CONSTANT_INPUTS",
    "CONSTANT_LIMIT",
    "constant_inputs",
    "default_relax_to_tir",
    "single_primfunc",
    "with_constant_inputs",
]

#: The partition function's attribute: ``{input index: relax.Constant}``, the small
#: constants the model passes it (see the module's docs).
CONSTANT_INPUTS = "umahub.constant_inputs"

#: The most elements a constant input has to be recorded in :data:`CONSTANT_INPUTS`
#: (a scale or zero point per channel, a bias; not a weight of any size).
CONSTANT_LIMIT = 1 << 16


def with_constant_inputs(function: relax.Function, values: Mapping[int, Any]) -> relax.Function:
    """``function`` (a partition) carrying ``values`` (input index -> relax.Constant)
    in its :data:`CONSTANT_INPUTS` attribute; unchanged when there are none."""
    if not values:
        return function
    return function.with_attr(CONSTANT_INPUTS, {int(i): v for i, v in values.items()})


def constant_inputs(function: relax.Function) -> dict[int, Any]:
    """The small constants the model passes a partition (scales, zero points, biases:
    at most :data:`CONSTANT_LIMIT` elements each), ``{input index: relax.Constant}``,
    as the partition ``function`` given to ``umahub_relax_to_tir`` carries them.

    The default lowering reads them to shape a quantized kernel (a weight known
    symmetric needs no per-window sums); a plugin's own lowering may too. Its
    PrimFunc must still take every input. ``CompileContext.constants`` has the
    values of every constant input, weights included."""
    attrs = function.attrs or {}
    if CONSTANT_INPUTS not in attrs:
        return {}
    return {int(i): v for i, v in attrs[CONSTANT_INPUTS].items()}


def _prepare(
    legalize: Mapping[str, Callable] | None, known: Mapping[int, Any]
) -> tvm.transform.Pass:
    return tvm.transform.Sequential(
        [
            relax.transform.LambdaLift(),  # composites are local functions: lift, then inline
            relax.transform.InlinePrivateFunctions(),
            relax.transform.ConvertToDataflow(),
            quantized_in_integers(known),
            relax.transform.LegalizeOps(dict(legalize) if legalize else None),
            relax.transform.DeadCodeElimination(),
        ]
    )


def _unlowered(func: relax.Function) -> list[tuple[str, str]]:
    """(node, op) of operators that LegalizeOps left as Relax operators."""
    left = []
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if (
                isinstance(value, relax.Call)
                and isinstance(value.op, tvm.ir.Op)
                and (value.op.name not in ("relax.call_tir", "relax.call_tir_inplace"))
            ):
                left.append((node_name(binding), value.op.name))
    return left


def default_relax_to_tir(
    function: relax.Function,
    symbol: str,
    accelerator: str,
    legalize: Mapping[str, Callable] | None = None,
) -> tvm.IRModule:
    """Lower a partition function to an IRModule holding one PrimFunc named ``symbol``.

    ``legalize`` maps op names to legalization functions ``f(bb, call) -> Expr``
    that replace TVM's for this partition (``LegalizeOps``'s
    ``customize_legalize_map``): how a plugin's ``umahub_relax_to_tir`` can
    change how one operator becomes TIR and keep the rest of the default.

    Raises:
        UnsupportedOperatorError: an operator has no TIR legalization.
    """
    known = constant_inputs(function)
    body = function.without_attr("Codegen").without_attr(CONSTANT_INPUTS)
    body = body.with_attr("global_symbol", "main")
    mod = _prepare(legalize, known)(tvm.IRModule({"main": body}))
    main = mod["main"]
    left = _unlowered(main)
    if left:
        names = ", ".join(f"{node} ({op})" for node, op in left)
        raise UnsupportedOperatorError(
            f"accelerator '{accelerator}' claimed operators that the default lowering cannot "
            f"turn into TIR: {names} (partition {symbol}); remove them from its patterns or "
            "give the plugin a umahub_relax_to_tir hook"
        )
    return single_primfunc(mod, symbol)


def single_primfunc(mod: tvm.IRModule, symbol: str) -> tvm.IRModule:
    """Fuse the call_tir kernels of ``mod["main"]`` into one PrimFunc named ``symbol``."""
    main = mod["main"]
    bb = relax.BlockBuilder(
        tvm.IRModule({gv: f for gv, f in mod.functions.items() if name_of(gv) != "main"})
    )
    fused = bb.add_func(main.without_attr("global_symbol").with_attr("Primitive", True), symbol)
    params = [relax.Var(name_of(p), type_of(p)) for p in main.params]
    with bb.function("main", params):
        out = bb.emit(relax.Call(fused, params))
        bb.emit_func_output(out)
    lowered = relax.transform.FuseTIR()(bb.get())
    prims = {
        name_of(gv): f for gv, f in lowered.functions.items() if isinstance(f, tvm.tirx.PrimFunc)
    }
    prim = prims[symbol]
    return tvm.IRModule({symbol: prim.with_attr("global_symbol", symbol)})
