"""umahub's own schedules for the host: what runs when no ``umahub_host_schedule`` does.

The operators no accelerator takes run on the host's CPU. Built without a
schedule, each is a loop nest on one thread with no vectors (TVM's default
Relax pipeline schedules nothing on a CPU). Each fused host PrimFunc gets, in
this order, the first of:

0. an int8 kernel's own schedule (:mod:`umahub.host.int8`, its description
   for the rule's name), and ``"table read"``: a lookup in a table of 8-bit
   entries (:mod:`umahub.host.lookup_tables`) nothing was fused with, 64
   entries a step where the CPU has AVX-512 VBMI;
1. ``"elementwise"``: a function of spatial blocks only (an activation, a
   bias add, a transpose, a fused chain of them): the chain inlined into its
   last block (a big block its consumers read several times excepted), its
   outer loops in parallel when there is enough work (the contiguous inner
   loop is left for LLVM to vectorize);
2. ``"matmul"``, ``"conv2d"``: a matrix product or a 2-D convolution with
   its epilogue, in register tiles (:mod:`umahub.host.matmul`,
   :mod:`umahub.host.conv`);
3. ``"rows"``: softmax, layer norm and their kin, a row at a time: rows in
   parallel, every step of a row while it is in cache, its reductions in
   vector-wide partial sums;
   ``"pooling"``: a max pooling as two 1-D ones (see
   :mod:`umahub.host.lowering`), output rows in parallel
   (:func:`schedule_pooling`);
   ``"columns"``: reductions over other axes than the last (a softmax over a
   middle axis, a norm over the spatial axes of a channels-last tensor or over
   a whole tensor): the contiguous last axis innermost, under the reduction,
   the outer axes in parallel;
4. TVM's ``dlight`` CPU rules (``tvm.s_tir.dlight.cpu``): ``Reduction`` for
   the reductions neither ``"rows"`` nor ``"columns"`` takes (a row count
   known only at run time), ``GEMV`` for matrix-vector products; not a
   pooling's window;
5. ``"parallel"``: anything else (an average pooling, a reduction dlight does not
   take, a convolution no accelerator took): the leading spatial loops of
   each root block fused and run in parallel; a pooling window's loops
   inside the output row, which stays a contiguous loop for LLVM to
   vectorize (so does the row of a padding block);
6. ``"unscheduled"``: what none of these could change, built as it is.

A rule that fails part-way leaves nothing behind: each works on a copy.

Why this module is long: it is the list of rules above, in the order they are
tried, with the block helpers they share (inlining, windows, loop extents,
contiguous accesses);
the two rules that are kernels of their own live in :mod:`umahub.host.matmul`
and :mod:`umahub.host.conv`.
"""

from __future__ import annotations

import math
from typing import Any

import tvm
from tvm import s_tir, tirx

from umahub._tvm import param_buffers
from umahub.host.conv import schedule_conv2d
from umahub.host.int8 import int8_kernel, schedule_int8, wide_depthwise
from umahub.host.matmul import schedule_matmul
from umahub.plugin.tir import loop_extents, static_int, static_ints
from umahub.targets import vector_lanes

__all__ = [
    "PARALLEL_MIN",
    "WINDOW_MAX",
    "default_schedule",
    "schedule_elementwise",
    "schedule_pooling",
]

#: Iterations below which a parallel loop costs more than it saves.
PARALLEL_MIN = 1 << 15


def _dlight(func: tirx.PrimFunc, target: Any) -> tuple[tirx.PrimFunc, str] | None:
    from tvm.s_tir import dlight

    sch = s_tir.Schedule(func)
    if any(_sliding(sch, b) for b in sch.get_child_blocks(sch.get_sblock("root"))):
        return None  # a pooling's window: "parallel" runs it window-first, dlight serially

    for name, rule in (("reduction", dlight.cpu.Reduction()), ("gemv", dlight.cpu.GEMV())):
        try:
            sch = rule.apply(func, target, False)
        except Exception:  # a rule refusing part-way: the next one
            continue
        if isinstance(sch, s_tir.Schedule):
            return sch.mod["main"], name
    return None


_SPATIAL = 0  # IterVar.iter_type of a data-parallel block axis


def _spatial(sch: s_tir.Schedule, block: Any) -> bool:
    return all(iv.iter_type == _SPATIAL for iv in sch.get(block).iter_vars)


def _iterations(sch: s_tir.Schedule, loops: list) -> int:
    """How many times the body of ``loops`` runs; 0 when an extent is not static."""
    return math.prod(static_int(sch.get(loop).extent) or 0 for loop in loops)


#: Expression nodes a block may grow to by inlining a producer it reads more than once.
INLINE_MAX = 250


def _size(node: Any) -> int:
    """The expression nodes under ``node``: only expressions, as TVM versions differ
    in the other objects they visit (0.26 also walks each node's dtype and type, which
    made every expression look 2-3 times bigger than on 0.27)."""
    from umahub.plugin.compat import Expr, nodes_in

    return sum(not isinstance(n, tvm.ir.Op) for n in nodes_in(node, Expr))


def _expression_size(sch: s_tir.Schedule, block: Any) -> int:
    """The nodes of the value ``block`` computes, a load counted as one: what inlining
    it copies into each read. The loads' indices are left out: inlined, they become the
    reader's, and a reshape's divisions and remainders would make a multiply look as
    big as a polynomial (GELU's ``x * 0.7071`` behind a reshape stayed a buffer of
    its own, written and read back: 0.93 ms where inlined took 0.59)."""
    from umahub.plugin.compat import Load, nodes_in

    value = sch.get(block).body.value
    loads = nodes_in(value, Load)
    return _size(value) - sum(_size(i) for load in loads for i in load.indices)


def _reads_of(sch: s_tir.Schedule, producer: Any) -> int:
    """How many loads of ``producer``'s output its consumers make (per element)."""
    from umahub.plugin.compat import Load, buffer_of, nodes_in

    written = buffer_of(sch.get(producer).writes[0])
    return sum(
        buffer_of(load).same_as(written)
        for consumer in sch.get_consumers(producer)
        for load in nodes_in(sch.get(consumer).body, Load)
    )


def _inline_chain(sch: s_tir.Schedule, blocks: list) -> None:
    """Inline each block into its consumers, unless they read it more than once and
    it is big: TVM's polynomial ``exp``/``erf`` read their input a dozen times,
    and a chain of them inlined would grow exponentially (GELU of a sigmoid of
    a tanh: millions of nodes); such a block is written once and read back."""
    for block in blocks:
        uses = _reads_of(sch, block)
        if uses > 1 and uses * _expression_size(sch, block) > INLINE_MAX:
            continue
        sch.compute_inline(block)


def _accesses(sch: s_tir.Schedule, block: Any) -> list[tuple[list[Any], list[Any]]]:
    """(indices, buffer shape) of every load and the store of ``block``."""
    from umahub.plugin.compat import Load, buffer_of, nodes_in

    body = sch.get(block).body
    accesses = [(list(n.indices), list(buffer_of(n).shape)) for n in nodes_in(body, Load)]
    accesses.append((list(body.indices), list(buffer_of(body).shape)))
    return accesses


def _contiguous_tail(sch: s_tir.Schedule, block: Any, limit: int) -> int:
    """How many of the block's last loops (at most ``limit``) every access reads
    as one contiguous run: indexed by exactly those axes, in order, in a buffer
    whose inner sizes are theirs, or not indexed by them at all (a broadcast
    operand). Fused, they are one loop LLVM vectorizes (a concatenation's
    select included), and the flattened index is still that loop's variable,
    with no divisions. 1 where only the row is."""
    node = sch.get(block)
    axes = [iv.var for iv in node.iter_vars]
    if len(sch.get_loops(block)) != len(axes):  # not one loop per axis, as TE makes them
        return 1
    extents = [static_int(iv.dom.extent) for iv in node.iter_vars]
    accesses = _accesses(sch, block)
    best = 1
    for k in range(2, min(limit, len(axes)) + 1):
        tail = axes[-k:]
        for indices, shape in accesses:
            uses = [i for i, e in enumerate(indices) if any(_uses_var(e, v) for v in tail)]
            if not uses:
                continue  # broadcast along the whole tail
            if len(indices) < k or uses != list(range(len(indices) - k, len(indices))):
                return best
            if not all(_is_var(e, v) for e, v in zip(indices[-k:], tail)):
                return best
            if [static_int(d) for d in shape[-k + 1 :]] != extents[-k + 1 :]:
                return best
        best = k
    return best


def _is_var(expr: Any, var: Any) -> bool:
    return isinstance(expr, tirx.Var) and expr.same_as(var)


def _uses_var(expr: Any, var: Any) -> bool:
    from umahub.plugin.compat import vars_in

    return any(v.same_as(var) for v in vars_in(expr))


def _parallel_rows(sch: s_tir.Schedule, block: Any) -> bool:
    """The block's outer loops, fused, in parallel until every thread has work; the
    last loop (a contiguous row) never, nor the loops before it that every access
    reads contiguously with it (:func:`_contiguous_tail`), which are fused into
    one longer row. A block too small for threads gets its row fused all the
    same. False when its loops are not static.

    Why a small block's row is fused too: LLVM computes the end of a short row
    (a 14-wide one: a vector of 8, one of 4, then 2 lanes) in part-filled
    registers whose other lanes hold what the last kernel left there, often
    integers, which are denormal floats. Dividing them costs a microcode assist
    each: a quantized add over 96x14x14 took 0.12 ms after an int8 convolution,
    0.018 ms after other code (Intel Xeon). One run of 18816 has no such end."""
    loops = sch.get_loops(block)
    extents = loop_extents(sch, loops)
    if not loops or extents is None:
        return False
    if len(loops) < 2:
        return True
    if math.prod(extents) < PARALLEL_MIN:
        row = _contiguous_tail(sch, block, len(loops))
        if row > 1:
            sch.fuse(*loops[-row:])
        return True
    outer, count = [], 1
    for loop, e in zip(loops[:-1], extents[:-1]):
        outer.append(loop)
        count *= e
        if count >= 64:
            break
    row = _contiguous_tail(sch, block, len(loops) - len(outer))
    sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
    if row > 1:
        sch.fuse(*loops[-row:])
    return True


def schedule_elementwise(sch: s_tir.Schedule) -> bool:
    """Schedule, in place, a function of spatial blocks only (an activation, a
    concatenation, a fused chain of them): the chain inlined into its last
    block, outer loops in parallel. False, and ``sch`` unchanged, when some
    block is not spatial; a primitive that refuses part-way raises.

    For plugins too: an accelerator's elementwise partitions (the npu's
    concatenations) get what the host's get.

    The inner loops stay inside, contiguous, for LLVM to vectorize itself (a
    loop split by the vector width would index with divisions); those every
    access reads as one run are fused into one (unfused, LLVM leaves a
    concatenation's select over short rows scalar). Small functions stay on
    one thread: a parallel launch costs more than it saves below
    :data:`PARALLEL_MIN`.
    """
    root = sch.get_sblock("root")
    blocks = sch.get_child_blocks(root)
    if not blocks or not all(_spatial(sch, b) for b in blocks):
        return False
    _inline_chain(sch, blocks[:-1])
    for block in sch.get_child_blocks(root):
        if not _parallel_rows(sch, block):
            raise ValueError(f"{sch.get(block).name_hint}: loops of unknown extent")
    return True


def _elementwise(func: tirx.PrimFunc) -> tuple[tirx.PrimFunc, str] | None:
    sch = s_tir.Schedule(func)
    return (sch.mod["main"], "elementwise") if schedule_elementwise(sch) else None


def _row_work(sch: s_tir.Schedule, blocks: list, rows: int) -> dict[str, int] | None:
    """Iterations per row of each block, when every block works row by row: a
    spatial block over ``rows`` rows, a reduction over the last axis of each of
    ``rows`` rows (TE puts reduction axes last); None otherwise."""
    work = {}
    for block in blocks:
        node = sch.get(block)
        loops = sch.get_loops(block)
        extents = loop_extents(sch, loops)
        if len(loops) != len(node.iter_vars) or extents is None:
            return None
        reduced = [iv.iter_type != _SPATIAL for iv in node.iter_vars]
        if any(reduced[:-1]) or (reduced[-1] and math.prod(extents[:-1]) != rows):
            return None
        if math.prod(extents) % rows:
            return None
        work[node.name_hint] = math.prod(extents) // rows
    return work


def _rows(func: tirx.PrimFunc, lanes: int) -> tuple[tirx.PrimFunc, str] | None:
    """A row kernel (softmax, layer norm, RMS norm): reductions over each row's last
    axis and elementwise steps between them, one row at a time, rows in parallel.

    Every step of a row runs while the row is in cache, in one parallel loop. A
    reduction over a whole number of vectors accumulates ``lanes`` partial
    results, one vector per step (``rfactor``), and adds them up after in
    halves (:func:`_halvings`); one value at a time, each addition would wait
    for the last. A row no vector
    divides (ViT's 197 tokens) keeps its reductions serial: a split by the
    vector width would be predicated, and x86 builds a predicated vector loop
    as scalar code. The elementwise steps (a softmax's exponentials, a norm's
    scaling) run in vectors of ``lanes`` where the row is whole vectors: left
    to LLVM, they ran at its preferred width, half of AVX-512's on Intel's
    Xeons (a softmax over 128 columns: 0.52 of its time, a layer norm over 768:
    0.80); the other rows stay contiguous loops, which LLVM vectorizes with
    their tails. None when a block does not work row by row (a softmax over a
    middle axis: dlight's).
    """
    sch = s_tir.Schedule(func)
    root = sch.get_sblock("root")
    blocks = sch.get_child_blocks(root)
    if all(_spatial(sch, b) for b in blocks) or not _spatial(sch, blocks[-1]):
        return None
    _inline_chain(sch, [b for b in blocks[:-1] if _spatial(sch, b)])
    blocks = sch.get_child_blocks(root)
    loops = sch.get_loops(blocks[-1])
    extents = loop_extents(sch, loops)
    if len(loops) < 2 or extents is None or math.prod(extents[:-1]) < 2:
        return None
    rows = math.prod(extents[:-1])
    work = _row_work(sch, blocks, rows)
    if work is None:
        return None
    # the blocks rfactor adds share a name ("<reduction>_rf"): kept by their handles,
    # with the iterations each does per row
    partials: list[tuple[Any, int]] = []
    halves: list[tuple[Any, int]] = []
    for block in blocks[:-1]:
        length = work[sch.get(block).name_hint]
        if _spatial(sch, block) or length % lanes or length < 2 * lanes:
            continue
        _, lane = sch.split(sch.get_loops(block)[-1], [None, lanes])
        partials.append((sch.rfactor(lane, factor_axis=0), length))
        halves += _halvings(sch, block, lanes)
        work[sch.get(block).name_hint] = 2
    row = sch.fuse(*loops[:-1])
    if rows * extents[-1] >= PARALLEL_MIN:
        sch.parallel(row)
    for block in reversed(sch.get_child_blocks(root)[:-1]):
        sch.compute_at(block, row, preserve_unit_loops=False)
    done = [(sch.get_sblock(name), per_row) for name, per_row in work.items()]
    for block, per_row in done + partials + halves:  # computed for more than its row: not ours
        if _iterations(sch, sch.get_loops(block)[1:]) != per_row:
            return None
    for block, _ in partials + halves:  # (lanes, steps): the lanes innermost, one vector
        lane, step = sch.get_loops(block)[1:]
        sch.reorder(step, lane)
        sch.vectorize(lane)
        sch.decompose_reduction(block, step)
    for block in sch.get_child_blocks(root):  # the elementwise steps, along the row
        inner = sch.get_loops(block)[-1]
        extent = static_int(sch.get(inner).extent)
        last = sch.get(block).iter_vars[-1].var
        if _spatial(sch, block) and extent is not None and _contiguous_last(sch, block, last):
            _vectorize_row(sch, inner, extent, lanes)
    return sch.mod["main"], "rows"


def _halvings(sch: s_tir.Schedule, final: Any, lanes: int) -> list[tuple[Any, int]]:
    """The reduction ``final`` of ``lanes`` partial results (after ``rfactor``) as
    halvings: the upper half added to the lower, a vector of half the width,
    down to two values, then ``final`` adds those. The last add of a row waits
    for log2(lanes) vector operations, not for ``lanes`` additions one after
    the other (a softmax over 128 columns: 0.90 of its time, a layer norm over
    768: 0.94, Intel Xeon). Returns each halving's block with its iterations
    per row; ``final``'s loop must not have moved yet (rfactor takes a
    reduction that is the first block of its loops)."""
    halves = []
    width = lanes
    while width > 2:
        _, half = sch.split(sch.get_loops(final)[-1], [2, width // 2])
        halves.append((sch.rfactor(half, factor_axis=0), width))
        width //= 2
    return halves


#: Reduction sizes (product of a block's reduction extents) taken for a window (pooling).
WINDOW_MAX = 64


def _window_first(sch: s_tir.Schedule, block: Any, loops: list, n: int) -> bool:
    """A pooling (see :func:`_window`): the window's loops moved outside the output
    row, so each window step runs over a whole contiguous row (which LLVM
    vectorizes). Whether it was done.
    """
    if n < 2 or len(loops) == n or not _window(sch, block):
        return False
    sch.reorder(*loops[: n - 1], *loops[n:], loops[n - 1])
    return True


def _window(sch: s_tir.Schedule, block: Any) -> bool:
    """Whether ``block`` reduces a small window of one tensor per output (a pooling;
    not a convolution, which reads weights too)."""
    from umahub.plugin.compat import buffer_of

    node = sch.get(block)
    reduced = static_ints(iv.dom.extent for iv in node.iter_vars if iv.iter_type != _SPATIAL)
    if not reduced or math.prod(reduced) > WINDOW_MAX:
        return False
    written = [buffer_of(w) for w in node.writes]
    read = [buffer_of(r) for r in node.reads]
    others = [b for b in read if not any(b.same_as(w) for w in written)]
    return len(others) == 1


def _inline_into_windows(sch: s_tir.Schedule) -> bool:
    """A spatial block only poolings read (their padding) computed where they read it:
    a few compares per element instead of a padded copy written and read again."""
    changed = False
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        consumers = sch.get_consumers(block)
        if _spatial(sch, block) and consumers and all(_window(sch, c) for c in consumers):
            try:
                sch.compute_inline(block)
                changed = True
            except Exception:  # not inlinable (an output, an opaque body): stays
                continue
    return changed


def _pool_by_rows(sch: s_tir.Schedule) -> bool:
    _inline_into_windows(sch)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    if len(blocks) != 2 or not all(_window(sch, b) for b in blocks):
        return False
    rows, out = blocks
    if [sch.get(c).name_hint for c in sch.get_consumers(rows)] != [sch.get(out).name_hint]:
        return False
    loops, axes = sch.get_loops(out), sch.get(out).iter_vars
    spatial = next((i for i, iv in enumerate(axes) if iv.iter_type != _SPATIAL), len(axes))
    extents = loop_extents(sch, loops)
    if len(loops) != len(axes) or spatial < 2 or extents is None:
        return False
    per_row = _iterations(sch, sch.get_loops(rows)[spatial - 1 :])
    row = sch.fuse(*loops[: spatial - 1])
    sch.compute_at(rows, row, preserve_unit_loops=False)
    if _iterations(sch, sch.get_loops(rows)[1:]) != per_row:
        return False  # computed for more than its output row
    if math.prod(extents) >= PARALLEL_MIN:
        sch.parallel(row)
    return True


def schedule_pooling(sch: s_tir.Schedule) -> bool:
    """Schedule a pooling computed as two 1-D ones in place; whether it was one.

    That is :func:`umahub.plugin.max_pool2d`'s max pooling: each
    window's rows reduced into a row of column maxima, then that row's windows.
    Output rows run in parallel, and the row of column maxima of each is
    computed under it, while in cache; an elementwise producer the pooling
    alone reads (a ReLU before it, a padding) is computed where it is read.
    The loops inside stay as TE made them, for LLVM: reordered window-first as
    the ``"parallel"`` rule does, they run slower. ``sch`` is left unchanged
    when this returns False. Public for plugins, like :func:`schedule_elementwise`.
    """
    if not _pool_by_rows(sch.copy()):
        return False
    return _pool_by_rows(sch)


def _pooling(func: tirx.PrimFunc) -> tuple[tirx.PrimFunc, str] | None:
    sch = s_tir.Schedule(func)
    return (sch.mod["main"], "pooling") if schedule_pooling(sch) else None


def _parallel(func: tirx.PrimFunc) -> tuple[tirx.PrimFunc, str] | None:
    sch = s_tir.Schedule(func)
    changed = _inline_into_windows(sch)
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        loops = sch.get_loops(block)
        axes = sch.get(block).iter_vars
        if len(loops) != len(axes):  # not one loop per axis, as TE makes them: left alone
            continue
        # TE puts a block's spatial axes first and binds loop i to axis i
        n = next((i for i, iv in enumerate(axes) if iv.iter_type != _SPATIAL), len(axes))
        if n == 0:
            continue
        # the last spatial loop (a row) stays inside, contiguous, when there is a
        # window to reduce or nothing to reduce: fusing it would index with divisions
        window = _window_first(sch, block, loops, n)
        keep_row = n >= 2 and (n == len(axes) or window)
        outer = loops[: n - 1] if keep_row else loops[:n]
        fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
        extent = static_int(sch.get(fused).extent)
        if extent is None or extent >= 2:
            sch.parallel(fused)
            changed = True
        if window:  # the row's accumulators initialised once, before the window
            sch.decompose_reduction(block, loops[n])
            changed = True
    return (sch.mod["main"], "parallel") if changed else None


#: Iterations of a reduction block the ``"columns"`` rule leaves serial, as it is, when
#: it is of neither of its kinds (the mean over a few channels of a norm).
SMALL_REDUCTION = 4096


def _contiguous_last(sch: s_tir.Schedule, block: Any, var: Any) -> bool:
    """Whether every access of ``block`` that uses ``var`` uses it as its last index
    (plus an offset that does not), and no other index: ``var`` walks a contiguous
    run of each buffer, as a vector does."""
    for indices, _ in _simplified_accesses(sch, block):
        uses = [i for i, e in enumerate(indices) if _uses_var(e, var)]
        if not uses:
            continue
        if uses != [len(indices) - 1]:
            return False
        last = indices[-1]
        if not _is_var(last, var) and not (
            isinstance(last, (tirx.Add, tirx.Sub))
            and _is_var(last.a, var)
            and not _uses_var(last.b, var)
        ):
            return False
    return True


def _simplified_accesses(sch: s_tir.Schedule, block: Any) -> list[tuple[list[Any], list[Any]]]:
    """:func:`_accesses`, each index simplified within the block's axes' ranges (an
    inlined reshape's ``(k // 56 + j) % 64`` is ``j`` when ``k < 56`` and ``j < 64``)."""
    from tvm import ir

    from umahub._tvm import Analyzer
    from umahub.plugin.compat import Load, buffer_of, nodes_in

    analyzer = Analyzer()
    for iv in sch.get(block).iter_vars:
        analyzer.bind(iv.var, ir.Range.from_min_extent(iv.dom.min, iv.dom.extent))
    body = sch.get(block).body  # several stores where a reduction has several outputs
    nodes = [*nodes_in(body, Load), *nodes_in(body, tirx.BufferStore)]
    return [([analyzer.simplify(e) for e in n.indices], list(buffer_of(n).shape)) for n in nodes]


def _sliding(sch: s_tir.Schedule, block: Any) -> bool:
    """Whether ``block`` reduces a small window (:data:`WINDOW_MAX`) that an index
    mixes with a spatial axis: a pooling's or a convolution's window sliding
    over its input (an axis of extent 1, which a reshape leaves, does not count)."""
    axes = sch.get(block).iter_vars
    reduced = [iv.var for iv in axes if iv.iter_type != _SPATIAL]
    window = static_ints(iv.dom.extent for iv in axes if iv.iter_type != _SPATIAL)
    if not reduced or window is None or math.prod(window) > WINDOW_MAX:
        return False
    spatial = [iv.var for iv in axes if iv.iter_type == _SPATIAL and static_int(iv.dom.extent) != 1]
    for indices, _ in _simplified_accesses(sch, block):
        for e in indices:
            if any(_uses_var(e, v) for v in spatial) and any(_uses_var(e, v) for v in reduced):
                return True
    return False


def _vectorize_row(sch: s_tir.Schedule, loop: Any, extent: int, lanes: int) -> None:
    """``loop`` (a contiguous row of ``extent``) in vectors of ``lanes``, or one vector
    when it is shorter; a row no vector divides is left to LLVM."""
    if extent <= lanes:
        sch.vectorize(loop)
    elif extent % lanes == 0:
        sch.vectorize(sch.split(loop, [None, lanes])[1])


def _contiguous_pair(sch: s_tir.Schedule, block: Any, var: Any, inner: int) -> bool:
    """Whether every access of ``block`` that uses ``var`` uses it as its last index
    but one, over a last dimension of ``inner`` (so that ``var`` and the last
    axis fused walk a contiguous run)."""
    for indices, shape in _simplified_accesses(sch, block):
        uses = [i for i, e in enumerate(indices) if _uses_var(e, var)]
        if not uses:
            continue
        if uses != [len(indices) - 2] or not _is_var(indices[-2], var):
            return False
        if static_int(shape[-1]) != inner:
            return False
    return True


def _columns_block(sch: s_tir.Schedule, block: Any, lanes: int) -> bool | None:
    """One reduction block of :func:`_columns`: whether it was changed; None when it is
    not of that kind."""
    node = sch.get(block)
    loops, axes = sch.get_loops(block), node.iter_vars
    extents = loop_extents(sch, loops)
    if len(loops) != len(axes) or extents is None:
        return None
    n = next(i for i, iv in enumerate(axes) if iv.iter_type != _SPATIAL)
    if any(iv.iter_type == _SPATIAL for iv in axes[n:]):
        return None
    work = math.prod(extents)
    if n and extents[n - 1] >= 2 and _contiguous_last(sch, block, axes[n - 1].var):
        # the contiguous spatial axis innermost: one vector of accumulators per step
        outer, column, reduced = loops[: n - 1], loops[n - 1], loops[n:]
        sch.reorder(*reduced, column)
        if outer and work >= PARALLEL_MIN and math.prod(extents[: n - 1]) >= 2:
            sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
        _vectorize_row(sch, column, extents[n - 1], lanes)
        sch.decompose_reduction(block, reduced[0])  # after: neither takes a split init
        return True
    # a reduction over several axes, the last contiguous (a norm over a whole
    # tensor): that axis made spatial (rfactor), a row of partial results that
    # each step adds a contiguous row into, as above; then the row reduced
    reduced = loops[n:]
    if len(reduced) < 2 or extents[-1] * (extents[-2] if len(reduced) > 2 else 1) < lanes // 2:
        # small (a mean of a few channels): left as it is
        return False if work <= SMALL_REDUCTION else None
    if not _contiguous_last(sch, block, axes[-1].var):
        return None
    last = reduced[-1]
    if extents[-1] < lanes // 2:  # a short row (7 of a 7x7 image): the last two, fused
        if len(reduced) < 3 or not _contiguous_pair(sch, block, axes[-2].var, extents[-1]):
            return None
        last = sch.fuse(*reduced[-2:])
    partial = sch.rfactor(last, factor_axis=n)
    rf_loops = sch.get_loops(partial)
    if n and work >= PARALLEL_MIN and math.prod(extents[:n]) >= 2:
        sch.parallel(sch.fuse(*rf_loops[:n]) if n > 1 else rf_loops[0])
        rf_loops = sch.get_loops(partial)
    sch.decompose_reduction(partial, rf_loops[-len(reduced)])
    return True


def _axis_loops(sch: s_tir.Schedule, block: Any) -> dict[int, Any] | None:
    """The loop bound to each axis of ``block`` (by the axis's index) where the axis
    is bound to a loop variable alone; None when the block is not right under its
    innermost loop."""
    from umahub.plugin.compat import SBlockRealize

    loops = sch.get_loops(block)
    realize = sch.get(loops[-1]).body if loops else None
    if not isinstance(realize, SBlockRealize):
        return None
    by_var = {sch.get(loop).loop_var: loop for loop in loops}
    return {
        i: by_var[value]
        for i, value in enumerate(realize.iter_values)
        if isinstance(value, tirx.Var) and value in by_var
    }


def _by_slabs(sch: s_tir.Schedule, lanes: int) -> bool:
    """:func:`_columns` with every block computed under one parallel loop over the
    outer axes they share (a softmax's batch and heads): each slab's steps run
    while it is in cache, in one parallel launch. False when the blocks do not
    share such axes (``sch`` is then a copy to drop)."""
    root = sch.get_sblock("root")
    blocks = sch.get_child_blocks(root)
    last = blocks[-1]
    if not _spatial(sch, last):
        return False
    outer = []
    for block in blocks[:-1]:
        if _spatial(sch, block):
            continue
        axes = sch.get(block).iter_vars
        n = next(i for i, iv in enumerate(axes) if iv.iter_type != _SPATIAL)
        column = static_int(axes[n - 1].dom.extent) if n else None
        if n < 2 or not column or column < 2 or not _contiguous_last(sch, block, axes[n - 1].var):
            return False
        outer.append((block, n - 1))
    p = min(count for _, count in outer)
    loops = sch.get_loops(last)
    extents = loop_extents(sch, loops)
    if extents is None or len(loops) <= p or math.prod(extents[:p]) < 2:
        return False
    for block, _ in outer:
        if (loop_extents(sch, sch.get_loops(block)) or [])[:p] != extents[:p]:
            return False
    rows = math.prod(extents[:p])
    work = {}
    for block in blocks:
        total = _iterations(sch, sch.get_loops(block))
        if total % rows:
            return False
        work[sch.get(block).name_hint] = total // rows
    row = sch.fuse(*loops[:p]) if p > 1 else loops[0]
    if math.prod(extents) >= PARALLEL_MIN:
        sch.parallel(row)
    for block in reversed(blocks[:-1]):
        sch.compute_at(block, row, preserve_unit_loops=False)
    for name, per_row in work.items():  # a block computed for more than its slab: not ours
        if _iterations(sch, sch.get_loops(sch.get_sblock(name))[1:]) != per_row:
            return False
    for block, count in outer:
        axes = sch.get(block).iter_vars
        bound = _axis_loops(sch, block)
        n = count + 1
        if bound is None or count not in bound:
            return False
        reduced = [bound[i] for i in range(n, len(axes)) if i in bound]
        if not reduced:
            return False
        sch.reorder(*reduced, bound[count])
        _vectorize_row(sch, bound[count], static_int(axes[count].dom.extent) or 0, lanes)
        sch.decompose_reduction(block, reduced[0])
    return True


def _columns(func: tirx.PrimFunc, lanes: int) -> tuple[tirx.PrimFunc, str] | None:
    """Reductions over other axes than the last (a softmax over a middle axis, a norm
    over the spatial axes of a channels-last tensor, a norm over a whole tensor).

    A reduction block whose last spatial axis is contiguous in every buffer it
    touches gets that axis innermost, under its reduction loops, in vectors:
    each step adds a contiguous row into a row of accumulators (reduced along
    the last axis instead, each addition would wait for the last). Where the
    blocks share outer axes (a softmax's batch and heads), every block is
    computed under one parallel loop over them, a slab at a time
    (:func:`_by_slabs`); else each block's outer axes run in parallel. A
    reduction over several axes, the last contiguous (a group norm of one
    group: a whole tensor), adds each contiguous row into a row of partial
    results the same way, then reduces that row. Spatial blocks between them
    are inlined or run as the ``"elementwise"`` rule runs them. None when a
    reduction is neither (a window of a pooling: that is
    :func:`schedule_pooling`'s and ``"parallel"``'s; a row: ``"rows"``'s).
    """
    sch = s_tir.Schedule(func)
    root = sch.get_sblock("root")
    blocks = sch.get_child_blocks(root)
    if all(_spatial(sch, b) for b in blocks) or any(_sliding(sch, b) for b in blocks):
        return None
    _inline_chain(sch, [b for b in blocks[:-1] if _spatial(sch, b)])
    slabs = sch.copy()
    try:
        if _by_slabs(slabs, lanes):
            return slabs.mod["main"], "columns"
    except Exception:  # a primitive refused part-way: block by block below
        pass
    changed = len(sch.get_child_blocks(root)) < len(blocks)
    for name in [sch.get(b).name_hint for b in sch.get_child_blocks(root)]:
        block = sch.get_sblock(name)
        if _spatial(sch, block):
            changed |= _iterations(sch, sch.get_loops(block)) >= PARALLEL_MIN
            if not _parallel_rows(sch, block):
                return None
            continue
        done = _columns_block(sch, block, lanes)
        if done is None:
            return None
        changed |= done
    return (sch.mod["main"], "columns") if changed else None


def _table_read(func: tirx.PrimFunc, target: Any) -> tuple[tirx.PrimFunc, str] | None:
    """A lookup in a table of :func:`~umahub.host.lookup_tables.tabulate`'s that
    nothing was fused with, 64 entries a step (``vpermi2b``) where the target
    has AVX-512 VBMI: the ``"elementwise"`` rule leaves it to LLVM, which reads
    a byte at a time (bert int8's six lookups, 98K to 393K entries each: 0.56
    ms of its 4.5, Intel Xeon)."""
    from umahub.host.lookup_tables import is_table_read, schedule_table_read

    sch = s_tir.Schedule(func)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    if len(blocks) != 1 or not is_table_read(sch, blocks[0]):
        return None
    if not schedule_table_read(sch, blocks[0], target):
        return None
    return sch.mod["main"], "table read"


def _int8(func: tirx.PrimFunc, target: Any) -> tuple[tirx.PrimFunc, str] | None:
    sch = s_tir.Schedule(func)
    if int8_kernel(sch) == "depthwise" and not wide_depthwise(sch):
        return None  # the generic rules below are faster on it
    said = schedule_int8(sch, target)
    return (sch.mod["main"], said) if said is not None else None


#: Types TVM computes in another type's storage (bfloat16 in uint16, the 8- and
#: 4-bit floats in bytes), rewriting loads and stores after scheduling; TVM
#: 0.27's rewrite refuses the vector stores an explicit ``vectorize`` makes
#: ("dtype mismatch on BufferStore ... bfloat16x4"), at build time.
_STORAGE_EMULATED = ("bfloat16", "float8", "float4", "float6")


def _emulated(func: tirx.PrimFunc) -> bool:
    """Whether a buffer of ``func`` has a type TVM keeps in another's storage."""
    return any(
        buf is not None and str(buf.dtype).startswith(_STORAGE_EMULATED)
        for buf in param_buffers(func)
    )


def default_schedule(func: tirx.PrimFunc, target: Any) -> tuple[tirx.PrimFunc, str]:
    """``func`` scheduled by the first rule that takes it, and that rule's name.

    The rules that vectorize loops themselves are left out for types TVM
    keeps in another type's storage (:data:`_STORAGE_EMULATED`): LLVM still
    vectorizes what it can of such functions.
    """
    vectorizing = not _emulated(func)
    for rule in (
        lambda f: _int8(f, target),
        lambda f: _table_read(f, target),
        # first: dlight's rules take no function without a reduction, and
        # inline every block before they look (see _inline_chain)
        _elementwise,
        lambda f: schedule_matmul(f, vector_lanes(target)) if vectorizing else None,
        lambda f: schedule_conv2d(f, vector_lanes(target)) if vectorizing else None,
        lambda f: _rows(f, vector_lanes(target)) if vectorizing else None,
        _pooling,
        lambda f: _columns(f, vector_lanes(target)) if vectorizing else None,
        lambda f: _dlight(f, target),
        _parallel,
    ):
        try:
            done = rule(func)
        except Exception:  # a schedule primitive refused: the next rule, from scratch
            continue
        if done is not None:
            return done
    return func, "unscheduled"
