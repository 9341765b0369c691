"""One quantized operator against ONNX Runtime's: at most one unit apart, and rarely.

ONNX Runtime requantizes in float32 (``float(acc) * scale``, rounded with the
FPU's rounding); umahub in fixed point from the scales' float64 product (see
:mod:`umahub.plugin.quantization`). The two differ only where the exact value is
within float32's error of a half: never by more than one unit, and in a small
fraction of the outputs, which these tests state.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import umahub


def _qdq_model(kind: str, seed: int = 0) -> onnx.ModelProto:
    """``QuantizeLinear -> DequantizeLinear -> Conv/Gemm (+ int32 bias) -> Relu ->
    QuantizeLinear``, weights int8 per output channel, as ORT's quantizer writes it."""
    rng = np.random.default_rng(seed)
    if kind == "conv":
        cin, cout, x_shape = 16, 32, [1, 16, 12, 12]
        w = rng.integers(-127, 128, size=(cout, cin, 3, 3)).astype(np.int8)
    else:
        cin, cout, x_shape = 64, 48, [4, 64]
        w = rng.integers(-127, 128, size=(cout, cin)).astype(np.int8)
    w_scale = rng.uniform(0.001, 0.01, cout).astype(np.float32)
    x_scale, y_scale = np.float32(0.02), np.float32(0.05)
    b = rng.integers(-20000, 20000, size=cout).astype(np.int32)
    inits = [
        numpy_helper.from_array(np.array(x_scale), "x_scale"),
        numpy_helper.from_array(np.array(128, np.uint8), "x_zp"),
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(w_scale, "w_scale"),
        numpy_helper.from_array(np.zeros(cout, np.int8), "w_zp"),
        numpy_helper.from_array(b, "b"),
        numpy_helper.from_array((x_scale * w_scale).astype(np.float32), "b_scale"),
        numpy_helper.from_array(np.zeros(cout, np.int32), "b_zp"),
        numpy_helper.from_array(np.array(y_scale), "y_scale"),
        numpy_helper.from_array(np.array(3, np.uint8), "y_zp"),
    ]
    if kind == "conv":
        op = helper.make_node("Conv", ["xd", "wd", "bd"], ["y"], pads=[1, 1, 1, 1], name="conv")
        out_shape = [1, cout, 12, 12]
    else:
        op = helper.make_node("Gemm", ["xd", "wd", "bd"], ["y"], transB=1, name="gemm")
        out_shape = [4, cout]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"], name="xq"),
        helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zp"], ["xd"], name="xd"),
        helper.make_node("DequantizeLinear", ["w", "w_scale", "w_zp"], ["wd"], axis=0, name="wd"),
        helper.make_node("DequantizeLinear", ["b", "b_scale", "b_zp"], ["bd"], axis=0, name="bd"),
        op,
        helper.make_node("Relu", ["y"], ["r"], name="relu"),
        helper.make_node("QuantizeLinear", ["r", "y_scale", "y_zp"], ["out"], name="yq"),
    ]
    graph = helper.make_graph(
        nodes,
        kind,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("out", TensorProto.UINT8, out_shape)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("kind", ["conv", "gemm"])
def test_one_quantized_operator_is_within_one_unit_of_onnx_runtime(kind):
    model = _qdq_model(kind)
    x_shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(1).standard_normal(x_shape).astype(np.float32) * 1.5
    session = onnxruntime.InferenceSession(model.SerializeToString())
    expected = session.run(None, {"x": x})[0].astype(int)
    compiled = umahub.Hub(config={"plugins": ["npu"]}).compile(model)
    assert [r["device"] for r in compiled.report.quantized] == ["npu:0"]
    got = compiled.run(x).astype(int)
    differ = np.abs(got - expected)
    assert differ.max() <= 1
    assert differ.sum() / differ.size < 0.01  # measured: 0 to a few in a thousand


@pytest.mark.parametrize("kind", ["conv", "gemm"])
def test_folding_keeps_the_weights_int8_under_their_dequantize(kind):
    from umahub.frontends.onnx_import import from_onnx
    from umahub.host.folding import fold_constants
    from umahub.plugin import dtype_of

    folded = fold_constants(from_onnx(_qdq_model(kind)))["main"]
    kept = [
        b.value
        for block in folded.body.blocks
        for b in block.bindings
        if getattr(b.value, "op", None) is not None
        and getattr(b.value.op, "name", "") == "relax.dequantize"
    ]
    # the input's, the weight's (transposed under it for the Gemm) and the bias's
    types = sorted(dtype_of(d.args[0]) for d in kept)
    assert types == ["int32", "int8", "uint8"]
    assert "R.permute_dims" not in folded.script()


def test_the_report_names_each_operator_of_a_quantized_partition_after_its_node():
    compiled = umahub.Hub(config={"plugins": ["npu"]}).explain(_qdq_model("conv"))
    assert [(o.name, o.op, o.device) for o in compiled.placement] == [
        ("xq", "relax.quantize", "host"),
        ("xd", "relax.dequantize", "npu:0"),
        ("wd", "relax.dequantize", "npu:0"),
        ("conv", "relax.nn.conv2d", "npu:0"),
        ("bd", "relax.dequantize", "npu:0"),
        ("conv", "relax.add", "npu:0"),
        ("relu", "relax.nn.relu", "npu:0"),
        ("yq", "relax.quantize", "npu:0"),
    ]
