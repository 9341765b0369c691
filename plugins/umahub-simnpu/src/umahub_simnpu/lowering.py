"""A quantized operator as the simnpu's program in TIR: tiled loops around its intrinsics.

:func:`lower` turns an :class:`~umahub_simnpu.operator.OperatorPlan` into a
PrimFunc whose parameters are the partition's inputs then its output, and
whose body is loops of constant extents around ``T.call_extern`` calls of the
four intrinsics, one per instruction (the arguments are PrimExprs in the loop
variables; :mod:`umahub_simnpu.codegen` evaluates them):

* ``simnpu.load(dst_buf, dst_base, src, src_type, src_offset, pad_value,
  size0, before0, after0, src_stride0, dst_stride0, ...x3)``;
* ``simnpu.gemm(reset, extent0, extent1, extent2, acc_base, acc_stride0..2,
  inp_base, inp_stride0..2, wgt_base, wgt_stride0..2)``;
* ``simnpu.alu(op, use_imm, extent0, extent1, dst_base, dst_stride0,
  dst_stride1, src_base, src_stride0, src_stride1, imm, mul_base, shift_base,
  res_shift_base, residual)``;
* ``simnpu.store(dst, dst_type, dst_offset, src_base, size0, dst_stride0,
  src_stride0, ...x3)``.

``src``/``dst`` is a parameter's data (``buffer.data``) or the string
``"simnpu.data"``: the program's data segment, attached to the PrimFunc as the
attribute ``simnpu.data`` (a uint8 tensor). The data segment holds, per block
of 16 output channels, four int32 vectors (bias, multiplier, shift, residual
shift: :data:`TABLE_BYTES`), then the weights in the matrix core's tile order
(``w - w_zp``, laid out at compile time: the weight parameter itself is not
read by the program).

The schedule, per block of 16 output channels and tile of output positions
(one row of a convolution's output, at most :data:`TILE` positions; at most
:data:`TILE` rows of a matmul's): the per-channel tables and the bias
(broadcast) into ACC; per block of 16 input channels (a chunk of the
reduction), the input window into INP (padding = the input's zero point) and
the weight tiles into WGT, then one GEMM; the residual into ACC; then the
vector unit (requantize, zero point, clamp) and one STORE.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from umahub_simnpu_runtime import isa

import umahub.plugin as up
from umahub_simnpu.operator import OperatorPlan, Unsupported

__all__ = ["DATA", "DATA_ATTR", "TABLE_BYTES", "TILE", "data_segment", "lower"]

#: Lanes of a vector (the matrix core is LANES x LANES).
LANES = isa.LANES
#: The string naming the data segment as an intrinsic's source.
DATA = "simnpu.data"
#: The PrimFunc attribute holding the data segment (a uint8 tensor).
DATA_ATTR = "simnpu.data"
#: Bytes of one block's per-channel tables: bias, multiplier, shift, residual shift.
TABLE_BYTES = 4 * LANES * 4
#: Most output positions (or matmul rows) one tile holds.
TILE = 256

#: Where the tables go in ACC: its top 64 words.
TABLES = isa.ACC_WORDS - 4 * LANES
BIAS, MUL, SHIFT, RES_SHIFT = (TABLES + i * LANES for i in range(4))

_TYPES = {"int8": isa.I8, "uint8": isa.U8, "int32": isa.I32}


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


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
    """Statements of the program's TIR, with helpers for loops and intrinsics."""

    def __init__(self) -> None:
        from tvm import tirx

        self.tirx = tirx

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

    def call(self, name: str, *args: Any) -> Any:
        """One intrinsic call, ``T.call_extern("int32", name, *args)``."""
        tirx = self.tirx
        return tirx.Evaluate(tirx.call_extern("int32", name, *args))

    def load(self, dst_buf, dst_base, src, src_type, src_offset, dims, pad=0) -> Any:
        """``simnpu.load``; ``dims`` outermost first, filled to three with unit ones."""
        dims = [(1, 0, 0, 0, 0)] * (3 - len(dims)) + list(dims)
        return self.call(
            "simnpu.load", dst_buf, dst_base, src, src_type, src_offset, pad,
            *[v for d in dims for v in d],
        )  # fmt: skip

    def gemm(self, extents, acc, inp, wgt) -> Any:
        """``simnpu.gemm``; ``acc``/``inp``/``wgt`` are a base and one stride per extent."""
        pad = 3 - len(extents)

        def operand(o):
            return [o[0], *([0] * pad), *o[1:]]

        return self.call(
            "simnpu.gemm", 0, *([1] * pad), *extents, *operand(acc), *operand(inp), *operand(wgt)
        )

    def alu(self, op, extents, dst, src=(0, 0, 0), imm=None, residual=False) -> Any:
        """``simnpu.alu`` on ACC vectors, the block's tables as FXP's multipliers and shifts."""
        return self.call(
            "simnpu.alu", op, 0 if imm is None else 1, *extents, *dst, *src,
            0 if imm is None else imm, MUL, SHIFT, RES_SHIFT, int(residual),
        )  # fmt: skip

    def store(self, dst, dst_type, dst_offset, src_base, dims) -> Any:
        """``simnpu.store``; ``dims`` outermost first, filled to three with unit ones."""
        dims = [(1, 0, 0)] * (3 - len(dims)) + list(dims)
        return self.call(
            "simnpu.store", dst, dst_type, dst_offset, src_base, *[v for d in dims for v in d]
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
    """The block's tables into ACC's top, and its bias broadcast to ``positions`` vectors."""
    words = ob * (TABLE_BYTES // 4)  # offsets are in elements of the source's type
    broadcast = [(positions, 0, 0, 0, LANES), (LANES, 0, 0, 1, 1)]  # source stride 0
    return [
        b.load(isa.ACC, TABLES, DATA, isa.I32, words, [(4 * LANES, 0, 0, 1, 1)]),
        b.load(isa.ACC, 0, DATA, isa.I32, words, broadcast),
    ]


def _conv(b: _Builder, plan: OperatorPlan, params: list[Any]) -> Any:
    from tvm import tirx

    n_, c, h, w = plan.x_shape
    _, o, oh_, ow_ = plan.y_shape
    _, _, kh, kw = plan.weight.shape
    sh, sw = plan.strides
    pt, pl, _, _ = plan.padding
    dh, dw = plan.dilation
    cb_, ob_ = _ceil(c, LANES), _ceil(o, LANES)
    if kh * kw > 255:
        raise Unsupported(f"a {kh}x{kw} kernel (at most 255 taps fit the weight buffer)")
    tile = min(ow_, TILE)
    while tile > 1 and kh * ((tile - 1) * sw + (kw - 1) * dw + 1) * LANES > isa.INP_BYTES:
        tile //= 2
    width = (tile - 1) * sw + (kw - 1) * dw + 1  # input columns one tile reads
    if kh * width * LANES > isa.INP_BYTES:
        raise Unsupported(f"a {kh}x{kw} kernel's window does not fit the input buffer")
    tiles = _ceil(ow_, tile)
    x, y = params[plan.data].data, params[plan.output].data
    r = params[plan.residual].data if plan.residual is not None else None
    x_type = _TYPES[plan.x_dtype]
    weights = ob_ * TABLE_BYTES
    res_base = tile * LANES

    def clamp(v, lo, hi):
        return tirx.max(lo, tirx.min(hi, v))

    def ceildiv(a, d):
        return tirx.floordiv(a + (d - 1), d)

    def block(n, oh, t, ob):
        ot = tirx.min(tile, ow_ - t * tile)
        lanes_out = tirx.min(LANES, o - ob * LANES)
        steps = _tables(b, ob, ot)
        row0 = oh * sh - pt
        before = clamp(ceildiv(-row0, dh), 0, kh)
        after = kh - clamp(ceildiv(h - row0, dh), 0, kh)
        rows = kh - before - after
        col0 = t * tile * sw - pl
        span = (ot - 1) * sw + (kw - 1) * dw + 1
        left = clamp(-col0, 0, span)
        right = clamp(col0 + span - w, 0, span)
        cols = span - left - right

        def reduce(cb):
            lanes_in = tirx.min(LANES, c - cb * LANES)
            offset = ((n * c + cb * LANES) * h + (row0 + before * dh)) * w + (col0 + left)
            return b.seq(
                b.load(
                    isa.INP, 0, x, x_type, tirx.max(offset, 0),
                    [
                        (rows, before, after, dh * w, width * LANES),
                        (cols, left, right, 1, LANES),
                        (lanes_in, 0, LANES - lanes_in, h * w, 1),
                    ],
                    pad=plan.x_zero,
                ),
                b.load(
                    isa.WGT, 0, DATA, isa.I8, weights + (ob * cb_ + cb) * kh * kw * LANES * LANES,
                    [(kh * kw, 0, 0, LANES * LANES, LANES * LANES), (LANES * LANES, 0, 0, 1, 1)],
                ),
                b.gemm(
                    [ot, kh, kw],
                    (0, LANES, 0, 0),
                    (0, sw * LANES, width * LANES, dw * LANES),
                    (0, 0, kw * LANES * LANES, LANES * LANES),
                ),
            )  # fmt: skip

        steps.append(b.loop("cb", cb_, reduce))
        at = ((n * o + ob * LANES) * oh_ + oh) * ow_ + t * tile
        residual = None
        if r is not None:
            steps.append(
                b.load(
                    isa.ACC, res_base, r, _TYPES[plan.residual_dtype], at,
                    [(ot, 0, 0, 1, LANES), (lanes_out, 0, LANES - lanes_out, oh_ * ow_, 1)],
                )
            )  # fmt: skip
            residual = res_base
        steps += _epilogue(b, plan, ot, residual)
        steps.append(
            b.store(y, _TYPES[plan.y_dtype], at, 0, [(lanes_out, oh_ * ow_, 1), (ot, 1, LANES)])
        )
        return b.seq(*steps)

    def row(n, oh):
        return b.loop("t", tiles, lambda t: b.loop("ob", ob_, lambda ob: block(n, oh, t, ob)))

    return b.loop("n", n_, lambda n: b.loop("oh", oh_, lambda oh: row(n, oh)))


def _matmul(b: _Builder, plan: OperatorPlan, params: list[Any]) -> Any:
    from tvm import tirx

    k = plan.x_shape[-1]
    rows_ = int(np.prod(plan.x_shape[:-1]))
    n_ = plan.y_shape[-1]
    if int(np.prod(plan.y_shape[:-1])) != rows_:
        raise Unsupported("a matmul whose input is broadcast against the output")
    kb_, nb_ = _ceil(k, LANES), _ceil(n_, LANES)
    chunk = min(kb_, isa.WGT_BYTES // (LANES * LANES)) * LANES  # reduction elements per pass
    chunks = _ceil(k, chunk)
    tile = max(1, min(rows_, TILE, isa.INP_BYTES // chunk))
    tiles = _ceil(rows_, tile)
    x, y = params[plan.data].data, params[plan.output].data
    r = params[plan.residual].data if plan.residual is not None else None
    weights = nb_ * TABLE_BYTES
    res_base = tile * LANES

    def block(t, nb):
        rows = tirx.min(tile, rows_ - t * tile)
        lanes_out = tirx.min(LANES, n_ - nb * LANES)
        steps = _tables(b, nb, rows)

        def reduce(kc):
            size = tirx.min(chunk, k - kc * chunk)
            blocks = tirx.floordiv(size + (LANES - 1), LANES)
            return b.seq(
                b.load(
                    isa.INP, 0, x, _TYPES[plan.x_dtype], t * tile * k + kc * chunk,
                    [(rows, 0, 0, k, chunk), (size, 0, blocks * LANES - size, 1, 1)],
                    pad=plan.x_zero,
                ),
                b.load(
                    isa.WGT, 0, DATA, isa.I8,
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
                    isa.ACC, res_base, r, _TYPES[plan.residual_dtype], at,
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


def lower(plan: OperatorPlan, function: Any, symbol: str) -> Any:
    """The IRModule holding the PrimFunc ``symbol``: the partition ``function``'s program.

    Raises:
        Unsupported: a shape the simnpu's buffers do not take.
    """
    import tvm
    from tvm import te

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
    b = _Builder()
    body = _conv(b, plan, params) if plan.kind == "conv2d" else _matmul(b, plan, params)
    func = up.with_root_body(func, [body], alloc_buffers=[])
    data = data_segment(plan)
    func = func.with_attr("global_symbol", symbol).with_attr(DATA_ATTR, tvm.runtime.tensor(data))
    return tvm.IRModule({symbol: func})
