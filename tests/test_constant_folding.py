"""Computations on weights alone run once, at compile time, not at every inference."""

from __future__ import annotations

import numpy as np
import pytest

import umahub

onnx = pytest.importorskip("onnx", reason="the case comes from an ONNX Gemm")


def _gemm_with_transposed_weight():
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = rng.standard_normal((32, 16)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1, name="fc")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, w, b


def test_a_transposed_constant_weight_is_transposed_once():
    model, w, b = _gemm_with_transposed_weight()
    hub = umahub.Hub(config={"plugins": ["npu"]}, project_config=False)
    compiled = hub.compile(model)
    # no permute_dims left to run on the host at every inference (apache-tvm 0.25's
    # ONNX frontend keeps no node names: the ops only)
    assert [(o.op, o.device) for o in compiled.report.placement] == [
        ("relax.matmul", "npu:0"),
        ("relax.add", "npu:0"),
    ]
    # the transposed weight goes to the npu once, at load; only x and y move per inference
    per_inference = [(c.src, c.dst, c.bytes) for c in compiled.report.copies if c.when != "load"]
    assert per_inference == [("host", "npu:0", 2 * 16 * 4), ("npu:0", "host", 2 * 32 * 4)]
    x = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)
    np.testing.assert_allclose(compiled.run(x), x @ w.T + b, rtol=1e-5, atol=1e-5)


def test_a_model_folding_would_break_is_kept_as_it_is():
    # ONNX Slice with starts and ends given at run time: TVM's FoldConstant drops the
    # PrimFunc "shape_func" while a call still names it; umahub keeps the unfolded module
    from onnx import TensorProto, helper

    ints = [helper.make_tensor_value_info(n, TensorProto.INT64, [1]) for n in ("s", "e", "a")]
    graph = helper.make_graph(
        [helper.make_node("Slice", ["x", "s", "e", "a"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [20, 10, 5]), *ints],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [20, 10, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    compiled = umahub.Hub(config={"plugins": ["npu"]}, project_config=False).compile(model)
    x = np.random.default_rng(0).standard_normal((20, 10, 5)).astype(np.float32)
    got = compiled.run(x, np.array([0]), np.array([-1]), np.array([2]))
    np.testing.assert_array_equal(got, x[:, :, 0:-1])
