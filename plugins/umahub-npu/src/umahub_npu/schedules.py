"""Scheduling strategies of the ``npu`` accelerator (umahub-npu).

The npu is a matrix engine with a scratchpad ("npu.sram"); here it is emulated
on the host CPU and generated through LLVM, so a schedule that is good for the
npu is one that is good for a CPU core with a cache of ``sram_bytes``: tile so
that one tile's working set stays in the scratchpad, keep the accumulator of a
tile local, compute the epilogue (bias, activation) while the tile is hot,
vectorize the innermost loop, run the outer tiles in parallel.

Public entry point: :func:`schedule`.  It is what the plugin's
``umahub_schedule`` hook calls on the ``tvm.s_tir.Schedule`` umahub gives it
(one PrimFunc per partition, produced by LegalizeOps + AnnotateTIROpPattern +
FuseOps + FuseTIR).

Its design space for ``umahub tune`` is the same schedule with the tile
sizes of the matmul, conv2d and pointwise strategies drawn instead of chosen
(:func:`drawing_tiles`): rows, columns (channels, positions) and reduction
steps, each from the sizes the rules below allow, the reduction steps among
those whose working set fits the scratchpad.

Strategies
----------
``"matmul"``
    ``C[b.., i, j] += A[b.., i, k] * B[b.., k, j]`` (2-D dense, and batched
    3-D / 4-D matmul as in attention; a transposed ``B[b.., j, k]`` is packed
    tile by tile into ``[k, j]``), with any chain of elementwise epilogue
    blocks (bias add, relu, gelu, residual add...) inlined into one epilogue
    computed per tile.
``"conv2d"``
    NCHW conv2d (groups == 1 or grouped), padding block kept as a separate
    parallel, vectorized stage (an unpadded convolution's input read in place),
    bias/relu/clip epilogue per tile.
``"pointwise"``
    A 1x1, stride-1, ungrouped conv2d whose output positions fill whole
    vectors: the matmul ``W[f, c] x X[c, p]`` of NCHW's own layout, the input
    (and a squeeze-and-excitation gate multiplying it) read in place.
``"depthwise"``
    NCHW conv2d with groups == channels (one input channel per output); one
    whose output rows are narrower than a vector (7x7, 5x5 filters on 7x7)
    on its plane read as one row, as ``umahub_npu.lowering`` writes it:
    vectors of consecutive positions over row ends.
``"sum"``
    A sum over a tensor's trailing axes (a mean, a global average pooling):
    rows in parallel, each in vector-wide partial sums (``rfactor``).
``"elementwise"``
    Spatial blocks only (a concatenation): umahub's own schedule for the
    host's (:func:`umahub.plugin.schedule_elementwise`).
``"pooling"``
    A max pooling, lowered as two 1-D ones (a ReLU before it computed where
    it is read): umahub's schedule for the host's
    (:func:`umahub.plugin.schedule_pooling`).
``"none"``
    Not recognised, or a schedule primitive refused: the function is left
    exactly as it was.  :func:`schedule` never raises.

Tile-size logic (``sram_bytes``, float32 = 4 bytes)
---------------------------------------------------
matmul, per (batch, i-tile, j-tile) task::

    working set = 4 * (ti*tk  +  tk*tj  +  ti*tj)   <= sram_bytes
                      A tile    B tile    C tile (accumulator)

* micro-kernel ``mr x nr``: ``nr`` = two vectors (16 lanes with AVX2, 32 with
  AVX-512) along ``j``, ``mr`` = 4 rows (``mr * nr/lanes`` = 8 accumulator
  registers of the 16 ymm registers), 8 rows with AVX-512's 32 registers
  when M is a multiple of 8 with a row tile of 16 to 40;
* ``tj``: a multiple of ``nr`` dividing N, at most 256; ``ti``: a multiple of
  ``mr`` dividing M, at most 32 (40 with 8-row micro-kernels; a C tile of 32-40
  KiB), or :data:`PACKING_ROWS` where each task packs its tile of a B computed
  at run time, so that one packing serves more rows (BERT's attention,
  12 x 128x64 @ 64x128: 0.86 of the kernel's time, Intel Xeon); both shrink
  while there are fewer parallel tasks than ``2 * threads``;
* ``tk``: the largest divisor of K, at most 256, for which the working set
  fits ``sram_bytes``;
* B is read in panels ``[j/nr][k][nr]`` (transposed when it is stored
  ``[.., j, k]``): a constant B (a weight, ``CompileContext.weights``) is
  packed so once, at compile time (:func:`umahub.plugin.pack_weight`); a B
  computed at run time has the tile of each (i, j, k) step packed into
  ``[tj/nr][tk][nr]``; the accumulator is the C
  tile (``cache_write`` when the matmul writes the output itself), the
  epilogue is ``reverse_compute_at`` the (i, j) tile, loop order
  ``[batch,j0,i0] (parallel) k0 | pack B | i1 j1 k1 i2 (unroll) j2 (vector)``,
  the steps of ``k1`` unrolled four at a time (:data:`STEPS_UNROLLED`);
* the column tile is outside the row tile: a thread's share of the parallel
  tasks is whole columns, and it runs every row tile of a column before the
  next, so that B's column block (``K x tj``) comes from memory once per call,
  not once per row tile. A large weight is not in cache when its matmul runs
  (ViT-B's 344 MB of weights pass through the caches every inference). In one
  process on the Intel Xeon, caches flushed before each call, 197 rows as
  ViT-B's: 197x768 @ 768x3072 6.54 -> 5.18 ms, @ 768x2304 4.10 -> 3.45 ms
  (ONNX Runtime 5.14 and 3.31 in the same runs); warm, no change (128x768 @
  768x768 0.731 -> 0.728). The same sums in the same order: the same bits.
  With the default 256 KiB, 128x768 @ 768x3072 gives ti=32, tj=256, tk=192:
  24 KiB + 192 KiB + 32 KiB = 248 KiB.

conv2d (NCHW) is scheduled as an implicit GEMM: rows = output positions
p = (y, x) (P = OH*OW), columns = output channels f, reduction = (c, kh, kw);
per (f-tile, p-tile) task::

    working set = 4 * (tc*rows_in*((OW-1)*s+KW)   input rows the tile reads
                       + tf*tc*KH*KW              weight tile, packed [f/nr][c][kh][kw][nr]
                       + tp*tf)                   accumulator, layout [y, x, f]

* micro-kernel ``mr`` positions (unrolled, input broadcast) x ``nr`` channels
  (1 or 2 vectors): the (mr, nr) with mr | P, at most 12 accumulator vectors,
  and the most FMAs per load (56x56: 4x16, 7x7: 7x8), of those with a tile
  as below (147x147: 7, not 9, whose tiles would be 3 rows);
* ``tp``: a multiple of mr, whole output rows (or a divisor of one row), <= 256
  positions (or one row where a row is longer): a tile must be a rectangle of
  the output, because reverse_compute_at of the epilogue covers the bounding
  box of what the tile produces; it shrinks to fit ``sram_bytes`` among
  rectangles only;
* ``tf`` <= 64 channels; tiles shrink until there are ``2 * threads`` tasks,
  then to a smaller tile where the threads share its tasks more evenly
  (:func:`_evenly_shared`: 960 -> 320 channels on 7x7 in 10 tasks, not 5 of
  which one thread runs 3: 0.84 of the kernel's time, Intel Xeon). The
  pointwise strategy keeps its tiles: split in channels, a task reads its
  input tile for fewer products (192 -> 32 on 28x28: 1.47x the time); split
  in positions, the measured change was within the noise;
* ``tc``: the largest divisor of C/groups that fits ``sram_bytes``.
  (1,64,56,56) 3x3: tf=64, tp=224 (4 rows), tc=32: 51 KiB + 72 KiB + 56 KiB.
* the filters are read as ``[f/nr][c][kh][kw][nr]``: packed at compile time
  when they are constants, else the tile of each (f-tile, c-step) per task.
* where ``tc`` is all of C (one reduction step) and the filters are packed at
  compile time, the epilogue runs per ``nr`` channels of the tile, as for
  pointwise below (squeezenet's 3x3 of 32 -> 128 channels on 27x27: 0.87).
* the padding block stays a separate stage (parallel, vectorized) at the root;
  an unpadded convolution's, a copy of its input, is read in place.

pointwise, per (f-tile, p-tile) task::

    working set = 4 * (tc*tp + tf*tc + tf*tp)   input, filters, accumulator

* micro-kernel ``mr`` channels (unrolled, the filter broadcast from its
  packing ``[f/mr][c][kh][kw][mr]``) x ``nr`` positions (two vectors, or one
  when P is an odd number of vectors): ``mr`` the largest divisor of F with
  ``mr * nr/lanes`` <= 24 accumulators (12 with AVX2), so any channel count
  (24, 40, 72) runs whole vectors and is not padded (the lowering leaves a
  1x1 convolution on a multiple of 16 positions unpadded:
  ``umahub_npu.lowering._positions_in_vectors``; keep the two in step);
* ``tp``: whole output rows or a divisor of one (a rectangle, as above), <= 512
  positions; ``tf`` <= 64 channels; tasks and ``sram_bytes`` as for conv2d.
* where ``tc`` is all of C (one reduction step), the epilogue runs per ``mr``
  channels of the tile, right after their micro-kernels, not per tile: it
  reads ``mr * tp`` accumulators from L1, not ``tf * tp`` from L2 (16 -> 96
  channels on 112x112: 0.82 of the kernel's time on the Intel Xeon).
* where the input rows a micro-kernel reads over its reduction lie on more
  4-KiB pages than the first-level data TLB holds (:data:`TLB_PAGES`: ``tc``
  rows a page or more apart, or fewer rows of 3136 bytes at 28x28), each task
  first copies its ``tc x tp`` input tile into a buffer of its own: 512 -> 128
  channels on 28x28 (196 pages) 0.61 of the kernel's time, resnet50 0.96
  (Intel Xeon); at 64 pages or fewer the copy measured no gain.
* Against the implicit GEMM, whose vectors hold channels, it is faster, the
  more so the fewer the channels: its vectors hold positions, of which a 1x1
  convolution has many, and a channel count no vector divides costs it no
  half-empty vectors.

depthwise: each channel is independent; the tile is ``ty`` full rows of one
channel (input rows + 9 weights + output rows), always far below the budget.
A micro-tile's accumulators start in registers where they and the taps'
weights fit the vector registers (3x3 with AVX-512), else the task's rows
are initialised in memory first; a padded row no vector divides is copied
by LLVM's own vectorizer (TVM's would be vectors of a divisor's width).
On a plane (rows narrower than a vector), a task is a channel: its padded
plane, then tiles of up to 8 vectors of positions accumulated in registers
over the unrolled taps, then the epilogue, which drops the positions past each
row's end.

Target: build with :func:`umahub.plugin.host_target` (this CPU by name: plain
``"llvm"`` is generic x86-64, SSE2 and no FMA).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

from tvm import s_tir, tirx
from tvm.s_tir.schedule import ScheduleError

from umahub.plugin import (
    PARALLEL_MIN,
    detect_linear_equation,
    nodes_in,
    pack_weight,
    param_buffers,
    read_in_place,
    schedule_elementwise,
    schedule_pooling,
    upper_bound,
    vars_in,
    vector_lanes,
)
from umahub.plugin import PREPACK_ANNOTATION as ANNOTATION
from umahub.plugin import Load as _LOAD
from umahub.plugin import buffer_of as _buf

__all__ = ["TUNED_KINDS", "drawing_tiles", "plan", "schedule"]

log = logging.getLogger("umahub_npu.schedules")

_DTYPE_BYTES = 4  # the npu computes in float32


# --------------------------------------------------------------------------- host facts


def _default_threads() -> int:
    env = os.environ.get("TVM_NUM_THREADS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, os.cpu_count() or 1)


# --------------------------------------------------------------------------- analysis


@dataclass
class Plan:
    """What :func:`plan` found in a PrimFunc: the strategy and the block roles."""

    kind: str  # "matmul" | "gemv" | "conv2d" | "depthwise" | "sum" | "elementwise" | "pooling"
    func_name: str
    reduction: str  # name of the reduction block
    prologue: list[str] = field(default_factory=list)  # blocks before it
    epilogue: list[str] = field(default_factory=list)  # blocks after it
    extents: dict = field(default_factory=dict)  # role -> extent
    b_transposed: bool = False  # matmul: B is indexed [.., j, k]
    b_buffer_index: int = -1  # matmul: index of B in the block's reads
    stride: int = 1  # conv2d
    kernel: tuple = (1, 1)  # conv2d
    pointwise: bool = False  # conv2d: 1x1, stride 1, not grouped
    plane: bool = False  # depthwise: on its plane read as one row (see lowering)


# A buffer load is ``tvm.ir.expr.TensorLoad`` with ``source`` in 0.27 and
# ``tirx.BufferLoad`` with ``buffer`` before; a store is ``tirx.BufferStore`` with
# ``buffer``; a read region names its buffer ``source`` (0.27) or ``buffer``:
# ``_LOAD`` and ``_buf`` (from ``umahub.plugin.compat``) cover both.


def _strip_cast(e):
    while isinstance(e, tirx.Cast):
        e = e.value
    return e


def _is_var(e, var) -> bool:
    return isinstance(e, tirx.Var) and e.same_as(var)


def _vars_in(e) -> list:
    return vars_in(e)


def _uses(e, var) -> bool:
    return any(v.same_as(var) for v in _vars_in(e))


def _func_name(sch: s_tir.Schedule) -> str:
    gv = sch.func_working_on
    if gv is None:
        names = [
            gv.name_hint for gv, f in sch.mod.functions.items() if isinstance(f, tirx.PrimFunc)
        ]
        if len(names) != 1:
            raise ValueError(f"expected one PrimFunc, found {names}")
        sch.work_on(names[0])
        return names[0]
    return gv.name_hint


def _mul_operands(value):
    """C + X*Y (any order) -> (C load, X load, Y load) or None."""
    value = _strip_cast(value)
    if not isinstance(value, tirx.Add):
        return None
    for acc, prod in ((value.a, value.b), (value.b, value.a)):
        acc, prod = _strip_cast(acc), _strip_cast(prod)
        if isinstance(acc, _LOAD) and isinstance(prod, tirx.Mul):
            x, y = _strip_cast(prod.a), _strip_cast(prod.b)
            if isinstance(x, _LOAD) and isinstance(y, _LOAD):
                return acc, x, y
    return None


def plan(sch: s_tir.Schedule) -> Plan | None:
    """Recognise the function; None when no strategy applies.  Does not modify ``sch``."""
    func_name = _func_name(sch)
    func = sch.mod[func_name]
    root = func.body.block
    root_rv = sch.get_sblock(root.name_hint, func_name)
    children = sch.get_child_blocks(root_rv)
    blocks = [sch.get(b) for b in children]
    if len({b.name_hint for b in blocks}) != len(blocks):
        return None
    red = [
        i
        for i, b in enumerate(blocks)
        if any(iv.iter_type == tirx.IterVar.CommReduce for iv in b.iter_vars)
    ]
    if not red and all(iv.iter_type == tirx.IterVar.DataPar for b in blocks for iv in b.iter_vars):
        return Plan(kind="elementwise", func_name=func_name, reduction="")
    if len(red) > 1:  # a max pooling as two 1-D ones (see lowering), or unknown
        return Plan(kind="pooling", func_name=func_name, reduction="")
    if len(red) != 1:
        return None
    ri = red[0]
    rb = blocks[ri]
    for i, b in enumerate(blocks):
        if i != ri and any(iv.iter_type != tirx.IterVar.DataPar for iv in b.iter_vars):
            return None
    if rb.init is None or not isinstance(rb.body, tirx.BufferStore):
        return None
    if str(rb.body.buffer.dtype) not in ("float32", "int32"):
        return None
    spatial = [iv for iv in rb.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    reduce_ = [iv for iv in rb.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    idx = list(rb.body.indices)
    if len(idx) != len(spatial) or not all(_is_var(e, iv.var) for e, iv in zip(idx, spatial)):
        return None
    if [iv.var for iv in rb.iter_vars[: len(spatial)]] != [iv.var for iv in spatial]:
        return None  # spatial iterators must come first
    common = dict(
        func_name=func_name,
        reduction=rb.name_hint,
        prologue=[b.name_hint for b in blocks[:ri]],
        epilogue=[b.name_hint for b in blocks[ri + 1 :]],
    )
    ops = _mul_operands(rb.body.value)
    if ops is None or str(rb.body.buffer.dtype) != "float32":  # int32: a quantized mean's
        return _plan_sum(rb, spatial, reduce_, common)
    acc, x, y = ops
    if not _buf(acc).same_as(rb.body.buffer):
        return None
    ext = lambda iv: int(iv.dom.extent)  # noqa: E731
    read_bufs = [_buf(r) for r in rb.reads]

    if len(reduce_) == 1 and len(spatial) >= 2:
        k = reduce_[0].var
        iv_i, iv_j = spatial[-2], spatial[-1]
        # A: the operand indexed by i and k; B: the one indexed by j and k
        a = b = None
        for cand in (x, y):
            ci = list(cand.indices)
            if len(ci) < 2:
                continue
            if _is_var(ci[-1], k) and _is_var(ci[-2], iv_i.var):
                a = cand
            elif _is_var(ci[-2], k) and _is_var(ci[-1], iv_j.var):
                b, bt = cand, False
            elif _is_var(ci[-1], k) and _is_var(ci[-2], iv_j.var):
                b, bt = cand, True
        if a is None or b is None:
            return None
        bidx = next((n for n, buf in enumerate(read_bufs) if buf.same_as(_buf(b))), -1)
        rows = iv_i.dom.extent  # a prompt's tokens may be known only at run time
        M = int(rows) if isinstance(rows, tirx.IntImm) else rows
        return Plan(
            kind="gemv" if M == 1 and _batch_size(spatial) == 1 else "matmul",
            extents=dict(
                batch=[ext(iv) for iv in spatial[:-2]],
                M=M,
                N=ext(iv_j),
                K=ext(reduce_[0]),
            ),
            b_transposed=bt,
            b_buffer_index=bidx,
            **common,
        )

    if len(reduce_) == 2 and len(spatial) == 4:
        return _plan_plane(spatial, reduce_, x, y, common)

    if len(reduce_) == 3 and len(spatial) == 4:
        n, f, yy, xx = (iv.var for iv in spatial)
        rc, ry, rx = (iv.var for iv in reduce_)
        data = weight = None
        for cand in (x, y):
            ci = list(cand.indices)
            if len(ci) != 4:
                continue
            if all(_is_var(e, v) for e, v in zip(ci[1:], (rc, ry, rx))) or (
                _is_var(ci[2], ry) and _is_var(ci[3], rx) and _uses(ci[0], f)
            ):
                weight = cand
            elif _uses(ci[2], yy) and _uses(ci[2], ry) and _uses(ci[3], xx) and _uses(ci[3], rx):
                data = cand
        if data is None or weight is None:
            return None
        # stride: coefficient of xx in data's last index (x*s + rx)
        stride = 1
        last = data.indices[3]
        try:
            coef = detect_linear_equation(last, [xx])
            if len(coef) == 2:
                stride = int(coef[0])
        except Exception:  # pylint: disable=broad-except
            pass
        C = ext(reduce_[0])
        kind = "depthwise" if C == 1 and _uses(data.indices[1], f) else "conv2d"
        pointwise = (
            kind == "conv2d"
            and ext(reduce_[1]) == ext(reduce_[2]) == 1
            and stride == 1
            and _is_var(data.indices[1], rc)
        )
        return Plan(
            kind=kind,
            extents=dict(
                N=ext(spatial[0]),
                F=ext(spatial[1]),
                OH=ext(spatial[2]),
                OW=ext(spatial[3]),
                C=C,
                KH=ext(reduce_[1]),
                KW=ext(reduce_[2]),
            ),
            stride=stride,
            kernel=(ext(reduce_[1]), ext(reduce_[2])),
            pointwise=pointwise,
            **common,
        )
    return None


def _plan_plane(spatial: list, reduce_: list, x, y, common: dict) -> Plan | None:
    """The npu's own depthwise lowering (``umahub_npu.lowering._depthwise_plane``):
    ``acc[n, c, y, x] += plane[n, c, y + ry + (x + rx) // Wp, (x + rx) % Wp] * w[c, 0, ry, rx]``
    (as TVM simplifies ``((y + ry) * Wp + x + rx) // Wp``)."""
    n, c, yy, xx = (iv.var for iv in spatial)
    ry, rx = (iv.var for iv in reduce_)
    data = weight = None
    for cand in (x, y):
        ci = list(cand.indices)
        if len(ci) != 4:
            return None
        if _is_var(ci[0], c) and _is_var(ci[2], ry) and _is_var(ci[3], rx):
            weight = cand
        elif (
            _is_var(ci[1], c)
            and _uses(ci[2], yy)
            and _uses(ci[2], ry)
            and isinstance(ci[3], tirx.FloorMod)
            and _uses(ci[3], xx)
            and _uses(ci[3], rx)
        ):
            data = cand
    if data is None or weight is None:
        return None
    ext = lambda iv: int(iv.dom.extent)  # noqa: E731
    return Plan(
        kind="depthwise",
        # the grid the plane is computed on: rows x the padded width (or more)
        extents=dict(
            N=ext(spatial[0]), F=ext(spatial[1]), rows=ext(spatial[2]), width=ext(spatial[3])
        ),
        kernel=(ext(reduce_[0]), ext(reduce_[1])),
        plane=True,
        **common,
    )


def _batch_size(spatial: list) -> int:
    """The product of a matmul's batch extents (1 for a 2-D matmul)."""
    return math.prod(int(iv.dom.extent) for iv in spatial[:-2]) if len(spatial) > 2 else 1


def _plan_sum(rb, spatial: list, reduce_: list, common: dict) -> Plan | None:
    """A sum over the trailing axes of one tensor (a mean's, a global pooling's),
    ``acc[i..] = acc[i..] + f(x[i.., r..])``, ``f`` elementwise (a quantized mean's
    ``int32(x) - x_zp``, its zero point read from a scalar); None when ``rb`` is
    not one."""
    value = rb.body.value
    if not reduce_ or not isinstance(value, tirx.Add):
        return None
    acc, term = value.a, value.b
    if not isinstance(acc, _LOAD) or not _buf(acc).same_as(rb.body.buffer):
        return None
    reduced = [iv.var for iv in reduce_]
    tensor = [
        ld
        for ld in nodes_in(term, _LOAD)
        if any(v.same_as(r) for v in _vars_in(ld) for r in reduced)
    ]
    if len(tensor) != 1 or _buf(tensor[0]).same_as(rb.body.buffer):
        return None
    indices = list(tensor[0].indices)
    if len(indices) < len(reduce_):
        return None
    if not all(_is_var(e, iv.var) for e, iv in zip(indices[-len(reduce_) :], reduce_)):
        return None  # the reduced axes must be the tensor's last, contiguous ones
    return Plan(
        kind="sum",
        extents=dict(
            rows=math.prod(int(iv.dom.extent) for iv in spatial),
            R=math.prod(int(iv.dom.extent) for iv in reduce_),
        ),
        **common,
    )


# --------------------------------------------------------------------------- tile choice

#: The strategies whose tile sizes ``umahub tune`` may draw (see :func:`drawing_tiles`).
TUNED_KINDS = ("matmul", "conv2d")

_drawing: ContextVar[Callable[[str, list[int], int], int] | None] = ContextVar(
    "umahub_npu_drawing", default=None
)


@contextlib.contextmanager
def drawing_tiles(sch: s_tir.Schedule) -> Iterator[None]:
    """While open, the tile sizes of :func:`matmul_tiles`, :func:`conv_tiles` and
    :func:`pointwise_tiles` are drawn on ``sch`` (``sample_categorical``, uniform over
    the sizes the rules allow) instead of chosen by the rules: the npu's design
    space for ``umahub tune``. Each size is drawn once per schedule (the dry run
    and the schedule itself take the same), and the trace keeps the draws.
    """
    drawn: dict[str, int] = {}

    def draw(name: str, options: list[int], _rule: int) -> int:
        if name not in drawn:
            rv = sch.sample_categorical(options, [1.0 / len(options)] * len(options))
            drawn[name] = int(sch.get(rv))
        return drawn[name]

    token = _drawing.set(draw)
    try:
        yield
    finally:
        _drawing.reset(token)


def _chosen(name: str, options: list[int], rule: int) -> int:
    """``rule``'s size, or one drawn from ``options`` inside :func:`drawing_tiles`."""
    draw = _drawing.get()
    options = sorted(set(options))
    if draw is None or len(options) < 2:
        return rule
    return draw(name, options, rule)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


#: A smaller tile is taken for its tasks' even split only where the threads' longest
#: share of the work shrinks by this much: each task also pays for its own loads of
#: filters or inputs and its epilogue, which the share does not count.
EVEN_SPLIT_GAIN = 0.95


def _evenly_shared(tasks: Callable[[int, int], int], firsts, seconds, chosen, threads: int):
    """``chosen`` (a tile ``(a, b)`` from ``firsts`` x ``seconds``) or the tile no larger
    in either size whose tasks the ``threads`` share most evenly.

    ``tasks(a, b)`` is the number of parallel tasks of a tile. TVM's parallel loop
    hands each thread a block of ``ceil(T / threads)`` tasks: 5 tasks on 2 threads
    take 3 tasks' time, 1/6 of the cores idle (mobilenetv2's 960 -> 160 channels on
    7x7 in tiles of 32 channels). The longest share, ``ceil(T / threads)`` tasks of
    ``a * b`` each, is what a tile costs; a smaller tile is taken where it costs
    at most :data:`EVEN_SPLIT_GAIN` of the chosen one's (the largest of those
    that cost least). Used by the implicit GEMM's tiles (:func:`conv_tiles`)."""

    def longest(a: int, b: int) -> int:
        return -(-tasks(a, b) // threads) * a * b

    a0, b0 = chosen
    options = [(a, b) for a in firsts for b in seconds if a <= a0 and b <= b0]
    best = min(options, key=lambda t: (longest(*t), -t[0] * t[1]), default=chosen)
    return best if longest(*best) <= EVEN_SPLIT_GAIN * longest(a0, b0) else chosen


def _pick_nr(n: int, lanes: int) -> int:
    for cand in (2 * lanes, lanes):
        if n % cand == 0:
            return cand
    return max(d for d in _divisors(n) if d <= 2 * lanes)


def _pick_mr(m: int) -> int:
    for cand in (4, 6, 3, 2):
        if m % cand == 0:
            return cand
    return 1


#: Rows a matmul's tile may have where B is packed by each task as it runs (B
#: computed at run time: attention's ``q @ k^T``), so that a packing serves more rows.
PACKING_ROWS = 128


def matmul_tiles(
    batch: int,
    M: int,
    N: int,
    K: int,
    lanes: int,
    sram_bytes: int,
    threads: int,
    packs_b: bool = False,
):
    """(ti, tj, tk, mr, nr) for one matmul; see the module docstring. ``packs_b``:
    each task packs its tile of B (computed at run time), for up to
    :data:`PACKING_ROWS` rows of A."""
    nr = _pick_nr(N, lanes)
    # AVX-512's 32 registers hold 8 rows x 2 vectors of accumulators (16 of
    # them), where a row tile of 16 or more amortizes packing B over its rows
    # (ViT's 197 rows, padded to 200, get row tiles of 40)
    eight = lanes >= 16 and M % 8 == 0 and any(d % 8 == 0 and 16 <= d <= 40 for d in _divisors(M))
    mr = 8 if eight else _pick_mr(M)
    tjs = [d for d in _divisors(N) if d % nr == 0 and d <= max(256, nr)] or [nr]
    rows = (40 if mr == 8 else 32) if not packs_b else PACKING_ROWS
    tis = [d for d in _divisors(M) if d % mr == 0 and d <= rows] or [mr]
    tj, ti = max(tjs), max(tis)
    # enough tasks for the threads: shrink j-tile first, then i-tile
    while batch * (M // ti) * (N // tj) < 2 * threads:
        smaller_j = [d for d in tjs if d < tj and d >= 64]
        smaller_i = [d for d in tis if d < ti and d >= 8]
        if smaller_j:
            tj = max(smaller_j)
        elif smaller_i:
            ti = max(smaller_i)
        else:
            break
    ti, tj = _chosen("matmul rows", tis, ti), _chosen("matmul columns", tjs, tj)

    def ws(tk):
        return _DTYPE_BYTES * (ti * tk + tk * tj + ti * tj)

    tks = [d for d in _divisors(K) if d <= 256]
    fitting = [d for d in tks if ws(d) <= sram_bytes]
    while not fitting and (tj > nr or ti > mr):  # tiny scratchpad: shrink C tile
        if tj > nr:
            tj = max(d for d in tjs if d < tj) if any(d < tj for d in tjs) else nr
        else:
            ti = max(d for d in tis if d < ti) if any(d < ti for d in tis) else mr
        fitting = [d for d in tks if ws(d) <= sram_bytes]
    tk = _chosen("matmul steps", fitting, max(fitting)) if fitting else 1
    return ti, tj, tk, mr, nr


def conv_tiles(p: Plan, lanes: int, sram_bytes: int, threads: int):
    """(tf, tp, tc, nr, mr) for NCHW conv2d as an implicit GEMM; see the module docstring.

    Rows of the GEMM are output positions p = (y, x) (P = OH*OW), columns are
    output channels f, the reduction is (c, kh, kw).
    """
    e = p.extents
    F, OH, OW, C, KH, KW = e["F"], e["OH"], e["OW"], e["C"], e["KH"], e["KW"]
    s = p.stride
    P = OH * OW
    # micro-kernel mr positions x nr channels: at most 12 accumulator vectors
    # (of 16 registers; 14 with one vector per row), 28 with AVX-512's 32
    # registers (16 lanes; 30 with one vector per row); best FMA per load (mr
    # broadcasts + nr/lanes loads), times how full the vectors are: channel
    # counts no whole vector divides (1000 classes) take half or quarter
    # vectors, and positions no small number divides (13x13) whole rows,
    # rather than a 1-wide tile that runs scalar code
    # a position tile must be a rectangle of the output (whole rows, or part of
    # one row): reverse_compute_at of the epilogue covers the bounding box of
    # the positions a tile produces, and a ragged tile would make it read
    # accumulators another tile has not produced yet. Its size is a multiple of
    # mr, so an mr is kept only where a rectangle of at most `limit` positions
    # is one (9 positions a step at 147x147 would need tiles of 3 rows)
    sizes = _divisors(P)
    limit = max(256, OW)

    def rectangles(m: int) -> list[int]:
        return [d for d in sizes if d % m == 0 and (d % OW == 0 or OW % d == 0)]

    budget = {1: 24, 2: 20} if lanes >= 16 else {1: 14, 2: 12}
    best = (0.0, 1, lanes)
    widths = [(2, 2 * lanes), (1, lanes)] + [(1, w) for w in (lanes // 2, lanes // 4) if w >= 4]
    for nv, nr_c in widths:
        if F % nr_c:
            continue
        fill = nr_c / (nv * lanes)
        for m in range(1, 15):
            if P % m == 0 and m * nv <= budget[nv] and rectangles(m)[0] <= limit:
                best = max(best, ((m * nv) / (m + nv) * fill, m, nr_c))
    _, mr, nr = best
    if F % nr:
        nr = _pick_nr(F, lanes)
    tfs = [d for d in _divisors(F) if d % nr == 0 and d <= max(64, nr)] or [nr]
    valid = rectangles(mr)
    tps = [d for d in valid if d <= limit]
    tf, tp = max(tfs), max(tps)
    while e["N"] * (F // tf) * (P // tp) < 2 * threads:
        if any(d < tp and d >= 32 for d in tps):
            tp = max(d for d in tps if d < tp and d >= 32)
        elif any(d < tf for d in tfs):
            tf = max(d for d in tfs if d < tf)
        else:
            break
    tf, tp = _evenly_shared(lambda f, q: e["N"] * (F // f) * (P // q), tfs, tps, (tf, tp), threads)
    tf, tp = _chosen("conv2d channels", tfs, tf), _chosen("conv2d positions", tps, tp)

    def ws(tc):
        rows = (math.ceil(tp / OW) + 1 - 1) * s + KH
        inp = tc * min(rows, (OH - 1) * s + KH) * ((OW - 1) * s + KW)
        return _DTYPE_BYTES * (inp + tf * tc * KH * KW + tp * tf)

    tcs = _divisors(C)
    fitting = [d for d in tcs if ws(d) <= sram_bytes]
    while not fitting and (tp > valid[0] or tf > nr):
        if tp > valid[0]:
            tp = max(d for d in valid if d < tp)  # a smaller rectangle, never a ragged tile
        else:
            tf = max(d for d in tfs if d < tf) if any(d < tf for d in tfs) else nr
        fitting = [d for d in tcs if ws(d) <= sram_bytes]
    tc = _chosen("conv2d steps", fitting, max(fitting)) if fitting else 1
    return tf, tp, tc, nr, mr


def pointwise_tiles(p: Plan, lanes: int, sram_bytes: int, threads: int):
    """(tf, tp, tc, mr, nr) for a 1x1 convolution as ``W[f, c] x X[c, p]``; see the
    module docstring. Positions ``P`` must be a multiple of ``lanes``."""
    e = p.extents
    F, OW, C = e["F"], e["OW"], e["C"]
    P = e["OH"] * OW
    # micro-kernel mr channels (weights broadcast) x nr positions (vectors): 24
    # accumulators of AVX-512's 32 registers, 12 of AVX2's 16
    nv = 2 if P % (2 * lanes) == 0 else 1
    nr = nv * lanes
    most = (24 if lanes >= 16 else 12) // nv
    mr = max(m for m in range(1, most + 1) if F % m == 0)
    tfs = [d for d in _divisors(F) if d % mr == 0 and d <= max(64, mr)]
    # rectangles of the output, as for conv2d: whole rows or part of one
    tps = [d for d in _divisors(P) if d % nr == 0 and (d % OW == 0 or OW % d == 0)]
    tps = [d for d in tps if d <= 512] or [min(tps)]
    tf, tp = max(tfs), max(tps)
    while e["N"] * (F // tf) * (P // tp) < 2 * threads:
        if any(64 <= d < tp for d in tps):
            tp = max(d for d in tps if 64 <= d < tp)
        elif any(d < tf for d in tfs):
            tf = max(d for d in tfs if d < tf)
        else:
            break
    tf, tp = _chosen("pointwise channels", tfs, tf), _chosen("pointwise positions", tps, tp)

    def ws(tc):
        return _DTYPE_BYTES * (tc * tp + tf * tc + tf * tp)

    while ws(1) > sram_bytes and (tp > min(tps) or tf > mr):
        if tp > min(tps):
            tp = max(d for d in tps if d < tp)
        else:
            tf = max(d for d in tfs if d < tf)
    fitting = [d for d in _divisors(C) if ws(d) <= sram_bytes]
    tc = _chosen("pointwise steps", fitting, max(fitting)) if fitting else 1
    return tf, tp, tc, mr, nr


# --------------------------------------------------------------------------- strategies


def _inline_chain(sch: s_tir.Schedule, names: list[str], keep_last: bool) -> list[str]:
    """compute_inline every block of ``names`` that allows it (the last one kept)."""
    todo = names[:-1] if keep_last else list(names)
    left = []
    for name in todo:
        try:
            sch.compute_inline(sch.get_sblock(name))
        except ScheduleError:  # the primitive refused; take the fallback
            left.append(name)
    return left + (names[-1:] if keep_last and names else [])


def _vectorize_inner(sch: s_tir.Schedule, loop, extent: int, lanes: int):
    """vectorize a loop of ``extent``: split it into vector-sized pieces when longer."""
    if extent <= 2 * lanes:
        sch.vectorize(loop)
        return
    width = (
        lanes
        if extent % lanes == 0
        else next((d for d in range(2 * lanes, 0, -1) if extent % d == 0), 1)
    )
    if width > 1:
        _, inner = sch.split(loop, [None, width])
        sch.vectorize(inner)


def _parallel_spatial(sch: s_tir.Schedule, block, lanes: int):
    """Elementwise block at root: parallel outer loops, vectorized innermost."""
    loops = sch.get_loops(block)
    exts = [int(sch.get(l).extent) for l in loops]
    if len(loops) > 1:
        outer = sch.fuse(*loops[:-1])
        sch.parallel(outer)
    _vectorize_inner(sch, loops[-1], exts[-1], lanes)


def _writes_output(sch: s_tir.Schedule, block) -> bool:
    """Whether ``block`` writes a buffer of the function's parameters (an output)."""
    written = _buf(sch.get(block).writes[0])
    func = sch.mod[_func_name(sch)]
    return any(b is not None and b.same_as(written) for b in param_buffers(func))


def _accumulator_and_epilogue(sch: s_tir.Schedule, p: Plan):
    """Inline the epilogue chain; return (reduction rv, output-writing rv, other epilogue).

    When the reduction writes a function output itself (no epilogue, or a
    partition that also returns the raw matmul/convolution), it accumulates in
    a local copy, so that the accumulator's layout can change while the
    output keeps the layout its callers expect; the epilogue then reads the
    output and is scheduled on its own.
    """
    red = sch.get_sblock(p.reduction)
    left = _inline_chain(sch, p.epilogue, keep_last=True) if p.epilogue else []
    if not left or _writes_output(sch, red):
        out = sch.cache_write(red, 0, "global")
        return red, out, left
    return red, sch.get_sblock(left[-1]), left[:-1]


def _epilogue_at(sch: s_tir.Schedule, loop, out, rest: list[str]) -> tuple[list, list[str]]:
    """Compute the epilogue per tile: ``out`` and the blocks of ``rest`` it may need
    (those that write an output too, so could not be inlined) under ``loop``.

    Returns (the blocks moved, to vectorize later; the names left at the root).
    """
    moved, left = [], []
    for name in rest:  # producers first: a block moves only after those it reads
        block = sch.get_sblock(name)
        try:
            sch.reverse_compute_at(block, loop)
            moved.append(block)
        except ScheduleError:  # not below this tile: stays at the root
            left.append(name)
    sch.reverse_compute_at(out, loop)
    return [*moved, out], left


def _vectorize_epilogue(sch: s_tir.Schedule, blocks: list, lanes: int) -> None:
    for block in blocks:
        loops = sch.get_loops(block)[1:]  # below the parallel loop
        if loops:
            _vectorize_inner(sch, loops[-1], int(sch.get(loops[-1]).extent), lanes)


def _reads_weight(sch: s_tir.Schedule, block, read_index: int, weights: frozenset[int]) -> bool:
    """Whether ``block``'s ``read_index``-th read is a parameter the model passes as a
    constant (``CompileContext.weights``): one umahub packs at compile time."""
    if not weights:
        return False
    buf = _buf(sch.get(block).reads[read_index])
    params = param_buffers(sch.mod[sch.func_working_on])
    return any(b is not None and b.same_as(buf) for i, b in enumerate(params) if i in weights)


def _b_panels(p: Plan, nr: int):
    """B's layout for the micro-kernel: panels ``[.., j/nr][k][nr]`` (from [k, j] or [j, k])."""

    def panel(*ax):
        *b, r, c = ax
        j, k = (r, c) if p.b_transposed else (c, r)
        return (*b, j // nr, k, j % nr)

    return panel


def _pack_b(sch, red, p: Plan, k0, tk: int, tj: int, nr: int, lanes: int):
    """Copy the B tile of a (i, j, k0) step into panels ``[tj/nr][tk][nr]``.

    The micro-kernel then reads B as one contiguous stream (64 B per k for
    nr=16) instead of ``tk`` rows ``N*4`` bytes apart, which for N a multiple
    of 1024 all fall into the same L1 set.  A transposed B (``[j, k]``) gets
    its transpose here too.  Cost: tk*tj copies per ti*tk*tj FMAs (1/ti).
    """
    bp = sch.cache_read(red, p.b_buffer_index, "global")
    sch.compute_at(bp, k0, preserve_unit_loops=True)
    *_, l_outer, l_inner = sch.get_loops(bp)
    # loop order of the copy: j panel, k, j within panel (contiguous writes)
    if p.b_transposed:  # cache block iterates (j, k)
        jl, kl = l_outer, l_inner
    else:  # (k, j)
        kl, jl = l_outer, l_inner
    jo, ji = sch.split(jl, [None, nr])
    sch.reorder(jo, kl, ji)
    sch.vectorize(ji)
    sch.transform_layout(bp, ("write", 0), _b_panels(p, nr))


def _padding(M: int, N: int, lanes: int) -> tuple[int, int]:
    """The multiples to pad M and N to, 1 for none: sizes nothing small divides.

    Tiles divide their axis (a predicated tile does not vectorise), so a size
    like 197 (ViT's tokens, a prime) would get 1-row and 1-column tiles and
    run scalar code, and 196 columns a tile of 28, not a whole
    number of vectors. Padded to a multiple of the register tile, it runs
    the same micro-kernel as 200 or 224, for a few extra rows and columns.
    """
    pad_m = 4 if M > 4 and _pick_mr(M) == 1 else 1
    wide = 2 * lanes if N > 2 * lanes else lanes
    pad_n = wide if N > lanes and _pick_nr(N, lanes) % lanes else 1
    return pad_m, pad_n


def _pad_to_tiles(
    sch: s_tir.Schedule, red, n_batch: int, pad_m: int, pad_n: int, lanes: int, pack=None
) -> bool:
    """``pad_einsum`` the reduction: zero-padded copies of its inputs (separate parallel
    stages) and of its accumulator, which the output block then reads directly.

    ``pack``: (buffer, layout) of a constant B: its padded copy is stored in
    ``layout`` and marked for packing at compile time. Returns whether it was.
    """
    before = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))}
    sch.pad_einsum(red, [1] * n_batch + [pad_m, pad_n, 1])
    packed = False
    for blk in sch.get_child_blocks(sch.get_sblock("root")):
        if sch.get(blk).name_hint in before:
            continue
        if not any(sch.get(c).same_as(sch.get(red)) for c in sch.get_consumers(blk)):
            sch.compute_inline(blk)  # the accumulator's copy back: read in place
        elif pack is not None and any(_buf(r).same_as(pack[0]) for r in sch.get(blk).reads):
            sch.transform_layout(blk, ("write", 0), pack[1])  # B, padded: in panels, once
            sch.annotate(blk, ANNOTATION, True)
            packed = True
        else:
            _parallel_spatial(sch, blk, lanes)  # an input, padded
    return packed


def _schedule_matmul(
    sch: s_tir.Schedule, p: Plan, sram: int, threads: int, lanes: int, weights: frozenset[int]
):
    _inline_prologue(sch, p, lanes)  # e.g. a transpose feeding the matmul
    red, out, rest = _accumulator_and_epilogue(sch, p)
    e = p.extents
    batch = math.prod(e["batch"]) if e["batch"] else 1
    M, N, K = e["M"], e["N"], e["K"]
    symbolic = not isinstance(M, int)
    if symbolic:  # rows known only at run time: tiles chosen for the bound, rows looped
        M = _rows_for_tiles(M)
    pad_m, pad_n = _padding(M, N, lanes)
    if symbolic:
        pad_m = 1  # the last row tile is predicated instead
    padded_m, padded_n = _round_up(M, pad_m), _round_up(N, pad_n)
    b_is_weight = p.b_buffer_index >= 0 and _reads_weight(sch, red, p.b_buffer_index, weights)
    runtime_b = p.b_buffer_index >= 0 and not b_is_weight
    ti, tj, tk, mr, nr = matmul_tiles(
        batch, padded_m, padded_n, K, lanes, sram, threads, packs_b=runtime_b
    )
    # a constant B is packed at compile time, unless its panels are its own layout
    # (one panel, not transposed: nothing to gain, and a copy of the weight)
    one_panel = padded_n <= nr and pad_n == 1 and not p.b_transposed
    constant_b = b_is_weight and not one_panel
    b_buffer = _buf(sch.get(red).reads[p.b_buffer_index]) if constant_b else None
    packed = False
    if pad_m > 1 or pad_n > 1:
        pack = (b_buffer, _b_panels(p, nr)) if constant_b else None
        packed = _pad_to_tiles(sch, red, len(e["batch"]), pad_m, pad_n, lanes, pack)
        M, N = padded_m, padded_n
    if constant_b and not packed:  # a constant B: packed into panels once, at compile time
        pack_weight(sch, red, p.b_buffer_index, _b_panels(p, nr))
        packed = True
    loops = sch.get_loops(red)
    *bl, i, j, k = loops
    i0, i1, i2 = sch.split(i, [None, ti // mr, mr])
    j0, j1, j2 = sch.split(j, [None, tj // nr, nr])
    k0, k1 = sch.split(k, [None, tk])
    # column tile outside row tile: B's column block is read from memory once per
    # call, not once per row tile (the module's docs)
    sch.reorder(*bl, j0, i0, k0, i1, j1, k1, i2, j2)
    if p.b_buffer_index >= 0 and not packed:  # B computed at run time: packed per tile
        _pack_b(sch, red, p, k0, tk, tj, nr, lanes)
    tiled, rest = _epilogue_at(sch, i0, out, rest)
    outer = sch.fuse(*bl, j0, i0)
    sch.parallel(outer)
    sch.unroll(i2)
    sch.vectorize(j2)
    _unroll_steps(sch, k1, tk)
    # last: after decompose_reduction the update block is no longer a
    # "reduction block" and parallel/vectorize over it are refused
    sch.decompose_reduction(red, k0)
    _finish_epilogue(sch, tiled, rest, lanes)
    return "matmul"


#: Reduction steps of the matmul micro-kernel unrolled together. One step is a
#: few loads and 8 x 2 vector FMAs; unrolled, the next steps' loads are issued
#: beside this one's FMAs and the loop's own instructions are paid once per
#: four. Measured in one process against the step loop (the Intel Xeon, AVX-512):
#: bert2's matmuls 7.5% faster; its outputs bit for bit the same (each
#: accumulator sums in the same order).
STEPS_UNROLLED = 4


def _unroll_steps(sch: s_tir.Schedule, loop, steps: int) -> None:
    """Unroll the micro-kernel's reduction ``loop`` of ``steps`` by :data:`STEPS_UNROLLED`
    where that divides it."""
    if steps > STEPS_UNROLLED and steps % STEPS_UNROLLED == 0:
        _, inner = sch.split(loop, [None, STEPS_UNROLLED])
        sch.unroll(inner)


def _inline_prologue(sch: s_tir.Schedule, p: Plan, lanes: int) -> None:
    """The blocks before the reduction inlined into it, or (refused) in parallel."""
    for name in p.prologue:
        try:
            sch.compute_inline(sch.get_sblock(name))
        except ScheduleError:  # the primitive refused; take the fallback
            _parallel_spatial(sch, sch.get_sblock(name), lanes)


def _finish_epilogue(sch: s_tir.Schedule, tiled: list, rest: list, lanes: int) -> None:
    """The epilogue computed under the tile vectorized; the blocks that could not be
    inlined in parallel."""
    _vectorize_epilogue(sch, tiled, lanes)
    for name in rest:
        _parallel_spatial(sch, sch.get_sblock(name), lanes)


#: Rows a symbolic M is tiled for when nothing bounds it (its tiles are looped over
#: whatever the rows are at run time: the bound only sizes the row tile).
UNBOUNDED_ROWS = 32


def _rows_for_tiles(rows) -> int:
    """The row count to choose tiles for, for rows known only at run time: their upper
    bound (``tir_var_upper_bound``: a prompt is at most the model's context) rounded
    up to 8 rows (whole micro-kernels), at most :data:`UNBOUNDED_ROWS` rows' worth when
    none is known. The rows are looped over, so any count at run time is computed."""
    bound = upper_bound(rows)
    return _round_up(bound, 8) if bound is not None else UNBOUNDED_ROWS


def _schedule_gemv(
    sch: s_tir.Schedule, p: Plan, sram: int, threads: int, lanes: int, weights: frozenset[int]
):
    """A matrix-vector product (one row: a decode step's projections).

    Each element of B is used once, so the schedule is about streaming B: its
    columns in vector-wide panels (``[j/nr][k][nr]``, packed at compile time when
    B is a weight, as the matmul's), the panels of a task one after the other
    with the whole K reduction inner, so that a panel's ``nr`` accumulators stay
    in registers while its ``K x nr`` block streams by; tasks (blocks of panels)
    in parallel. A B computed at run time and stored transposed (``[j, k]``),
    and columns no vector width divides, go to the matmul's schedule, which
    packs per tile and pads.
    """
    _inline_prologue(sch, p, lanes)
    red = sch.get_sblock(p.reduction)
    constant_b = p.b_buffer_index >= 0 and _reads_weight(sch, red, p.b_buffer_index, weights)
    if (p.b_transposed and not constant_b) or _padding(1, p.extents["N"], lanes)[1] > 1:
        # a B to pack per tile, or columns no vector width divides (1000 classes):
        # the matmul's schedule, which packs per tile and pads to whole vectors
        return _schedule_matmul(sch, p, sram, threads, lanes, weights)
    red, out, rest = _accumulator_and_epilogue(sch, p)
    N = p.extents["N"]
    nr = _pick_nr(N, lanes)
    panels = N // nr
    # tasks: blocks of whole panels, at least 2 per thread where there are enough
    per_task = max((d for d in _divisors(panels) if panels // d >= 2 * threads), default=1)
    if constant_b and N > nr:
        pack_weight(sch, red, p.b_buffer_index, _b_panels(p, nr))
    *bl, i, j, k = sch.get_loops(red)
    j0, j1, j2 = sch.split(j, [None, per_task, nr])
    sch.reorder(*bl, i, j0, j1, k, j2)
    tiled, rest = _epilogue_at(sch, j0, out, rest)
    outer = sch.fuse(*bl, i, j0)
    sch.parallel(outer)
    sch.vectorize(j2)
    sch.decompose_reduction(red, k)
    _finish_epilogue(sch, tiled, rest, lanes)
    return "gemv"


def _prologue(
    sch: s_tir.Schedule, p: Plan, lanes: int, weights: frozenset[int], gates: bool = False
):
    """A convolution's prologue scheduled; returns which of the reduction's reads is
    then its filter, and the block that zero-pads a constant filter
    (:func:`_filter_padding`, left for the packing) or None.

    A block that only copies the input (an unpadded convolution's "padding"), and
    with ``gates`` one that gates it, is read in place
    (:func:`umahub.plugin.read_in_place`); the others (a zero padding) are a
    parallel, vectorized stage each. The pointwise strategy reads each input once
    per tile and gains by gates read in place; the implicit GEMM broadcasts each
    input once per vector of channels, and measured slower with them
    (efficientnet_b0 1.1x, AMD EPYC).

    The filter is found again after the prologue: a block read in place puts its
    own reads in the reduction's (a gate's scale, ``[1, C, 1, 1]``, before the
    filter), and a stale index packed the scale as the filter.
    """
    red = sch.get_sblock(p.reduction)
    w_index = _weight_index(sch, p)
    filt = _buf(sch.get(red).reads[w_index])
    padding = _filter_padding(sch, red, w_index, weights)
    for name in p.prologue:
        block = sch.get_sblock(name)
        if padding is not None and sch.get(block).same_as(sch.get(padding)):
            continue
        if not read_in_place(sch, block, gates):
            _parallel_spatial(sch, block, lanes)
    reads = sch.get(sch.get_sblock(p.reduction)).reads
    return next(i for i, r in enumerate(reads) if _buf(r).same_as(filt)), padding


def _filter_padding(sch: s_tir.Schedule, red, w_index: int, weights: frozenset[int]):
    """The block that zero-pads a constant filter's output channels
    (``umahub_npu.lowering``), when it writes ``red``'s ``w_index``-th read; else None."""
    read = _buf(sch.get(red).reads[w_index])
    for producer in sch.get_producers(red):
        node = sch.get(producer)
        if (
            _buf(node.writes[0]).same_as(read)
            and len(node.reads) == 1
            and _reads_weight(sch, producer, 0, weights)
        ):
            return producer
    return None


def _weight_index(sch: s_tir.Schedule, p: Plan) -> int:
    """Which of the convolution's reads is its filter."""
    red = sch.get(sch.get_sblock(p.reduction))
    return next(
        i
        for i, r in enumerate(red.reads)
        if len(r.region) == 4
        and not _buf(r).same_as(_buf(red.writes[0]))
        and str(_buf(r).name) != str(_data_buffer_name(sch, p))
    )


def _schedule_conv2d(
    sch: s_tir.Schedule, p: Plan, sram: int, threads: int, lanes: int, weights: frozenset[int]
):
    """Implicit GEMM: positions x channels micro-kernel, weights packed as
    ``[f/nr][c][kh][kw][nr]``: at compile time when they are constants, else per tile.
    A 1x1 convolution whose positions fill whole vectors: :func:`_schedule_pointwise`."""
    if p.pointwise and (p.extents["OH"] * p.extents["OW"]) % lanes == 0:
        return _schedule_pointwise(sch, p, sram, threads, lanes, weights)
    w_index, padding = _prologue(sch, p, lanes, weights)
    red, out, rest = _accumulator_and_epilogue(sch, p)
    tf, tp, tc, nr, mr = conv_tiles(p, lanes, sram, threads)
    # accumulator layout [n, y, x, f]: the channel vector of a position is contiguous
    sch.transform_layout(red, ("write", 0), lambda n, f, y, x: (n, y, x, f))
    packed = padding is not None or _reads_weight(sch, red, w_index, weights)
    if packed:
        pack_weight(sch, red, w_index, lambda f, c, kh, kw: (f // nr, c, kh, kw, f % nr))
        if padding is not None:  # the packing reads the constant itself: done at compile time
            sch.compute_inline(padding)
    n, f, y, x, rc, ry, rx = sch.get_loops(red)
    pos = sch.fuse(y, x)
    f0, f1, f2 = sch.split(f, [None, tf // nr, nr])
    p0, p1, p2 = sch.split(pos, [None, tp // mr, mr])
    micro = (p2, f2)
    if packed and tc == int(sch.get(rc).extent):
        # one reduction step: the epilogue per nr channels, as in _schedule_pointwise
        sch.reorder(n, f0, p0, f1, p1, rc, ry, rx, p2, f2)
        _finish_tiles(sch, red, (out, rest), (n, f0, p0), rc, micro, lanes, epilogue_at=f1)
        return "conv2d"
    rc0, rc1 = sch.split(rc, [None, tc])
    sch.reorder(n, f0, p0, rc0, f1, p1, rc1, ry, rx, p2, f2)
    if not packed:  # weights of the (f-tile, c-step) packed as [f/nr][c][kh][kw][nr]
        wp = sch.cache_read(red, w_index, "global")
        sch.compute_at(wp, rc0, preserve_unit_loops=True)
        wl = sch.get_loops(wp)[-4:]  # f, c, kh, kw of the tile
        wf0, wf1 = sch.split(wl[0], [None, nr])
        sch.reorder(wf0, wl[1], wl[2], wl[3], wf1)
        sch.vectorize(wf1)
        sch.transform_layout(wp, ("write", 0), lambda f, c, kh, kw: (f // nr, c, kh, kw, f % nr))
    _finish_tiles(sch, red, (out, rest), (n, f0, p0), rc0, micro, lanes)
    return "conv2d"


def _finish_tiles(
    sch: s_tir.Schedule, red, epilogue, tasks, rc0, micro, lanes: int, epilogue_at=None
) -> None:
    """What a convolution's tiling ends with: the epilogue (``(out, rest)`` of
    :func:`_accumulator_and_epilogue`) per task (or per iteration of the loop
    ``epilogue_at``, below the tasks), the ``tasks`` loops fused in parallel, the
    ``micro``-kernel's (unrolled, vectorized) loops, and the accumulator initialised
    before the reduction step ``rc0``."""
    out, rest = epilogue
    tiled, rest = _epilogue_at(sch, tasks[-1] if epilogue_at is None else epilogue_at, out, rest)
    sch.parallel(sch.fuse(*tasks))
    sch.unroll(micro[0])
    sch.vectorize(micro[1])
    sch.decompose_reduction(red, rc0)
    _finish_epilogue(sch, tiled, rest, lanes)


def _schedule_pointwise(
    sch: s_tir.Schedule, p: Plan, sram: int, threads: int, lanes: int, weights: frozenset[int]
):
    """A 1x1 stride-1 convolution as the matmul ``W[f, c] x X[c, p]``: positions in the
    vectors, weights broadcast from filters packed ``[f/mr][c][mr]``, the
    accumulator in the output's own layout (see the module docstring)."""
    w_index, padding = _prologue(sch, p, lanes, weights, gates=True)
    red, out, rest = _accumulator_and_epilogue(sch, p)
    tf, tp, tc, mr, nr = pointwise_tiles(p, lanes, sram, threads)
    if padding is not None or _reads_weight(sch, red, w_index, weights):
        pack_weight(sch, red, w_index, lambda f, c, kh, kw: (f // mr, c, kh, kw, f % mr))
        if padding is not None:
            sch.compute_inline(padding)
    n, f, y, x, rc, ry, rx = sch.get_loops(red)
    pos = sch.fuse(y, x)
    f0, f1, f2 = sch.split(f, [None, tf // mr, mr])
    p0, p1, p2 = sch.split(pos, [None, tp // nr, nr])
    micro = (f2, p2)
    copy_input = input_pages(tc, p.extents["OH"] * p.extents["OW"]) > TLB_PAGES
    if tc == int(sch.get(rc).extent):
        # one reduction step: each mr channels of the tile are final after their
        # micro-kernels, and their epilogue reads them while they are in L1, not the
        # whole tile's back from L2 (a few input channels make as few products per
        # accumulator as the epilogue has loads)
        sch.reorder(n, f0, p0, f1, p1, rc, ry, rx, f2, p2)
        if copy_input:
            _copy_input_tile(sch, red, w_index, p0, lanes)
        _finish_tiles(sch, red, (out, rest), (n, f0, p0), rc, micro, lanes, epilogue_at=f1)
        return "pointwise"
    rc0, rc1 = sch.split(rc, [None, tc])
    sch.reorder(n, f0, p0, rc0, f1, p1, rc1, ry, rx, f2, p2)
    if copy_input:
        _copy_input_tile(sch, red, w_index, rc0, lanes)
    _finish_tiles(sch, red, (out, rest), (n, f0, p0), rc0, micro, lanes)
    return "pointwise"


#: 4-KiB pages that the first-level data TLB of the x86 cores this runs on holds
#: at least (Intel's Golden Cove 96 for loads, AMD's Zen 4 72). A micro-kernel
#: whose reduction reads input rows on more pages than this misses it on most
#: loads: see :func:`input_pages`.
TLB_PAGES = 64


def input_pages(channels: int, positions: int, page: int = 4096) -> int:
    """4-KiB pages a pointwise micro-kernel reads its input from over ``channels``
    steps of its reduction: the input's channels are ``positions`` floats apart
    (NCHW), each on a page of its own once they are a page or more apart."""
    row = positions * _DTYPE_BYTES
    return channels if row >= page else -(-channels * row // page)


def _copy_input_tile(sch: s_tir.Schedule, red, w_index: int, at, lanes: int) -> None:
    """The input rows of the pointwise reduction ``red`` that one iteration of the
    loop ``at`` reads, copied into a buffer of their own (compacted to the tile:
    ``tc`` rows of ``tp`` positions, contiguous) before the loop's micro-kernels.

    The micro-kernels then read one buffer a few pages long, its rows at most
    2 KiB apart, not ``tc`` planes of the input a whole plane apart: 512 -> 128
    channels on 28x28 read 196 pages per micro-kernel (0.58 of the time with the
    copy, Intel Xeon); below :data:`TLB_PAGES` the copy measured no gain or a loss
    (256 -> 64 on 56x56, 64 pages: 1.0-1.2)."""
    block = sch.get(red)
    reads, others = block.reads, (_buf(block.reads[w_index]), _buf(block.writes[0]))
    # the input is the largest read but the filter and the accumulator: a gate read in
    # place (a scale per channel, [1, C, 1, 1]) is the other one
    index = max(
        (i for i, r in enumerate(reads) if not any(_buf(r).same_as(b) for b in others)),
        key=lambda i: math.prod(int(d) for d in _buf(reads[i]).shape),
    )
    tile = sch.cache_read(red, index, "global")
    sch.compute_at(tile, at, preserve_unit_loops=True)
    *_, y, x = sch.get_loops(tile)
    row = sch.fuse(y, x)
    extent = sch.get(row).extent
    if isinstance(extent, tirx.IntImm):  # a tile's rows: a constant count, whole rows
        _vectorize_inner(sch, row, int(extent), lanes)


def _data_buffer_name(sch: s_tir.Schedule, p: Plan) -> str:
    """Name of the buffer the conv reads its (padded) input from."""
    blk = sch.get(sch.get_sblock(p.reduction))
    ops = _mul_operands(blk.body.value)
    _, x, y = ops
    # the weight is indexed by (.., rc, ry, rx) directly; the data by y + ry, x + rx
    for cand in (x, y):
        if not all(isinstance(e, tirx.Var) for e in cand.indices):
            return str(_buf(cand).name)
    return ""


def _deinterleave_padded(sch: s_tir.Schedule, pads: list[str], stride: int) -> list[str]:
    """Store the padded input of a strided depthwise convolution column phase by
    column phase, ``[n, c, y, x % s, x // s]``: output column x then reads input
    ``x*s + rx`` at phase ``rx % s``, position ``x + rx // s``, consecutive for
    consecutive x, so the row loads as vectors instead of element by element.
    Returns the blocks so stored (a refused one keeps its layout)."""
    done = []
    for name in pads:
        block = sch.get_sblock(name)
        width = int(_buf(sch.get(block).writes[0]).shape[3])
        try:
            sch.transform_layout(
                block,
                ("write", 0),
                lambda n, c, y, x: (n, c, y, x % stride, x // stride),
                pad_value=0.0 if width % stride else None,
            )
        except ScheduleError:
            continue
        done.append(name)
    return done


def _schedule_plane(sch: s_tir.Schedule, p: Plan, lanes: int) -> str:
    """A depthwise convolution on its plane read as one row (see ``lowering``):
    a channel per task, its plane padded while it is in cache, the positions in
    tiles of up to 8 vectors accumulated in registers over the unrolled taps,
    the epilogue (which drops each row's extra positions) per channel."""
    (pad,) = p.prologue
    red, out, rest = _accumulator_and_epilogue(sch, p)
    n, c, y, x, ry, rx = sch.get_loops(red)
    vectors = p.extents["rows"] * p.extents["width"] // lanes
    tile = max(d for d in _divisors(vectors) if d <= 8)
    p0, p1, p2 = sch.split(sch.fuse(y, x), [None, tile, lanes])
    sch.reorder(p0, ry, rx, p1, p2)
    outer = sch.fuse(n, c)
    sch.parallel(outer)
    tiled, rest = _epilogue_at(sch, outer, out, rest)
    _pad_at(sch, sch.get_sblock(pad), outer, lanes, 1)
    _finish_taps(sch, red, (ry, rx), (p1, p2), ry, (tiled, rest), lanes)
    return "depthwise"


def _schedule_depthwise(
    sch: s_tir.Schedule, p: Plan, sram: int, threads: int, lanes: int, weights: frozenset[int]
):
    if p.plane:
        return _schedule_plane(sch, p, lanes)
    pads = _padding_blocks(sch, p)
    phased = _deinterleave_padded(sch, pads, p.stride) if p.stride > 1 else []
    for name in p.prologue:
        if name not in pads:
            _parallel_spatial(sch, sch.get_sblock(name), lanes)
    red, out, rest = _accumulator_and_epilogue(sch, p)
    e = p.extents
    OH, OW = e["OH"], e["OW"]
    xr = (
        OW
        if OW <= 2 * lanes
        else max(
            [d for d in _divisors(OW) if d <= 2 * lanes and d % lanes == 0]
            or [d for d in _divisors(OW) if d <= 2 * lanes]
        )
    )
    yr = next(d for d in (4, 2, 1) if OH % d == 0 and d * math.ceil(xr / lanes) <= 8)
    # rows per task: the tile (input rows + output rows of one channel) is tiny
    ty = max(d for d in _divisors(OH) if d % yr == 0 and d * OW <= max(OW * yr, 1024))
    n, f, y, x, rc, ry, rx = sch.get_loops(red)
    y0, y1, y2 = sch.split(y, [None, ty // yr, yr])
    x0, x1 = sch.split(x, [None, xr])
    sch.reorder(n, f, y0, y1, x0, rc, ry, rx, y2, x1)
    tiled, rest = _epilogue_at(sch, y0, out, rest)
    outer = sch.fuse(n, f, y0)
    sch.parallel(outer)
    for name in pads:  # the rows a task reads, padded while they are in cache
        _pad_at(sch, sch.get_sblock(name), outer, lanes, p.stride if name in phased else 1)
    # the accumulators initialised per micro-tile, in registers, where they and the
    # taps' weights fit the vector registers (3x3 on AVX-512: 0.84-0.96 of the time
    # of initialising the task's rows in memory first; 5x5: 1.04, Intel Xeon)
    taps = int(sch.get(ry).extent) * int(sch.get(rx).extent)
    in_registers = taps + yr * math.ceil(xr / lanes) + 2 <= (32 if lanes >= 16 else 16)
    _finish_taps(sch, red, (ry, rx), (y2, x1), rc if in_registers else y1, (tiled, rest), lanes)
    return "depthwise"


def _finish_taps(sch: s_tir.Schedule, red, taps, micro, init, epilogue, lanes: int) -> None:
    """What a depthwise tiling ends with: the filter's ``taps`` (ry, rx) and the
    ``micro`` tile's outer loop unrolled, its inner loop vectorized, the
    accumulator initialised before the loop ``init``, then the epilogue
    (``(tiled, rest)`` of :func:`_epilogue_at`)."""
    for loop in (*taps, micro[0]):
        sch.unroll(loop)
    sch.vectorize(micro[1])
    sch.decompose_reduction(red, init)
    _finish_epilogue(sch, *epilogue, lanes)


def _padding_blocks(sch: s_tir.Schedule, p: Plan) -> list[str]:
    """The prologue blocks that write the (padded) input the reduction reads."""
    read = {str(_buf(r).name) for r in sch.get(sch.get_sblock(p.reduction)).reads}
    found = []
    for name in p.prologue:
        (write,) = sch.get(sch.get_sblock(name)).writes
        if len(write.region) == 4 and str(_buf(write).name) in read:
            found.append(name)
    return found


def _pad_at(sch: s_tir.Schedule, block, loop, lanes: int, stride: int) -> None:
    """Compute the padding ``block`` under ``loop`` (only the region one iteration
    reads), its innermost loop vectorized; at the root if that is refused.
    ``stride`` > 1: the block stores its rows phase by phase (see
    :func:`_deinterleave_padded`); a long row is walked in the input's order,
    a short one phase by phase."""
    try:
        sch.compute_at(block, loop, preserve_unit_loops=True)
    except ScheduleError:
        _parallel_spatial(sch, block, lanes)
        return
    inner = sch.get_loops(block)[-1]
    if stride > 1:
        pos, phase = sch.split(inner, [None, stride])
        if 2 * int(sch.get(pos).extent) > lanes:
            # the input row read once, in order, each element written to its
            # phase: LLVM vectorizes this loop as wide loads and shuffles. A
            # vector per phase (below) loads every ``stride``-th element one by
            # one: slower, except on rows of a vector or less
            sch.unroll(phase)
            return
        sch.reorder(phase, pos)  # phase by phase: contiguous writes
        inner = pos
    extent = int(sch.get(inner).extent)
    if extent > lanes and extent % lanes:
        # a padded row is a vector's multiple plus a few (58, 114): TVM's vectors
        # would be of a divisor's width (29, 19), which LLVM splits into pieces;
        # its own vectorizer copies the row in whole vectors and a remainder
        return
    _vectorize_inner(sch, inner, extent, lanes)


def _schedule_sum(
    sch: s_tir.Schedule, p: Plan, sram: int, threads: int, lanes: int, weights: frozenset[int]
):
    """A sum over trailing axes: rows in parallel, each summed in ``lanes`` partial
    sums over contiguous vectors (``rfactor``), which are added up after; the
    epilogue (a mean's division) at the root. An elementwise prologue (a
    dequantize, in QDQ form) is computed as the sum reads it, not in a pass of
    its own over the tensor."""
    _inline_chain(sch, p.prologue, keep_last=False)
    red = sch.get_sblock(p.reduction)
    n_reduce = sum(1 for iv in sch.get(red).iter_vars if iv.iter_type == tirx.IterVar.CommReduce)
    loops = sch.get_loops(red)
    spatial, reduce_ = loops[:-n_reduce], loops[-n_reduce:]
    rows = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    r = sch.fuse(*reduce_) if len(reduce_) > 1 else reduce_[0]
    R = p.extents["R"]
    width = next((w for w in (lanes, lanes // 2, 4) if w >= 4 and R % w == 0 and R >= 2 * w), 0)
    parallel = p.extents["rows"] >= 2 and p.extents["rows"] * R >= PARALLEL_MIN
    if width:
        _, inner = sch.split(r, [None, width])
        partial = sch.rfactor(inner, factor_axis=0)
        sch.vectorize(sch.get_loops(partial)[-1])
        if parallel:  # the partial sums are the sum's work: its rows in parallel too
            sch.parallel(sch.get_loops(partial)[0])
    if parallel:
        sch.parallel(rows)
    for name in p.epilogue:
        block = sch.get_sblock(name)
        if len(sch.get_loops(block)) > 1:
            sch.fuse(*sch.get_loops(block))
    return "sum"


def _schedule_elementwise(
    sch: s_tir.Schedule, p: Plan, sram: int, threads: int, lanes: int, weights: frozenset[int]
):
    """Spatial blocks only (a concatenation): as umahub schedules the host's."""
    if not schedule_elementwise(sch):
        raise ValueError("not a function of spatial blocks")
    return "elementwise"


def _schedule_pooling(
    sch: s_tir.Schedule, p: Plan, sram: int, threads: int, lanes: int, weights: frozenset[int]
):
    """A max pooling as two 1-D ones: as umahub schedules the host's."""
    if not schedule_pooling(sch):
        raise ValueError("not a max pooling computed as two 1-D ones")
    return "pooling"


_STRATEGIES = {
    "matmul": _schedule_matmul,
    "gemv": _schedule_gemv,
    "conv2d": _schedule_conv2d,
    "depthwise": _schedule_depthwise,
    "sum": _schedule_sum,
    "elementwise": _schedule_elementwise,
    "pooling": _schedule_pooling,
}


def schedule(
    sch: s_tir.Schedule,
    sram_bytes: int = 256 * 1024,
    threads: int | None = None,
    lanes: int | None = None,
    weights: frozenset[int] = frozenset(),
) -> str:
    """Schedule the (single) PrimFunc of ``sch`` for the npu; return the strategy name.

    ``lanes``: float32 lanes of the target's vector registers (a cross build);
    None: this host's (:func:`vector_lanes`). ``weights``: the parameters the
    model passes as constants (``CompileContext.weights``): their packing is
    left to umahub, to do once at compile time (:func:`umahub.plugin.pack_weight`).

    Returns ``"matmul"``, ``"gemv"``, ``"conv2d"``, ``"pointwise"``, ``"depthwise"``, ``"sum"``,
    ``"elementwise"``, ``"pooling"``, or ``"none"`` when the function is not recognised
    or a primitive refuses (``sch`` is then left untouched).  Never raises.
    """
    threads = threads or _default_threads()
    lanes = lanes or vector_lanes()
    try:
        p = plan(sch)
    except Exception as err:  # pylint: disable=broad-except
        log.debug("npu schedule: analysis failed: %s", err)
        return "none"
    if p is None:
        return "none"
    strategy = _STRATEGIES[p.kind]
    # dry run on a copy: a primitive that refuses half way must not leave a
    # half-scheduled function behind
    try:
        strategy(sch.copy(), p, sram_bytes, threads, lanes, weights)
    except Exception as err:  # pylint: disable=broad-except
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        log.warning("npu schedule: %s strategy refused for %s: %s", p.kind, p.func_name, first)
        return "none"
    return strategy(sch, p, sram_bytes, threads, lanes, weights)
