"""The host's schedule for 2-D convolutions: register tiles over output channels and columns.

A convolution no accelerator takes (a model compiled without plugins, a
grouped or dilated convolution an accelerator refuses) is, as TVM legalizes
it, a reduction ``out[n, f, y, x] += data[n, c, y*s + ry, x*s + rx] *
w[f, c, ry, rx]`` over ``(c, ry, rx)``, after a padding stage and before an
elementwise epilogue (bias, batch norm, activation). ``dlight``'s CPU
rules have no convolution rule: their reduction rule takes it as any other
reduction, without register tiles.

The schedule, for a tile of ``fr`` output channels (unrolled) x ``xr``
output columns (a vector), whose accumulators stay in registers::

    [n, f0, y] (parallel) | x0 | c | ry | rx | f1 (unroll) | x1 (vector)

Each step loads a row piece of the input once and multiplies it by ``fr``
weights; the epilogue is applied to the tile after its reduction. The padding
stage stays at the root, its rows in parallel; an unpadded convolution's, a copy
of its input, is read in place.
"""

from __future__ import annotations

import math
from typing import Any

from tvm import s_tir, tirx

from umahub.plugin.compat import Load, buffer_of, nodes_in
from umahub.plugin.tir import loop_extents, read_in_place

__all__ = ["schedule_conv2d"]

_SPATIAL = 0  # IterVar.iter_type of a data-parallel block axis


def _is_conv(sch: s_tir.Schedule, red: Any) -> bool:
    """Four spatial axes then three reduced ones, and a weight read as ``w[f, c, ry, rx]``."""
    block = sch.get(red)
    kinds = [iv.iter_type == _SPATIAL for iv in block.iter_vars]
    if kinds != [True] * 4 + [False] * 3:
        return False
    f, c, ry, rx = (block.iter_vars[i].var for i in (1, 4, 5, 6))
    written = buffer_of(block.writes[0])
    loads = [n for n in nodes_in(block.body, Load) if not buffer_of(n).same_as(written)]
    return len(loads) == 2 and any(
        len(n.indices) == 4 and all(a.same_as(b) for a, b in zip(n.indices, (f, c, ry, rx)))
        for n in loads
    )


def _stride(sch: s_tir.Schedule, red: Any) -> int:
    """The column stride: the coefficient of ``x`` in the input's last index."""
    from umahub.plugin.compat import detect_linear_equation

    block = sch.get(red)
    x, f = block.iter_vars[3].var, block.iter_vars[1].var
    written = buffer_of(block.writes[0])
    for load in nodes_in(block.body, Load):
        data = not buffer_of(load).same_as(written) and not load.indices[0].same_as(f)
        if data and len(load.indices) == 4:
            coefficients = detect_linear_equation(load.indices[3], [x])
            if len(coefficients) == 2 and isinstance(coefficients[0], tirx.IntImm):
                return int(coefficients[0])
    return 1


def _deinterleave(sch: s_tir.Schedule, before: list, red: Any, stride: int) -> None:
    """The padded input stored column phase by column phase, ``[n, c, y, x % s, x //
    s]``: the strided columns a vector of outputs reads are then consecutive."""
    read = [buffer_of(r) for r in sch.get(red).reads]
    for block in before:
        (write,) = sch.get(block).writes
        buf = buffer_of(write)
        if len(write.region) != 4 or not any(buf.same_as(r) for r in read):
            continue
        width = int(buf.shape[3])
        sch.transform_layout(
            block,
            ("write", 0),
            lambda n, c, y, x: (n, c, y, x % stride, x // stride),
            pad_value=0.0 if width % stride else None,
        )


def schedule_conv2d(func: tirx.PrimFunc, lanes: int) -> tuple[tirx.PrimFunc, str] | None:
    """``func`` scheduled as a convolution with ``lanes``-wide vectors, or None when
    it is not one (see the module's docs)."""
    sch = s_tir.Schedule(func)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    spatial = [all(iv.iter_type == _SPATIAL for iv in sch.get(b).iter_vars) for b in blocks]
    if spatial.count(False) != 1:
        return None
    position = spatial.index(False)
    red = blocks[position]
    if not _is_conv(sch, red):
        return None
    before, after = blocks[:position], blocks[position + 1 :]
    loops = sch.get_loops(red)
    if len(loops) != 7:
        return None
    n, f, y, x, rc, ry, rx = loops
    extents = loop_extents(sch, loops)
    if extents is None:
        return None
    channels, width = extents[1], extents[3]
    xr = max(d for d in range(1, min(width, 2 * lanes) + 1) if width % d == 0)
    vectors = math.ceil(xr / lanes)
    registers = 12  # accumulators, of 16 vector registers (AVX2; AVX-512 has 32)
    fr = next(d for d in (8, 4, 2, 1) if channels % d == 0 and d * vectors <= registers)
    stride = _stride(sch, red)
    if stride > 1:
        _deinterleave(sch, before, red, stride)
    for block in after[:-1]:  # an epilogue chain: into its last block
        sch.compute_inline(block)
    acc = sch.cache_write(red, 0, "local")
    f0, f1 = sch.split(f, [None, fr])
    x0, x1 = sch.split(x, [None, xr])
    sch.reorder(n, f0, y, x0, rc, ry, rx, f1, x1)
    sch.parallel(sch.fuse(n, f0, y))
    sch.reverse_compute_at(acc, x0)
    if after:
        sch.reverse_compute_at(after[-1], x0)
    sch.unroll(f1)
    sch.vectorize(x1)
    sch.decompose_reduction(red, rc)
    for block in before:  # the padding: its rows in parallel, each row one loop
        if stride == 1 and read_in_place(sch, block):  # an unpadded one's: a copy
            continue
        rows = sch.get_loops(block)[:-1]
        if rows:
            sch.parallel(sch.fuse(*rows) if len(rows) > 1 else rows[0])
    return sch.mod["main"], "conv2d"
