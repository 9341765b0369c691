"""A fixed sample of the ONNX backend node tests, through umahub with the bundled plugins.

The whole sweep is ``python -m umahub.testing.onnx_suite`` (``tox -e onnx-suite``);
this sample keeps a case of each failure class the sweep found in umahub, the
cases issue 15 names, and a few ordinary operators in the default test run.
Plain TVM gets every case here right (checked by the sweep), so umahub must too.
"""

from __future__ import annotations

import pytest
import tvm

pytest.importorskip("onnx")

from umahub.testing import onnx_suite

# case name -> (generator module of onnx.backend.test.case.node, why it is here)
SAMPLE: dict[str, tuple[str, str]] = {
    # ordinary operators
    "test_relu": ("relu", "ordinary"),
    "test_add_bcast": ("add", "ordinary, broadcast"),
    "test_gemm_default_vector_bias": ("gemm", "ordinary"),
    "test_matmul_2d": ("matmul", "ordinary"),
    "test_softmax_axis_1": ("softmax", "ordinary"),
    "test_conv_with_strides_padding": ("conv", "ordinary"),
    # the importer's own PrimFuncs (pad, maximum, minimum) called with call_tir
    "test_conv_with_autopad_same": ("conv", "Conv auto_pad SAME_LOWER: the importer's pad"),
    "test_convtranspose_autopad_same": ("convtranspose", "auto_pad SAME_UPPER"),
    "test_clip": ("clip", "Clip with min/max inputs: the importer's maximum/minimum"),
    "test_dynamicquantizelinear_expanded": ("dynamicquantizelinear", "the importer's PrimFuncs"),
    # 0-d (scalar) inputs
    "test_clip_default_min": ("clip", "0-d input"),
    "test_gemm_default_scalar_bias": ("gemm", "0-d input"),
    "test_pow_bcast_scalar": ("pow", "0-d input"),
    "test_einsum_scalar": ("einsum", "0-d first input"),
    # types TVM keeps in another type's storage
    "test_einsum_batch_matmul_bfloat16": ("einsum", "bfloat16: no host rule vectorizes it"),
    "test_quantizelinear": ("quantizelinear", "0-d scale and zero point"),
    "test_triu_pos": ("trilu", "0-d k"),
    # sizes read from input tensors at run time (symbolic shapes)
    "test_unsqueeze_axis_0": ("unsqueeze", "axes as an input"),
    "test_squeeze": ("squeeze", "axes as an input"),
    "test_tile": ("tile", "repeats as an input"),
    "test_expand_dim_unchanged": ("expand", "shape as an input"),
    "test_compress_0": ("compress", "output size from the data (num_nonzero)"),
    # values computed at run time, control flow
    "test_range_float_type_positive_delta": ("rangeop", "Range: size from 0-d inputs"),
    "test_range_int32_type_negative_delta": ("rangeop", "Range, int32"),
    "test_tril_zero": ("trilu", "an empty output from a 0-d k"),
    "test_if": ("if_", "If: control flow in main"),
    # outputs that are shapes
    "test_shape_start_greater_than_end": ("shape", "an empty R.shape output"),
}


@pytest.fixture(scope="session")
def onnx_cases() -> dict[str, onnx_suite.Case]:
    """The sample's cases, generated once (only their generator modules)."""
    modules = sorted({module for module, _ in SAMPLE.values()})
    cases = onnx_suite.load_cases(names=SAMPLE, modules=modules)
    return {case.name: case for case in cases}


@pytest.fixture(scope="session")
def onnx_hub():
    """One hub with the bundled plugins and the default configuration."""
    return onnx_suite.make_hub()


@pytest.mark.parametrize("name", sorted(SAMPLE))
def test_onnx_node_case_matches_expected(name, onnx_cases, onnx_hub):
    """umahub's outputs of the case match the case's expected outputs."""
    assert name in onnx_cases, f"{name}: not generated (or not tensor-only) by this onnx"
    result = onnx_suite.run_case(onnx_cases[name], "umahub", onnx_hub)
    if result.outcome != "ok":
        # The promise is "never worse than plain TVM": on an older apache-tvm that
        # cannot import or run this case itself, there is nothing to compare.
        plain = onnx_suite.run_case(onnx_cases[name], "plain", None)
        if plain.outcome != "ok":
            pytest.skip(f"plain TVM {tvm.__version__} fails {name} too: {plain.outcome}")
    assert result.outcome == "ok", f"{name} ({SAMPLE[name][1]}): {result.outcome}: {result.detail}"
