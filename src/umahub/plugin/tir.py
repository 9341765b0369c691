"""Reading and rewriting a PrimFunc the same way on apache-tvm 0.25, 0.26 and 0.27.

What a TIR pass of a plugin (``umahub_tir_passes``, phase 0: S-TIR with its
blocks) does again and again: find the root block and its statements,
recognise a perfect loop nest around one block, replace some statements by a
call into a kernel library, rebuild the root. The constructors and attribute
names involved moved between the supported TVMs (:mod:`umahub.plugin.compat`
says which); these helpers take care of it::

    from umahub.plugin import extern_block, root_block, with_root_body

    def my_pass(func, _mod, _ctx):
        root = root_block(func)
        if root is None:
            return func
        stmts = [call_kernel(s) if is_mine(s) else s for s in root.stmts]
        return with_root_body(func, stmts)

:func:`rewrite` is the general tool: every node of a kind replaced, bottom up
(tvm-ffi's ``structural_mutate`` where it exists, TIR's ``ir_transform``
before it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from umahub.plugin import compat

__all__ = [
    "Root",
    "blocks",
    "extern_block",
    "full_region",
    "loop_extents",
    "perfect_nest",
    "read_in_place",
    "rewrite",
    "root_block",
    "static_int",
    "static_ints",
    "with_root_body",
]


@dataclass(frozen=True)
class Root:
    """A PrimFunc's root block: its realize, the block, and the statements of its body."""

    realize: Any
    block: Any
    stmts: list[Any]


def root_block(func: Any) -> Root | None:
    """The root block of an S-TIR PrimFunc, or None where it has none to rewrite.

    None for a function already lowered past its blocks, and for a root that
    is more than a container (iterators, an init, matched buffers).
    """
    from tvm import tirx

    realize = func.body
    if not isinstance(realize, compat.SBlockRealize):
        return None
    block = realize.block
    if block.iter_vars or block.init is not None or block.match_buffers:
        return None
    body = block.body
    return Root(realize, block, list(body) if isinstance(body, tirx.SeqStmt) else [body])


def with_root_body(
    func: Any, stmts: Sequence[Any], alloc_buffers: Sequence[Any] | None = None
) -> Any:
    """``func`` with its root block's body replaced by ``stmts`` (and its allocations by
    ``alloc_buffers``, when given: drop the buffers the new body no longer uses).

    Raises:
        ValueError: ``func`` has no root block (see :func:`root_block`).
    """
    from tvm import tirx

    root = root_block(func)
    if root is None:
        raise ValueError("with_root_body: the PrimFunc has no root block to rewrite")
    if not stmts:
        raise ValueError("with_root_body: a root block needs at least one statement")
    block = root.block
    body = stmts[0] if len(stmts) == 1 else tirx.SeqStmt(list(stmts))
    allocs = list(block.alloc_buffers) if alloc_buffers is None else list(alloc_buffers)
    new_block = compat.SBlock(
        block.iter_vars,
        block.reads,
        block.writes,
        block.name_hint,
        body,
        block.init,
        allocs,
        block.match_buffers,
        block.annotations,
    )
    realize = root.realize
    return func.with_body(compat.SBlockRealize(realize.iter_values, realize.predicate, new_block))


def perfect_nest(stmt: Any) -> tuple[list[Any], Any] | None:
    """``(loops, realize)`` where ``stmt`` is a nest of loops, each the only statement of
    the one around it, ending in one block; None otherwise. Loops of any kind."""
    from tvm import tirx

    loops = []
    while isinstance(stmt, tirx.For):
        loops.append(stmt)
        stmt = stmt.body
    if not isinstance(stmt, compat.SBlockRealize):
        return None
    return loops, stmt


def full_region(buffer: Any) -> Any:
    """The whole of ``buffer`` as a read or write region of a block."""
    import tvm
    from tvm import tirx

    ranges = [
        tvm.ir.Range.from_min_extent(tirx.const(0, compat.dtype_of_expr(d)), d)
        for d in buffer.shape
    ]
    return tirx.BufferRegion(buffer, ranges)


def extern_block(
    name: str, args: Sequence[Any], reads: Sequence[Any], writes: Sequence[Any]
) -> Any:
    """A block named ``name`` whose body is ``T.call_extern("int32", name, *args)``.

    ``reads`` and ``writes`` are the buffers the call reads and writes, whole:
    TVM's later passes keep them (and their sizes) because the block says so.
    Pointers to a buffer's data are :func:`umahub.plugin.compat.data_pointer`.
    """
    from tvm import tirx

    call = tirx.call_extern("int32", name, *args)
    block = compat.SBlock(
        [],
        [full_region(b) for b in reads],
        [full_region(b) for b in writes],
        name,
        tirx.Evaluate(call),
    )
    return compat.SBlockRealize([], True, block)


def static_int(expr: Any) -> int | None:
    """The value of an integer expression known at compile time, or None (a symbolic one)."""
    from tvm import tirx

    return int(expr) if isinstance(expr, tirx.IntImm) else None


def static_ints(exprs: Iterable[Any]) -> list[int] | None:
    """The values of integer expressions known at compile time, or None when any is not."""
    values = []
    for expr in exprs:
        value = static_int(expr)
        if value is None:
            return None
        values.append(value)
    return values


def loop_extents(sch: Any, loops: Sequence[Any]) -> list[int] | None:
    """The extent of each of ``loops`` (loop references of the ``tvm.s_tir.Schedule``
    ``sch``), or None when any of them is known only at run time."""
    return static_ints(sch.get(loop).extent for loop in loops)


def read_in_place(sch: Any, block: Any, gates: bool = False) -> bool:
    """Inline ``block`` (of the ``tvm.s_tir.Schedule`` ``sch``) into what reads it when
    it only copies a tensor, element for element (``y[i] = x[i]``); with ``gates``,
    also when it multiplies one by something (a squeeze-and-excitation gate,
    ``y[i] = x[i] * scale[c]``). Returns whether it was inlined.

    An unpadded convolution's "padding" (every 1x1 one's, as TVM legalizes it) is
    such a copy: left a stage of its own, it is a pass over the input and a
    parallel launch that compute nothing. A gate read in place costs a multiply per
    load: a gain where each input is loaded once per tile (positions in the
    vectors), a loss where it is broadcast once per vector of channels. A block
    the primitive refuses (it writes an output, say) stays, and False says so.
    """
    from tvm import tirx
    from tvm.s_tir.schedule import ScheduleError

    store = sch.get(block).body
    value = getattr(store, "value", None)
    operands = [value.a, value.b] if gates and isinstance(value, tirx.Mul) else [value]
    # where it was written: a transposed copy, read in place, would put its
    # strided reads in the consumer's innermost loop
    if not any(
        isinstance(v, compat.Load)
        and len(v.indices) == len(store.indices)
        and all(a.same_as(b) for a, b in zip(v.indices, store.indices))
        for v in operands
    ):
        return False
    try:
        sch.compute_inline(block)
    except ScheduleError:
        return False
    return True


def blocks(func: Any) -> list[Any]:
    """Every block of a PrimFunc, root included, in post order."""
    return compat.nodes_in(func.body, compat.SBlock)


def rewrite(node: Any, kind: type, replace: Callable[[Any], Any]) -> Any:
    """``node`` (an expression, a statement or a PrimFunc's body) with every node of
    class ``kind`` replaced by ``replace(n)``, bottom up: ``n`` has its own children
    rewritten already. ``replace`` returns ``n`` itself to keep it.

    The same for expressions and statements on every supported TVM: where tvm-ffi
    has no ``structural_mutate`` (0.25), TIR's ``ir_transform`` takes only a
    statement, so an expression is rewritten inside a ``T.evaluate`` of it and
    taken back out.
    """
    import tvm_ffi

    mutate = getattr(tvm_ffi, "structural_mutate", None)
    if mutate is not None:
        return mutate(node, [(kind, lambda n, m: replace(m.default_mutate(n)))])

    def post(n: Any) -> Any:
        return replace(n) if isinstance(n, kind) else None

    return compat._ir_transform(node, post)
