"""The host's schedule for matrix products: register tiles, vectors, threads.

A host function whose one reduction is a matrix product ``C[b.., i, j] +=
A[b.., i, k] * B[b.., k, j]`` (a dense or linear layer, attention's batched
products; ``B`` also stored ``[b.., j, k]``), with an elementwise epilogue or
none (bias, activation, residual add), is what a model leaves on the host when
no accelerator takes its matmuls: a shape known only at run time, a type the
accelerator refuses, no accelerator at all. Unscheduled, it is a loop nest on
one thread without vectors, and TVM's ``dlight`` CPU rules have no matmul rule.

The schedule, for ``mr`` x ``nr`` register tiles (``nr`` one or two vectors
along ``j``, ``mr`` rows unrolled; the tile's accumulators stay in registers)::

    [b.., j0] (parallel) | i0 | k | i1 (unroll) | j1 (vector)

Each task owns a panel of ``nr`` columns of ``B`` (``K * nr`` floats, a few
hundred KiB for BERT's layers) and walks every row tile of ``A`` against it,
so the panel is read from memory once and then from cache. A transposed ``B``
(``Q @ K^T``) has its panel copied to ``[k, nr]`` first, per task. Where
``B`` is computed in the function (a cast; a quantized product's operand less
its zero point), that computation makes the task's panel. The
accumulator tile is written back, with the epilogue applied, after its ``k``
loop. ``M`` may be a size known only at run time (its last row tile is
predicated); ``N`` must be known and divisible by at least 4.
"""

from __future__ import annotations

from typing import Any

from tvm import s_tir, tirx

from umahub.plugin.compat import Load, buffer_of, nodes_in

__all__ = ["schedule_matmul"]

_SPATIAL = 0  # IterVar.iter_type of a data-parallel block axis


def _roles(sch: s_tir.Schedule, red: Any) -> tuple[int, int, bool] | None:
    """(index of B among the block's reads, number of batch axes, B stored [.., j, k])
    of a matrix product block, or None."""
    block = sch.get(red)
    axes = block.iter_vars
    spatial = [iv.var for iv in axes if iv.iter_type == _SPATIAL]
    reduced = [iv.var for iv in axes if iv.iter_type != _SPATIAL]
    if len(reduced) != 1 or len(spatial) < 2 or len(axes) != len(spatial) + 1:
        return None
    if [iv.iter_type for iv in axes][-1] == _SPATIAL:  # the reduction axis last, as TE makes it
        return None
    i, j, k = spatial[-2], spatial[-1], reduced[0]
    written = buffer_of(block.writes[0])
    loads = [n for n in nodes_in(block.body, Load) if not buffer_of(n).same_as(written)]
    if len(loads) != 2:
        return None

    def uses(load: Any, var: Any) -> bool:
        return any(idx.same_as(var) for idx in load.indices)

    a = next((n for n in loads if uses(n, i) and uses(n, k) and not uses(n, j)), None)
    b = next((n for n in loads if uses(n, k) and uses(n, j) and not uses(n, i)), None)
    if a is None or b is None or a.same_as(b):
        return None
    reads = [buffer_of(r) for r in block.reads]
    index = next((n for n, buf in enumerate(reads) if buf.same_as(buffer_of(b))), None)
    if index is None:
        return None
    transposed = b.indices[-1].same_as(k)
    return index, len(spatial) - 2, transposed


def _tile(extent: int, choices: tuple[int, ...]) -> int | None:
    return next((c for c in choices if c >= 4 and extent % c == 0), None)


def schedule_matmul(func: tirx.PrimFunc, lanes: int) -> tuple[tirx.PrimFunc, str] | None:
    """``func`` scheduled as a matrix product with ``lanes``-wide vectors, or None
    when it is not one (see the module's docs)."""
    sch = s_tir.Schedule(func)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    reductions = [b for b in blocks if any(iv.iter_type != _SPATIAL for iv in sch.get(b).iter_vars)]
    if len(reductions) != 1:
        return None
    red = reductions[0]
    roles = _roles(sch, red)
    if roles is None:
        return None
    b_index, n_batch, transposed = roles
    position = [sch.get(b).same_as(sch.get(red)) for b in blocks].index(True)
    before, after = blocks[:position], blocks[position + 1 :]
    if not all(_is_spatial(sch, b) for b in before + after):
        return None
    loops = sch.get_loops(red)
    if len(loops) != n_batch + 3:
        return None
    *batch, i, j, k = loops
    n = sch.get(j).extent
    if not isinstance(n, tirx.IntImm):
        return None
    nr = _tile(int(n), (2 * lanes, lanes, lanes // 2))
    if nr is None:
        return None
    m = sch.get(i).extent
    mr = 4 if not isinstance(m, tirx.IntImm) else (_tile(int(m), (6, 4)) or 4)
    b_buffer = buffer_of(sch.get(red).reads[b_index])
    # B's producer (a cast, a zero point taken off) computes each task's panel itself
    producer = next(
        (blk for blk in before if buffer_of(sch.get(blk).writes[0]).same_as(b_buffer)), None
    )
    for block in before:  # a transpose or a cast feeding the product: read in place
        if producer is not None and sch.get(block).same_as(sch.get(producer)):
            continue
        try:
            sch.compute_inline(block)
        except Exception:
            return None
    for block in after[:-1]:  # an epilogue chain: into its last block
        sch.compute_inline(block)
    acc = sch.cache_write(red, 0, "local")
    i0, i1 = sch.split(i, [None, mr])
    j0, j1 = sch.split(j, [None, nr])
    sch.reorder(*batch, j0, i0, k, i1, j1)
    outer = sch.fuse(*batch, j0) if batch else j0
    sch.parallel(outer)
    # the task's panel of B, copied to [k, nr] once when several row tiles read it
    # (then as one stream), or because it is stored transposed
    panel = None
    if producer is not None:
        panel = producer
    elif transposed or not isinstance(m, tirx.IntImm) or int(m) > mr:
        panel = sch.cache_read(red, b_index, "global")
    if panel is not None:
        sch.compute_at(panel, outer)
        if transposed:
            sch.transform_layout(panel, ("write", 0), lambda *ax: (*ax[:-2], ax[-1], ax[-2]))
    sch.reverse_compute_at(acc, i0)
    if after:  # the epilogue of the tile, while it is in cache
        sch.reverse_compute_at(after[-1], i0)
    sch.unroll(i1)
    sch.vectorize(j1)
    sch.decompose_reduction(red, k)
    for block in [acc] + ([after[-1]] if after else []):
        inner = sch.get_loops(block)[-1]
        extent = sch.get(inner).extent
        if isinstance(extent, tirx.IntImm) and int(extent) % lanes == 0:
            sch.vectorize(inner)
    return sch.mod["main"], "matmul"


def _is_spatial(sch: s_tir.Schedule, block: Any) -> bool:
    return all(iv.iter_type == _SPATIAL for iv in sch.get(block).iter_vars)
