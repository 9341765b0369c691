"""Strided vector loads as contiguous loads and one shuffle.

A vectorized loop that reads every ``s``-th element (a convolution of stride
2 with its output positions in the lanes: ``x[2 * i + tap]``) becomes a
``BufferLoad`` at ``Ramp(base, s, lanes)``. TVM's LLVM code generator writes
such a load as one scalar load per lane and an insert, which costs more than
the arithmetic it feeds. The same elements are ``s`` contiguous vectors of
``lanes`` elements, shuffled: on x86 two unaligned loads and one two-source
permute (``vpermt2ps``) for a stride of 2.

The vectors start at ``base``, ``base + lanes``, ... and the last one ends at
the last element the strided load reads, so nothing outside the elements
between its first and its last is read: a load that was in bounds stays in
bounds. Strides above :data:`MAX_STRIDE` are left alone (a load per lane is
cheaper than ``s`` whole vectors for a wide stride), as are loads of fewer than
:data:`MIN_LANES` lanes.
"""

from __future__ import annotations

from typing import Any

import tvm

from umahub.plugin.compat import Load, buffer_of, dtype_of_expr
from umahub.plugin.tir import rewrite, static_int

__all__ = ["MAX_STRIDE", "MIN_LANES", "contiguous_loads", "strided_load_pass"]

#: The widest stride rewritten: ``s`` vectors read for ``lanes`` elements.
MAX_STRIDE = 4
#: The fewest lanes rewritten.
MIN_LANES = 4


def contiguous_loads(buffer: Any, base: Any, stride: int, lanes: int) -> Any:
    """``buffer[base + stride * i]`` for ``i < lanes`` as ``stride`` contiguous vector
    loads of ``buffer`` and a shuffle of their lanes (see the module's docs)."""
    span = stride * (lanes - 1) + 1
    starts = [j * lanes for j in range(stride - 1)] + [span - lanes]
    kind = f"{buffer.dtype}x{lanes}"
    offset = dtype_of_expr(base)
    vectors = [buffer.vload([base + tvm.tirx.const(s, offset)], kind) for s in starts]
    picks = []
    for i in range(lanes):
        element = stride * i
        j = min(element // lanes, stride - 1)
        picks.append(tvm.tirx.const(j * lanes + element - starts[j], "int32"))
    return tvm.tirx.Shuffle(vectors, picks)


def _rewritten(load: Any) -> Any:
    """``load`` as :func:`contiguous_loads`, or None when it is no strided vector load of
    one flat buffer with a stride from 2 to :data:`MAX_STRIDE`."""
    if len(load.indices) != 1 or getattr(load, "predicate", None) is not None:
        return None
    index = load.indices[0]
    if not isinstance(index, tvm.tirx.Ramp):
        return None
    stride, lanes = static_int(index.stride), static_int(index.lanes)
    if stride is None or lanes is None or not 2 <= stride <= MAX_STRIDE or lanes < MIN_LANES:
        return None
    buffer = buffer_of(load)
    if len(buffer.shape) != 1:
        return None
    return contiguous_loads(buffer, index.base, stride, lanes)


def strided_load_pass() -> Any:
    """A TIR pass: every strided vector load (see the module's docs) as contiguous
    loads and a shuffle. Runs after ``VectorizeLoop``, on flat buffers; a function
    without such loads is left as it is."""

    def transform(func: Any, _mod: Any, _ctx: Any) -> Any:
        def post(node: Any) -> Any:
            found = _rewritten(node)
            return node if found is None else found

        return func.with_body(rewrite(func.body, Load, post))

    return tvm.tirx.transform.prim_func_pass(transform, opt_level=0, name="umahub.StridedLoads")
