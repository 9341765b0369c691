"""The int8 schedules (umahub.host.int8): vpdpbusd where the target has VNNI, the
exact int32 fallback elsewhere, both bit for bit the arithmetic's numpy reference.

The fallback is forced by the target: ``skylake-avx512`` has AVX-512 but no VNNI.
The VNNI schedule is built for this machine's own CPU (``emeraldrapids``,
``znver4``...): built for another with VNNI, LLVM may use what this one lacks
(an Emerald Rapids target on an AMD EPYC stopped the process on an illegal
instruction).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from test_quantized import _matmul_reference, qconv_graph, qmatmul_graph, reference

import umahub
from umahub.host.int8 import has_vnni
from umahub.host.quantized import (
    double_pays_in_pointwise,
    flat_plane,
    flat_tile_rows,
    has_quad_instructions,
    pointwise_positions,
)
from umahub.targets import has_feature, host_target, this_machine

VNNI = {"kind": "llvm", "mcpu": str(tvm.target.codegen.llvm_get_system_cpu())}
NO_VNNI = {"kind": "llvm", "mcpu": "skylake-avx512"}
#: This CPU without AVX-512 VBMI: the depthwise forms that take one or two taps at a time.
NO_VBMI = {**VNNI, "mattr": ["-avx512vbmi"]}

needs_vnni = pytest.mark.skipif(not has_vnni(), reason="this CPU has no AVX-512 VNNI")
needs_quads = pytest.mark.skipif(
    not has_quad_instructions(host_target()), reason="this CPU has no AVX-512 VBMI and VNNI"
)

SHAPES = {
    "3x3": {},
    "3x3 stride 2, uneven padding": {"strides": (2, 2), "padding": (0, 1, 2, 1)},
    "int8 input, asymmetric weights": {"x_dtype": "int8", "x_zp": -3, "w_zp": 5},
    "24 output channels, 3 input channels": {"channels": (3, 24)},
    "1x1": {"kernel": 1, "padding": (0, 0, 0, 0), "channels": (8, 24)},
    "1x1 stride 2, int8 input, asymmetric weights": {
        "kernel": 1,
        "padding": (0, 0, 0, 0),
        "strides": (2, 2),
        "x_dtype": "int8",
        "x_zp": -3,
        "w_zp": 5,
    },
}


@pytest.fixture(scope="module")
def host_hub():
    return umahub.Hub(config={"plugins": []})


def _x(options, seed=1):
    dtype = options.get("x_dtype", "uint8")
    cin = options.get("channels", (8, 16))[0]
    info = np.iinfo(dtype)
    rng = np.random.default_rng(seed)
    return rng.integers(info.min, info.max + 1, size=(1, cin, 10, 10)).astype(dtype)


@pytest.mark.parametrize(
    "target", [pytest.param(VNNI, marks=needs_vnni), NO_VNNI], ids=["vnni", "fallback"]
)
@pytest.mark.parametrize("shape", SHAPES)
def test_a_quantized_convolution_on_the_host_is_exact_with_either_schedule(host_hub, shape, target):
    options = SHAPES[shape]
    mod, parts = qconv_graph(**options)
    x = _x(options)
    compiled = host_hub.compile(mod, target=target)
    how = "vnni, 16x4 dot" if target is VNNI else "int32 vectors, 16 lanes (no VNNI)"
    kind = "conv2d"
    if options.get("kernel") == 1:  # positions in the lanes: 100 or 25 of them, not 16s
        how, kind = f"{how} over 16 positions", "conv2d 1x1"
    assert compiled.report.host_schedules == {
        f"int8 {kind}: {how}, weights packed at compile time": 1
    }
    np.testing.assert_array_equal(compiled.run(x), reference(x, parts))


def _depthwise_case(options: dict) -> tuple:
    """The graph of a depthwise convolution over 16 channels (``qconv_graph``'s
    ``options``), its parts, and an input over its type's whole range."""
    mod, parts = qconv_graph(**options)
    dtype, size = options.get("x_dtype", "uint8"), options["size"]
    info = np.iinfo(dtype)
    x = np.random.default_rng(3).integers(info.min, info.max + 1, size=(1, 16, size, size))
    return mod, parts, x.astype(dtype)


#: Cases every form of a depthwise convolution is tried on
_EVERY_DEPTHWISE = {
    "uint8 input, relu": {},
    "int8 input, asymmetric weights, clip": {
        "x_dtype": "int8",
        "x_zp": -3,
        "w_zp": 5,
        "activation": "clip",
    },
    "uneven padding, float bias": {"padding": (0, 1, 2, 1), "bias": "float"},
}

DEPTHWISE = {
    **_EVERY_DEPTHWISE,
    "rows of 7, dilation 2": {"size": 7, "dilation": (2, 2), "padding": (2, 2, 2, 2)},
    # 17x17 taps: sums up to 289 * 255 * 255, past float32's exact integers (2**24)
    "a kernel of 289 taps: int32 sums": {"kernel": 17, "padding": (8, 8, 8, 8), "size": 20},
}


@pytest.mark.parametrize(
    "target", [pytest.param(NO_VBMI, marks=needs_vnni), NO_VNNI], ids=["vnni", "fallback"]
)
@pytest.mark.parametrize("case", DEPTHWISE)
def test_a_depthwise_convolution_is_exact_over_its_flat_plane(host_hub, case, target):
    options = {"channels": (16, 16), "groups": 16, "size": 58, **DEPTHWISE[case]}  # stride 1
    mod, parts, x = _depthwise_case(options)
    compiled = host_hub.compile(mod, target=target)
    # exact in float32 below 2**24 (up to 258 taps of 255 * 255), else in int32
    sums = "int32 vectors" if options.get("kernel") == 17 else "exact float32 sums"
    assert compiled.report.host_schedules == {
        f"int8 depthwise: {sums} over the padded plane read flat": 1
    }
    np.testing.assert_array_equal(compiled.run(x), reference(x, parts))


#: (output rows, padded input row) -> (pitch, rows) of the flat plane computed
FLAT_PLANES = {
    (7, 11): (12, 8),  # a 7x7 output of a 5x5 kernel: one tile of 96 positions
    (7, 9): (10, 8),
    (14, 16): (16, 14),  # as it is: tiles of 7 rows of 16
    (14, 18): (20, 16),
    (56, 58): (64, 56),  # rows rounded up to 4 vectors, as their part-filled last one cost
    (112, 114): (128, 112),
    (3, 3): (4, 4),
}


@pytest.mark.parametrize("rows, width", FLAT_PLANES)
def test_a_flat_depthwise_plane_is_whole_tiles_of_whole_rows_and_vectors(rows, width):
    pitch, computed = flat_plane(rows, width)
    assert (pitch, computed) == FLAT_PLANES[rows, width]
    tile = flat_tile_rows(computed, pitch)
    assert tile is not None and computed % tile == 0 and tile * pitch % 16 == 0
    assert tile * pitch <= 128 or tile == 1


#: output positions -> the positions a 1x1 convolution's accumulator computes
POINTWISE_POSITIONS = {
    12: 16,  # one vector: a tile of one vector by 24 channels
    16: 16,
    17: 32,
    49: 64,  # 7x7
    196: 224,  # 14x14, 13 vectors: computed as 14 (7 tiles of two)
    784: 800,  # 28x28, 49 vectors
    3136: 3136,  # 56x56, 196 vectors
}


@pytest.mark.parametrize("positions", POINTWISE_POSITIONS)
def test_a_pointwise_convolution_computes_whole_pairs_of_vectors(positions):
    assert pointwise_positions(positions) == POINTWISE_POSITIONS[positions]


@pytest.mark.parametrize(
    "target", [pytest.param(VNNI, marks=needs_vnni), NO_VNNI], ids=["vnni", "fallback"]
)
def test_a_pointwise_convolution_over_an_odd_number_of_vectors_is_exact(host_hub, target):
    """14x14 outputs: 13 vectors of positions, computed as 14; the last one's 28
    positions past the output are dropped."""
    mod, parts = qconv_graph(channels=(8, 24), kernel=1, padding=(0, 0, 0, 0), size=14)
    x = np.random.default_rng(7).integers(0, 256, size=(1, 8, 14, 14)).astype("uint8")
    compiled = host_hub.compile(mod, target=target)
    how = "vnni, 16x4 dot" if target is VNNI else "int32 vectors, 16 lanes (no VNNI)"
    assert compiled.report.host_schedules == {
        f"int8 conv2d 1x1: {how} over 16 positions, weights packed at compile time": 1
    }
    np.testing.assert_array_equal(compiled.run(x), reference(x, parts))


needs_avx512 = pytest.mark.skipif(not has_feature("avx512f"), reason="this CPU has no AVX-512")


@needs_avx512
def test_a_flat_depthwise_sums_in_whole_512_bit_vectors(built_asm, host_hub):
    """A 7x7 output of a 5x5 kernel (rows of 11). Computed a row at a time, each row
    took a vector of 8 and a part-filled one, whose unused lanes held the previous
    kernel's leftovers: as floats, denormals, a microcode assist each.
    efficientnet_b0 int8's 7x7 depthwise convolutions took twice their time now
    (Intel Xeon)."""
    mod, parts = qconv_graph(channels=(16, 16), groups=16, size=7, kernel=5, padding=(2,) * 4)
    x = np.random.default_rng(3).integers(0, 256, size=(1, 16, 7, 7)).astype("uint8")
    compiled = host_hub.compile(mod, target={"kind": "llvm", "mcpu": "skylake-avx512"})
    (asm,) = [a for a in built_asm if "vfmadd" in a]
    registers = re.findall(r"^\s*vfmadd\w*ps\s.*%([xyz])mm\d+$", asm, re.MULTILINE)
    assert registers and set(registers) == {"z"}
    np.testing.assert_array_equal(compiled.run(x), reference(x, parts))


@pytest.mark.parametrize(
    "target", [pytest.param(VNNI, marks=needs_vnni), NO_VNNI], ids=["vnni", "fallback"]
)
def test_a_quantized_matmul_by_a_weight_is_exact_with_either_schedule(host_hub, target):
    mod, b, scales = qmatmul_graph(True)
    rng = np.random.default_rng(5)
    a = rng.integers(-128, 128, size=(2, 5, 24)).astype("int8")
    compiled = host_hub.compile(mod, target=target)
    assert any(k.startswith("int8 matmul") for k in compiled.report.host_schedules)
    bias = np.random.default_rng(0)
    bias.integers(-127, 128, size=(24, 12))
    bias.uniform(0.001, 0.01, 12)
    expected = _matmul_reference(a, b, scales, bias.uniform(-1, 1, 12).astype("float32"))
    np.testing.assert_array_equal(compiled.run(a), expected)


def _activation_product(depth, seed=0):
    """``quantize(dequantize(a) @ dequantize(b))`` of two uint8 activations with zero
    points (attention's ``Q @ K^T`` and ``P @ V`` in ORT's QDQ form): no weight for
    the packed form."""
    from test_quantized import _const
    from tvm import relax

    from umahub._tvm import TensorType

    bb = relax.BlockBuilder()
    a = relax.Var("a", TensorType((2, 12, depth), "uint8"))
    b = relax.Var("b", TensorType((2, depth, 32), "uint8"))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            da = bb.emit(relax.op.dequantize(a, _const(0.02, "float32"), _const(120, "uint8")))
            db = bb.emit(relax.op.dequantize(b, _const(0.03, "float32"), _const(7, "uint8")))
            y = bb.emit(relax.op.matmul(da, db))
            q = bb.emit(
                relax.op.quantize(
                    y, _const(0.5, "float32"), _const(128, "uint8"), out_dtype="uint8"
                )
            )
            out = bb.emit_output(q)
        bb.emit_func_output(out)
    rng = np.random.default_rng(seed)
    inputs = [
        rng.integers(0, 256, size=s).astype("uint8") for s in ((2, 12, depth), (2, depth, 32))
    ]
    return bb.get(), inputs


@pytest.mark.parametrize("depth", [64, 300], ids=["exact in float32", "int32"])
def test_a_product_of_two_activations_is_the_hosts_matmul_and_exact(host_hub, depth):
    """Each operand less its zero point is a stage of its own, so the sum is a plain
    matrix product that the host's matmul rule tiles (it was a reduction over
    "columns", 3x slower than ONNX Runtime's on BERT's attention); in float32 where
    every partial sum is an integer below 2**24 (64 steps of 8-bit values), in int32
    where not (300 steps)."""
    from umahub.plugin import requantize

    mod, (a, b) = _activation_product(depth)
    compiled = host_hub.compile(mod)
    assert compiled.report.host_schedules == {"matmul": 1}
    acc = np.matmul(a.astype(np.int64) - 120, b.astype(np.int64) - 7)
    multiplier = np.float64(np.float32(0.02)) * np.float64(np.float32(0.03)) / np.float64(0.5)
    expected = requantize(acc, multiplier, 128, 0, 255, "uint8")
    np.testing.assert_array_equal(compiled.run(a, b), expected)


def _classifier(channels, depth=64, seed=0, rows=1):
    """``quantize(dequantize(a) @ dequantize(w) + dequantize(bias))``, ``a`` one row of
    ``depth`` uint8 values (or ``rows`` of them): a classifier's last product, ORT's
    QDQ form."""
    from test_quantized import _const
    from tvm import relax

    from umahub._tvm import TensorType

    rng = np.random.default_rng(seed)
    w = rng.integers(-127, 128, size=(depth, channels)).astype("int8")
    w_scale = rng.uniform(0.001, 0.01, channels).astype("float32")
    bias = rng.integers(-5000, 5000, size=(channels,)).astype("int32")
    bb = relax.BlockBuilder()
    a = relax.Var("a", TensorType((rows, depth), "uint8"))
    with bb.function("main", [a]):
        with bb.dataflow():
            da = bb.emit(relax.op.dequantize(a, _const(0.03, "float32"), _const(3, "uint8")))
            zeros = _const(np.zeros(channels), "int8")
            dw = bb.emit(
                relax.op.dequantize(_const(w, "int8"), _const(w_scale, "float32"), zeros, axis=1)
            )
            y = bb.emit(relax.op.matmul(da, dw))
            units = _const(np.float32(0.03) * w_scale, "float32")
            db = bb.emit(
                relax.op.dequantize(
                    _const(bias, "int32"), units, _const(np.zeros(channels), "int32")
                )
            )
            y = bb.emit(relax.op.add(y, db))
            q = bb.emit(
                relax.op.quantize(
                    y, _const(0.2, "float32"), _const(100, "uint8"), out_dtype="uint8"
                )
            )
            out = bb.emit_output(q)
        bb.emit_func_output(out)
    return bb.get(), rng.integers(0, 256, size=(rows, depth)).astype("uint8")


@pytest.mark.parametrize("channels", [40, 48], ids=["40 channels", "48 channels"])
def test_a_one_row_product_runs_its_channel_tiles_in_parallel(host_hub, channels):
    """One row (a classifier's) is one tile of rows: its channels are split into tiles
    for the threads, also where they are no whole number of 16-channel blocks (the
    last tile partly past them); it once ran as one tile on one thread."""
    mod, a = _classifier(channels)
    recorder = _BlockRecorder()
    compiled = umahub.Hub(config={"plugins": ["npu"]}, plugins=[recorder]).compile(mod)
    how = "vnni, 16x4 dot" if has_vnni() else "int32 vectors, 16 lanes (no VNNI)"
    assert [p.schedule for p in compiled.report.partitions] == [
        [f"int8 matmul: {how}, weights packed at compile time"]
    ]
    assert recorder.loops[0]["requantized"][0] == "PARALLEL"
    np.testing.assert_array_equal(compiled.run(a), host_hub.compile(mod).run(a))


@pytest.mark.parametrize(
    ("rows", "channels", "outer"),
    [(16, 96, "i1"), (96, 48, "i0")],  # i0: the output's rows, i1: its channels
    ids=["fewer rows than channels", "more rows than channels"],
)
def test_a_products_tiles_read_the_smaller_operand_again(host_hub, rows, channels, outer):
    """The tiles of the operand read once are the outer ones of the parallel loop:
    with fewer rows than channels, the weight's panel of a channel tile is read for
    every row tile while it is in cache (row tiles outer, a weight bigger than the
    cache was read from memory again for each of them)."""
    mod, a = _classifier(channels, rows=rows)
    recorder = _BlockRecorder()
    compiled = umahub.Hub(config={"plugins": ["npu"]}, plugins=[recorder]).compile(mod)
    assert recorder.loops[0]["requantized"][0] == "PARALLEL"
    inner = {"i1": "i0", "i0": "i1"}[outer]
    assert recorder.names[0]["requantized"][0] == f"{outer}_0_{inner}_0_fused"
    np.testing.assert_array_equal(compiled.run(a), host_hub.compile(mod).run(a))


@pytest.mark.parametrize(
    ("channels", "size", "outer"),
    [((8, 16), 8, "i2"), ((8, 96), 4, "i1")],  # i1: the output's channels, i2: its positions
    ids=["more positions than channels", "more channels than positions"],
)
def test_a_pointwise_convolutions_tiles_read_the_smaller_operand_again(
    host_hub, channels, size, outer
):
    """As a product's: the tiles of a 1x1 convolution's operand read once are the
    outer ones of the parallel loop. With more positions than channels, a tile of
    positions' input (its channel groups a plane apart) serves every channel tile
    while it is in cache (channel tiles outer, resnet50's 1x1 over 56x56 read its
    800 KB input again for each of its 16 channel tiles)."""
    mod, parts = qconv_graph(channels=channels, kernel=1, padding=(0, 0, 0, 0), size=size)
    x = np.random.default_rng(5).integers(0, 256, size=(1, channels[0], size, size))
    x = x.astype("uint8")
    recorder = _BlockRecorder()
    compiled = umahub.Hub(config={"plugins": ["npu"]}, plugins=[recorder]).compile(mod)
    (partition,) = compiled.report.partitions
    assert partition.schedule[0].startswith("int8 conv2d 1x1: ")
    assert recorder.loops[0]["requantized"][0] == "PARALLEL"
    inner = {"i1": "i2", "i2": "i1"}[outer]
    assert recorder.names[0]["requantized"][0] == f"i0_{outer}_0_{inner}_0_fused"
    np.testing.assert_array_equal(compiled.run(x), reference(x, parts))


#: Depthwise convolutions whose columns step by 2: their taps summed in pairs
PAIRED = {
    **_EVERY_DEPTHWISE,
    "5x5: a pair's second weight 0": {"kernel": 5, "padding": (2, 2, 2, 2)},
    "rows a step of 3 apart, dilated 2": {"strides": (3, 2), "dilation": (2, 1), "size": 23},
    "rows a step of 1 apart, 9 columns": {"strides": (1, 2), "size": 17, "padding": (1, 1, 1, 0)},
}


@pytest.mark.parametrize(
    "target", [pytest.param(NO_VBMI, marks=needs_vnni), NO_VNNI], ids=["vnni", "fallback"]
)
@pytest.mark.parametrize("case", PAIRED)
def test_a_depthwise_convolution_with_columns_two_apart_sums_its_taps_in_pairs(
    host_hub, built_asm, case, target
):
    """Each pair of a kernel row's taps reads two consecutive bytes for each of 16
    consecutive outputs (32 bytes of the padded plane): one ``vpdpwssd``, exact; the
    outputs of a row past its whole vectors computed and dropped (rows of 9, 15).
    Where the CPU has no VBMI for the four taps' gather (below)."""
    options = {"channels": (16, 16), "groups": 16, "size": 30, "strides": (2, 2)}
    options.update(PAIRED[case])
    mod, parts, x = _depthwise_case(options)
    compiled = host_hub.compile(mod, target=target)
    how = "vpdpwssd" if target is NO_VBMI else "int32 vectors, 16 lanes (no VNNI)"
    assert compiled.report.host_schedules == {
        f"int8 depthwise: {how} over a row's positions, its taps in pairs": 1
    }
    assert any("vpdpwssd" in asm for asm in built_asm) == (target is NO_VBMI)
    np.testing.assert_array_equal(compiled.run(x), reference(x, parts))


@pytest.mark.parametrize(
    "options",
    [{"strides": (3, 3), "size": 30, "w_zp": 5}, {"strides": (2, 1), "size": 30, "w_zp": 5}],
    ids=["stride 3", "rows 2 apart, columns 1"],
)
def test_the_host_leaves_other_strided_narrow_depthwise_convolutions_to_its_generic_rules(
    host_hub, options
):
    """Strides other than 1 and of columns other than 2, by weights with zero points
    (no four taps at a time), stay in the plain sum, which the host's generic rules
    run faster than its own schedule."""
    mod, parts = qconv_graph(channels=(16, 16), groups=16, **options)
    size = options["size"]
    x = np.random.default_rng(3).integers(0, 256, size=(1, 16, size, size)).astype("uint8")
    compiled = host_hub.compile(mod)
    assert not any(k.startswith("int8") for k in compiled.report.host_schedules)
    np.testing.assert_array_equal(compiled.run(x), reference(x, parts))


#: Depthwise convolutions by symmetric int8 weights: their taps summed four at a time
QUADS = {
    "stride 1": {"strides": (1, 1)},
    "stride 2": {},
    "stride 3, rows of 10": {"strides": (3, 3)},
    "stride 4, 5x5": {"strides": (4, 4), "kernel": 5, "padding": (2, 2, 2, 2)},
    "7x7: two fours, the last weight 0": {"kernel": 7, "padding": (3, 3, 3, 3)},
    "int8 input, clip": {"x_dtype": "int8", "x_zp": -3, "activation": "clip"},
    "uneven padding, float bias": {"padding": (0, 1, 2, 1), "bias": "float"},
    "rows a step of 3 apart, dilated 2": {"strides": (3, 2), "dilation": (2, 1), "size": 23},
}


@needs_quads
@pytest.mark.parametrize("case", QUADS)
def test_a_depthwise_convolution_by_symmetric_weights_sums_its_taps_in_fours(
    host_hub, built_asm, case
):
    """For 16 consecutive outputs, the four taps 4j .. 4j + 3 of each lie in 64 bytes
    of the padded plane (a column step of up to 4): one byte gather (``vpermb``, or
    the shuffles LLVM finds for the step's pattern) puts each output's four in a
    lane, one ``vpdpbusd`` sums them; exact."""
    options = {"channels": (16, 16), "groups": 16, "size": 30, "strides": (2, 2)}
    options.update(QUADS[case])
    mod, parts, x = _depthwise_case(options)
    compiled = host_hub.compile(mod)
    assert compiled.report.host_schedules == {
        "int8 depthwise: vpermb, vpdpbusd over a row's positions, its taps in fours": 1
    }
    assert any("vpdpbusd" in asm for asm in built_asm)
    np.testing.assert_array_equal(compiled.run(x), reference(x, parts))


@needs_avx512
def test_a_depthwise_convolution_in_fours_scheduled_without_vnni_is_int32_vectors(
    monkeypatch, host_hub
):
    """The form is chosen where the model is lowered, the instructions where it is
    scheduled: a plugin may schedule for a CPU without VNNI what was lowered for one
    with it. The four taps are then four int32 vectors, exact."""
    from umahub.host import quantized

    monkeypatch.setattr(quantized, "has_quad_instructions", lambda target=None: True)
    mod, parts, x = _depthwise_case({"channels": (16, 16), "groups": 16, "size": 30})
    compiled = host_hub.compile(mod, target=NO_VNNI)
    assert compiled.report.host_schedules == {
        "int8 depthwise: int32 vectors, 16 lanes (no VNNI) over a row's positions, "
        "its taps in fours": 1
    }
    np.testing.assert_array_equal(compiled.run(x), reference(x, parts))


@pytest.mark.skipif(this_machine() != "x86_64", reason="the build is for x86-64")
@pytest.mark.parametrize(
    ("mcpu", "w_zp", "said"),
    [
        ("icelake-server", 0, "vpermb, vpdpbusd over a row's positions, its taps in fours"),
        ("icelake-server", 5, "vpdpwssd over a row's positions, its taps in pairs"),
        ("cascadelake", 0, "vpdpwssd over a row's positions, its taps in pairs"),
    ],
    ids=["VBMI and VNNI", "weights with zero points", "VNNI, no VBMI"],
)
def test_a_depthwise_convolutions_form_is_chosen_by_the_target_and_its_weights(
    host_hub, mcpu, w_zp, said
):
    """Four taps at a time where the target has VBMI and VNNI and the weights are known
    symmetric (built, not run: the target's instructions)."""
    mod, _ = qconv_graph(channels=(16, 16), groups=16, size=30, strides=(2, 2), w_zp=w_zp)
    compiled = host_hub.compile(mod, target={"kind": "llvm", "mcpu": mcpu})
    assert compiled.report.host_schedules == {f"int8 depthwise: {said}": 1}


def test_the_npu_schedules_a_quantized_depthwise_partition():
    mod, parts = qconv_graph(channels=(16, 16), groups=16, size=12, strides=(5, 5))
    x = np.random.default_rng(3).integers(0, 256, size=(1, 16, 12, 12)).astype("uint8")
    compiled = umahub.Hub(config={"plugins": ["npu"]}).compile(mod)
    (partition,) = compiled.report.partitions
    assert partition.schedule == ["int8 depthwise: exact float32 sums over a row's positions"]
    np.testing.assert_array_equal(compiled.run(x), reference(x, parts))


@needs_vnni
def test_the_npu_schedules_its_quantized_partition_with_vnni_and_packs_at_compile_time():
    mod, parts = qconv_graph(channels=(8, 32), strides=(2, 2))
    x = _x({})
    compiled = umahub.Hub(config={"plugins": ["npu"]}).compile(mod)
    (partition,) = compiled.report.partitions
    assert partition.schedule == ["int8 conv2d: vnni, 16x4 dot, weights packed at compile time"]
    np.testing.assert_array_equal(compiled.run(x), reference(x, parts))


@needs_vnni
@pytest.mark.parametrize("kernel", [1, 3], ids=["1x1", "3x3"])
def test_the_requantization_multiplies_int32_by_int32(built_asm, kernel):
    """The accumulator's per-channel term (the bias, less the input's zero point times
    the weight's sums) is added after the multiply, scaled by a stage per channel:
    LLVM then multiplies two int32 values into int64 (``vpmuldq``). Added before,
    the int32 sum it widened took a 64-bit multiply (``vpmullq``, 3 micro-ops):
    MobileNetV2's 1x1 expansions took 1/0.84 the time (Intel Xeon). A 1x1
    convolution on a CPU where float64 pays multiplies in float64 instead."""
    padding = (0, 0, 0, 0) if kernel == 1 else (1, 1, 1, 1)
    mod, parts = qconv_graph(x_zp=7, channels=(8, 32), kernel=kernel, padding=padding)
    x = _x({})
    compiled = umahub.Hub(config={"plugins": ["npu"]}).compile(mod)
    (asm,) = [a for a in built_asm if "vpdpbusd" in a]
    double = kernel == 1 and double_pays_in_pointwise(host_target())
    assert ("vmulpd" if double else "vpmuldq") in asm and "vpmullq" not in asm
    np.testing.assert_array_equal(compiled.run(x), reference(x, parts))


@pytest.mark.parametrize(
    ("target", "pays"),
    [
        ({"kind": "llvm", "mcpu": "sapphirerapids"}, True),
        ({"kind": "llvm", "mcpu": "skylake-avx512"}, True),
        ({"kind": "llvm", "mcpu": "znver4"}, False),  # measured slower on the AMD EPYC
        ({"kind": "llvm", "mcpu": "haswell"}, False),  # no AVX-512: not measured
        ({"kind": "llvm"}, False),  # no CPU named
        ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a72"}, False),
    ],
)
def test_a_pointwise_requantization_is_in_float64_where_the_cpu_runs_it_faster(target, pays):
    assert double_pays_in_pointwise(target) is pays
    with tvm.target.Target(target):  # as the build enters the model's target
        assert double_pays_in_pointwise() is pays
    assert double_pays_in_pointwise() is False  # no target: the int64 form


@pytest.mark.skipif(this_machine() != "x86_64", reason="the build is for x86-64")
@pytest.mark.parametrize(
    ("mcpu", "double"), [("sapphirerapids", True), ("znver4", False)], ids=["intel", "amd"]
)
def test_a_pointwise_convolution_requantizes_as_its_target_cpu_runs_fastest(
    built_asm, mcpu, double
):
    """The build's target chooses the arithmetic (built, not run: the other CPU's
    instructions); the integers are the same either way (the tests of the 1x1
    convolutions above, on this machine's CPU)."""
    mod, _ = qconv_graph(channels=(16, 32), kernel=1, padding=(0, 0, 0, 0), size=8)
    hub = umahub.Hub(config={"plugins": ["npu"]}, project_config=False)
    compiled = hub.compile(mod, target={"kind": "llvm", "mcpu": mcpu})
    (partition,) = compiled.report.partitions
    assert partition.schedule[0].startswith("int8 conv2d 1x1: vnni")
    (asm,) = [a for a in built_asm if "vpdpbusd" in a]
    assert ("vcvtdq2pd" in asm and "vmulpd" in asm) is double


class _BlockRecorder:
    """A plugin that records the block names of each npu partition it is asked to schedule."""

    UMAHUB_API = 1

    def __init__(self):
        self.blocks: list[set[str]] = []
        self.loops: list[dict[str, list[str]]] = []  # block -> the loops' kinds around it
        self.names: list[dict[str, list[str]]] = []  # block -> the loops' names around it

    @umahub.hookimpl
    def umahub_schedule(self, accelerator, schedule, context):
        from tvm import tirx

        from umahub.plugin.compat import SBlock, nodes_in

        func = schedule.mod[context.symbol]
        names = {b.name_hint for b in nodes_in(func.body, SBlock)}
        self.blocks.append(names)
        # an AMX task's zeroing is a block inside its init, which the schedule cannot get
        in_init = {b.name_hint for blk in nodes_in(func.body, SBlock) if blk.init is not None
                   for b in nodes_in(blk.init, SBlock)}  # fmt: skip
        loops = {n: schedule.get_loops(schedule.get_sblock(n)) for n in names - in_init}
        kinds = {
            n: [tirx.ForKind(schedule.get(lp).kind).name for lp in ls] for n, ls in loops.items()
        }
        self.loops.append(kinds)
        self.names.append(
            {n: [str(schedule.get(lp).loop_var.name) for lp in ls] for n, ls in loops.items()}
        )


@pytest.mark.parametrize(
    "x_zp, stages",
    [(0, set()), (7, {"weight_sum"})],
    ids=["input zero point 0", "input zero point 7"],
)
def test_a_partition_knows_its_constant_quantization_parameters(x_zp, stages):
    """The zero points a model passes a partition as constants shape its kernel as on
    the host: a weight known symmetric needs no per-window input sums, an input zero
    point known 0 no weight sums (the window sums once took two thirds of a 3x3
    convolution's time on the npu)."""
    mod, parts = qconv_graph(x_zp=x_zp, channels=(8, 32))
    x = _x({})
    recorder = _BlockRecorder()
    hub = umahub.Hub(config={"plugins": ["npu"]}, plugins=[recorder])
    compiled = hub.compile(mod)
    (blocks,) = recorder.blocks
    assert "requantized" in blocks and "dot_init" in blocks  # the npu's packed form
    # a stage scheduled as a reduction is split in two: weight_sum_init, weight_sum_update
    assert {s for s in ("window_sum", "weight_sum") if any(b.startswith(s) for b in blocks)} == (
        stages
    )
    if stages:  # computed at every call: in parallel and in vectors, not serially
        kinds = recorder.loops[0]["weight_sum_update"]
        assert kinds[0] == "PARALLEL" and kinds[-1] == "VECTORIZED", kinds
    np.testing.assert_array_equal(compiled.run(x), reference(x, parts))


@pytest.mark.parametrize("second", [1.0, 0.0], ids=["the same", "another"])
def test_a_partition_called_twice_knows_a_constant_only_if_both_calls_pass_it(second):
    from tvm import relax

    from umahub.compiler.lowering import CONSTANT_LIMIT
    from umahub.ir import partition_constants
    from umahub.plugin.compat import TensorType

    bb = relax.BlockBuilder()
    a = relax.Var("a", TensorType((4,), "float32"))
    b = relax.Var("b", TensorType((4,), "float32"))
    with bb.function("npu_0", [a, b], attrs={"Codegen": "npu"}):
        bb.emit_func_output(bb.emit(relax.op.add(a, b)))
    gv = bb.get().get_global_var("npu_0")
    x = relax.Var("x", TensorType((4,), "float32"))
    with bb.function("main", [x]):
        first = bb.emit(relax.Call(gv, [x, relax.const(np.ones(4, "float32"))]))
        again = relax.const(np.full(4, second, "float32"))
        bb.emit_func_output(bb.emit(relax.Call(gv, [first, again])))
    known = partition_constants(bb.get(), CONSTANT_LIMIT)["npu_0"]
    assert list(known) == ([1] if second == 1.0 else [])
    assert partition_constants(bb.get(), 3) == {"npu_0": {}}  # more elements than the limit
