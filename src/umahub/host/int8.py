"""Schedules of the quantized kernels in their packed form: a byte dot product per vector.

:func:`umahub.host.quantized.quantized_kernel` computes an ungrouped 8-bit
convolution or a matmul by a weight as ``dot = sum(x' * w)`` over groups of
four bytes, with the input copied to ``[N, C/4, H, W, 4]`` and the weight
packed ``[O/16, C/4, KH, KW, 16, 4]`` (``[N/16, K/4, 16, 4]``). One step of
that sum, 16 output channels by 4 bytes, is exactly x86's ``vpdpbusd``
(AVX-512 VNNI): 64 multiply-adds of an unsigned byte by a signed byte into 16
int32 lanes, without the int16 saturation of ``vpmaddubsw``.
:func:`schedule_int8` tiles ``dot``:

* a register tile of ``xi`` output positions (a divisor of the output row,
  at most 16) by ``bi`` blocks of 16 channels (``xi * bi <= 24`` accumulators
  of the 32 vector registers);
* the tiles (batch, channel blocks, rows, row blocks) fused into one
  parallel loop;
* the reduction (4-byte groups, kernel rows and columns) outside the
  register tile, so each weight vector is loaded once for ``xi`` positions;
* the 16x4 step tensorized with TVM's ``dot_16x4_vnni`` where the target
  has AVX-512 VNNI (:func:`has_vnni`); elsewhere the same loops with the 16
  channels as one int32 vector, which LLVM builds from exact widening
  multiplies (never the saturating ``vpmaddubsw``);
* a matmul whose rows are a multiple of 16 and whose reduction is of whole
  64-byte steps, where the target has AMX and Linux lets the process use it
  (:func:`umahub.host.amx.has_amx`): tasks of up to 32 rows by 32 channels,
  each task's whole sum on AMX's tiles (:mod:`umahub.host.amx`), the same
  integers (a 1x1 convolution too: below); likewise a convolution whose input
  channels are whole 64-byte steps and output channels whole blocks of 16
  (:func:`_conv_on_tiles`): its input copied channels last (``[N, H, W, C/4,
  4]``, a position's 64 bytes a tile row), tasks of one or two output rows by
  up to 16 positions by 32 channels, every tap of the window a step on the
  tiles (on an Intel Xeon, resnet50's 3x3 convolutions 1.4-2.3x the VNNI
  kernel's speed);
* the requantization (``requantized``, which reads ``dot``) computed per
  tile, while the tile is in cache, as vectors of 16 channels (the
  accumulator's own vectors); the input's copy (by rows, the four bytes of a
  group unrolled) and the per-position sums (``window_sum``) are parallel
  stages of their own; the per-channel stages (multiplier, bias, weight sums,
  their term times the multiplier) stay at the root, where the compiler
  computes them once, at compile time, from a partition's constants
  (:mod:`umahub.host.constant_stages`).

A 1x1 convolution without padding (``dot_positions``, :func:`umahub.host.quantized.pointwise`)
turns the tile around: positions in the lanes. One ``vpdpbusd`` takes sixteen
positions' four input bytes (64 contiguous bytes of the copy ``[N, C/4, P, 4]``)
by one channel's four weight bytes, broadcast; a register tile is up to 24
channels by one or two vectors of positions, and the requantization works on
positions, whose bytes are contiguous in an NCHW output (with channels in the
lanes each byte is stored a plane apart: for a short sum, most of the time).
The positions are rounded up to vectors; the output's copy is a stage of its
own only where they were (inlined, the last vector would be predicated).
On AMX (whole blocks of 16 output channels, input channels in whole 64-byte
steps), a task is up to 32 channels by 32 positions on the tiles: the weight's
rows (``[O, C/4, 4]``, as the packing writes them: :func:`_weight_rows`)
by the copy's blocks of 16 positions, ``tdpbsud`` (signed by unsigned bytes).

A depthwise convolution of stride 1 is computed over its padded input plane
read as one flat row (``acc_flat``, :func:`umahub.host.quantized.flat_depthwise`):
whole vectors of positions however narrow the rows, each tap an offset. A tile
is whole rows of that plane and whole 512-bit vectors (the rows rounded up:
:func:`umahub.host.quantized.flat_plane`), and its output rows (the positions
computed past the output's dropped) are written under it, while they are in
cache: not in a pass of their own over the whole output.
A depthwise convolution whose columns step by 2 (the strided ones of the
mobile models) sums its taps in pairs (``acc_pairs``,
:func:`umahub.host.quantized.paired_depthwise`): output column ``x`` reads
padded columns ``2x + kx``, so a kernel row's taps ``2j`` and ``2j + 1`` are
two consecutive bytes for each output, 32 consecutive bytes for 16 outputs,
and one ``vpdpwssd`` multiplies them, widened to 16 bits, by the pair of
weights and adds both products to 16 int32 sums (a block marked for
:func:`vnni_dot_pass`). The plane is copied as bytes, padded with the input's
zero point; a row at a time, its sums in registers. On an Intel Xeon 1.7-3.8x
the plain form's speed (MobileNetV2's 96 channels from 112x112: 0.18 ->
0.10 ms; EfficientNet's 5x5 ones, 240 channels from 28x28: 0.10 -> 0.026).
Where the target has AVX-512 VBMI too and the weights are known symmetric
(int8, their zero points 0), a depthwise convolution whose columns step by 1
to 4 sums its taps four at a time (``acc_quads``,
:func:`umahub.host.quantized.quad_depthwise`): the four taps of 16
consecutive outputs lie in 64 bytes of a row, one ``vpermb`` gathers each
output's four into an int32 lane and one ``vpdpbusd`` multiplies them by the
four weights (:data:`QUADS_ANNOTATION`). On the Intel Xeon 1.07-1.1x the
pairs' speed for stride 2, 1.1-1.4x the flat form's for stride 1 (576
channels on 14x14: 0.043 -> 0.031 ms; 5x5 on 672 channels: 0.110 -> 0.054).
Otherwise, a depthwise convolution stays in the plain sum (``acc``; no byte dot product
fits one input channel per output channel): :func:`schedule_int8` computes
it a row of up to 64 positions at a time as int32 vectors, the kernel's taps
outside the vectors.

Why this module is long: the schedules of the three kernel classes share
their tiling helpers and the ``vpdpbusd`` (and ``vpdpwssd``) rewrite that the
conv2d, matmul and depthwise tiles rely on; split, the marker and its pass would live apart from the
schedule that places it.

A weight packed inside the kernel (a partition, whose weight is a
parameter) has its packing block annotated for packing at compile time
(:data:`umahub.plugin.PREPACK_ANNOTATION`) when the parameter is a constant.
"""

from __future__ import annotations

import math
from typing import Any

from tvm import s_tir, tirx

from umahub.host.amx import AMX_ANNOTATION, AMX_STRIDE, FROM_ZERO, has_amx
from umahub.plugin.compat import buffer_of

__all__ = [
    "PAIRS_ANNOTATION",
    "QUADS_ANNOTATION",
    "VNNI_ANNOTATION",
    "has_vnni",
    "int8_kernel",
    "schedule_int8",
    "vnni_dot_pass",
    "wide_depthwise",
]

#: The block annotation marking a 16x4 step for ``vpdpbusd`` (:func:`vnni_dot_pass`).
VNNI_ANNOTATION = "umahub.vpdpbusd"

#: The block annotation marking 16 positions by a pair of taps for ``vpdpwssd``
#: (:func:`vnni_dot_pass`, :func:`_tap_groups_depthwise`).
PAIRS_ANNOTATION = "umahub.vpdpwssd"

#: The block annotation marking 16 positions by four taps for ``vpermb`` and
#: ``vpdpbusd`` (:func:`vnni_dot_pass`, :func:`_tap_groups_depthwise`); its value is the
#: column step between the positions.
QUADS_ANNOTATION = "umahub.vpermb_vpdpbusd"

#: Accumulator vectors of a register tile (of AVX-512's 32 registers).
ACCUMULATORS = 24

_PREPACK = "meta_schedule.layout_rewrite_preproc"


def has_vnni(target: Any = None) -> bool:
    """Whether ``target`` (a ``tvm.target.Target``, a dict or a string; None: this
    machine's CPU, as umahub builds for it) has AVX-512 VNNI."""
    from umahub.targets import has_feature

    return has_feature("avx512vnni", target)


def int8_kernel(sch: s_tir.Schedule) -> str | None:
    """``"conv2d"`` or ``"matmul"`` when ``sch``'s function is a packed-form quantized
    kernel (its blocks ``dot`` and ``requantized``), ``"pointwise"`` for a 1x1
    convolution with positions in the lanes (``dot_positions``), ``"depthwise"`` for a depthwise
    convolution in the plain sum (``acc`` and ``requantized``), ``"flat depthwise"``
    and ``"paired depthwise"`` for its forms of stride 1 and of columns stepping by
    2 (``acc_flat``, ``acc_pairs``), else None."""
    names = _block_names(sch)
    if "requantized" not in names:
        return None
    if "dot_positions" in names:
        return "pointwise"
    if "acc_flat" in names:
        return "flat depthwise"
    if "acc_pairs" in names:
        return "paired depthwise"
    if "acc_quads" in names:
        return "quad depthwise"
    if "dot" not in names:
        return "depthwise" if "acc" in names and _is_depthwise(sch) else None
    dot = sch.get_sblock("dot")
    return "conv2d" if len(sch.get(dot).iter_vars) == 9 else "matmul"


def _is_depthwise(sch: s_tir.Schedule) -> bool:
    """Whether the plain sum ``acc`` is a depthwise convolution: one input channel
    per output channel (``acc``'s loops: batch, channel, row, column, and the
    reduction over one channel, kernel rows and columns)."""
    acc = sch.get_sblock("acc")
    loops = sch.get_loops(acc)
    return len(loops) == 7 and int(sch.get(loops[4]).extent) == 1


def wide_depthwise(sch: s_tir.Schedule) -> bool:
    """Whether ``sch``'s depthwise kernel (:func:`int8_kernel` says ``"depthwise"``)
    has stride-1 rows of at least 56 positions: where its schedule measured faster
    than the host's generic rules (strided rows measured slower; an accelerator
    without such rules takes them all). A stride-1 depthwise convolution of 8-bit
    integers takes the flat form instead (``"flat depthwise"``), on the host too:
    a 5x5 one over 672 channels of 14x14 took 14.5 ms in the generic rules, 0.46
    ms flat."""
    acc = sch.get_sblock("acc")
    loops = sch.get_loops(acc)
    width, kernel = int(sch.get(loops[3]).extent), int(sch.get(loops[6]).extent)
    padded = sch.get_loops(sch.get_sblock("pad_zero_point"))[-1]
    return width >= 56 and int(sch.get(padded).extent) == width + kernel - 1


def _func(sch: s_tir.Schedule) -> Any:
    """The one PrimFunc of ``sch`` (worked on from now on)."""
    from tvm import tirx

    gv = sch.func_working_on
    if gv is None:
        names = [g.name_hint for g, f in sch.mod.functions.items() if isinstance(f, tirx.PrimFunc)]
        if len(names) != 1:
            raise ValueError(f"expected one PrimFunc, found {names}")
        sch.work_on(names[0])
        return sch.mod[names[0]]
    return sch.mod[gv]


def _block_names(sch: s_tir.Schedule) -> list[str]:
    from umahub.plugin.compat import SBlock, nodes_in

    return [b.name_hint for b in nodes_in(_func(sch).body, SBlock)]


def _divisor_at_most(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def _extents(sch: s_tir.Schedule, loops: list) -> list[int]:
    return [int(sch.get(loop).extent) for loop in loops]


def _parallel_outer(sch: s_tir.Schedule, block: Any, keep: int = 1) -> None:
    """``block``'s loops but the last ``keep`` fused and parallel (a stage at the root)."""
    loops = sch.get_loops(block)
    axes = sch.get(block).iter_vars
    spatial = next((i for i, iv in enumerate(axes) if iv.iter_type != 0), len(axes))
    if spatial < len(axes):  # a reduction: its spatial loops only, the last one kept
        keep = len(loops) - max(1, spatial - 1)
    if len(loops) <= keep:
        return
    outer = loops[:-keep]
    _parallel_tile(sch, *outer)


def _param_index(sch: s_tir.Schedule, block: Any) -> int | None:
    """The index of the parameter ``block`` reads (one buffer), or None."""
    from umahub.plugin.compat import buffer_of, param_buffers

    reads = [buffer_of(r) for r in sch.get(block).reads]
    if len(reads) != 1:
        return None
    for i, buffer in enumerate(param_buffers(_func(sch))):
        if buffer is not None and buffer.same_as(reads[0]):
            return i
    return None


def _side_stages(sch: s_tir.Schedule, weights: frozenset[int], channels_last: bool = False) -> bool:
    """The stages around ``dot``: the input's copy (``channels_last``: the AMX
    convolution's, :func:`_copy_in_rows`) and the window sums in parallel, the
    weight's sums in parallel vectors (:func:`_weight_sum`), the weight's packing for
    compile time (a constant) or in parallel. Whether the weight is packed at compile
    time."""
    names = set(_block_names(sch))
    for name in ("pad_zero_point", "window_sum"):
        if name in names:
            copy = sch.get_sblock(name)
            if name == "pad_zero_point" and _copy_in_rows(sch, copy, channels_last):
                continue
            _parallel_outer(sch, copy)
    if "weight_sum" in names:
        _weight_sum(sch, sch.get_sblock("weight_sum"))
    prepacked = False
    if "weight_packed" in names:
        block = sch.get_sblock("weight_packed")
        index = _param_index(sch, block)
        if index is not None and index in weights:
            sch.annotate(block, _PREPACK, True)
            prepacked = True
        else:
            _parallel_outer(sch, block, keep=2)
    return prepacked


def _weight_sum(sch: s_tir.Schedule, block: Any) -> None:
    """The packed weight's sum per output channel (``[o/16][..][16][4]``), which the
    kernel computes at every call (it is no layout of one parameter, which is all
    a compile-time packing is): its blocks of 16 channels in parallel, each a
    16-lane vector summed over the block's steps (a lane reads every 4th byte of
    a step). Left to run serially at the root, it was most of a 1x1280 by
    1280x1000 product's time."""
    o, *reduction = sch.get_loops(block)
    blocks, lanes = sch.split(o, [None, 16])
    _parallel_tile(sch, blocks)
    sch.reorder(*reduction, lanes)
    sch.unroll(reduction[-1])
    sch.vectorize(lanes)  # before the init is split off: an update alone is refused
    sch.decompose_reduction(block, reduction[0])
    sch.vectorize(sch.get_loops(sch.get_sblock("weight_sum_init"))[-1])


def _copy_in_rows(sch: s_tir.Schedule, block: Any, channels_last: bool = False) -> bool:
    """The convolution input's copy (``[N, C/4, H, W, 4]``) by rows: a parallel loop
    over the rows, each row a loop over its positions with the four bytes of a
    group unrolled (fused into one loop, LLVM vectorized the copy with a division
    per byte). ``channels_last``: the copy is ``[N, H, W, C/4, 4]``
    (:func:`_channels_last`), a row all its positions' groups, in the order they are
    written (by group, a row of the copy was written 16 times over, a group at a time:
    the AMX 3x3 convolution of 64 channels on 56x56 took 0.207 ms, 0.122 in order,
    Intel Xeon). Whether ``block`` was such a copy."""
    loops = sch.get_loops(block)
    if len(loops) == 4:  # a 1x1 convolution's copy: [N, C/4, positions, 4]
        b, cb, _, ci = loops
        _parallel_tile(sch, b, cb)
        sch.unroll(ci)
        return True
    if len(loops) != 5:
        return False
    b, cb, i, w, ci = loops
    if channels_last:  # a row of positions, each its channel groups: written in order
        sch.reorder(b, i, w, cb, ci)
        _parallel_tile(sch, b, i)
    else:
        _parallel_tile(sch, b, cb, i)
    sch.unroll(ci)  # scalar bytes: LLVM's vectors of this gather are far slower
    return True


def _tail(sch: s_tir.Schedule, target: Any = None, tables: list | None = None) -> None:
    """Elementwise blocks after ``requantized`` (a fused consumer: an ``astype``, a
    table's lookup) inlined into it, one after the other, or left at the root in
    parallel. A table's lookup (:func:`umahub.host.lookup_tables.is_table_read`)
    is inlined into the vectorized epilogue only where ``target`` reads a vector
    of entries at once (``vpermi2b``, :func:`~umahub.host.lookup_tables.table_gather_pass`):
    elsewhere LLVM would take the epilogue's vectors apart for it, and it is a
    stage of its own. ``tables`` gets how each lookup is read, for the report."""
    requantized = sch.get_sblock("requantized")
    for block in _consumers_once(sch, requantized):
        if sch.get(block).name_hint == "unflattened" and _padded(sch, requantized, block):
            # inlined, the last vector of positions would be predicated (scalar code);
            # a flat depthwise computes its tiles under it already
            if not _in_parallel(sch, block):
                _parallel_outer(sch, block)
            for consumer in _consumers_once(sch, block):
                _inline_or_parallel(sch, consumer, target, tables, vectorized=False)
            continue
        inlined = _inline_or_parallel(sch, block, target, tables, vectorized=True)
        if not inlined and sch.get(block).name_hint == "unflattened":
            for consumer in _consumers_once(sch, block):  # the consumers read it instead
                _inline_or_parallel(sch, consumer, target, tables, vectorized=False)


def _consumers_once(sch: s_tir.Schedule, block: Any) -> Any:
    """The consumers of ``block``, each once, including those that become its
    consumers as the ones before them are inlined into it."""
    seen: set[str] = set()
    while True:
        fresh = [c for c in sch.get_consumers(block) if sch.get(c).name_hint not in seen]
        if not fresh:
            return
        for consumer in fresh:
            seen.add(sch.get(consumer).name_hint)
            yield consumer


#: How a table's lookup is read, as the report says it.
TABLE_READS = {
    "epilogue": "its table read in the epilogue (vpermi2b where it is vectorized)",
    "stage": "its table read 64 entries a step (vpermi2b)",
    "scalar": "its table read an entry at a time",
}


def _inline_or_parallel(
    sch: s_tir.Schedule,
    block: Any,
    target: Any = None,
    tables: list | None = None,
    vectorized: bool = True,
) -> bool:
    """``block`` inlined into its producer (True), or, where it is not a one-to-one
    consumer, a stage of its own with its outer loops in parallel (False). A
    table's lookup: see :func:`_tail` (``vectorized``: whether the producer is
    the vectorized epilogue)."""
    from umahub.host.lookup_tables import has_vbmi, is_table_read, schedule_table_read

    if is_table_read(sch, block):
        how = "scalar"
        if vectorized and has_vbmi(target):
            try:
                sch.reverse_compute_inline(block)
                how = "epilogue"
            except Exception:  # a stage of its own, then
                pass
        if how != "epilogue":
            how = "stage" if schedule_table_read(sch, block, target) else "scalar"
            if how == "scalar":
                _parallel_outer(sch, block)
        if tables is not None:
            tables.append(how)
        return how == "epilogue"
    try:
        sch.reverse_compute_inline(block)
        return True
    except Exception:
        _parallel_outer(sch, block)
        return False


def _in_parallel(sch: s_tir.Schedule, block: Any) -> bool:
    """Whether one of ``block``'s loops runs in parallel."""
    return any(sch.get(loop).kind == tirx.ForKind.PARALLEL for loop in sch.get_loops(block))


def _padded(sch: s_tir.Schedule, flat: Any, shaped: Any) -> bool:
    """Whether the flat positions of ``flat`` outnumber the outputs of ``shaped``."""
    return math.prod(_extents(sch, sch.get_loops(flat))) != math.prod(
        _extents(sch, sch.get_loops(shaped))
    )


def _inner(sch: s_tir.Schedule, dot: Any, lanes_loop: Any, vnni: bool) -> None:
    """The 16x4 step: one ``vpdpbusd`` (a block marked for :func:`vnni_dot_pass`), or
    a 16-lane int32 vector (the fallback)."""
    if vnni:
        sch.annotate(sch.blockize(lanes_loop), VNNI_ANNOTATION, 1)
        return
    lane, group = sch.get_loops(dot)[-2:]
    sch.reorder(group, lane)  # the 16 lanes innermost and contiguous: LLVM's vector
    sch.unroll(group)


def _llvm_major() -> int:
    try:
        import tvm

        return int(tvm.target.codegen.llvm_version_major())
    except Exception:
        return 0


_BYTE_OPERANDS = _llvm_major() >= 21


def _substitute(expr: Any, pairs: list[tuple[Any, Any]]) -> Any:
    from tvm import tirx

    from umahub.plugin.tir import rewrite

    def replace(v: Any) -> Any:
        return next((new for old, new in pairs if old.same_as(v)), v)

    return rewrite(expr, tirx.Var, replace)


class _FirstStep:
    """A block marked for :func:`vnni_dot_pass`, at its first step (every loop inside
    it at 0): its inner ``store`` of the sums plus ``product``, ``base(load)`` (a load's
    indices there), and the 16 sums it updates (``sums``: their indices, ``sums_now``:
    their load)."""

    def __init__(self, block: Any) -> None:
        from tvm import tirx

        from umahub.plugin.compat import SBlockRealize, buffer_of, nodes_in

        (self.inner,) = [r for r in nodes_in(block.body, SBlockRealize)]
        loops = [f.loop_var for f in nodes_in(block.body, tirx.For)]
        at_zero = [(v, tirx.const(0, "int64")) for v in loops]
        self._bound = [
            (iv.var, _substitute(value, at_zero))
            for iv, value in zip(self.inner.block.iter_vars, self.inner.iter_values)
        ]
        self.store = self.inner.block.body
        self.product = self.store.value.b
        first = self.base(self.store)
        self.sums = [*first[:-1], tirx.Ramp(first[-1], tirx.const(1, "int64"), 16)]
        self.sums_now = tirx.BufferLoad(buffer_of(self.store), self.sums)

    def base(self, load: Any) -> list[Any]:
        """``load``'s indices at the first step."""
        return [_substitute(i, self._bound) for i in load.indices]


def _vnni_body(block: Any) -> Any:
    """The body of a marked block: ``c[16] = vpdpbusd(c[16], bcast(a[4]), b[16, 4])``."""
    from tvm import tirx

    from umahub.plugin.compat import buffer_of

    step = _FirstStep(block)
    product, base, c_index, c_now = step.product, step.base, step.sums, step.sums_now
    a_load, b_load = product.a.value, product.b.value
    lane = step.inner.block.iter_vars[0].var  # the 16 lanes; the second iter var: the 4 bytes
    # channels in the lanes: the input's four bytes broadcast, a 16x4 panel of weights;
    # positions in the lanes (a 1x1 convolution): 16 positions' four bytes of input, a
    # channel's four bytes of weight broadcast
    positions = _uses(a_load, lane)
    vector, four_of = (a_load, b_load) if positions else (b_load, a_load)
    dtype = "uint8" if positions else "int8"
    lanes = buffer_of(vector).vload(base(vector), f"{dtype}x64")
    four = tirx.reinterpret("int32", buffer_of(four_of).vload(base(four_of), f"{_other(dtype)}x4"))
    if _BYTE_OPERANDS:  # LLVM 21 types vpdpbusd's operands as bytes, earlier ones as int32
        broadcast = tirx.reinterpret("int8x64", tirx.Broadcast(four, 16))
        lanes = tirx.reinterpret("int8x64", lanes) if positions else lanes
    else:
        broadcast, lanes = tirx.Broadcast(four, 16), tirx.reinterpret("int32x16", lanes)
    unsigned, signed = (lanes, broadcast) if positions else (broadcast, lanes)
    value = tirx.call_llvm_pure_intrin(
        "int32x16", "llvm.x86.avx512.vpdpbusd.512", c_now, unsigned, signed
    )
    return tirx.BufferStore(buffer_of(step.store), value, c_index)


def _pairs_body(block: Any) -> Any:
    """The body of a block marked with :data:`PAIRS_ANNOTATION`: ``c[16] =
    vpdpwssd(c[16], x[32] as 16-bit, bcast(w[2]))``, the 32 bytes the 16 positions'
    tap pairs read (consecutive: :func:`umahub.host.quantized._tap_groups_acc`)."""
    from tvm import tirx

    from umahub.plugin.compat import buffer_of

    step = _FirstStep(block)
    base, c_index, c_now = step.base, step.sums, step.sums_now
    x_load, w_load = step.product.a.value, step.product.b.value  # int32(x) * int32(w)
    data = buffer_of(x_load).vload(base(x_load), f"{buffer_of(x_load).dtype}x32")
    data = data.astype("int16x32")
    pair = tirx.reinterpret("int32", buffer_of(w_load).vload(base(w_load), "int16x2"))
    weights: Any = tirx.Broadcast(pair, 16)
    if _BYTE_OPERANDS:  # LLVM 21 types vpdpwssd's operands as 16-bit lanes, earlier as int32
        weights = tirx.reinterpret("int16x32", weights)
    else:
        data = tirx.reinterpret("int32x16", data)
    value = tirx.call_llvm_pure_intrin(
        "int32x16", "llvm.x86.avx512.vpdpwssd.512", c_now, data, weights
    )
    return tirx.BufferStore(buffer_of(step.store), value, c_index)


def _quads_body(block: Any) -> Any:
    """The body of a block marked with :data:`QUADS_ANNOTATION`: ``c[16] =
    vpdpbusd(c[16], vpermb(x[64], windows), bcast(w[4]))``, ``windows`` each of the
    16 positions' four bytes of the 64 from the first (its column step the mark's
    value: :func:`umahub.host.quantized._tap_groups_acc`)."""
    from tvm import tirx

    from umahub.plugin.compat import buffer_of

    column_step = int(block.annotations[QUADS_ANNOTATION])
    step = _FirstStep(block)
    base, c_index, c_now = step.base, step.sums, step.sums_now
    x_load, w_load = step.product.a.value, step.product.b.value  # int32(x) * int32(w)
    row = tirx.reinterpret("int8x64", buffer_of(x_load).vload(base(x_load), "uint8x64"))
    every = tirx.Ramp(tirx.const(0, "int8"), tirx.const(1, "int8"), 64)
    windows = tirx.Shuffle([every], [column_step * i + e for i in range(16) for e in range(4)])
    quads = tirx.call_llvm_pure_intrin("int8x64", "llvm.x86.avx512.permvar.qi.512", row, windows)
    four = tirx.reinterpret("int32", buffer_of(w_load).vload(base(w_load), "int8x4"))
    if _BYTE_OPERANDS:  # as in _vnni_body
        weights: Any = tirx.reinterpret("int8x64", tirx.Broadcast(four, 16))
    else:
        weights, quads = tirx.Broadcast(four, 16), tirx.reinterpret("int32x16", quads)
    value = tirx.call_llvm_pure_intrin(
        "int32x16", "llvm.x86.avx512.vpdpbusd.512", c_now, quads, weights
    )
    return tirx.BufferStore(buffer_of(step.store), value, c_index)


def _uses(load: Any, var: Any) -> bool:
    """Whether one of ``load``'s indices reads ``var``."""
    from umahub.plugin.compat import nodes_in

    return any(v.same_as(var) for i in load.indices for v in nodes_in(i, type(var)))


def _other(dtype: str) -> str:
    return "int8" if dtype == "uint8" else "uint8"


def vnni_dot_pass() -> Any:
    """A TIR pass: each block :func:`schedule_int8` marked with :data:`VNNI_ANNOTATION`
    computed by one ``vpdpbusd`` (TVM's ``tensorize`` of the same step crashes
    apache-tvm 0.27), each marked with :data:`PAIRS_ANNOTATION` by one ``vpdpwssd``.
    Runs on S-TIR, before blocks are lowered (umahub's TIR pipeline runs it
    first); a function without such blocks is left as it is."""
    import tvm

    def rewrite(func: Any, _mod: Any, _ctx: Any) -> Any:
        from umahub.plugin.compat import SBlock
        from umahub.plugin.tir import rewrite

        def post(node: Any) -> Any:
            for mark, body in (
                (VNNI_ANNOTATION, _vnni_body),
                (PAIRS_ANNOTATION, _pairs_body),
                (QUADS_ANNOTATION, _quads_body),
            ):
                if mark in node.annotations:
                    annotations = {k: v for k, v in node.annotations.items() if k != mark}
                    return SBlock(
                        node.iter_vars,
                        node.reads,
                        node.writes,
                        node.name_hint,
                        body(node),
                        node.init,
                        node.alloc_buffers,
                        node.match_buffers,
                        annotations,
                    )
            return node

        return func.with_body(rewrite(func.body, SBlock, post))

    return tvm.tirx.transform.prim_func_pass(rewrite, opt_level=0, name="umahub.VnniDot")


def _blocks_per_tile(blocks: int, channels: int, positions: int) -> int:
    """Channel blocks of one register tile: all of them when the channels are no
    whole number of blocks (the output's channel loop is then not split)."""
    if channels % 16:
        return blocks
    return _divisor_at_most(blocks, max(1, ACCUMULATORS // positions))


def _conv(sch: s_tir.Schedule, vnni: bool, amx: bool = False) -> None:
    """A convolution: on AMX's tiles where ``amx`` (its input already copied channels
    last: :func:`_conv_on_tiles`), else register tiles of ``vpdpbusd`` (the module's docs)."""
    if amx:
        _conv_on_tiles(sch)
        return
    dot = sch.get_sblock("dot")
    _, blocks, _, width, _ = _extents(sch, sch.get_loops(dot)[:5])
    out = sch.get_sblock("requantized")
    n, o, y, x = sch.get_loops(out)
    channels = int(sch.get(o).extent)
    xi = _divisor_at_most(width, 16)
    bi = _blocks_per_tile(blocks, channels, xi)
    o0, o1 = sch.split(o, [None, min(channels, bi * 16)])
    x0, x1 = sch.split(x, [None, xi])
    sch.reorder(n, o0, y, x0, o1, x1)
    tile = _parallel_tile(sch, n, o0, y, x0)
    sch.compute_at(dot, tile, preserve_unit_loops=True)
    _requantize_by_channels(sch, o1, x1, channels)
    b, ob, yy, xx, oi, rc, ry, rx, ri = sch.get_loops(dot)[1:]
    sch.reorder(rc, ry, rx, b, ob, yy, xx, oi, ri)
    sch.decompose_reduction(dot, rc)
    _unroll_small(sch, ob, xx)
    _inner(sch, dot, oi, vnni)


def _window_steps(sch: s_tir.Schedule, dot: Any) -> tuple[tuple[int, int], tuple[int, int]]:
    """((stride, dilation) down the rows, (stride, dilation) along them) of the
    convolution ``dot`` (its axes: batch, channel block, row, column, lane, then
    groups, kernel row, kernel column, byte): how far its input's index moves for one
    output row (column), and for one kernel row (column), wherever the copy's layout
    has that index."""
    from umahub.plugin.compat import Load, nodes_in

    block = sch.get(dot)
    (load,) = [x for x in nodes_in(block.body, Load) if str(buffer_of(x).dtype) == "uint8"]

    def moved(axis: int) -> int:
        return _index_step(block, load, axis)

    return (moved(2), moved(6)), (moved(3), moved(7))


def _index_step(block: Any, load: Any, axis: int) -> int:
    """How far ``load``'s index (in ``block``) moves when the block's iteration
    variable ``axis`` takes one step from all at zero: the largest move of its
    indices, wherever the buffer's layout has that index."""
    from tvm import tirx

    from umahub._tvm import Analyzer
    from umahub.plugin.compat import dtype_of_expr

    axes = [iv.var for iv in block.iter_vars]
    at = [[tirx.const(int(i == axis and one), dtype_of_expr(v)) for i, v in enumerate(axes)]
          for one in (False, True)]  # fmt: skip
    indices = [
        [int(Analyzer().simplify(_substitute(i, list(zip(axes, point))))) for i in load.indices]
        for point in at
    ]
    return max(b - a for a, b in zip(*indices))


def _tile_positions(width: int) -> int:
    """An AMX convolution tile's positions (its rows): the largest divisor of the output
    row's ``width`` up to 16."""
    return _divisor_at_most(width, 16)


def _conv_fits_tiles(sch: s_tir.Schedule) -> bool:
    """Whether a convolution fits AMX's tiles (:func:`_conv_on_tiles`): its channel
    groups whole 64-byte steps, its output channels whole blocks of 16, its kernel
    not dilated, its output rows at least 4 positions wide (a tile a divisor of one)."""
    dot = sch.get_sblock("dot")
    _, _, _, width, _, groups, *_ = _extents(sch, sch.get_loops(dot))
    channels = int(sch.get(sch.get_loops(sch.get_sblock("requantized"))[1]).extent)
    (_, row_dilation), (_, dilation) = _window_steps(sch, dot)
    fits = groups % 16 == 0 and channels % 16 == 0 and dilation == row_dilation == 1
    return fits and _tile_positions(width) >= 4


def _channels_last(sch: s_tir.Schedule) -> None:
    """The convolution input's copy laid out ``[N, H, W, C/4, 4]``: a position's channel
    groups together, 64 bytes of them a row of an AMX tile."""
    sch.transform_layout(
        sch.get_sblock("pad_zero_point"), ("write", 0), lambda b, c, h, w, i: (b, h, w, c, i)
    )


def _conv_on_tiles(sch: s_tir.Schedule) -> None:
    """A convolution on AMX's tiles (it fits: :func:`_conv_fits_tiles`; its input copied
    by :func:`_channels_last`): tasks of one or two output rows by up to 16 positions
    (a divisor of the row) by 16 or 32 channels, the sum of every tap and 64-byte step
    of the window on the tiles (:func:`umahub.host.amx.amx_dot_pass`), a tile row a
    position's channels; the requantization of the task as vectors of 16 channels."""
    dot = sch.get_sblock("dot")
    _, _, height, width, *_ = _extents(sch, sch.get_loops(dot))
    (row_stride, _), (stride, _) = _window_steps(sch, dot)
    n, o, y, x = sch.get_loops(sch.get_sblock("requantized"))
    channels = int(sch.get(o).extent)
    o0, o1 = sch.split(o, [None, 32 if channels % 32 == 0 else 16])
    y0, y1 = sch.split(y, [None, 2 if height % 2 == 0 else 1])
    x0, x1 = sch.split(x, [None, _tile_positions(width)])
    sch.reorder(n, o0, y0, x0, o1, y1, x1)
    tile = _parallel_tile(sch, n, o0, y0, x0)
    sch.compute_at(dot, tile, preserve_unit_loops=True)
    blocks, lanes = sch.split(o1, [None, 16])
    sch.reorder(blocks, y1, x1, lanes)
    sch.vectorize(lanes)
    _on_tiles(sch, dot, sch.get_loops(dot)[1], (row_stride, stride))


def _pointwise(sch: s_tir.Schedule, vnni: bool, amx: bool = False) -> None:
    """A 1x1 convolution with positions in the lanes: a register tile of up to 24
    accumulators, ``oc`` channels by two vectors of 16 positions (one where there
    are no more, :func:`umahub.host.quantized.pointwise_positions`); the tiles in
    parallel, those of the smaller operand inner; each channel's four weight bytes
    broadcast once per step; the requantization of the tile vectorized over its
    positions. On AMX (whole blocks of 16 channels, a reduction of whole 64-byte
    steps): tasks of up to 32 channels by 32 positions, each task's sum on the
    tiles, the weight's rows by the input's positions."""
    dot = sch.get_sblock("dot_positions")
    out = sch.get_sblock("requantized")
    n, o, p = sch.get_loops(out)
    channels, positions = int(sch.get(o).extent), int(sch.get(p).extent)
    groups = _extents(sch, sch.get_loops(dot)[-2:])[0]
    task = _amx_task(channels, positions // 16, positions, groups) if amx else None
    vectors = 2 if positions % 32 == 0 else 1
    oc = _divisor_at_most(channels, ACCUMULATORS // vectors) if task is None else task[0]
    o0, o1 = sch.split(o, [None, oc])
    p0, p1 = sch.split(p, [None, 16 * vectors])
    # as in _matmul, the operand read again for each tile of the other is the smaller
    # one: with more positions than channels, a tile of positions' input (its channel
    # groups a plane apart) serves every channel tile while it is in cache (channel
    # tiles outer, resnet50's 1x1 of 256 to 128 channels over 56x56 read its 800 KB
    # input again for each of its 16 channel tiles: 1/0.80 the time, Intel Xeon)
    outer, inner = (o0, p0) if positions <= channels else (p0, o0)
    sch.reorder(n, outer, inner, o1, p1)
    tile = _parallel_tile(sch, n, outer, inner)
    if task is not None:
        _weight_rows(sch, dot)
    sch.compute_at(dot, tile, preserve_unit_loops=True)
    sch.vectorize(p1)
    if task is not None:
        _on_tiles(sch, dot, sch.get_loops(dot)[1])
        return
    b, oo, pp, rc, ri = sch.get_loops(dot)[1:]
    pv, lanes = sch.split(pp, [None, 16])
    sch.reorder(rc, b, oo, pv, lanes, ri)
    sch.decompose_reduction(dot, rc)
    sch.unroll(oo)  # the accumulators in registers
    sch.unroll(pv)
    _inner(sch, dot, lanes, vnni)


def _weight_rows(sch: s_tir.Schedule, dot: Any) -> None:
    """The packed weight ``[O/16, C/4, 1, 1, 16, 4]`` that ``dot`` reads laid out as
    rows of its channels ``[O, C/4, 4]`` instead: the rows of AMX's weight tile. The
    packing itself writes them (``weight_packed``, a block of its own: at compile
    time for a constant weight, :mod:`umahub.host.prepack`), so the kernel holds
    one copy of the weight, and the weight's sums read the same rows. (As a copy of
    the packing, a stage of its own, the weight was held twice, and a copy larger
    than 64 KiB stopped the kernel's other constant stages being computed at
    compile time: resnet50's 1x1 convolutions of 512 channels and more summed their
    weights at every call, 2048 to 512 channels on 7x7 in 0.26 ms, 0.11 after.)
    Not for ``vpdpbusd``, which broadcasts four bytes of one channel: from the
    packing, the 16 channels of a step are one cache line (read from rows,
    mobilenetv2's int8 model took 1.07x the time, Intel Xeon)."""
    rows = lambda ob, k, y, x, oi, i: (ob * 16 + oi, k + y + x, i)  # noqa: E731 (1x1)
    if "weight_packed" in _block_names(sch):
        sch.transform_layout(sch.get_sblock("weight_packed"), ("write", 0), rows)
        return
    reads = sch.get(dot).reads
    index = next(i for i, r in enumerate(reads) if str(buffer_of(r).dtype) == "int8")
    copy = sch.cache_read(dot, index, "global", consumer_blocks=[dot])
    sch.transform_layout(copy, ("write", 0), rows)


def _requantize_by_channels(
    sch: s_tir.Schedule, channel: Any, position: Any, channels: int
) -> None:
    """The tile's requantization as vectors of 16 channels: the accumulator's own
    vectors, the per-channel multiplier, bias and weight sums read contiguously,
    the 16 bytes stored one by one (a channel apart in the output)."""
    if channels % 16:
        return
    blocks, lanes = sch.split(channel, [None, 16])
    sch.reorder(blocks, position, lanes)
    sch.vectorize(lanes)


def _depthwise(sch: s_tir.Schedule) -> None:
    """A depthwise convolution in the plain sum (any stride, padding, row width):
    per channel, its padded plane copied (it stays in the core's cache for the
    channel's rows, where a copy of every plane first wrote them all out to
    memory), then a tile of a run of up to 64 positions of one row at a time, its
    accumulators vectors over the positions (float32 where exact, else int32:
    :func:`umahub.host.quantized._exact_in_float`), the kernel's rows and columns
    outside them (each weight broadcast once), the requantization in the same
    vectors. A stride's every other input is read as two contiguous vectors and a
    shuffle (:mod:`umahub.host.strided_loads`)."""
    pad = sch.get_sblock("pad_zero_point")
    acc = sch.get_sblock("acc")
    out = sch.get_sblock("requantized")
    n, o, _, x = sch.get_loops(out)
    xi = _divisor_at_most(int(sch.get(x).extent), 64)  # a row: 4 vectors of 16
    x0, x1 = sch.split(x, [None, xi])
    plane = _parallel_tile(sch, n, o)
    sch.compute_at(acc, x0, preserve_unit_loops=True)
    sch.compute_at(pad, plane, preserve_unit_loops=True)
    *_, lane, rc, ry, rx = sch.get_loops(acc)
    sch.reorder(rc, ry, rx, lane)
    sch.vectorize(lane)  # before the init is split off: the update alone may not be
    sch.decompose_reduction(acc, rc)
    sch.unroll(ry)
    sch.unroll(rx)
    init = sch.get_sblock("acc_init")
    sch.vectorize(sch.get_loops(init)[-1])
    sch.vectorize(x1)


def _flat_depthwise(sch: s_tir.Schedule) -> None:
    """A depthwise convolution over its flat padded plane: per channel, its plane
    copied (in the core's cache for its tiles), then tiles of whole rows and
    whole vectors of it (:func:`umahub.host.quantized.flat_tile_rows`), the taps
    outside the vectors of 16 (each weight broadcast once, the tile's sums in
    registers), the requantization in the same vectors, and the tile's output
    rows written out (without the positions the flat form computes past the
    output's) while they are in cache."""
    from umahub.host.quantized import BLOCK_O, flat_tile_rows

    pad = sch.get_sblock("pad_zero_point")
    sch.compute_inline(sch.get_sblock("pad_flat"))  # the flat plane is the padded one, read flat
    acc = sch.get_sblock("acc_flat")
    requantized = sch.get_sblock("requantized")
    n, o, y, x = sch.get_loops(requantized)
    rows, pitch = (int(sch.get(loop).extent) for loop in (y, x))
    y0, y1 = sch.split(y, [None, flat_tile_rows(rows, pitch)])
    tile = _parallel_tile(sch, n, o)
    sch.compute_at(acc, y0, preserve_unit_loops=True)
    sch.vectorize(sch.fuse(y1, x))
    _output_rows_under(sch, requantized, y0)
    sch.compute_at(pad, tile, preserve_unit_loops=True)
    *_, q, ry, rx = sch.get_loops(acc)
    vectors, lanes = sch.split(q, [None, BLOCK_O])  # 16 float32: a 512-bit vector
    sch.reorder(ry, rx, vectors, lanes)
    sch.vectorize(lanes)  # before the init is split off: the update alone may not be
    sch.decompose_reduction(acc, ry)
    sch.unroll(ry)
    sch.unroll(rx)
    sch.unroll(vectors)
    init = sch.get_loops(sch.get_sblock("acc_flat_init"))
    sch.vectorize(init[-1])


def _output_rows_under(sch: s_tir.Schedule, requantized: Any, loop: Any) -> None:
    """The output's copy of a depthwise form whose rows run past the output's
    (``unflattened``, the columns past them dropped) computed under ``loop``, a tile
    of whole rows, while they are in cache: not in a pass of its own."""
    for shaped in sch.get_consumers(requantized):
        if sch.get(shaped).name_hint == "unflattened" and _padded(sch, requantized, shaped):
            sch.reverse_compute_at(shaped, loop, preserve_unit_loops=True)
            sch.vectorize(sch.get_loops(shaped)[-1])


def _tap_groups_depthwise(sch: s_tir.Schedule, vnni: bool, quads: bool = False) -> None:
    """A depthwise convolution summing its taps in groups, over its padded plane of bytes.

    Pairs: a convolution whose columns step by 2
    (:func:`umahub.host.quantized._tap_groups_acc`): per channel, its plane
    copied (in the core's cache for its rows), then an output row at a time, its
    accumulators the row's vectors of 16 positions in registers, each tap pair of
    each kernel row one ``vpdpwssd`` per vector (a block marked for
    :func:`vnni_dot_pass`; without VNNI the same loops as int32 vectors), the
    row's requantization under it while its sums are in registers or L1.
    ``quads``: the same for four taps at a time
    (:func:`umahub.host.quantized._tap_groups_acc`), ``vpermb`` and
    ``vpdpbusd`` per vector."""
    pad = sch.get_sblock("pad_zero_point")
    name = "acc_quads" if quads else "acc_pairs"
    acc = sch.get_sblock(name)
    step = _column_step(sch, acc) if quads else 0  # the quads' mark carries it
    requantized = sch.get_sblock("requantized")
    n, o, y, _ = sch.get_loops(requantized)
    plane = _parallel_tile(sch, n, o)
    sch.compute_at(acc, y, preserve_unit_loops=True)
    _output_rows_under(sch, requantized, y)
    sch.compute_at(pad, plane, preserve_unit_loops=True)
    *_, x, ry, rj, re = sch.get_loops(acc)
    vectors, lanes = sch.split(x, [None, 16])
    sch.reorder(ry, rj, vectors, lanes, re)
    if not vnni:  # the pair's two taps one after the other, each an int32 vector of 16
        sch.reorder(re, lanes)
        sch.unroll(re)
        sch.vectorize(lanes)  # before the init is split off: the update alone may not be
    sch.decompose_reduction(acc, ry)
    sch.vectorize(sch.get_loops(sch.get_sblock(f"{name}_init"))[-1])
    for loop in (ry, rj, vectors):
        sch.unroll(loop)
    if vnni and quads:
        sch.annotate(sch.blockize(lanes), QUADS_ANNOTATION, step)
    elif vnni:
        sch.annotate(sch.blockize(lanes), PAIRS_ANNOTATION, 1)
    sch.vectorize(sch.get_loops(requantized)[-1])


def _column_step(sch: s_tir.Schedule, acc: Any) -> int:
    """The columns of its plane between two consecutive outputs of a depthwise sum
    ``acc`` (batch, channel, row, column, then its taps)."""
    from umahub.plugin.compat import Load, nodes_in

    block = sch.get(acc)
    (plane,) = [r for r in nodes_in(block.body, Load) if buffer_of(r).name == "pad_zero_point"]
    return _index_step(block, plane, 3)


def _parallel_tile(sch: s_tir.Schedule, *loops: Any) -> Any:
    """``loops`` fused, in parallel where there is more than one iteration."""
    tile = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    if int(sch.get(tile).extent) > 1:
        sch.parallel(tile)
    return tile


def _unroll_small(sch: s_tir.Schedule, *loops: Any) -> None:
    for loop in loops:
        if int(sch.get(loop).extent) <= 16:
            sch.unroll(loop)


def _amx_task(rows: int, blocks: int, columns: int, groups: int) -> tuple[int, int] | None:
    """(rows, column blocks) of a task on AMX's tiles (:mod:`umahub.host.amx`): 32 or 16
    rows, two blocks of 16 columns or one (a matmul's channels, a 1x1 convolution's
    positions); None where the rows are no multiple of 16, the columns no whole
    blocks or the reduction (``groups`` of 4 bytes) no whole 64-byte steps."""
    if rows % 16 or columns % 16 or columns != blocks * 16 or groups % 16:
        return None
    return (32 if rows % 32 == 0 else 16), (2 if blocks % 2 == 0 else 1)


def _on_tiles(
    sch: s_tir.Schedule, dot: Any, loop: Any, strides: tuple[int, int] | None = None
) -> None:
    """The sum ``dot`` under ``loop`` (a task's) marked for AMX
    (:func:`umahub.host.amx.amx_dot_pass`) as one block, its zeroing included: the
    tiles start from ``tilezero``. (Zeroed in vectors and loaded, the accumulators
    cost resnet50's 1x1 convolutions 1.08-1.40x the time, Intel Xeon.) ``strides``: a
    convolution's, down its rows and along them."""
    task = sch.blockize(loop)
    sch.annotate(task, AMX_ANNOTATION, FROM_ZERO)
    if strides is not None:
        sch.annotate(task, AMX_STRIDE, list(strides))


def _marked_for_amx(sch: s_tir.Schedule) -> bool:
    """Whether a block of ``sch`` is marked for AMX (the tiles fit: :func:`_amx_task`)."""
    from umahub.plugin.compat import SBlock, nodes_in

    return any(AMX_ANNOTATION in b.annotations for b in nodes_in(_func(sch).body, SBlock))


def _matmul(sch: s_tir.Schedule, vnni: bool, amx: bool = False) -> None:
    dot = sch.get_sblock("dot")
    *_, rows, blocks, _ = _extents(sch, sch.get_loops(dot)[:-2])
    groups = _extents(sch, sch.get_loops(dot)[-2:])[0]
    out = sch.get_sblock("requantized")
    *lead, m, n = sch.get_loops(out)
    channels = int(sch.get(n).extent)
    task = _amx_task(rows, blocks, channels, groups) if amx else None
    mi = _divisor_at_most(rows, 8) if task is None else task[0]
    bi = _blocks_per_tile(blocks, channels, mi) if task is None else task[1]
    if task is None and rows == mi and bi == blocks and blocks > 1:
        # one row tile (a classifier's single row) and all the channel blocks in it:
        # tiles of channels instead, for the threads (the last one partly past the
        # channels when they are no whole number of blocks)
        bi = _divisor_at_most(blocks, max(1, blocks // 4))
    m0, m1 = sch.split(m, [None, mi])
    n0, n1 = sch.split(n, [None, min(channels, bi * 16)])
    # the operand read again for each tile of the other is the smaller one: with fewer
    # rows than channels the row tiles are inner, and a tile of channels' weight panel
    # serves them all while it is in cache (row tiles outer, bert's 128x768 by 768x3072
    # read its 2.4 MB weight from L3 again for each of its 16 row tiles: 1/0.85 the
    # time, Intel Xeon)
    outer, inner = (n0, m0) if rows <= channels else (m0, n0)
    sch.reorder(*lead, outer, inner, m1, n1)
    tile = _parallel_tile(sch, *lead, outer, inner)
    sch.compute_at(dot, tile, preserve_unit_loops=True)
    *spatial, ni, rk, ri = sch.get_loops(dot)[1:]
    if task is not None:
        _on_tiles(sch, dot, spatial[0])
        return
    mm, nb = spatial[-2:]
    sch.reorder(rk, *spatial, ni, ri)
    sch.decompose_reduction(dot, rk)
    _unroll_small(sch, mm, nb)
    _inner(sch, dot, ni, vnni)


def schedule_int8(
    sch: s_tir.Schedule, target: Any = None, weights: frozenset[int] = frozenset()
) -> str | None:
    """Schedule a packed-form quantized kernel in place (see the module's docs).

    Args:
        sch: a schedule of one PrimFunc (``main``), as TE and ``FuseTIR`` made it.
        target: what it is built for (None: this machine): AMX's tiles for a
            matmul or convolution they fit where it has AMX and is this machine
            (:func:`umahub.host.amx.has_amx`), ``vpdpbusd`` where it has AVX-512
            VNNI, the exact int32 fallback elsewhere.
        weights: indices of the parameters that are constants
            (``CompileContext.weights``): a weight packed in the kernel is
            then packed at compile time.

    Returns:
        What was done, for the report (``"int8 conv2d: vnni, 16x4 dot,
        weights packed at compile time"``, ``"int8 depthwise: exact float32 sums
        over a row's positions"``), or None (``sch`` unchanged) when
        the function is no such kernel or a primitive refused.
    """
    try:
        kind = int8_kernel(sch)
    except ValueError:  # not one PrimFunc
        return None
    if kind is None:
        return None
    vnni = has_vnni(target)
    amx = kind in ("matmul", "pointwise", "conv2d") and has_amx(target)
    names = set(_block_names(sch))
    tile = {"conv2d": _conv, "pointwise": _pointwise, "matmul": _matmul}.get(kind)

    tables: list[str] = []

    def apply(s: s_tir.Schedule) -> bool:
        tables.clear()
        if kind in ("paired depthwise", "quad depthwise"):
            _tap_groups_depthwise(s, vnni, quads=kind == "quad depthwise")
            _tail(s, target, tables)
            return False
        if tile is None:  # depthwise
            (_flat_depthwise if kind == "flat depthwise" else _depthwise)(s)
            _tail(s, target, tables)
            return False
        channels_last = tile is _conv and amx and _conv_fits_tiles(s)
        if channels_last:  # the AMX convolution's copy: before its stage is scheduled
            _channels_last(s)
        packed_here = _side_stages(s, weights, channels_last)
        tile(s, vnni, amx and (tile is not _conv or channels_last))
        _tail(s, target, tables)
        return packed_here

    tile_rows = 16  # an AMX tile's rows, for the report: a convolution's, a row's positions
    if kind == "conv2d":
        tile_rows = _tile_positions(_extents(sch, sch.get_loops(sch.get_sblock("dot")))[3])
    sums = ""  # a depthwise's sums' type, for the report
    if kind in ("depthwise", "flat depthwise"):
        acc = sch.get_sblock("acc_flat" if kind == "flat depthwise" else "acc")
        sums = str(buffer_of(sch.get(acc).writes[0]).dtype)
    try:
        apply(sch.copy())
    except Exception:  # a primitive refusing: the function is left to other rules
        return None
    packed_here = apply(sch)
    table = "".join(f", {TABLE_READS[how]}" for how in dict.fromkeys(tables))
    if kind in ("paired depthwise", "quad depthwise"):
        vector = "vpermb, vpdpbusd" if kind == "quad depthwise" else "vpdpwssd"
        how = vector if vnni else "int32 vectors, 16 lanes (no VNNI)"
        taps = "fours" if kind == "quad depthwise" else "pairs"
        return f"int8 depthwise: {how} over a row's positions, its taps in {taps}{table}"
    if kind in ("depthwise", "flat depthwise"):
        how = "exact float32 sums" if sums == "float32" else "int32 vectors"
        where = "the padded plane read flat" if kind == "flat depthwise" else "a row's positions"
        return f"int8 depthwise: {how} over {where}{table}"
    how = "vnni, 16x4 dot" if vnni else "int32 vectors, 16 lanes (no VNNI)"
    if kind == "pointwise":
        how += " over 16 positions"
        kind = "conv2d 1x1"
    if amx and _marked_for_amx(sch):
        how = f"amx, {tile_rows}x16 tiles"
    if "weight_packed" not in names or packed_here:
        where = "weights packed at compile time"
    else:
        where = "weights packed at every call"
    return f"int8 {kind}: {how}, {where}{table}"
