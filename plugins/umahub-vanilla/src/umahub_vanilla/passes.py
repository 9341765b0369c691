"""TIR passes of umahub-vanilla ("vanilla_accel").

``conv2d_to_extern()`` is a phase-0 pass (it runs on the S-TIR PrimFunc as
LegalizeOps/FuseTIR produced it, blocks still there, before TVM's lowering
passes).  It finds the loop nests LegalizeOps emits for ``R.nn.conv2d``::

    pad_temp[i0, i1, i2, i3] = T.if_then_else(pt <= i2 < pt + H and pl <= i3 < pl + W,
                                              x[i0, i1, i2 - pt, i3 - pl], 0.0)   # optional
    conv[nn, ff, yy, xx] += pad_temp[nn, rc, yy * sh + ry, xx * sw + rx] * w[ff, rc, ry, rx]

and replaces both (the padding block is dropped: the kernel pads by itself)
with one opaque block around::

    T.call_extern("int32", "vanilla_conv2d_nchw", x.data, w.data, conv.data,
                  N, C, H, W, K, R, S, pad_top, pad_left, pad_bottom, pad_right, sh, sw)

A bias add right after the convolution (``y = conv + b`` with a (1, K, 1, 1)
bias, the convolution read by nothing else) goes into the call too, as
``vanilla_conv2d_nchw_bias(x, w, b, y, ...)``: the kernel adds the bias before
it stores, and the output costs no second pass. So does an activation right
after that bias add that bounds its input (a ReLU ``max(y, 0)``, a ReLU6 or
a clip ``max(min(y, hi), lo)``), as ``vanilla_conv2d_nchw_bias_clamp(x, w, b,
z, lo, hi, bounds, ...)``. Whatever else follows stays TIR and reads the
call's output.

The pass is conservative: it rewrites only what it has proven to be a
float32, NCHW/OIHW, groups = 1, dilation = 1 convolution with zero padding,
static shapes and untouched (unscheduled) loop nests, and leaves every other
PrimFunc and every other loop nest exactly as it was.

The extern's pointer arguments are the buffers' ``.data`` (TVM's C codegen
prints them as ``float*`` and declares the callee as
``int32_t vanilla_conv2d_nchw(float*, float*, float*, int32_t, ...)``);
the kernel's header is written to agree with that prototype.  With
apache-tvm 0.25, where ``.data`` is a handle the C codegen declares ``void*``,
they are ``T.address_of(x[0, 0, 0, 0])`` instead (see ``umahub.plugin.data_pointer``).
"""

from __future__ import annotations

import dataclasses

import tvm
from tvm import tirx

from umahub.plugin import (
    Call,
    Load,
    buffer_of,
    data_pointer,
    detect_linear_equation,
    extern_block,
    is_buffer,
    param_buffers,
    perfect_nest,
    root_block,
    with_root_body,
)

__all__ = [
    "C_INCLUDES",
    "C_SOURCES",
    "EXTERN_BIAS_NAME",
    "EXTERN_CLAMP_NAME",
    "EXTERN_NAME",
    "INCLUDE_DIRS",
    "KERNEL_DIR",
    "ConvMatch",
    "conv2d_to_extern",
    "match_conv2d",
]

from umahub_vanilla.library import (
    C_INCLUDES,
    C_SOURCES,
    EXTERN_BIAS_NAME,
    EXTERN_CLAMP_NAME,
    EXTERN_NAME,
    INCLUDE_DIRS,
    KERNEL_DIR,
)

_DATA_PAR = 0  # IterVar.DataPar
_COMM_REDUCE = 2  # IterVar.CommReduce


class _NoMatch(Exception):
    """Raised internally when a loop nest is not a convolution we handle."""


@dataclasses.dataclass
class ConvMatch:
    """A recognised convolution inside a PrimFunc's root block."""

    conv_index: int  # position of the conv loop nest in the root block's body
    pad_index: int | None  # position of the pad loop nest, None without padding
    pad_buffer: object | None  # the pad_temp buffer (root alloc), dropped
    data: object  # unpadded input buffer
    weight: object
    out: object
    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    pad_top: int
    pad_left: int
    pad_bottom: int
    pad_right: int
    stride_h: int
    stride_w: int
    # the bias add that follows, taken into the call: its position in the root
    # block's body, the (1, K, 1, 1) bias, and the convolution's own output
    # (a root allocation then dropped; ``out`` is the add's output)
    bias_index: int | None = None
    bias: object | None = None
    conv_buffer: object | None = None
    # the activation after the bias add, taken into the call: its position,
    # its bounds (lo, hi, which: bit 0 lo applies, bit 1 hi), and the bias
    # add's output (a root allocation then dropped; ``out`` is the activation's)
    act_index: int | None = None
    bounds: tuple[float, float, int] | None = None
    bias_buffer: object | None = None

    @property
    def absorbed(self) -> list[int]:
        """Positions of the loop nests the call replaces besides the convolution's
        (its padding, bias add and activation)."""
        return [i for i in (self.pad_index, self.bias_index, self.act_index) if i is not None]

    @property
    def extern_name(self) -> str:
        if self.bounds is not None:
            return EXTERN_CLAMP_NAME
        return EXTERN_NAME if self.bias is None else EXTERN_BIAS_NAME

    @property
    def reads(self) -> list:
        """The buffers the call reads: the input, the weights, the bias if any."""
        return [self.data, self.weight] + ([self.bias] if self.bias is not None else [])

    def extern_args(self):
        ints = (
            self.n, self.c, self.h, self.w, self.k, self.r, self.s,
            self.pad_top, self.pad_left, self.pad_bottom, self.pad_right,
            self.stride_h, self.stride_w,
        )  # fmt: skip
        buffers = (self.data, self.weight, self.out)
        if self.bias is not None:
            buffers = (self.data, self.weight, self.bias, self.out)
        bounds = []
        if self.bounds is not None:
            lo, hi, which = self.bounds
            bounds = [tirx.const(lo, "float32"), tirx.const(hi, "float32")]
            bounds.append(tirx.const(which, "int32"))
        ints = [tirx.const(v, "int32") for v in ints]
        return [data_pointer(b) for b in buffers] + bounds + ints


# ---------------------------------------------------------------- helpers


def _int(expr) -> int:
    if isinstance(expr, int):
        return expr
    if isinstance(expr, tirx.IntImm):
        return int(expr.value)
    raise _NoMatch(f"not a constant: {expr}")


def _dtype(obj) -> str:
    dt = getattr(obj, "dtype", None)
    if dt is None:
        dt = obj.ty
    return str(dt)


def _is_zero_float(expr) -> bool:
    return isinstance(expr, tirx.FloatImm) and float(expr.value) == 0.0


def _unwrap_loops(stmt):
    """A perfect nest of plain serial loops ending in one SBlockRealize."""
    nest = perfect_nest(stmt)
    if nest is None:
        raise _NoMatch("loop nest does not end in a block")
    for loop in nest[0]:
        if int(loop.kind) != int(tirx.ForKind.SERIAL) or loop.annotations:
            raise _NoMatch("loop is not a plain serial loop")
        if _int(loop.min) != 0:
            raise _NoMatch("loop does not start at 0")
    return nest


def _check_trivial_binding(loops, realize):
    block = realize.block
    if not (isinstance(realize.predicate, tirx.IntImm) and int(realize.predicate.value) == 1):
        raise _NoMatch("block has a predicate")
    if len(loops) != len(block.iter_vars) or len(realize.iter_values) != len(loops):
        raise _NoMatch("block is not bound one loop per iterator")
    for loop, iv, val in zip(loops, block.iter_vars, realize.iter_values):
        if not val.same_as(loop.loop_var):
            raise _NoMatch("block iterator not bound to its loop")
        if _int(iv.dom.min) != 0 or _int(iv.dom.extent) != _int(loop.extent):
            raise _NoMatch("block iterator domain differs from its loop")
    if block.match_buffers or block.alloc_buffers:
        raise _NoMatch("block has match/alloc buffers")


def _static_shape(buf) -> list[int]:
    return [_int(d) for d in buf.shape]


def _check_dense_f32_4d(buf, what):
    if not is_buffer(buf):
        raise _NoMatch(f"{what} is not a buffer")
    if _dtype(buf) != "float32":
        raise _NoMatch(f"{what} is not float32")
    if len(buf.shape) != 4:
        raise _NoMatch(f"{what} is not 4-D")
    _static_shape(buf)
    if len(buf.strides) != 0:
        raise _NoMatch(f"{what} is strided")
    if _int(buf.elem_offset) != 0:
        raise _NoMatch(f"{what} has an element offset")
    if buf.scope() not in ("global", ""):
        raise _NoMatch(f"{what} is not in global memory")


def _same_vars(indices, ivs) -> bool:
    return len(indices) == len(ivs) and all(
        isinstance(i, tirx.Var) and i.same_as(v) for i, v in zip(indices, ivs)
    )


def _linear(expr, var_list):
    coeffs = detect_linear_equation(expr, var_list)
    if len(coeffs) != len(var_list) + 1:
        raise _NoMatch(f"index not linear: {expr}")
    return [_int(c) for c in coeffs]


def _conjuncts(cond):
    if isinstance(cond, tirx.And):
        return _conjuncts(cond.a) + _conjuncts(cond.b)
    return [cond]


def _interval_of(cond, ivars, extents):
    """Intersect, per iterator, the intervals the conjunction of simple
    comparisons ``const <op> var`` / ``var <op> const`` allows; returns a list
    of [lo, hi) (starting from the iterators' full domain)."""
    ranges = [[0, e] for e in extents]
    for cj in _conjuncts(cond):
        if not isinstance(cj, tirx.LE | tirx.LT | tirx.GE | tirx.GT):
            raise _NoMatch(f"unsupported padding condition: {cj}")
        a, b = cj.a, cj.b
        op = type(cj)
        # normalise to `var <op> const`
        if isinstance(b, tirx.Var) and not isinstance(a, tirx.Var):
            a, b = b, a
            op = {tirx.LE: tirx.GE, tirx.LT: tirx.GT, tirx.GE: tirx.LE, tirx.GT: tirx.LT}[op]
        idx = next(
            (i for i, v in enumerate(ivars) if isinstance(a, tirx.Var) and a.same_as(v)), None
        )
        if idx is None:
            raise _NoMatch(f"padding condition on an unknown variable: {cj}")
        c = _int(b)
        lo, hi = ranges[idx]
        if op is tirx.LE:  # v <= c
            hi = min(hi, c + 1)
        elif op is tirx.LT:  # v < c
            hi = min(hi, c)
        elif op is tirx.GE:  # v >= c
            lo = max(lo, c)
        else:  # v > c
            lo = max(lo, c + 1)
        ranges[idx] = [lo, hi]
    return ranges


# ---------------------------------------------------------------- matching


def _match_conv_block(loops, realize):
    """The reduction block of a conv2d; returns (A, W, O, numbers)."""
    _check_trivial_binding(loops, realize)
    block = realize.block
    ivs = [iv.var for iv in block.iter_vars]
    types = [int(iv.iter_type) for iv in block.iter_vars]
    if types != [_DATA_PAR] * 4 + [_COMM_REDUCE] * 3:
        raise _NoMatch("not an SSSSRRR block")
    vn, vf, vy, vx, vc, vr, vs = ivs
    ext = [_int(iv.dom.extent) for iv in block.iter_vars]

    init, store = block.init, block.body
    if not isinstance(init, tirx.BufferStore) or not isinstance(store, tirx.BufferStore):
        raise _NoMatch("not a single init + update store")
    out = store.buffer
    if not init.buffer.same_as(out) or not _same_vars(init.indices, ivs[:4]):
        raise _NoMatch("init does not write the output")
    if not _is_zero_float(init.value):
        raise _NoMatch("init is not 0.0")
    if not _same_vars(store.indices, ivs[:4]):
        raise _NoMatch("output not indexed [n, k, y, x]")
    val = store.value
    if not isinstance(val, tirx.Add):
        raise _NoMatch("update is not an accumulation")
    acc, prod = val.a, val.b
    if not isinstance(acc, Load):
        acc, prod = prod, acc
    if not (
        isinstance(acc, Load) and buffer_of(acc).same_as(out) and _same_vars(acc.indices, ivs[:4])
    ):
        raise _NoMatch("update does not read the accumulator")
    if not isinstance(prod, tirx.Mul):
        raise _NoMatch("update is not a product")
    loads = [prod.a, prod.b]
    if not all(isinstance(x, Load) for x in loads):
        raise _NoMatch("product operands are not plain loads (cast, scale, ...)")
    # weight: [ff, rc, ry, rx]; data: [nn, rc, yy*sh + ry*dh, xx*sw + rx*dw]
    if _same_vars(loads[0].indices, [vf, vc, vr, vs]):
        wload, aload = loads
    elif _same_vars(loads[1].indices, [vf, vc, vr, vs]):
        aload, wload = loads
    else:
        raise _NoMatch("weight not indexed [k, c, r, s] (layout or groups)")
    a_idx = aload.indices
    if len(a_idx) != 4 or not _same_vars([a_idx[0], a_idx[1]], [vn, vc]):
        raise _NoMatch("data not indexed [n, c, ...] (layout or groups)")
    sh, dh, *others_h, base_h = _linear(a_idx[2], [vy, vr, vn, vf, vx, vc, vs])
    sw, dw, *others_w, base_w = _linear(a_idx[3], [vx, vs, vn, vf, vy, vc, vr])
    if any(others_h) or any(others_w):
        raise _NoMatch("spatial index depends on other iterators")
    if dh != 1 or dw != 1:
        raise _NoMatch("dilation != 1")
    if sh < 1 or sw < 1 or base_h != 0 or base_w != 0:
        raise _NoMatch("unexpected stride/offset")

    A, Wt = buffer_of(aload), buffer_of(wload)
    for buf, what in ((A, "data"), (Wt, "weight"), (out, "output")):
        _check_dense_f32_4d(buf, what)
    if A.same_as(out) or Wt.same_as(out):
        raise _NoMatch("output aliases an input")
    n, k, oh, ow, c, r, s = ext
    if _static_shape(out) != [n, k, oh, ow]:
        raise _NoMatch("output shape differs from the loop extents")
    if _static_shape(Wt) != [k, c, r, s]:
        raise _NoMatch("weight shape differs from the loop extents (groups?)")
    a_shape = _static_shape(A)
    if a_shape[0] != n or a_shape[1] != c:
        raise _NoMatch("data batch/channels differ from the loop extents (groups?)")
    return A, Wt, out, dict(n=n, k=k, oh=oh, ow=ow, c=c, r=r, s=s, sh=sh, sw=sw)


def _match_pad_block(loops, realize, pad_buf):
    """The block that writes pad_buf = zero-padded copy of some X; returns
    (X, pad_top, pad_left)."""
    _check_trivial_binding(loops, realize)
    block = realize.block
    ivs = [iv.var for iv in block.iter_vars]
    if [int(iv.iter_type) for iv in block.iter_vars] != [_DATA_PAR] * 4:
        raise _NoMatch("pad block is not SSSS")
    if block.init is not None:
        raise _NoMatch("pad block has an init")
    store = block.body
    if not (
        isinstance(store, tirx.BufferStore)
        and store.buffer.same_as(pad_buf)
        and _same_vars(store.indices, ivs)
    ):
        raise _NoMatch("pad block does not write pad_temp[i0, i1, i2, i3]")
    ext = _static_shape(pad_buf)
    val = store.value
    if isinstance(val, Load):
        cond_ranges = [[0, e] for e in ext]
        load = val
    elif (
        isinstance(val, Call)
        and isinstance(val.op, tvm.ir.Op)
        and val.op.name.endswith("if_then_else")
        and len(val.args) == 3
        and isinstance(val.args[1], Load)
        and _is_zero_float(val.args[2])
    ):
        load = val.args[1]
        cond_ranges = _interval_of(val.args[0], ivs, ext)
    else:
        raise _NoMatch("pad value is not if_then_else(cond, x[...], 0.0)")
    X = buffer_of(load)
    _check_dense_f32_4d(X, "pad source")
    idx = load.indices
    if len(idx) != 4 or not _same_vars([idx[0], idx[1]], ivs[:2]):
        raise _NoMatch("padding on batch/channel axes")
    ch, *others_h, off_h = _linear(idx[2], [ivs[2], ivs[0], ivs[1], ivs[3]])
    cw, *others_w, off_w = _linear(idx[3], [ivs[3], ivs[0], ivs[1], ivs[2]])
    if any(others_h) or any(others_w):
        raise _NoMatch("pad index depends on other iterators")
    if ch != 1 or cw != 1 or off_h > 0 or off_w > 0:
        raise _NoMatch("pad source not indexed [i0, i1, i2 - pt, i3 - pl]")
    pt, pl = -off_h, -off_w
    xn, xc, xh, xw = _static_shape(X)
    if [xn, xc] != ext[:2]:
        raise _NoMatch("pad changes batch/channels")
    # exactly the rows/columns of X are copied, the rest is 0
    if cond_ranges[0] != [0, ext[0]] or cond_ranges[1] != [0, ext[1]]:
        raise _NoMatch("padding condition on batch/channel axes")
    if cond_ranges[2] != [pt, pt + xh] or cond_ranges[3] != [pl, pl + xw]:
        raise _NoMatch("padding condition does not match the source offsets")
    pb, pr = ext[2] - xh - pt, ext[3] - xw - pl
    if pb < 0 or pr < 0:
        raise _NoMatch("negative padding (a crop)")
    return X, pt, pl, pb, pr


def _elementwise_store(loops, realize):
    """The store of a block over [n, k, h, w] that writes ``out[n, k, h, w]`` (a bias
    add's, an activation's), and the block's four iteration variables."""
    _check_trivial_binding(loops, realize)
    block = realize.block
    ivs = [iv.var for iv in block.iter_vars]
    if [int(iv.iter_type) for iv in block.iter_vars] != [_DATA_PAR] * 4 or block.init is not None:
        raise _NoMatch("not an SSSS block")
    store = block.body
    if not (isinstance(store, tirx.BufferStore) and _same_vars(store.indices, ivs)):
        raise _NoMatch("does not write out[n, k, h, w]")
    return store, ivs


def _match_bias_block(loops, realize, conv_out):
    """The block ``y[n, k, h, w] = conv_out[n, k, h, w] + b[0, k, 0, 0]`` (either
    order) of a (1, K, 1, 1) float32 bias; returns (b, y)."""
    store, ivs = _elementwise_store(loops, realize)
    val = store.value
    if not isinstance(val, tirx.Add) or not all(isinstance(x, Load) for x in (val.a, val.b)):
        raise _NoMatch("not a sum of two loads")
    conv, bias = (val.a, val.b) if buffer_of(val.a).same_as(conv_out) else (val.b, val.a)
    if not (buffer_of(conv).same_as(conv_out) and _same_vars(conv.indices, ivs)):
        raise _NoMatch("does not read the convolution at [n, k, h, w]")
    b, y = buffer_of(bias), store.buffer
    _check_dense_f32_4d(b, "bias")
    _check_dense_f32_4d(y, "bias add output")
    k = _static_shape(conv_out)[1]
    if _static_shape(b) != [1, k, 1, 1] or _static_shape(y) != _static_shape(conv_out):
        raise _NoMatch("not a (1, K, 1, 1) bias")
    idx = bias.indices
    if not (len(idx) == 4 and isinstance(idx[1], tirx.Var) and idx[1].same_as(ivs[1])):
        raise _NoMatch("bias not indexed by the channel")
    ones = [v for v, e in zip(ivs, _static_shape(y)) if e == 1]  # an axis of extent 1
    for i in (idx[0], idx[2], idx[3]):
        if not ((isinstance(i, tirx.IntImm) and int(i) == 0) or any(i.same_as(v) for v in ones)):
            raise _NoMatch("bias indexed by more than the channel")
    if y.same_as(b) or y.same_as(conv_out):
        raise _NoMatch("bias add in place")
    return b, y


def _bounds_of(value, src, ivs) -> tuple[float, float, int]:
    """``value`` as max/min with float constants around ``src[n, k, h, w]``:
    (lo, hi, which), ``which`` bit 0 when a lower bound applies, bit 1 an upper
    (an infinite bound does not). The kernel applies max(v, lo) then min(v, hi),
    which is ``value`` in either order of the two when lo <= hi."""
    lo, hi, which, seen = 0.0, 0.0, 0, 0
    while isinstance(value, (tirx.Max, tirx.Min)):
        a, b = value.a, value.b
        const, inner = (a, b) if isinstance(a, tirx.FloatImm) else (b, a)
        if not isinstance(const, tirx.FloatImm) or _dtype(const) != "float32":
            raise _NoMatch("not bounded by a float32 constant")
        bound, bit = float(const.value), 1 if isinstance(value, tirx.Max) else 2
        if bound != bound or bound == (float("inf") if bit == 1 else float("-inf")):
            raise _NoMatch("a NaN bound, or one that leaves a constant")
        if seen & bit:
            raise _NoMatch("two lower or two upper bounds")
        seen |= bit
        if abs(bound) != float("inf"):  # max(v, -inf), min(v, inf): no bound
            lo, hi = (bound, hi) if bit == 1 else (lo, bound)
            which |= bit
        value = inner
    if not (isinstance(value, Load) and buffer_of(value).same_as(src)):
        raise _NoMatch("does not bound the bias add's output")
    if not _same_vars(value.indices, ivs):
        raise _NoMatch("does not read the bias add at [n, k, h, w]")
    if which == 3 and lo > hi:
        raise _NoMatch("empty bounds")
    return lo, hi, which


def _match_act_block(loops, realize, src):
    """The block ``z[n, k, h, w] = max(min(src[n, k, h, w], hi), lo)`` (either
    bound alone too: a ReLU is ``max(src, 0)``); returns ((lo, hi, which), z)."""
    store, ivs = _elementwise_store(loops, realize)
    bounds = _bounds_of(store.value, src, ivs)
    z = store.buffer
    _check_dense_f32_4d(z, "activation output")
    if _static_shape(z) != _static_shape(src) or z.same_as(src):
        raise _NoMatch("activation in place or of another shape")
    return bounds, z


def _reads_writes(stmt):
    """Buffers named in the reads/writes of every block under stmt."""
    out = []
    try:
        _, realize = _unwrap_loops(stmt)
    except _NoMatch:
        return None
    for region in list(realize.block.reads) + list(realize.block.writes):
        out.append(buffer_of(region))
    return out


def _only_reader(stmts, i: int, out, allocs, match):
    """What ``match`` finds in the block right after the one at ``i``, when
    that block is the only other one that touches ``out``, an intermediate;
    None otherwise."""
    if i + 1 >= len(stmts) or not any(out.same_as(b) for b in allocs):
        return None
    try:
        loops, realize = _unwrap_loops(stmts[i + 1])
        found = match(loops, realize, out)
    except _NoMatch:
        return None
    for j, other in enumerate(stmts):
        if j in (i, i + 1):
            continue
        used = _reads_writes(other)
        if used is None or any(out.same_as(u) for u in used):
            return None
    return found


def _bias_after(stmts, i: int, out, allocs) -> dict:
    """The bias add right after the convolution at ``i``, and the activation
    after it, as ConvMatch's fields, when the convolution's output is an
    intermediate nothing else reads."""
    found = _only_reader(stmts, i, out, allocs, _match_bias_block)
    if found is None:
        return {"out": out}
    b, y = found
    fields = {"out": y, "bias_index": i + 1, "bias": b, "conv_buffer": out}
    return {**fields, **_act_after(stmts, i + 1, y, allocs)}


def _act_after(stmts, i: int, out, allocs) -> dict:
    """The activation right after the bias add at ``i``, as ConvMatch's fields,
    when the bias add's output is an intermediate nothing else reads."""
    found = _only_reader(stmts, i, out, allocs, _match_act_block)
    if found is None:
        return {}
    bounds, z = found
    return {"out": z, "act_index": i + 1, "bounds": bounds, "bias_buffer": out}


def match_conv2d(func) -> list[ConvMatch]:
    """All the convolutions of ``func`` that ``conv2d_to_extern`` would
    replace (an empty list when there is none or the function is not the
    unscheduled S-TIR LegalizeOps emits)."""
    root = root_block(func)
    if root is None:
        return []
    stmts = root.stmts
    allocs = list(root.block.alloc_buffers)
    params = [b for b in param_buffers(func) if b is not None]
    matches = []
    for i, stmt in enumerate(stmts):
        try:
            loops, realize = _unwrap_loops(stmt)
            A, Wt, out, d = _match_conv_block(loops, realize)
            for buf in (A, Wt, out):
                if not any(buf.same_as(b) for b in params + allocs):
                    raise _NoMatch("buffer is neither a parameter nor a root allocation")
            pad_index = pad_buf = None
            if any(A.same_as(b) for b in allocs):
                # A must be the pad_temp written by the loop nest just before,
                # and read by no other block.
                if i == 0:
                    raise _NoMatch("conv input is an intermediate not written just before")
                ploops, prealize = _unwrap_loops(stmts[i - 1])
                X, pt, pl, pb, pr = _match_pad_block(ploops, prealize, A)
                for j, other in enumerate(stmts):
                    if j in (i, i - 1):
                        continue
                    used = _reads_writes(other)
                    if used is None or any(A.same_as(b) for b in used):
                        raise _NoMatch("pad_temp used elsewhere")
                pad_index, pad_buf = i - 1, A
            else:
                X, pt, pl, pb, pr = A, 0, 0, 0, 0
            n, c, h, w = _static_shape(X)
            if X.same_as(out) or Wt.same_as(out):
                raise _NoMatch("output aliases an input")
            # the kernel derives the output size from these numbers
            if (h + pt + pb - d["r"]) // d["sh"] + 1 != d["oh"] or (w + pl + pr - d["s"]) // d[
                "sw"
            ] + 1 != d["ow"]:
                raise _NoMatch("output size does not follow from shape/padding/stride")
            if h + pt + pb < d["r"] or w + pl + pr < d["s"]:
                raise _NoMatch("kernel larger than the padded input")
            if max(n, c, h, w, d["k"], d["r"], d["s"], pt, pl, pb, pr) >= 2**31:
                raise _NoMatch("sizes exceed int32")
            bias = _bias_after(stmts, i, out, allocs)
            matches.append(
                ConvMatch(
                    conv_index=i,
                    pad_index=pad_index,
                    pad_buffer=pad_buf,
                    data=X,
                    weight=Wt,
                    n=n,
                    c=c,
                    h=h,
                    w=w,
                    k=d["k"],
                    r=d["r"],
                    s=d["s"],
                    pad_top=pt,
                    pad_left=pl,
                    pad_bottom=pb,
                    pad_right=pr,
                    stride_h=d["sh"],
                    stride_w=d["sw"],
                    **bias,
                )
            )
        except _NoMatch:
            continue
    return matches


# ---------------------------------------------------------------- rewriting


def _read_by_loops(buf, stmts, skip: set[int]) -> bool:
    """Whether a loop nest of ``stmts`` (other than those at ``skip``) reads or writes ``buf``."""
    for i, stmt in enumerate(stmts):
        if i in skip:
            continue
        named = _reads_writes(stmt)
        if named is None or any(b.same_as(buf) for b in named):
            return True  # a statement that is not a plain nest: assume it does
    return False


def _through_first_element(buf) -> bool:
    """Whether the extern call reaches ``buf`` through the address of its first
    element rather than through its data pointer: where ``buf.data`` is a handle
    variable (TVM 0.25), as :func:`umahub.plugin.data_pointer` decides."""
    return isinstance(buf.data, tirx.Var)


def _kept(matches: list[ConvMatch], root, stmts) -> list[ConvMatch]:
    """The matches whose output buffer stays whole in the generated code.

    On TVM 0.25 an intermediate buffer that only extern calls touch is reached
    through the address of its first element (:func:`_through_first_element`),
    and buffer compaction then sizes it to that one element (``float
    conv2d_nchw[1];``): the next call writes past it. There such a convolution
    keeps its loop nest, which writes the buffer as TIR and so keeps it whole;
    the extern call reads it. Where the call takes the buffer's data pointer
    (0.26, 0.27) the buffer stays whole, and every match is kept: a partition
    of two convolutions (a residual block's) runs both as calls.
    """
    allocated = list(root.alloc_buffers)
    rewritten = {i for m in matches for i in (m.conv_index, *m.absorbed)}
    kept = []
    for m in matches:
        intermediate = any(m.out.same_as(b) for b in allocated)
        if (
            intermediate
            and _through_first_element(m.out)
            and not _read_by_loops(m.out, stmts, rewritten)
        ):
            continue
        kept.append(m)
    return kept


def rewrite_conv2d(func):
    """``func`` with every recognised convolution replaced by the extern call
    (``func`` itself when there is none)."""
    matches = match_conv2d(func)
    if not matches:
        return func
    root = root_block(func)
    matches = _kept(matches, root.block, root.stmts)
    if not matches:
        return func
    replace = {
        m.conv_index: extern_block(m.extern_name, m.extern_args(), m.reads, [m.out])
        for m in matches
    }
    drop = {i for m in matches for i in m.absorbed}
    dropped_bufs = [
        b for m in matches for b in (m.pad_buffer, m.conv_buffer, m.bias_buffer) if b is not None
    ]
    stmts = [replace.get(i, s) for i, s in enumerate(root.stmts) if i not in drop]
    allocs = [b for b in root.block.alloc_buffers if not any(b.same_as(d) for d in dropped_bufs)]
    return with_root_body(func, stmts, allocs)


def conv2d_to_extern() -> tvm.transform.Pass:
    """Phase-0 TIR pass: replace LegalizeOps' pad + conv2d_nchw loop nests by
    ``T.call_extern("int32", "vanilla_conv2d_nchw", ...)``; everything it
    does not recognise is left unchanged."""

    def _transform(func, _mod, _ctx):
        return rewrite_conv2d(func)

    return tirx.transform.prim_func_pass(
        _transform, opt_level=0, name="umahub_vanilla.Conv2dToExtern"
    )
