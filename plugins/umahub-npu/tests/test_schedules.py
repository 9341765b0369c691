"""Tests of umahub_npu.schedules: strategy recognition and numbers against numpy."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
from tvm import relax, s_tir  # noqa: E402
from tvm.script import relax as R  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from umahub_npu import schedules  # noqa: E402

from umahub.plugin import host_target  # noqa: E402

TARGET = host_target()
RNG = np.random.default_rng(0)


def primfunc_from_relax(inputs, body) -> tvm.IRModule:
    """The PrimFunc umahub hands to the schedule hook: LegalizeOps, AnnotateTIROpPattern,
    FuseOps, FuseTIR of a Relax function, the one fused PrimFunc as "main"."""
    bb = relax.BlockBuilder()
    # R.Tensor: TensorType in apache-tvm 0.26/0.27, TensorStructInfo in 0.25
    params = [relax.Var(n, R.Tensor(s, "float32")) for n, s in inputs]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *params))
        bb.emit_func_output(out)
    mod = tvm.transform.Sequential(
        [
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
        ]
    )(bb.get())
    prims = [f for _, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(prims) == 1
    return tvm.IRModule({"main": prims[0].with_attr("global_symbol", "main")})


def run(mod, args, out_shape):
    f = tvm.tirx.build(mod, target=tvm.target.Target(TARGET))["main"]
    targs = [tvm.runtime.tensor(a) for a in args]
    out = tvm.runtime.tensor(np.zeros(out_shape, np.float32))
    f(*targs, out)
    return out.numpy()


def schedule_and_run(mod, args, out_shape, **kw):
    sch = s_tir.Schedule(mod)
    name = schedules.schedule(sch, **kw)
    return name, run(sch.mod, args, out_shape)


def close(got, ref):
    scale = float(np.abs(ref).max()) or 1.0
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * scale)


def f32(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def gelu(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


# ----------------------------------------------------------------- matmul


@pytest.mark.parametrize(
    "M,K,N,act",
    [(32, 64, 48, "relu"), (24, 96, 64, "gelu"), (16, 40, 32, None), (7, 13, 5, "relu")],
)
def test_dense_bias_activation(M, K, N, act):
    def body(bb, x, w, b):
        y = bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, w)), b))
        if act == "relu":
            y = bb.emit(relax.op.nn.relu(y))
        elif act == "gelu":
            y = bb.emit(relax.op.nn.gelu(y))
        return y

    mod = primfunc_from_relax([("x", (M, K)), ("w", (K, N)), ("b", (N,))], body)
    x, w, b = f32(M, K), f32(K, N, scale=1 / math.sqrt(K)), f32(N)
    ref = x.astype(np.float64) @ w + b
    ref = np.maximum(ref, 0) if act == "relu" else gelu(ref) if act == "gelu" else ref
    name, got = schedule_and_run(mod, [x, w, b], (M, N))
    assert name == "matmul"
    close(got, ref)


@pytest.mark.parametrize("K, steps", [(64, (16, 4)), (36, (9, 4)), (30, (30,))])
def test_the_matmul_micro_kernel_unrolls_its_reduction_steps_four_at_a_time(K, steps):
    """k1 (the steps of one k-tile) in pieces of four, unrolled; a tile that four
    does not divide keeps its step loop. The register tile (8 rows x 2 vectors
    with AVX-512's lanes) stays innermost."""
    mod = primfunc_from_relax(
        [("x", (32, K)), ("w", (K, 64))], lambda bb, x, w: relax.op.matmul(x, w)
    )
    sch = s_tir.Schedule(mod)
    assert schedules.schedule(sch, lanes=16, threads=2) == "matmul"
    kinds = {0: "serial", 1: "parallel", 2: "vectorized", 3: "unrolled"}
    update = next(
        b for b in sch.get_child_blocks(sch.get_sblock("root")) if "update" in sch.get(b).name_hint
    )
    loops = [(kinds[int(sch.get(l).kind)], int(sch.get(l).extent)) for l in sch.get_loops(update)]
    micro = [("unrolled", 8), ("vectorized", 32)]
    want = [("serial", steps[0])] + ([("unrolled", 4)] if len(steps) == 2 else []) + micro
    assert loops[-len(want) :] == want
    x, w = f32(32, K), f32(K, 64)
    close(run(sch.mod, [x, w], (32, 64)), x.astype(np.float64) @ w)


def test_plain_matmul_gets_accumulator_and_tiny_sram():
    # no epilogue: the schedule adds a cache_write accumulator; a scratchpad of
    # 4 KiB forces the smallest tiles and must still be correct
    mod = primfunc_from_relax(
        [("x", (32, 64)), ("w", (64, 32))], lambda bb, x, w: relax.op.matmul(x, w)
    )
    x, w = f32(32, 64), f32(64, 32)
    for sram in (256 * 1024, 4 * 1024):
        name, got = schedule_and_run(mod, [x, w], (32, 32), sram_bytes=sram, threads=2)
        assert name == "matmul"
        close(got, x.astype(np.float64) @ w)


@pytest.mark.parametrize(
    "a_shape,b_shape", [((1, 2, 16, 8), (1, 2, 8, 16)), ((2, 16, 32), (2, 32, 8))]
)
def test_batched_matmul(a_shape, b_shape):
    mod = primfunc_from_relax(
        [("a", a_shape), ("b", b_shape)], lambda bb, a, b: relax.op.matmul(a, b)
    )
    a, b = f32(*a_shape), f32(*b_shape)
    ref = a.astype(np.float64) @ b
    name, got = schedule_and_run(mod, [a, b], ref.shape)
    assert name == "matmul"
    close(got, ref)


@pytest.mark.parametrize(
    "a_shape,b_shape,padded",
    [
        ((1, 3, 197, 64), (1, 3, 64, 197), {"a_pad", "b_pad"}),  # ViT: 197 tokens, a prime
        ((1, 2, 196, 32), (1, 2, 32, 196), {"b_pad"}),  # 196 rows: 4 | 196; columns: 28-wide
        ((37, 48), (48, 53), {"a_pad", "b_pad"}),  # both odd
    ],
)
def test_sizes_no_tile_divides_are_padded_not_scalar(a_shape, b_shape, padded):
    mod = primfunc_from_relax(
        [("a", a_shape), ("b", b_shape)], lambda bb, a, b: relax.op.matmul(a, b)
    )
    sch = s_tir.Schedule(mod)
    assert schedules.schedule(sch) == "matmul"
    # the zero-padded copies of the inputs are stages of their own, so that the
    # micro-kernel runs whole vectors and the B panels are packed again
    names = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))}
    assert {n for n in names if n.endswith("_pad")} == padded
    assert ("b_pad_global" in names) == ("b_pad" in names)
    a, b = f32(*a_shape), f32(*b_shape)
    close(run(sch.mod, [a, b], (a @ b).shape), a.astype(np.float64) @ b)


@pytest.mark.parametrize(
    "M, lanes, tiles",
    [
        (200, 16, (40, 8)),  # ViT's 197 rows, padded: 8 x 2 vectors, 40-row tiles
        (128, 16, (32, 8)),  # BERT's 128 tokens
        (200, 8, (20, 4)),  # 16 registers: 4 rows of accumulators
        (8, 16, (8, 4)),  # no tile of 16 rows or more: packing B would not pay
    ],
)
def test_the_register_tile_is_eight_rows_where_avx512_has_the_registers(M, lanes, tiles):
    ti, tj, tk, mr, nr = schedules.matmul_tiles(1, M, 3072, 768, lanes, 256 * 1024, threads=2)
    assert (ti, mr) == tiles
    assert nr == 2 * lanes


@pytest.mark.parametrize(
    ("packs_b", "rows"),
    [
        (True, 128),  # attention's q @ k^T: B packed by each task, for all 128 rows
        (False, 32),  # a constant B is packed once: row tiles as for any matmul
    ],
)
def test_a_matmul_whose_tasks_pack_b_takes_more_rows_per_tile(packs_b, rows):
    ti, tj, tk, mr, nr = schedules.matmul_tiles(
        12, 128, 128, 64, 16, 256 * 1024, threads=2, packs_b=packs_b
    )
    assert (ti, tj, tk) == (rows, 128, 64)


def test_a_batched_matmul_of_two_computed_tensors_packs_b_per_tile_of_whole_columns():
    def body(bb, a, b):
        return bb.emit(relax.op.matmul(a, b))

    mod = primfunc_from_relax([("a", (4, 64, 32)), ("b", (4, 32, 48))], body)
    a, b = f32(4, 64, 32), f32(4, 32, 48)
    name, got = schedule_and_run(mod, [a, b], (4, 64, 48), lanes=16)
    assert name == "matmul"
    close(got, np.einsum("bmk,bkn->bmn", a.astype(np.float64), b))


def test_transposed_b_dense():
    # a dense with B stored [N, K] (as topi/te dense writes it): B is packed and transposed per tile
    from tvm import te

    M, K, N = 16, 32, 48
    A = te.placeholder((M, K), name="A")
    B = te.placeholder((N, K), name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[j, k], axis=k), name="T_dense")
    mod = tvm.IRModule({"main": te.create_prim_func([A, B, C]).with_attr("global_symbol", "main")})
    a, b = f32(M, K), f32(N, K)
    name, got = schedule_and_run(mod, [a, b], (M, N))
    assert name == "matmul"
    close(got, a.astype(np.float64) @ b.T)


# ----------------------------------------------------------------- conv2d


def conv_ref(x, w, b, s, p, groups):
    x, w = x.astype(np.float64), w.astype(np.float64)
    _, C, H, W = x.shape
    O, Cg, KH, KW = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    OH, OW = (H + 2 * p - KH) // s + 1, (W + 2 * p - KW) // s + 1
    out = np.zeros((1, O, OH, OW))
    og = O // groups
    for g in range(groups):
        xs = xp[:, g * Cg : (g + 1) * Cg]
        for kh in range(KH):
            for kw in range(KW):
                patch = xs[:, :, kh : kh + s * OH : s, kw : kw + s * OW : s]
                out[:, g * og : (g + 1) * og] += np.einsum(
                    "nchw,oc->nohw", patch, w[g * og : (g + 1) * og, :, kh, kw]
                )
    return np.maximum(out + b, 0)


@pytest.mark.parametrize(
    "C,H,O,k,s,p,groups,expect",
    [
        (8, 10, 16, 3, 1, 1, 1, "conv2d"),
        (3, 20, 16, 7, 2, 3, 1, "conv2d"),  # ResNet stem shape, small
        (16, 7, 32, 3, 1, 1, 1, "conv2d"),  # 7x7 output: 7-position micro-kernel
        (8, 9, 8, 1, 1, 0, 1, "conv2d"),  # 1x1
        (8, 12, 16, 3, 1, 1, 2, "conv2d"),  # grouped
        (8, 12, 8, 3, 1, 1, 8, "depthwise"),
        (16, 15, 16, 3, 2, 1, 16, "depthwise"),  # strided depthwise
    ],
)
def test_conv2d_bias_relu(C, H, O, k, s, p, groups, expect):
    def body(bb, x, w, b):
        y = bb.emit(relax.op.nn.conv2d(x, w, strides=s, padding=p, groups=groups))
        return bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(y, b))))

    mod = primfunc_from_relax(
        [("x", (1, C, H, H)), ("w", (O, C // groups, k, k)), ("b", (1, O, 1, 1))], body
    )
    x, w, b = f32(1, C, H, H), f32(O, C // groups, k, k, scale=0.3), f32(1, O, 1, 1)
    ref = conv_ref(x, w, b, s, p, groups)
    name, got = schedule_and_run(mod, [x, w, b], ref.shape)
    assert name == expect
    close(got, ref)


@pytest.mark.parametrize(
    "H, walk",
    [
        # 58 padded columns: the row read in order, each element to its phase
        # (LLVM's wide loads and shuffles), 2x faster than a vector per phase
        (56, [("serial", 29), ("unrolled", 2)]),
        # 16 padded columns, 8 per phase: a vector per phase is faster
        (14, [("serial", 2), ("vectorized", 8)]),
    ],
)
def test_a_strided_depthwise_pads_a_long_row_in_input_order_and_a_short_one_by_phase(H, walk):
    def body(bb, x, w, b):
        y = bb.emit(relax.op.nn.conv2d(x, w, strides=2, padding=1, groups=16))
        return bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(y, b))))

    inputs = [("x", (1, 16, H, H)), ("w", (16, 1, 3, 3)), ("b", (1, 16, 1, 1))]
    sch = s_tir.Schedule(primfunc_from_relax(inputs, body))
    assert schedules.schedule(sch, lanes=16) == "depthwise"
    kinds = {0: "serial", 1: "parallel", 2: "vectorized", 3: "unrolled"}
    loops = sch.get_loops(sch.get_sblock("pad_temp"))
    assert [(kinds[int(sch.get(l).kind)], int(sch.get(l).extent)) for l in loops[-2:]] == walk
    x, w, b = f32(1, 16, H, H), f32(16, 1, 3, 3, scale=0.3), f32(1, 16, 1, 1)
    close(run(sch.mod, [x, w, b], (1, 16, H // 2, H // 2)), conv_ref(x, w, b, 2, 1, 16))


def test_conv2d_channels_and_positions_no_vector_divides():
    # SqueezeNet's classifier: 1000 channels (8 divides it, 16 does not) on 13x13
    # positions (13 is prime): half vectors and a whole row per micro-kernel, not a
    # 1x25 tile of scalar code
    def body(bb, x, w, b):
        y = bb.emit(relax.op.nn.conv2d(x, w))
        return bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(y, b))))

    C, H, O = 16, 13, 40
    mod = primfunc_from_relax([("x", (1, C, H, H)), ("w", (O, C, 1, 1)), ("b", (1, O, 1, 1))], body)
    plan = schedules.plan(s_tir.Schedule(mod))
    tf, tp, tc, nr, mr = schedules.conv_tiles(plan, lanes=16, sram_bytes=256 * 1024, threads=2)
    assert (nr, mr) == (8, 13)
    x, w, b = f32(1, C, H, H), f32(O, C, 1, 1, scale=0.3), f32(1, O, 1, 1)
    name, got = schedule_and_run(mod, [x, w, b], (1, O, H, H))
    assert name == "conv2d"
    close(got, conv_ref(x, w, b, 1, 0, 1))


@pytest.mark.parametrize(
    ("H", "mr", "tp"),
    [
        # 105x105 positions (Inception's stem has 147x147): 9 a step would need tiles of
        # 3 rows, more than fit; its tiles shrank past whole rows to 9 positions,
        # ragged, and the epilogue read accumulators other tiles had not written
        # (wrong numbers). 7 divides a row: tiles of whole rows or parts of one
        (107, 7, 105),
        (77, 9, 225),  # 75x75: 9 a step fits tiles of 3 rows (225)
    ],
)
def test_conv2d_position_tiles_are_rectangles_of_the_output(H, mr, tp):
    def body(bb, x, w, b):
        y = bb.emit(relax.op.nn.conv2d(x, w))
        return bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(y, b))))

    C, O = 4, 32
    mod = primfunc_from_relax([("x", (1, C, H, H)), ("w", (O, C, 3, 3)), ("b", (1, O, 1, 1))], body)
    plan = schedules.plan(s_tir.Schedule(mod))
    tiles = schedules.conv_tiles(plan, lanes=16, sram_bytes=256 * 1024, threads=2)
    OW = H - 2
    assert tiles[4] == mr and tiles[1] == tp
    assert tp % mr == 0 and (tp % OW == 0 or OW % tp == 0)
    x, w, b = f32(1, C, H, H), f32(O, C, 3, 3, scale=0.3), f32(1, O, 1, 1)
    name, got = schedule_and_run(mod, [x, w, b], (1, O, OW, OW))
    assert name == "conv2d"
    close(got, conv_ref(x, w, b, 1, 0, 1))


@pytest.mark.parametrize(
    ("threads", "tiles"),
    [
        # 160 channels on 7x7: 5 tiles of 32 channels, of which one of two threads
        # runs 3; tiles of a row (35 tasks, 18 the longest share) take 18/21 of it
        (2, (32, 7)),
        (1, (32, 49)),  # one thread: nothing to share, the whole plane
        (5, (32, 49)),  # five tiles, one each
    ],
)
def test_conv2d_tiles_are_taken_smaller_where_the_threads_share_their_tasks_more_evenly(
    threads, tiles
):
    def body(bb, x, w):
        return bb.emit(relax.op.nn.conv2d(x, w))

    mod = primfunc_from_relax([("x", (1, 96, 7, 7)), ("w", (160, 96, 1, 1))], body)
    plan = schedules.plan(s_tir.Schedule(mod))
    tf, tp, *_ = schedules.conv_tiles(plan, lanes=16, sram_bytes=256 * 1024, threads=threads)
    assert (tf, tp) == tiles
    x, w = f32(1, 96, 7, 7), f32(160, 96, 1, 1, scale=0.3)
    name, got = schedule_and_run(mod, [x, w], (1, 160, 7, 7), lanes=16, threads=threads)
    assert name == "conv2d"
    close(got, np.einsum("nchw,oc->nohw", x, w[:, :, 0, 0]))


@pytest.mark.parametrize(
    ("kernel", "padding", "gate", "stages"),
    [
        # 14x14 positions: no whole vectors of them, so the implicit GEMM. An unpadded
        # convolution's "padding" is a copy of its input: read in place, where a
        # stage of its own took a pass over the input and a parallel launch
        (1, 0, False, []),
        (3, 0, False, []),
        (3, 1, False, ["pad_temp"]),  # a real padding keeps its stage
        # a gate stays a stage: read in place, each input is multiplied once per
        # vector of channels (measured slower)
        (1, 0, True, ["T_multiply"]),
    ],
)
def test_the_implicit_gemm_reads_an_unpadded_input_in_place(kernel, padding, gate, stages):
    from tvm import te, topi

    C, H, O = 16, 14, 32
    x, s, w, b = (
        te.placeholder(shape, name=name)
        for name, shape in (
            ("x", (1, C, H, H)),
            ("s", (1, C, 1, 1)),
            ("w", (O, C, kernel, kernel)),
            ("b", (1, O, 1, 1)),
        )
    )
    data = topi.multiply(x, s) if gate else x
    conv = topi.nn.conv2d_nchw(data, w, 1, padding, 1)
    out = topi.clip(topi.add(conv, b), 0.0, 6.0)
    prim = te.create_prim_func([x, s, w, b, out] if gate else [x, w, b, out])
    sch = s_tir.Schedule(tvm.IRModule({"main": prim}))
    assert schedules.schedule(sch, lanes=16) == "conv2d"
    blocks = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    assert [n for n in blocks if n.startswith(("pad_temp", "T_multiply"))] == stages
    x, s, b = f32(1, C, H, H), f32(1, C, 1, 1), f32(1, O, 1, 1)
    w = f32(O, C, kernel, kernel, scale=0.3)
    args = [x, s, w, b] if gate else [x, w, b]
    want = np.clip(conv_ref(x * s if gate else x, w, b, 1, padding, 1), 0, 6)
    close(run(sch.mod, args, want.shape), want)


@pytest.mark.parametrize(
    "lanes, C, H, O, gate, micro",
    [
        # positions in two vectors, 12 channels broadcast: 24 of AVX-512's 32 registers
        (16, 16, 16, 24, False, (12, 32)),
        # 40 channels: 10 rows of the register tile, no padding of channels
        (16, 8, 8, 40, False, (10, 32)),
        # 7x16 positions: one vector of positions, 16 channels
        (16, 8, 7, 16, False, (16, 16)),
        (8, 16, 16, 24, False, (6, 16)),  # AVX2's 16 registers: 12 accumulators
        # a squeeze-and-excitation gate, x * s[c]: multiplied as it is read
        (16, 16, 16, 32, True, (8, 32)),
    ],
)
def test_a_one_by_one_convolution_is_a_matmul_with_positions_in_vectors(
    lanes, C, H, O, gate, micro
):
    from tvm import te, topi

    W = 16 if H == 7 else H
    # as umahub fuses the npu's scaled-convolution pattern: one PrimFunc (Relax's
    # FuseOps would leave the gate out)
    x, s, w, b = (
        te.placeholder(shape, name=name)
        for name, shape in (
            ("x", (1, C, H, W)),
            ("s", (1, C, 1, 1)),
            ("w", (O, C, 1, 1)),
            ("b", (1, O, 1, 1)),
        )
    )
    data = topi.multiply(x, s) if gate else x
    out = topi.clip(topi.add(topi.nn.conv2d_nchw(data, w, 1, 0, 1), b), 0.0, 6.0)
    prim = te.create_prim_func([x, s, w, b, out] if gate else [x, w, b, out])
    mod = tvm.IRModule({"main": prim})
    sch = s_tir.Schedule(mod)
    assert schedules.schedule(sch, lanes=lanes) == "pointwise"
    kinds = {0: "serial", 1: "parallel", 2: "vectorized", 3: "unrolled"}
    conv = sch.get_sblock("conv2d_nchw_update")
    loops = [(kinds[int(sch.get(l).kind)], int(sch.get(l).extent)) for l in sch.get_loops(conv)]
    assert loops[0][0] == "parallel"
    assert loops[-2:] == [("unrolled", micro[0]), ("vectorized", micro[1])]
    # the input is read in place: no copy ("padding") and no separate gate stage
    blocks = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    assert not any(name.startswith(("pad_temp", "T_multiply")) for name in blocks), blocks
    x, s, w, b = f32(1, C, H, W), f32(1, C, 1, 1), f32(O, C, 1, 1, scale=0.3), f32(1, O, 1, 1)
    args = [x, s, w, b] if gate else [x, w, b]
    want = np.clip(np.einsum("nchw,oc->nohw", x * s if gate else x, w[:, :, 0, 0]) + b, 0, 6)
    close(run(sch.mod, args, want.shape), want)


@pytest.mark.parametrize(
    "C, sram, copied",
    [
        (72, 1 << 20, True),  # one reduction step over 72 channels 4 KiB apart: 72 pages
        (144, 320 << 10, True),  # two steps of 72
        (48, 1 << 20, False),  # 48 pages: read in place
    ],
)
def test_a_one_by_one_convolution_reading_more_pages_than_the_tlb_holds_copies_its_input_tile(
    C, sram, copied
):
    def body(bb, x, w, b):
        return bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(relax.op.nn.conv2d(x, w), b))))

    mod = primfunc_from_relax(
        [("x", (1, C, 32, 32)), ("w", (32, C, 1, 1)), ("b", (1, 32, 1, 1))], body
    )
    sch = s_tir.Schedule(mod)
    assert schedules.schedule(sch, lanes=16, sram_bytes=sram) == "pointwise"
    blocks = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    assert ("x_global" in blocks) is copied, blocks
    if copied:  # a tile's copy, in the parallel tasks, not one of the whole input
        first = sch.get_loops(sch.get_sblock("x_global"))[0]
        assert int(sch.get(first).kind) == 1  # parallel
    x, w, b = f32(1, C, 32, 32), f32(32, C, 1, 1, scale=0.3), f32(1, 32, 1, 1)
    want = np.maximum(np.einsum("nchw,oc->nohw", x, w[:, :, 0, 0]) + b, 0)
    close(run(sch.mod, [x, w, b], want.shape), want)
    assert schedules.input_pages(C, 32 * 32) == C
    assert schedules.input_pages(256, 28 * 28) == 196  # 256 rows 3136 bytes apart


@pytest.mark.parametrize(
    "H, stride, groups",
    [(9, 1, 1), (16, 2, 1), (16, 1, 2)],  # 81 positions, strided, grouped
)
def test_a_one_by_one_convolution_that_is_no_plain_matmul_stays_an_implicit_gemm(H, stride, groups):
    def body(bb, x, w):
        return bb.emit(relax.op.nn.conv2d(x, w, strides=stride, groups=groups))

    mod = primfunc_from_relax([("x", (1, 16, H, H)), ("w", (16, 16 // groups, 1, 1))], body)
    sch = s_tir.Schedule(mod)
    assert schedules.schedule(sch, lanes=16) == "conv2d"


def test_conv2d_clip_epilogue():
    def body(bb, x, w, b):
        y = bb.emit(relax.op.add(bb.emit(relax.op.nn.conv2d(x, w, padding=1)), b))
        return bb.emit(relax.op.clip(y, 0.0, 6.0))

    mod = primfunc_from_relax(
        [("x", (1, 8, 8, 8)), ("w", (16, 8, 3, 3)), ("b", (1, 16, 1, 1))], body
    )
    x, w, b = f32(1, 8, 8, 8), f32(16, 8, 3, 3), f32(1, 16, 1, 1)
    ref = np.clip(_conv_nobias(x, w) + b, 0, 6)
    name, got = schedule_and_run(mod, [x, w, b], ref.shape)
    assert name == "conv2d"
    close(got, ref)


def _conv_nobias(x, w):
    x, w = x.astype(np.float64), w.astype(np.float64)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    H = x.shape[2]
    return sum(
        np.einsum("nchw,oc->nohw", xp[:, :, kh : kh + H, kw : kw + H], w[:, :, kh, kw])
        for kh in range(3)
        for kw in range(3)
    )


# ----------------------------------------------------------------- sums


@pytest.mark.parametrize(
    "shape, axes, partial",
    [
        ((1, 96, 56, 56), [2, 3], True),  # 3136 = 196 vectors of 16
        ((2, 40, 7, 7), [2, 3], False),  # 49: no vector width divides it
        ((3, 64), [1], True),
    ],
)
def test_a_mean_over_the_last_axes_is_a_parallel_sum_in_vector_wide_partial_sums(
    shape, axes, partial
):
    mod = primfunc_from_relax([("x", shape)], lambda bb, x: relax.op.mean(x, axis=axes))
    sch = s_tir.Schedule(mod)
    assert schedules.schedule(sch, lanes=16) == "sum"
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    assert ("x_red_rf" in names) == partial
    x = f32(*shape)
    out_shape = shape[: len(shape) - len(axes)]
    close(run(sch.mod, [x], out_shape), x.mean(axis=tuple(axes)))


# ----------------------------------------------------------------- not recognised


def test_softmax_is_left_alone():
    mod = primfunc_from_relax([("x", (4, 32))], lambda bb, x: relax.op.nn.softmax(x))
    sch = s_tir.Schedule(mod)
    before = sch.mod
    assert schedules.schedule(sch) == "none"
    tvm.ir.assert_structural_equal(sch.mod, before)
    x = f32(4, 32)
    e = np.exp(x - x.max(-1, keepdims=True))
    close(run(sch.mod, [x], (4, 32)), e / e.sum(-1, keepdims=True))


@pytest.mark.parametrize(
    "inputs,body",
    [
        ([("x", (4, 8))], lambda bb, x: relax.op.sum(x, axis=[0])),  # not the last axis
        (
            [("x", (2, 4, 8))],
            lambda bb, x: relax.op.nn.layer_norm(
                x,
                relax.const(np.ones(8, np.float32)),
                relax.const(np.zeros(8, np.float32)),
                axes=[-1],
            ),
        ),
    ],
)
def test_other_functions_return_none(inputs, body):
    mod = primfunc_from_relax(inputs, body)
    sch = s_tir.Schedule(mod)
    assert schedules.schedule(sch) == "none"
    tvm.ir.assert_structural_equal(sch.mod, mod)


def test_a_concatenation_is_scheduled_as_umahub_schedules_the_hosts():
    def body(bb, x, y):
        return relax.op.concat([x, y], axis=1)

    mod = primfunc_from_relax([("x", (1, 32, 32, 32)), ("y", (1, 16, 32, 32))], body)
    sch = s_tir.Schedule(mod)
    assert schedules.schedule(sch) == "elementwise"
    (block,) = sch.get_child_blocks(sch.get_sblock("root"))
    kinds = [int(sch.get(l).kind) for l in sch.get_loops(block)]
    assert kinds[0] == 1  # parallel: rows of channels
    x, y = f32(1, 32, 32, 32), f32(1, 16, 32, 32)
    np.testing.assert_array_equal(run(sch.mod, [x, y], (1, 48, 32, 32)), np.concatenate([x, y], 1))


# ----------------------------------------------------------------- max pooling


def _max_pool_reference(x, k, s, pad, out_hw):
    n, c, h, w = x.shape
    padded = np.full((n, c, h + 2 * pad + k, w + 2 * pad + k), -np.inf, np.float32)
    padded[:, :, pad : pad + h, pad : pad + w] = x
    oh, ow = out_hw
    return np.stack(
        [
            np.stack(
                [padded[:, :, y * s : y * s + k, i * s : i * s + k].max((2, 3)) for i in range(ow)],
                -1,
            )
            for y in range(oh)
        ],
        -2,
    )


@pytest.mark.parametrize(
    "shape,k,s,pad,ceil,relu,out_hw",
    [
        ((1, 64, 111, 111), 3, 2, 0, True, True, (55, 55)),  # SqueezeNet's stem
        ((1, 64, 112, 112), 3, 2, 1, False, False, (56, 56)),  # ResNet's
        ((2, 8, 9, 14), 2, 2, 0, True, False, (5, 7)),  # windows off the edge (ceil)
    ],
)
def test_a_max_pooling_is_two_one_d_poolings_by_output_row(shape, k, s, pad, ceil, relu, out_hw):
    from umahub_npu import lowering

    def body(bb, x):
        data = bb.emit(relax.op.nn.relu(x)) if relu else x
        return relax.op.nn.max_pool2d(data, k, s, pad, ceil_mode=ceil)

    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(body(bb, x))
        bb.emit_func_output(out)
    # the one PrimFunc of a partition, as the npu lowers it
    sch = s_tir.Schedule(lowering.lower(bb.get()["main"], "main", "npu"))
    assert schedules.schedule(sch) == "pooling"
    # one loop nest: the output rows (in parallel when there is enough work),
    # the row of column maxima under each, the ReLU read where it is used
    rows_block, out_block = sch.get_child_blocks(sch.get_sblock("root"))
    assert [sch.get(b).name_hint for b in (rows_block, out_block)] == ["pool_rows", "pool_max"]
    assert sch.get(sch.get_loops(rows_block)[0]).same_as(sch.get(sch.get_loops(out_block)[0]))
    rows = sch.get(sch.get_loops(out_block)[0])
    parallel = math.prod(shape[:2]) * math.prod(out_hw) >= schedules.PARALLEL_MIN
    assert int(rows.kind) == (1 if parallel else 0)
    assert int(rows.extent) == shape[0] * shape[1] * out_hw[0]
    x = f32(*shape)
    want = _max_pool_reference(np.maximum(x, 0) if relu else x, k, s, pad, out_hw)
    np.testing.assert_array_equal(run(sch.mod, [x], want.shape), want)


@pytest.mark.parametrize(
    "C,H,W,k,pad,grid",
    [
        (8, 7, 7, 3, (1, 1, 1, 1), (8, 10)),  # MobileNetV2's last blocks: 5 vectors, not 7 rows
        (16, 7, 7, 5, (2, 2, 2, 2), (8, 12)),  # MobileNetV3's 5x5 filters
        (4, 6, 6, 3, (0, 1, 1, 2), (5, 16)),  # padded unevenly: 5 rows of 7 outputs
        (3, 1, 1, 3, (1, 1, 1, 1), (1, 16)),  # a 1x1 plane
        (2, 14, 14, 3, (1, 1, 1, 1), (14, 16)),
    ],
)
def test_a_depthwise_on_rows_narrower_than_a_vector_runs_vectors_over_its_plane(
    C, H, W, k, pad, grid
):
    from umahub_npu import lowering

    top, left, bottom, right = pad
    OH, OW = H + top + bottom - k + 1, W + left + right - k + 1
    bb = relax.BlockBuilder()
    params = [
        relax.Var("x", R.Tensor((2, C, H, W), "float32")),
        relax.Var("w", R.Tensor((C, 1, k, k), "float32")),
        relax.Var("b", R.Tensor((1, C, 1, 1), "float32")),
    ]
    x_, w_, b_ = params
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x_, w_, padding=pad, groups=C))
            out = bb.emit_output(relax.op.nn.relu(bb.emit(relax.op.add(y, b_))))
        bb.emit_func_output(out)
    # the one PrimFunc of a partition, as the npu lowers it
    sch = s_tir.Schedule(lowering.lower(bb.get()["main"], "main", "npu"))
    p = schedules.plan(sch)
    assert (p.kind, p.plane, p.extents["rows"], p.extents["width"]) == ("depthwise", True, *grid)
    assert schedules.schedule(sch, lanes=16) == "depthwise"
    # positions in whole vectors, accumulated over the unrolled taps
    loops = sch.get_loops(sch.get_sblock("plane_conv_update"))
    kinds = {0: "serial", 1: "parallel", 2: "vectorized", 3: "unrolled"}
    assert [kinds[int(sch.get(l).kind)] for l in loops[-4:]] == ["unrolled"] * 3 + ["vectorized"]
    assert int(sch.get(loops[-1]).extent) == 16
    x, w, b = f32(2, C, H, W), f32(C, 1, k, k, scale=0.3), f32(1, C, 1, 1)
    padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    want = np.concatenate([conv_ref(padded[i : i + 1], w, b, 1, 0, C) for i in range(2)])
    assert want.shape == (2, C, OH, OW)
    close(run(sch.mod, [x, w, b], want.shape), want)


@pytest.mark.parametrize(
    "H, stride, kind",
    [
        (32, 2, "pointwise"),  # 16x16 positions: whole vectors of them
        (14, 2, "conv2d"),  # 7x7: an implicit GEMM, on the compact positions too
        (24, (3, 2), "pointwise"),  # 8x12 positions, a stride per axis
    ],
)
def test_a_strided_one_by_one_convolution_reads_its_positions_copied_compact(H, stride, kind):
    from umahub_npu import lowering

    bb = relax.BlockBuilder()
    params = [
        relax.Var("x", R.Tensor((1, 24, H, H), "float32")),
        relax.Var("w", R.Tensor((32, 24, 1, 1), "float32")),
        relax.Var("b", R.Tensor((1, 32, 1, 1), "float32")),
    ]
    x_, w_, b_ = params
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x_, w_, strides=stride))
            out = bb.emit_output(relax.op.nn.relu(bb.emit(relax.op.add(y, b_))))
        bb.emit_func_output(out)
    sch = s_tir.Schedule(lowering.lower(bb.get()["main"], "main", "npu"))
    p = schedules.plan(sch)
    assert (p.kind, p.stride, p.pointwise) == ("conv2d", 1, True)
    assert p.prologue[0] == "subsample"
    assert schedules.schedule(sch, lanes=16) == kind
    sy, sx = (stride, stride) if isinstance(stride, int) else stride
    x, w, b = f32(1, 24, H, H), f32(32, 24, 1, 1, scale=0.3), f32(1, 32, 1, 1)
    want = np.maximum(np.einsum("nchw,oc->nohw", x[:, :, ::sy, ::sx], w[:, :, 0, 0]) + b, 0)
    close(run(sch.mod, [x, w, b], want.shape), want)


def test_a_strided_one_by_one_convolution_of_a_batch_known_at_run_time_stays_strided():
    from umahub_npu import lowering

    bb = relax.BlockBuilder()
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", R.Tensor((n, 8, 16, 16), "float32"))
    w = relax.Var("w", R.Tensor((16, 8, 1, 1), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv2d(x, w, strides=2))
        bb.emit_func_output(out)
    funcs = lowering.lower(bb.get()["main"], "main", "npu").functions.values()
    assert not any("subsample" in f.script() for f in funcs if isinstance(f, tvm.tirx.PrimFunc))


@pytest.mark.parametrize(
    "size,dtype",
    [
        (16, "float32"),  # a row of a whole vector
        (7, "float16"),  # half-precision operands summed in float32
    ],
)
def test_other_depthwise_convolutions_keep_the_row_by_row_lowering(size, dtype):
    from umahub_npu import lowering

    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((1, 8, size, size), dtype))
    w = relax.Var("w", R.Tensor((8, 1, 3, 3), dtype))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            conv = relax.op.nn.conv2d(x, w, padding=1, groups=8, out_dtype="float32")
            out = bb.emit_output(conv)
        bb.emit_func_output(out)
    (func,) = [
        f
        for f in lowering.lower(bb.get()["main"], "main", "npu").functions.values()
        if isinstance(f, tvm.tirx.PrimFunc)
    ]
    assert "plane_conv" not in func.script()


# ----------------------------------------------------------------- rows known at run time


def test_a_matmul_over_a_symbolic_number_of_rows_is_tiled_and_loops_the_rows():
    # a prefill's projection: tokens known only at run time, bounded by the context
    from umahub.plugin.memory import bounded

    n = tvm.tirx.Var("n", "int64")
    mod = primfunc_from_relax(
        [("x", (1, n, 64)), ("w", (64, 96)), ("b", (96,))],
        lambda bb, x, w, b: relax.op.nn.relu(
            bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, w)), b))
        ),
    )
    sch = s_tir.Schedule(mod)
    with bounded({"n": 40}):
        assert schedules.schedule(sch, threads=2) == "matmul"
    w, b = f32(64, 96, scale=1 / 8), f32(96)
    for tokens in (1, 5, 40):
        x = f32(1, tokens, 64)
        got = run(sch.mod, [x, w, b], (1, tokens, 96))
        close(got, np.maximum(x.astype(np.float64) @ w + b, 0))


def test_a_one_row_matmul_is_a_gemv_over_column_panels():
    # a decode step's projection: one token, B stored [k, j]
    K, N = 256, 192
    mod = primfunc_from_relax(
        [("x", (1, K)), ("w", (K, N))], lambda bb, x, w: relax.op.matmul(x, w)
    )
    x, w = f32(1, K), f32(K, N, scale=1 / 16)
    name, got = schedule_and_run(mod, [x, w], (1, N), threads=2)
    assert name == "gemv"
    close(got, x.astype(np.float64) @ w)
    sch = s_tir.Schedule(mod)
    schedules.schedule(sch, threads=2, lanes=16)
    loops = [line.strip() for line in sch.mod.script().splitlines() if "for " in line]
    # 6 panels of 32 columns: 6 tasks (2 per thread at least); K inner, 32 lanes vectorized
    assert loops[0] == "for i0_i1_0_fused in T.parallel(T.int64(6)):"
    assert "for k in range(T.int64(256)):" in loops
    assert loops[loops.index("for k in range(T.int64(256)):") + 1] == (
        "for i1_2 in T.vectorized(T.int64(32)):"
    )


def test_drawing_tiles_draws_each_size_once_among_the_rules_sizes():
    """The npu's design space for ``umahub tune``: the tile sizes drawn on the schedule."""
    rule = schedules.matmul_tiles(1, 128, 256, 512, 16, 256 * 1024, 2)
    drawn = set()
    for seed in range(8):
        sch = s_tir.Schedule(
            primfunc_from_relax(
                [("a", (128, 512)), ("b", (512, 256))], lambda bb, a, b: relax.op.matmul(a, b)
            ),
            seed=seed + 1,
        )
        with schedules.drawing_tiles(sch):
            first = schedules.matmul_tiles(1, 128, 256, 512, 16, 256 * 1024, 2)
            again = schedules.matmul_tiles(1, 128, 256, 512, 16, 256 * 1024, 2)
        assert first == again  # the dry run and the schedule take the same sizes
        ti, tj, tk, mr, nr = first
        assert (mr, nr) == rule[3:]  # the micro-kernel is the rules'
        assert 128 % ti == 0 and ti % mr == 0 and 256 % tj == 0 and tj % nr == 0
        assert 512 % tk == 0 and 4 * (ti * tk + tk * tj + ti * tj) <= 256 * 1024
        kinds = [i.kind.name for i in sch.trace.insts]
        assert kinds.count("SampleCategorical") == 3
        drawn.add(first)
    assert len(drawn) > 1
    # outside, the rules choose
    assert schedules.matmul_tiles(1, 128, 256, 512, 16, 256 * 1024, 2) == rule
