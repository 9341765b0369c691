"""The int8 schedules (umahub.host.int8): vpdpbusd where the target has VNNI, the
exact int32 fallback elsewhere, both bit for bit the arithmetic's numpy reference.

The fallback is forced by the target: ``skylake-avx512`` has AVX-512 but no VNNI.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_quantized import _matmul_reference, qconv_graph, qmatmul_graph, reference

import umahub
from umahub.host.int8 import has_vnni

VNNI = {"kind": "llvm", "mcpu": "emeraldrapids"}
NO_VNNI = {"kind": "llvm", "mcpu": "skylake-avx512"}

needs_vnni = pytest.mark.skipif(not has_vnni(), reason="this CPU has no AVX-512 VNNI")

SHAPES = {
    "3x3": {},
    "3x3 stride 2, uneven padding": {"strides": (2, 2), "padding": (0, 1, 2, 1)},
    "int8 input, asymmetric weights": {"x_dtype": "int8", "x_zp": -3, "w_zp": 5},
    "24 output channels, 3 input channels": {"channels": (3, 24)},
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
    assert compiled.report.host_schedules == {
        f"int8 conv2d: {how}, weights packed at compile time": 1
    }
    np.testing.assert_array_equal(compiled.run(x), reference(x, parts))


DEPTHWISE = {
    "uint8 input, relu": {},
    "int8 input, asymmetric weights, clip": {
        "x_dtype": "int8",
        "x_zp": -3,
        "w_zp": 5,
        "activation": "clip",
    },
    "uneven padding, float bias": {"padding": (0, 1, 2, 1), "bias": "float"},
}


@pytest.mark.parametrize(
    "target", [pytest.param(VNNI, marks=needs_vnni), NO_VNNI], ids=["vnni", "fallback"]
)
@pytest.mark.parametrize("case", DEPTHWISE)
def test_a_depthwise_convolution_is_exact_in_int32_vectors(host_hub, case, target):
    options = {"channels": (16, 16), "groups": 16, "size": 58, **DEPTHWISE[case]}
    mod, parts = qconv_graph(**options)
    dtype, size = options.get("x_dtype", "uint8"), options["size"]
    info = np.iinfo(dtype)
    x = np.random.default_rng(3).integers(info.min, info.max + 1, size=(1, 16, size, size))
    x = x.astype(dtype)
    compiled = host_hub.compile(mod, target=target)
    assert compiled.report.host_schedules == {
        "int8 depthwise: int32 vectors over a row's positions": 1
    }
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


@pytest.mark.parametrize(
    "options", [{"strides": (2, 2), "size": 58}, {"size": 10}], ids=["stride 2", "narrow"]
)
def test_the_host_leaves_strided_and_narrow_depthwise_convolutions_to_its_generic_rules(
    host_hub, options
):
    mod, parts = qconv_graph(channels=(16, 16), groups=16, **options)
    size = options["size"]
    x = np.random.default_rng(3).integers(0, 256, size=(1, 16, size, size)).astype("uint8")
    compiled = host_hub.compile(mod)
    assert not any(k.startswith("int8") for k in compiled.report.host_schedules)
    np.testing.assert_array_equal(compiled.run(x), reference(x, parts))


def test_the_npu_schedules_a_quantized_depthwise_partition():
    mod, parts = qconv_graph(channels=(16, 16), groups=16, size=12, strides=(2, 2))
    x = np.random.default_rng(3).integers(0, 256, size=(1, 16, 12, 12)).astype("uint8")
    compiled = umahub.Hub(config={"plugins": ["npu"]}).compile(mod)
    (partition,) = compiled.report.partitions
    assert partition.schedule == ["int8 depthwise: int32 vectors over a row's positions"]
    np.testing.assert_array_equal(compiled.run(x), reference(x, parts))


@needs_vnni
def test_the_npu_schedules_its_quantized_partition_with_vnni_and_packs_at_compile_time():
    mod, parts = qconv_graph(channels=(8, 32), strides=(2, 2))
    x = _x({})
    compiled = umahub.Hub(config={"plugins": ["npu"]}).compile(mod)
    (partition,) = compiled.report.partitions
    assert partition.schedule == ["int8 conv2d: vnni, 16x4 dot, weights packed at compile time"]
    np.testing.assert_array_equal(compiled.run(x), reference(x, parts))
