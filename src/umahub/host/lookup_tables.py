"""Elementwise functions of one 8-bit tensor, as tables of 256 entries.

In a quantized model, an activation between two quantized operators is written
in floats: ``quantize(sigmoid(dequantize(q)))``, a SiLU as
``quantize(dequantize(q) * dequantize(quantize(sigmoid(dequantize(q)))))``, a
GELU as ONNX writes it with ``erf``. Each such chain reads one tensor of 8-bit
integers, elementwise, with constants of one value each: its result depends on
nothing but the integer at the same index, which takes 256 values. So the chain
is computed once, at compile time, for each of them, and the model reads the
result from that table (``take``): one load per element instead of a
transcendental function, divisions and roundings. The table is the chain's own
arithmetic, evaluated by TVM on every input it can see, so the model computes
what it wrote (and every device reads the same table).

:func:`tabulate` rewrites each ``quantize`` (to 8 bits) that ends such a chain
of at least two operators.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax

from umahub._tvm import Constant, constant_value
from umahub.ir import bindings, var_uses
from umahub.plugin.patterns import dtype_of, shape_of

__all__ = ["ELEMENTWISE", "tabulate"]

#: Operators that work element by element (their other operands, where they have
#: any, must be constants of one value for a chain through them to be tabulated).
ELEMENTWISE = frozenset(
    {
        "relax.quantize",
        "relax.dequantize",
        "relax.astype",
        "relax.sigmoid",
        "relax.tanh",
        "relax.exp",
        "relax.log",
        "relax.erf",
        "relax.sqrt",
        "relax.rsqrt",
        "relax.abs",
        "relax.negative",
        "relax.floor",
        "relax.ceil",
        "relax.round",
        "relax.clip",
        "relax.nn.relu",
        "relax.nn.gelu",
        "relax.nn.gelu_tanh",
        "relax.nn.silu",
        "relax.nn.leakyrelu",
        "relax.add",
        "relax.subtract",
        "relax.multiply",
        "relax.divide",
        "relax.maximum",
        "relax.minimum",
        "relax.power",
    }
)

_BYTES = ("int8", "uint8")


def _scalar(expr: Any) -> bool:
    """Whether ``expr`` is a constant of one value (any rank of ones)."""
    return isinstance(expr, Constant) and int(np.prod(constant_value(expr).shape)) == 1


class _Chain:
    """The elementwise operators behind an expression, walked back to the 8-bit
    tensors (and anything not elementwise) they read: its leaves."""

    def __init__(self, lookup: Any):
        self.lookup = lookup
        self.leaves: set[relax.Var] = set()
        self.count = 0
        self.ok = True

    def walk(self, expr: Any) -> None:
        if not self.ok or _scalar(expr):
            return
        if isinstance(expr, relax.Var) and dtype_of(expr) in _BYTES:
            self.leaves.add(expr)
            return
        value = self.lookup(expr) if isinstance(expr, relax.Var) else expr
        if not (
            isinstance(value, relax.Call)
            and isinstance(value.op, tvm.ir.Op)
            and value.op.name in ELEMENTWISE
        ):
            if isinstance(expr, relax.Var):
                self.leaves.add(expr)
            else:
                self.ok = False
            return
        self.count += 1
        tensors = [a for a in value.args if not _scalar(a)]
        if value.op.name in ("relax.quantize", "relax.dequantize") and len(tensors) != 1:
            self.ok = False  # a scale or zero point per channel
            return
        for arg in tensors:
            self.walk(arg)


def _walked(expr: Any, lookup: Any) -> _Chain | None:
    chain = _Chain(lookup)
    chain.walk(expr)
    return chain if chain.ok else None


def _chain_of(call: relax.Call, lookup: Any) -> tuple[relax.Var, set] | None:
    """The one 8-bit tensor a quantize's chain reads, or None when it is no chain
    of at least two elementwise operators of that tensor and scalar constants.

    The walk stops at 8-bit tensors; where it reached several, those computed
    from the others alone (a SiLU's quantized sigmoid, from the tensor it
    multiplies) are walked through, until one is left. Returns it, and the 8-bit
    tensors walked through.
    """
    if dtype_of(call) not in _BYTES:
        return None
    chain = _walked(call, lookup)
    if chain is None:
        return None
    leaves, count = set(chain.leaves), chain.count
    through = set()
    changed = True
    while len(leaves) > 1 and changed:
        changed = False
        for leaf in list(leaves):
            inner = _walked(lookup(leaf), lookup) if lookup(leaf) is not None else None
            if inner is not None and inner.leaves and inner.leaves <= leaves - {leaf}:
                leaves.discard(leaf)
                through.add(leaf)
                count += inner.count
                changed = True
    if count < 2 or len(leaves) != 1:
        return None
    (leaf,) = leaves
    if dtype_of(leaf) not in _BYTES or shape_of(leaf) != shape_of(call):
        return None
    return leaf, through


def _rebuilt(expr: Any, lookup: Any, leaf: relax.Var, x: relax.Var) -> Any:
    """``expr`` with ``leaf`` replaced by ``x`` (the chain copied, bindings inlined)."""
    if isinstance(expr, relax.Var):
        if expr.same_as(leaf):
            return x
        expr = lookup(expr)
    if isinstance(expr, relax.Call):
        args = [_rebuilt(a, lookup, leaf, x) if not _scalar(a) else a for a in expr.args]
        if expr.op.name in ("relax.quantize", "relax.dequantize"):  # one scale: any axis
            make = getattr(relax.op, expr.op.name.split(".")[-1])
            return make(*args, axis=-1, out_dtype=str(expr.attrs.out_dtype))
        return relax.Call(expr.op, args, expr.attrs)
    return expr


def _tables(chains: list[tuple[Any, str]]) -> list[np.ndarray]:
    """Each chain (its expression of ``x``, and ``x``'s dtype) on all 256 values, in
    the order of their bits read as uint8, computed by one TVM build."""
    inputs = {dtype: relax.Var(f"x_{dtype}", relax.TensorType((256,), dtype)) for dtype in _BYTES}
    bb = relax.BlockBuilder()
    with bb.function("main", list(inputs.values())):
        outs = [bb.emit(expr(inputs[dtype])) for expr, dtype in chains]
        bb.emit_func_output(relax.Tuple(outs))
    mod = relax.transform.LegalizeOps()(bb.get())
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    # every byte, in the order of its bits read as uint8 (what the table is indexed by)
    every = np.arange(256).astype("uint8")
    result = vm["main"](*[tvm.runtime.tensor(every.view(dtype)) for dtype in inputs])
    return [result[i].numpy() for i in range(len(chains))]


@relax.expr_functor.mutator
class _Tabulate(relax.PyExprMutator):
    """Replaces each chain's final quantize (``chains``: the call, its 8-bit input and
    its table) by a read of the table."""

    def __init__(self, mod: tvm.IRModule, chains: list[tuple[relax.Call, relax.Var, Any]]):
        super().__init__(mod)
        self.chains = chains

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        new = super().visit_call_(call)
        found = next((c for c in self.chains if c[0].same_as(new)), None)
        if found is None:
            return new
        _, leaf, table = found
        index = leaf  # a byte indexes the table by its bits (an int8's: two's complement)
        if dtype_of(leaf) == "int8":
            index = self.builder_.emit(relax.op.astype(leaf, "uint8"))
        out = relax.op.take(relax.const(table), index, axis=0)
        return relax.Call(out.op, out.args, out.attrs, span=call.span)


def tabulate(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """``mod`` with each elementwise chain of one 8-bit tensor that ends in a
    quantize read from its table (see the module's docs), and how many were."""
    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        return mod, 0
    main = mod["main"]
    values = {b.var: b.value for b in bindings(main)}
    lookup = values.get
    chains_by_var = {}
    for var, value in values.items():
        if isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.quantize":
            chain = _chain_of(value, lookup)
            if chain is not None:
                chains_by_var[var] = (value, *chain)
    # a chain that another walks through, and that nothing else reads, is part of it
    uses = var_uses(main)
    inside = {v for _, _, through in chains_by_var.values() for v in through}
    found = [
        (call, leaf)
        for var, (call, leaf, _) in chains_by_var.items()
        if not (var in inside and uses.get(var, 0) == 1)
    ]
    if not found:
        return mod, 0
    chains = []
    for call, leaf in found:

        def expr(x: relax.Var, call: Any = call, leaf: Any = leaf) -> Any:
            return _rebuilt(call, lookup, leaf, x)

        chains.append((expr, dtype_of(leaf)))
    tables = _tables(chains)
    rewriter = _Tabulate(mod, [(c, leaf, t) for (c, leaf), t in zip(found, tables, strict=True)])
    new_main = rewriter.visit_expr(main)
    out = rewriter.builder_.get()
    out["main"] = relax.analysis.remove_all_unused(new_main)
    return out, len(tables)
