"""A quantized operator as the simnpu's program in TIR: tiled loops around its intrinsics.

:func:`lower` turns an :class:`~umahub_simnpu.operator.OperatorPlan` into an
S-TIR PrimFunc whose parameters are the partition's inputs then its output.
Its root block allocates the three on-chip tiles (``inp``, ``wgt``, ``acc``,
sized by :func:`tiling` for the on-chip buffers' capacities); its body is loops
of constant extents around blocks, one per instruction, each a call of an
intrinsic (:mod:`umahub_simnpu.intrinsics` lists them) on the tiles and the
DRAM buffers. The program is written for one of each tile, in the order a
single machine would run it; the tiles' scopes, double buffering and the
dependency tokens between the load, compute and store modules are the
schedule's and the TIR passes' (:mod:`umahub_simnpu.schedule`,
:mod:`umahub_simnpu.passes`).

The program's data segment is attached to the PrimFunc as the attribute
``simnpu.data`` (a uint8 tensor) and read as the string ``"simnpu.data"``. It
holds, per block of 16 output channels, four int32 vectors (bias, multiplier,
shift, residual shift: :data:`TABLE_BYTES`), then the weights in the matrix
core's tile order (``w - w_zp``, laid out at compile time: the weight
parameter itself is not read by the program).

The schedule of the work, per block of 16 output channels and tile of output
positions (part of one row of a convolution's output; rows of a matmul): the
block's tables and bias (broadcast) into ACC; per block of 16 input channels
(a step of the reduction), the input window into INP (padding = the input's
zero point) and the weight tiles into WGT, then one GEMM; the residual into
ACC; then the vector unit (requantize, zero point, clamp) and one STORE.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from umahub_simnpu_runtime import isa

import umahub.plugin as up
from umahub_simnpu.intrinsics import DATA
from umahub_simnpu.operator import OperatorPlan, Unsupported

__all__ = [
    "DATA",
    "DATA_ATTR",
    "TABLE_BYTES",
    "TILE",
    "Capacities",
    "Tiling",
    "data_segment",
    "lower",
    "tiling",
]

#: Lanes of a vector (the matrix core is LANES x LANES).
LANES = isa.LANES
#: The PrimFunc attribute holding the data segment (a uint8 tensor).
DATA_ATTR = "simnpu.data"
#: The PrimFunc attribute holding the tiling (what the report's schedule line says).
TILING_ATTR = "simnpu.tiling"
#: Bytes of one block's per-channel tables: bias, multiplier, shift, residual shift.
TABLE_BYTES = 4 * LANES * 4
#: Most output positions of one row (or matmul rows) one tile holds.
TILE = 256
#: Most output positions one tile of several whole rows holds.
ROWS_TILE = 1024
#: Fewest reduction steps a double-buffered convolution is cut into (while rows can
#: be split): a single step has nothing to overlap its loads with.
PIPELINE_STEPS = 4
#: Words of the tables in an ACC tile (at its top).
TABLE_WORDS = 4 * LANES

_TYPES = {"int8": isa.I8, "uint8": isa.U8, "int32": isa.I32}


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Capacities:
    """The on-chip buffers' capacities the tiles must fit: INP and WGT in bytes, ACC in
    32-bit words (the accelerator's declared :class:`umahub.plugin.OnChipBuffer` sizes)."""

    inp: int = isa.INP_BYTES
    wgt: int = isa.WGT_BYTES
    acc: int = isa.ACC_WORDS


@dataclass(frozen=True)
class Tiling:
    """How an operator is cut to fit the on-chip buffers.

    Attributes:
        positions: output positions (a convolution's, along a row) or matmul rows
            per tile.
        rows: a convolution's output rows per tile (more than one only when a tile
            holds whole rows; it divides the output's height).
        chunk: reduction elements per step (a matmul's; a convolution's step is
            one block of 16 input channels).
        inp, wgt: bytes of one INP and one WGT tile; acc: words of one ACC tile
            (accumulators, the residual, the tables).
        copies: tiles of each kind the buffers must hold at once (2: double-buffered).
    """

    positions: int
    chunk: int
    inp: int
    wgt: int
    acc: int
    copies: int
    rows: int = 1

    def describe(self) -> str:
        """One line for the report: the tile and each buffer's share."""
        rows = f"{self.rows} rows x " if self.rows > 1 else ""
        return (
            f"tiles of {rows}{self.positions} output position{'s' if self.positions > 1 else ''}"
            f" x 16 channels: INP {self.inp} B, WGT {self.wgt} B, ACC {self.acc} words"
            + (f", x{self.copies} (double-buffered)" if self.copies > 1 else "")
        )


#: The simnpu's own capacities (its runtime's defaults).
DEFAULT_CAPACITIES = Capacities()


def tiling(
    plan: OperatorPlan, capacities: Capacities = DEFAULT_CAPACITIES, copies: int = 2
) -> Tiling:
    """The largest tiles of ``plan`` of which ``copies`` fit each on-chip buffer: a tile
    that does not fit is made smaller, down to one position or row. A convolution's
    tile whose whole output row fits grows to several rows (a divisor of the output's
    height), so that a weight tile serves every row of it, but to no fewer than
    :data:`PIPELINE_STEPS` steps of the reduction where the rows allow.

    Raises:
        Unsupported: not even the smallest tile fits (the message names the buffer).
    """
    inp, wgt, acc = (c // copies for c in (capacities.inp, capacities.wgt, capacities.acc))
    note = " per copy, double-buffered" if copies > 1 else ""
    residual = plan.residual is not None

    def acc_words(positions: int) -> int:
        return positions * LANES * (2 if residual else 1) + TABLE_WORDS

    if plan.kind == "conv2d":
        _, _, kh, kw = plan.weight.shape
        (sh, sw), (dh, dw) = plan.strides, plan.dilation
        oh, ow = plan.y_shape[2:]

        def window(positions: int, rows: int = 1) -> int:
            height = (rows - 1) * sh + (kh - 1) * dh + 1
            return height * ((positions - 1) * sw + (kw - 1) * dw + 1) * LANES

        weights = kh * kw * LANES * LANES
        if kh * kw > 0xFFFF:
            raise Unsupported(f"a {kh}x{kw} kernel (more taps than a GEMM loop counts)")
        if weights > wgt:
            raise Unsupported(
                f"a {kh}x{kw} kernel's weight tiles ({weights} bytes per 16 input channels) "
                f"do not fit WGT ({wgt} bytes{note})"
            )
        positions = min(ow, TILE)
        while positions > 1 and (window(positions) > inp or acc_words(positions) > acc):
            positions = _ceil(positions, 2)
        if window(positions) > inp:
            raise Unsupported(
                f"a {kh}x{kw} kernel's input window ({window(1)} bytes for one position) does "
                f"not fit INP ({inp} bytes{note})"
            )
        if acc_words(positions) > acc:
            raise Unsupported(f"one output position does not fit ACC ({acc} words{note})")
        rows = 1
        # the steps of the reduction: a pipeline needs a few to overlap (the same rule
        # single-buffered, so that the option changes the overlap, not the tiles)
        blocks = plan.x_shape[0] * _ceil(plan.weight.shape[0], LANES)
        steps = blocks * _ceil(plan.weight.shape[1], LANES)
        least = PIPELINE_STEPS
        if positions == ow:  # whole rows: as many as fit, dividing the output's height
            for more in range(oh, 1, -1):
                fits = window(ow, more) <= inp and acc_words(more * ow) <= acc
                enough = steps * (oh // more) >= least
                if oh % more == 0 and more * ow <= ROWS_TILE and fits and enough:
                    rows = more
                    break
        return Tiling(
            positions, LANES, window(positions, rows), weights, acc_words(rows * positions),
            copies, rows,
        )  # fmt: skip
    k = plan.x_shape[-1]
    rows = int(np.prod(plan.x_shape[:-1]))
    kb = _ceil(k, LANES)
    blocks = min(kb, wgt // (LANES * LANES))
    if blocks < 1:
        raise Unsupported(f"one 16x16 weight tile does not fit WGT ({wgt} bytes{note})")
    chunk = blocks * LANES
    positions = max(1, min(rows, TILE, inp // chunk))
    while positions > 1 and acc_words(positions) > acc:
        positions = _ceil(positions, 2)
    if chunk > inp:
        raise Unsupported(f"one row of {chunk} inputs does not fit INP ({inp} bytes{note})")
    if acc_words(positions) > acc:
        raise Unsupported(f"one row does not fit ACC ({acc} words{note})")
    return Tiling(positions, chunk, positions * chunk, blocks * LANES * LANES,
                  acc_words(positions), copies)  # fmt: skip


def data_segment(plan: OperatorPlan) -> np.ndarray:
    """The program's data segment: tables per output block, then the weight tiles."""
    channels = plan.channels
    blocks = _ceil(channels, LANES)
    tables = np.zeros((blocks, 4, LANES), np.int32)
    padded = blocks * LANES

    def lanes(values: Any, fill: int) -> np.ndarray:
        out = np.full(padded, fill, np.int64)
        out[:channels] = np.asarray(values, np.int64).reshape(-1)
        return out.reshape(blocks, LANES)

    tables[:, 0] = lanes(plan.bias, 0)
    tables[:, 1] = lanes(plan.multiplier, 0)
    tables[:, 2] = lanes(plan.shift, 1)
    tables[:, 3] = lanes(plan.residual_shift, 0)
    w = plan.weight
    if plan.kind == "conv2d":
        o, c, kh, kw = w.shape
        cb = _ceil(c, LANES)
        full = np.zeros((blocks * LANES, cb * LANES, kh, kw), np.int8)
        full[:o, :c] = w
        tiles = full.reshape(blocks, LANES, cb, LANES, kh, kw).transpose(0, 2, 4, 5, 1, 3)
    else:
        k, n = w.shape
        kb = _ceil(k, LANES)
        full = np.zeros((kb * LANES, blocks * LANES), np.int8)
        full[:k, :n] = w
        tiles = full.reshape(kb, LANES, blocks, LANES).transpose(2, 0, 3, 1)
    return np.concatenate(
        [
            tables.astype("<i4").view(np.uint8).reshape(-1),
            np.ascontiguousarray(tiles).view(np.uint8).reshape(-1),
        ]
    )


class _Builder:
    """Statements of the program's TIR: loops, and one block per intrinsic call on the
    tiles ``inp``, ``wgt``, ``acc`` and the DRAM buffers."""

    def __init__(self, t: Tiling) -> None:
        from tvm import tirx

        self.tirx = tirx
        self.inp = tirx.decl_buffer((t.inp,), "int8", "inp")
        self.wgt = tirx.decl_buffer((t.wgt,), "int8", "wgt")
        self.acc = tirx.decl_buffer((t.acc,), "int32", "acc")
        #: where the block's tables sit in the ACC tile
        self.tables = t.acc - TABLE_WORDS
        self.mul, self.shift, self.res_shift = (self.tables + i * LANES for i in (1, 2, 3))
        self.dram: dict[Any, Any] = {}  # a DRAM pointer -> its buffer (the block's region)
        self.count = 0

    def loop(self, name: str, extent: int, body: Any) -> Any:
        """``for name in range(extent): body(var)`` (a unit extent: body(0), no loop)."""
        tirx = self.tirx
        if extent == 1:
            return body(tirx.const(0, "int32"))
        var = tirx.Var(name, "int32")
        inner = body(var)
        return tirx.For(
            var, tirx.const(0, "int32"), tirx.const(extent, "int32"), tirx.ForKind.SERIAL, inner
        )

    def seq(self, *stmts: Any) -> Any:
        """The statements in order (flattened)."""
        flat = [s for s in stmts if s is not None]
        return flat[0] if len(flat) == 1 else self.tirx.SeqStmt(flat)

    def _block(self, role: str, name: str, args: list[Any], reads: list[Any], writes: list[Any]):
        """The block ``<role>_<n>`` holding ``T.call_extern("int32", name, 0, *args)``."""
        self.count += 1
        call = self.tirx.call_extern("int32", name, 0, *args)
        block = up.SBlock(
            [],
            [up.full_region(b) for b in reads],
            [up.full_region(b) for b in writes],
            f"{role}_{self.count}",
            self.tirx.Evaluate(call),
        )
        return up.SBlockRealize([], True, block)

    def _source(self, src: Any) -> tuple[Any, list[Any]]:
        """A DRAM source: its pointer argument and the buffers the block reads."""
        if isinstance(src, str):
            return src, []  # call_extern makes it a string immediate
        return up.data_pointer(src), [src]

    def load(self, tile, offset, src, src_type, src_offset, dims, pad=0) -> Any:
        """``simnpu.load`` into ``tile``; ``dims`` outermost first, filled to three."""
        dims = [(1, 0, 0, 0, 0)] * (3 - len(dims)) + list(dims)
        pointer, reads = self._source(src)
        args = [up.data_pointer(tile), offset, pointer, src_type, src_offset, pad]
        role = f"load_{tile.name}"
        return self._block(role, "simnpu.load", args + [v for d in dims for v in d], reads, [tile])

    def gemm(self, extents, acc, inp, wgt) -> Any:
        """``simnpu.gemm``; ``acc``/``inp``/``wgt`` are an offset and one stride per extent."""
        pad = 3 - len(extents)

        def operand(tile, o):
            return [up.data_pointer(tile), o[0], *([0] * pad), *o[1:]]

        args = [0, *([1] * pad), *extents, *operand(self.acc, acc), *operand(self.inp, inp),
                *operand(self.wgt, wgt)]  # fmt: skip
        return self._block("gemm", "simnpu.gemm", args, [self.acc, self.inp, self.wgt], [self.acc])

    def alu(self, op, extents, dst, src=(0, 0, 0), imm=None, residual=False) -> Any:
        """``simnpu.alu`` on ACC vectors, the block's tables as FXP's multipliers and shifts."""
        tables = [self.mul, self.shift, self.res_shift]
        args = [op, 0 if imm is None else 1, *extents, up.data_pointer(self.acc), *dst, *src,
                0 if imm is None else imm, *tables, int(residual)]  # fmt: skip
        return self._block("alu", "simnpu.alu", args, [self.acc], [self.acc])

    def store(self, dst, dst_type, dst_offset, src_offset, dims) -> Any:
        """``simnpu.store`` from ACC; ``dims`` outermost first, filled to three."""
        dims = [(1, 0, 0)] * (3 - len(dims)) + list(dims)
        args = [up.data_pointer(dst), dst_type, dst_offset, up.data_pointer(self.acc), src_offset]
        return self._block(
            "store", "simnpu.store", args + [v for d in dims for v in d], [self.acc], [dst]
        )


def _epilogue(b: _Builder, plan: OperatorPlan, positions: Any, residual: Any) -> list[Any]:
    """The vector unit's work on ``positions`` ACC vectors at 0 (residual, when given,
    already in ACC at ``residual``): requantize, add the zero point, clamp."""
    steps = []
    extents = (positions, 1)
    if residual is not None:
        steps.append(b.alu(isa.ALU_ADD, extents, (residual, LANES, 0), imm=-plan.residual_zero))
        steps.append(
            b.alu(
                isa.ALU_FXP,
                extents,
                (0, LANES, 0),
                (residual, LANES, 0),
                imm=plan.residual_multiplier,
                residual=True,
            )
        )
    else:
        steps.append(b.alu(isa.ALU_FXP, extents, (0, LANES, 0)))
    steps.append(b.alu(isa.ALU_ADD, extents, (0, LANES, 0), imm=plan.y_zero))
    steps.append(b.alu(isa.ALU_MAX, extents, (0, LANES, 0), imm=plan.low))
    steps.append(b.alu(isa.ALU_MIN, extents, (0, LANES, 0), imm=plan.high))
    return steps


def _tables(b: _Builder, ob: Any, positions: Any) -> list[Any]:
    """The block's tables into the ACC tile's top, and its bias broadcast to ``positions``
    vectors at its bottom."""
    words = ob * (TABLE_BYTES // 4)  # offsets are in elements of the source's type
    broadcast = [(positions, 0, 0, 0, LANES), (LANES, 0, 0, 1, 1)]  # source stride 0
    return [
        b.load(b.acc, b.tables, DATA, isa.I32, words, [(TABLE_WORDS, 0, 0, 1, 1)]),
        b.load(b.acc, 0, DATA, isa.I32, words, broadcast),
    ]


def _conv(b: _Builder, plan: OperatorPlan, params: list[Any], t: Tiling) -> Any:
    from tvm import tirx

    n_, c, h, w = plan.x_shape
    _, o, oh_, ow_ = plan.y_shape
    _, _, kh, kw = plan.weight.shape
    sh, sw = plan.strides
    pt, pl, _, _ = plan.padding
    dh, dw = plan.dilation
    cb_, ob_ = _ceil(c, LANES), _ceil(o, LANES)
    tile, rows_ = t.positions, t.rows  # rows_ > 1: whole rows (tile == ow_), dividing oh_
    width = (tile - 1) * sw + (kw - 1) * dw + 1  # input columns one tile reads
    height = (rows_ - 1) * sh + (kh - 1) * dh + 1  # input rows one tile reads
    tiles = _ceil(ow_, tile)
    x, y = params[plan.data], params[plan.output]
    r = params[plan.residual] if plan.residual is not None else None
    x_type = _TYPES[plan.x_dtype]
    weights = ob_ * TABLE_BYTES
    res_base = rows_ * tile * LANES

    def clamp(v, lo, hi):
        return tirx.max(lo, tirx.min(hi, v))

    def ceildiv(a, d):
        return tirx.floordiv(a + (d - 1), d)

    def block(n, oh, t, ob):
        # ``oh``: the tile's first output row; ``rows_`` rows of ``ot`` positions each
        ot = tirx.min(tile, ow_ - t * tile)
        positions = ot * rows_
        lanes_out = tirx.min(LANES, o - ob * LANES)
        steps = _tables(b, ob, positions)
        row0 = oh * sh - pt
        top = clamp(-row0, 0, height)
        bottom = clamp(row0 + height - h, 0, height)
        col0 = t * tile * sw - pl
        span = (ot - 1) * sw + (kw - 1) * dw + 1
        left = clamp(-col0, 0, span)
        right = clamp(col0 + span - w, 0, span)
        cols = span - left - right

        def gemm(r):  # output row r of the tile: its positions, its input rows
            return b.gemm(
                [ot, kh, kw],
                (r * tile * LANES, LANES, 0, 0),
                (r * sh * width * LANES, sw * LANES, dh * width * LANES, dw * LANES),
                (0, 0, kw * LANES * LANES, LANES * LANES),
            )

        def reduce(cb):
            lanes_in = tirx.min(LANES, c - cb * LANES)
            offset = ((n * c + cb * LANES) * h + (row0 + top)) * w + (col0 + left)
            return b.seq(
                b.load(
                    b.inp, 0, x, x_type, tirx.max(offset, 0),
                    [
                        (height - top - bottom, top, bottom, w, width * LANES),
                        (cols, left, right, 1, LANES),
                        (lanes_in, 0, LANES - lanes_in, h * w, 1),
                    ],
                    pad=plan.x_zero,
                ),
                b.load(
                    b.wgt, 0, DATA, isa.I8, weights + (ob * cb_ + cb) * kh * kw * LANES * LANES,
                    [(kh * kw, 0, 0, LANES * LANES, LANES * LANES), (LANES * LANES, 0, 0, 1, 1)],
                ),
                b.loop("r", rows_, gemm),
            )  # fmt: skip

        steps.append(b.loop("cb", cb_, reduce))
        at = ((n * o + ob * LANES) * oh_ + oh) * ow_ + t * tile
        residual = None
        if r is not None:
            steps.append(
                b.load(
                    b.acc, res_base, r, _TYPES[plan.residual_dtype], at,
                    [(positions, 0, 0, 1, LANES),
                     (lanes_out, 0, LANES - lanes_out, oh_ * ow_, 1)],
                )
            )  # fmt: skip
            residual = res_base
        steps += _epilogue(b, plan, positions, residual)
        steps.append(
            b.store(
                y, _TYPES[plan.y_dtype], at, 0, [(lanes_out, oh_ * ow_, 1), (positions, 1, LANES)]
            )
        )
        return b.seq(*steps)

    def row(n, oh):
        return b.loop("t", tiles, lambda t: b.loop("ob", ob_, lambda ob: block(n, oh, t, ob)))

    return b.loop("n", n_, lambda n: b.loop("oh", oh_ // rows_, lambda i: row(n, i * rows_)))


def _matmul(b: _Builder, plan: OperatorPlan, params: list[Any], t: Tiling) -> Any:
    from tvm import tirx

    k = plan.x_shape[-1]
    rows_ = int(np.prod(plan.x_shape[:-1]))
    n_ = plan.y_shape[-1]
    if int(np.prod(plan.y_shape[:-1])) != rows_:
        raise Unsupported("a matmul whose input is broadcast against the output")
    kb_, nb_ = _ceil(k, LANES), _ceil(n_, LANES)
    chunk = t.chunk  # reduction elements per step
    chunks = _ceil(k, chunk)
    tile = t.positions
    tiles = _ceil(rows_, tile)
    x, y = params[plan.data], params[plan.output]
    r = params[plan.residual] if plan.residual is not None else None
    weights = nb_ * TABLE_BYTES
    res_base = rows_ * tile * LANES

    def block(t, nb):
        rows = tirx.min(tile, rows_ - t * tile)
        lanes_out = tirx.min(LANES, n_ - nb * LANES)
        steps = _tables(b, nb, rows)

        def reduce(kc):
            size = tirx.min(chunk, k - kc * chunk)
            blocks = tirx.floordiv(size + (LANES - 1), LANES)
            return b.seq(
                b.load(
                    b.inp, 0, x, _TYPES[plan.x_dtype], t * tile * k + kc * chunk,
                    [(rows, 0, 0, k, chunk), (size, 0, blocks * LANES - size, 1, 1)],
                    pad=plan.x_zero,
                ),
                b.load(
                    b.wgt, 0, DATA, isa.I8,
                    weights + (nb * kb_ + kc * (chunk // LANES)) * LANES * LANES,
                    [(blocks, 0, 0, LANES * LANES, LANES * LANES), (LANES * LANES, 0, 0, 1, 1)],
                ),
                b.gemm([rows, blocks], (0, LANES, 0), (0, chunk, LANES), (0, 0, LANES * LANES)),
            )  # fmt: skip

        steps.append(b.loop("kc", chunks, reduce))
        at = t * tile * n_ + nb * LANES
        residual = None
        if r is not None:
            steps.append(
                b.load(
                    b.acc, res_base, r, _TYPES[plan.residual_dtype], at,
                    [(rows, 0, 0, n_, LANES), (lanes_out, 0, LANES - lanes_out, 1, 1)],
                )
            )  # fmt: skip
            residual = res_base
        steps += _epilogue(b, plan, rows, residual)
        steps.append(
            b.store(y, _TYPES[plan.y_dtype], at, 0, [(rows, n_, LANES), (lanes_out, 1, 1)])
        )
        return b.seq(*steps)

    return b.loop("t", tiles, lambda t: b.loop("nb", nb_, lambda nb: block(t, nb)))


def lower(plan: OperatorPlan, function: Any, symbol: str, cut: Tiling | None = None) -> Any:
    """The IRModule holding the S-TIR PrimFunc ``symbol``: the partition ``function``'s
    program, cut as ``cut`` says (default: :func:`tiling` for the default capacities,
    double-buffered).

    Raises:
        Unsupported: a shape the simnpu's buffers do not take.
    """
    import tvm
    from tvm import te

    cut = cut or tiling(plan)
    placeholders = [
        te.placeholder(
            tuple(int(d) for d in up.shape_of(p)), up.dtype_of(p), up.name_of(p) or f"p{i}"
        )
        for i, p in enumerate(function.params)
    ]
    out = te.compute(
        plan.y_shape, lambda *i: tvm.tirx.const(0, plan.y_dtype), name="output"
    )  # a placeholder body: replaced below
    func = te.create_prim_func([*placeholders, out])
    params = up.param_buffers(func)
    b = _Builder(cut)
    body = _conv(b, plan, params, cut) if plan.kind == "conv2d" else _matmul(b, plan, params, cut)
    func = up.with_root_body(func, [body], alloc_buffers=[b.inp, b.wgt, b.acc])
    data = data_segment(plan)
    func = (
        func.with_attr("global_symbol", symbol)
        .with_attr(DATA_ATTR, tvm.runtime.tensor(data))
        .with_attr(TILING_ATTR, cut.describe())
    )
    return tvm.IRModule({symbol: func})
