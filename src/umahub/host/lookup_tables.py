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

Reading the table: a table of 8-bit entries fits in four 64-byte vectors, and
AVX-512 VBMI's ``vpermi2b`` picks 64 bytes out of two of them by the low 7
bits of 64 indices at once. Two of those (the table's halves) and a blend on
the indices' top bit read 64 entries in three instructions, where a load per
element is one each (LLVM scalarizes a gather of bytes: inlined into a
vectorized epilogue, it takes the epilogue's vectors apart).
:func:`table_gather_pass` writes every vector read of such a table that way
(an integer kernel's epilogue, :func:`umahub.host.int8.schedule_int8`, reads
its 16 or 32 outputs' entries at once); where the lookup cannot be inlined
into a vectorized epilogue, :func:`schedule_table_read` makes it a stage of
its own, 64 entries per step, which :func:`table_read_pass` writes as those
instructions.

Why this module is long: a table is made and read by the same module, so
that what the lookup assumes of it (8-bit entries, 256 of them, indexed by
bytes) is stated where the table is made.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax

from umahub._tvm import Constant, TensorType, constant_value
from umahub.ir import bindings, var_uses
from umahub.plugin.compat import dtype_of_expr
from umahub.plugin.patterns import dtype_of, shape_of

__all__ = [
    "ELEMENTWISE",
    "VPERMI2B_ANNOTATION",
    "has_vbmi",
    "is_table_read",
    "schedule_table_read",
    "table_gather_pass",
    "table_read_pass",
    "tabulate",
]

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
    inputs = {dtype: relax.Var(f"x_{dtype}", TensorType((256,), dtype)) for dtype in _BYTES}
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


# ------------------------------------------------------------------ reading a table

#: The block annotation marking 64 lookups for ``vpermi2b`` (:func:`table_read_pass`).
VPERMI2B_ANNOTATION = "umahub.vpermi2b"

#: Entries one step reads: a 512-bit vector of bytes.
_LANES = 64


def _table_load(block: Any) -> tuple[Any, Any] | None:
    """``(table_load, index_load)`` of a block ``out[i...] = table[idx[i...]]``: an
    8-bit table of at least 256 entries, read at an element of an 8-bit buffer
    whose indices, like the store's, are the block's own iteration variables in
    order (an elementwise lookup, so that 64 neighbours in one are 64 in the
    other). None for any other block."""
    from umahub.plugin.compat import Load, buffer_of, nodes_in

    store = block.body
    if not isinstance(store, tvm.tirx.BufferStore) or not isinstance(store.value, Load):
        return None
    table = store.value
    if len(table.indices) != 1 or len(buffer_of(table).shape) != 1:
        return None
    entries = buffer_of(table).shape[0]
    if not hasattr(entries, "value") or int(entries.value) < 256:
        return None
    if str(buffer_of(table).dtype) not in _BYTES or str(buffer_of(store).dtype) not in _BYTES:
        return None
    loads = nodes_in(table.indices[0], Load)
    if len(loads) != 1 or str(buffer_of(loads[0]).dtype) != "uint8":
        return None
    index = loads[0]
    own = [iv.var for iv in block.iter_vars]

    def elementwise(indices: Any) -> bool:
        return len(indices) == len(own) and all(i.same_as(v) for i, v in zip(indices, own))

    if not (elementwise(store.indices) and elementwise(index.indices)):
        return None
    shapes = [[int(d) for d in buffer_of(x).shape] for x in (store, index)]
    extents = [int(iv.dom.extent) for iv in block.iter_vars]
    if not shapes[0] == shapes[1] == extents:
        return None
    return table, index


def is_table_read(sch: Any, block: Any) -> bool:
    """Whether ``block`` (of the schedule ``sch``) reads a table of 8-bit entries
    elementwise, indexed by another buffer's bytes: a ``take`` of
    :func:`tabulate`'s, legalized."""
    return _table_load(sch.get(block)) is not None


def has_vbmi(target: Any = None) -> bool:
    """Whether ``target`` (None: this machine's CPU) has AVX-512 VBMI (``vpermi2b``)."""
    from umahub.targets import has_feature

    return has_feature("avx512vbmi", target)


def schedule_table_read(sch: Any, block: Any, target: Any = None) -> bool:
    """A table's lookup (:func:`is_table_read`) as a stage of its own: its loops
    fused into one, in parallel, 64 entries per step marked for ``vpermi2b``
    (:func:`table_read_pass`) where ``target`` (None: this machine) has AVX-512
    VBMI and the entries are a multiple of 64. Whether it was; otherwise the
    stage is left to the caller (a load per entry).

    The block iterates over its buffers' whole shape, row-major, at the root
    (:func:`is_table_read`): fused, 64 steps of its loop are 64 consecutive
    elements of both, which is what the marker promises the pass."""
    loops = sch.get_loops(block)
    count = 1
    for loop in loops:
        count *= int(sch.get(loop).extent)
    if count % _LANES or not has_vbmi(target):
        return False
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    outer, inner = sch.split(fused, [None, _LANES])
    if count > _LANES:
        sch.parallel(outer)
    sch.annotate(inner, VPERMI2B_ANNOTATION, 1)
    return True


def _vpermi2b(loop: Any) -> Any:
    """The marked loop ``for i in 0..64: out[b + i] = table[idx[b + i]]`` (flat
    buffers) as one step: 64 indices loaded, the entries of each half of the
    table picked by ``vpermi2b``, blended by the indices' top bit, stored. None
    when the loop is not that. The marker is the promise that ``i`` walks 64
    consecutive elements of both buffers (:func:`schedule_table_read` sets it on
    a loop that does): flattened, their indices are sums of divisions of the
    fused loop's, which no simplifier needs to see through."""
    from umahub.plugin.compat import Analyzer, Load, buffer_of, nodes_in
    from umahub.plugin.tir import rewrite

    store = loop.body
    if not isinstance(store, tvm.tirx.BufferStore) or not isinstance(store.value, Load):
        return None
    table = store.value
    loads = nodes_in(table.indices[0], Load) if len(table.indices) == 1 else []
    if len(loads) != 1 or len(store.indices) != 1 or len(loads[0].indices) != 1:
        return None
    index = loads[0]
    var = loop.loop_var
    analyzer = Analyzer()

    def at_zero(expr: Any) -> Any:
        zero = tvm.tirx.const(0, dtype_of_expr(var))
        return rewrite(expr, tvm.tirx.Var, lambda v: zero if v.same_as(var) else v)

    def lanes(expr: Any) -> Any:
        # consecutive by construction (see schedule_table_read): the loop's 64 steps
        # are 64 neighbours of a row-major iteration over both buffers' own shape
        base = analyzer.simplify(at_zero(expr))
        return tvm.tirx.Ramp(base, tvm.tirx.const(1, dtype_of_expr(base)), _LANES)

    out_at, index_at = lanes(store.indices[0]), lanes(index.indices[0])
    at = buffer_of(index).vload([index_at.base], f"uint8x{_LANES}")
    value = _lookup64(buffer_of(table), at)
    return tvm.tirx.BufferStore(buffer_of(store), value, [out_at])


def table_read_pass() -> Any:
    """A TIR pass: each loop :func:`schedule_table_read` marked with
    :data:`VPERMI2B_ANNOTATION` computed by ``vpermi2b`` (see the module's docs).
    Runs after the buffers are flattened (umahub's TIR pipeline runs it after
    ``FlattenBuffer``); a loop it cannot rewrite stays a load per entry, and a
    function without such loops is left as it is."""

    def transform(func: Any, _mod: Any, _ctx: Any) -> Any:
        from umahub.plugin.tir import rewrite

        def post(node: Any) -> Any:
            if VPERMI2B_ANNOTATION not in node.annotations:
                return node
            step = _vpermi2b(node) if int(node.extent) == _LANES else None
            if step is not None:
                return step
            annotations = {k: v for k, v in node.annotations.items() if k != VPERMI2B_ANNOTATION}
            return tvm.tirx.For(
                node.loop_var, node.min, node.extent, node.kind, node.body, None, annotations
            )

        return func.with_body(rewrite(func.body, tvm.tirx.For, post))

    return tvm.tirx.transform.prim_func_pass(transform, opt_level=0, name="umahub.TableRead")


def _gathered(load: Any) -> Any:
    """``load`` (a vector of up to 64 entries of a table of 256 bytes, at a vector of
    bytes) as ``vpermi2b`` reads it: the indices widened to 64 lanes, the entries of
    each half picked, blended by the indices' top bit, the first lanes kept. None
    when ``load`` is no such gather."""
    from umahub.plugin.compat import buffer_of

    table = buffer_of(load)
    shape = [getattr(d, "value", None) for d in table.shape]
    if shape != [256] or len(load.indices) != 1 or str(table.dtype) not in _BYTES:
        return None
    index = load.indices[0]
    kind = dtype_of_expr(index)
    lanes = int(kind.split("x")[1]) if "x" in kind else 1
    if lanes == 1 or lanes > _LANES:
        return None
    inner = index.value if isinstance(index, tvm.tirx.Cast) else index
    if dtype_of_expr(inner) != f"uint8x{lanes}":
        return None
    if lanes < _LANES:
        zeros = tvm.tirx.Broadcast(tvm.tirx.const(0, "uint8"), _LANES - lanes)
        every = [tvm.tirx.const(i, "int32") for i in range(_LANES)]
        inner = tvm.tirx.Shuffle([inner, zeros], every)
    value = _lookup64(table, inner)
    if lanes < _LANES:
        value = tvm.tirx.Shuffle([value], [tvm.tirx.const(i, "int32") for i in range(lanes)])
    return value


def _lookup64(table: Any, at: Any) -> Any:
    """The 64 entries of the 256-byte ``table`` (a buffer) at the 64 bytes ``at``."""
    kind = f"{table.dtype}x{_LANES}"
    quarters = [table.vload([tvm.tirx.const(q * _LANES, "int32")], kind) for q in range(4)]
    indices = tvm.tirx.reinterpret(kind, at) if kind != dtype_of_expr(at) else at
    picks = [
        tvm.tirx.call_llvm_pure_intrin(
            kind, "llvm.x86.avx512.vpermi2var.qi.512", quarters[h], indices, quarters[h + 1]
        )
        for h in (0, 2)
    ]
    top = at >= tvm.tirx.Broadcast(tvm.tirx.const(128, "uint8"), _LANES)
    return tvm.tirx.Select(top, picks[1], picks[0])


def table_gather_pass() -> Any:
    """A TIR pass: each vectorized read of a 256-byte table at a vector of bytes (a
    table's lookup inlined into a vectorized epilogue, which LLVM would scalarize)
    computed by ``vpermi2b`` (see the module's docs), where the function's target
    has AVX-512 VBMI. Runs after ``VectorizeLoop``."""

    def transform(func: Any, _mod: Any, _ctx: Any) -> Any:
        from umahub.plugin.compat import Load
        from umahub.plugin.tir import rewrite

        target = (func.attrs or {}).get("target")
        if target is None or not has_vbmi(target):
            return func

        def post(node: Any) -> Any:
            found = _gathered(node)
            return node if found is None else found

        return func.with_body(rewrite(func.body, Load, post))

    return tvm.tirx.transform.prim_func_pass(transform, opt_level=0, name="umahub.TableGather")
