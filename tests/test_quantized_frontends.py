"""Quantized ONNX models through umahub's import: operator forms in QDQ, parameters checked.

Each operator form umahub rewrites (QLinearConv, QLinearMatMul, ConvInteger,
ONNX Runtime's com.microsoft QLinear operators) is built as a one-node graph,
imported by ``umahub.frontends.from_onnx``, compiled by plain ``tvm.compile``
and compared with ONNX Runtime and with ONNX's reference implementation.

Two kinds of data:

* power-of-two scales and small integers: every float step of the QDQ form
  is exact, so the outputs must be equal element for element, including the
  ties that round half to even;
* random scales: the QDQ form computes in float32 where ONNX Runtime
  requantizes an int32 accumulator with one float multiplier (or, for its
  QLinearAdd/Mul, scales each input by a ratio of scales), so an element lying
  within a float32 rounding of a half may round the other way. The test
  asserts that no element differs by more than 1 and exactly how many differ
  by 1 (measured; TVM's float path is deterministic on x86).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto as T  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from umahub.errors import UmahubError  # noqa: E402
from umahub.frontends import from_onnx  # noqa: E402
from umahub.frontends.onnx_quantized import to_qdq  # noqa: E402
from umahub.testing.onnx_suite import operator_nodes  # noqa: E402

MS = "com.microsoft"
ONNX_TYPE = {"uint8": T.UINT8, "int8": T.INT8, "int32": T.INT32, "float32": T.FLOAT}


def _model(nodes, inputs, outputs, inits=(), opset=13):
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info(n, ONNX_TYPE[str(a.dtype)], a.shape) for n, a in inputs.items()],
        [h.make_tensor_value_info(n, ONNX_TYPE[d], None) for n, d in outputs.items()],
        [nh.from_array(np.asarray(v), k) for k, v in dict(inits).items()],
    )
    opsets = [h.make_opsetid("", opset), h.make_opsetid(MS, 1)]
    return h.make_model(graph, opset_imports=opsets, ir_version=8)


def _tvm(model, inputs):
    import tvm
    from tvm import relax

    ex = tvm.compile(from_onnx(model), target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs.values()])
    return out.numpy()


def _ort(model, inputs):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)[0]


def _reference(model, inputs):
    return ReferenceEvaluator(model).run(None, inputs)[0]


def _differ_by_one(ours, theirs):
    """How many elements differ (asserting that none differs by more than 1)."""
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    diff = np.abs(ours.astype(np.int64) - theirs.astype(np.int64))
    assert diff.max(initial=0) <= 1, diff.max()
    return int(np.count_nonzero(diff))


def _q(rng, dtype, shape):
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    return rng.integers(lo, hi, shape).astype(dtype)


# ---------------------------------------------------------------------------- QLinearConv


def _qlinear_conv(dtype, per_channel, exact, seed=0):
    rng = np.random.default_rng(seed)
    x = _q(rng, dtype, (1, 4, 6, 6)) // (8 if exact else 1)
    w = _q(rng, "int8", (8, 4, 3, 3)) // (8 if exact else 1)
    if exact:  # power-of-two scales: the float path is exact, ties included
        xs, ws, ys = np.float32(0.5), np.float32(0.25), np.float32(4.0)
    else:
        xs, ys = np.float32(0.0173), np.float32(0.231)
        ws = np.float32(0.0071)
    ws = np.full(8, ws, np.float32) * (np.arange(8, dtype=np.float32) + 1) if per_channel else ws
    wzp = np.zeros(8 if per_channel else (), np.int8)
    xzp = np.array(3 if dtype == "uint8" else -2, dtype)
    yzp = np.array(128 if dtype == "uint8" else 5, dtype)
    bias = rng.integers(-300, 300, 8).astype(np.int32)
    node = h.make_node(
        "QLinearConv",
        ["x", "xs", "xzp", "w", "ws", "wzp", "ys", "yzp", "b"],
        ["y"],
        name="conv1",
        pads=[1, 1, 1, 1],
        strides=[1, 1],
    )
    inits = {"xs": xs, "xzp": xzp, "w": w, "ws": ws, "wzp": wzp, "ys": ys, "yzp": yzp, "b": bias}
    return _model([node], {"x": x}, {"y": dtype}, inits, opset=13), {"x": x}


# ONNX's reference QLinearConv and QLinearMatMul add the zero point *before* rounding
# (round(acc * m + zp)); QuantizeLinear, ONNX Runtime and umahub round first
# (round(acc * m) + zp). They differ where acc * m is a tie and zp is odd: 26
# elements of the exact int8 case (zp 5), which has ties by construction.
@pytest.mark.parametrize(
    "dtype, per_channel, exact, off_ort, off_reference",
    [
        ("uint8", False, True, 0, 0),
        ("int8", True, True, 0, 26),
        ("uint8", False, False, 0, 0),
        ("int8", True, False, 0, 0),
    ],
)
def test_qlinear_conv_is_qdq_and_matches_onnxruntime(
    dtype, per_channel, exact, off_ort, off_reference
):
    model, inputs = _qlinear_conv(dtype, per_channel, exact)
    ours = _tvm(model, inputs)
    assert _differ_by_one(ours, _ort(model, inputs)) == off_ort
    assert _differ_by_one(ours, _reference(model, inputs)) == off_reference


def test_qlinear_conv_becomes_dequantize_conv_quantize_named_after_the_node():
    model, _ = _qlinear_conv("int8", True, True)
    nodes = [(n.op_type, n.name) for n in to_qdq(model).graph.node]
    assert nodes == [
        ("DequantizeLinear", "conv1.dequantize_x"),
        ("DequantizeLinear", "conv1.dequantize_w"),
        ("DequantizeLinear", "conv1.dequantize_bias"),
        ("Conv", "conv1"),
        ("QuantizeLinear", "conv1.quantize"),
    ]
    rewritten = to_qdq(model)
    bias_scale = next(i for i in rewritten.graph.initializer if i.name == "conv1.bias_scale")
    assert np.array_equal(
        nh.to_array(bias_scale),
        np.float32(0.5) * np.float32(0.25) * np.arange(1, 9, dtype=np.float32),
    )
    names = operator_nodes(from_onnx(model))
    assert {"conv1", "conv1.quantize", "conv1.dequantize_w", "conv1.dequantize_x"} <= set(names)


# ---------------------------------------------------------------------------- QLinearMatMul


@pytest.mark.parametrize("dtype, per_column, off_by_one", [("uint8", False, 0), ("int8", True, 0)])
def test_qlinear_matmul_matches_onnxruntime_and_the_reference(dtype, per_column, off_by_one):
    rng = np.random.default_rng(1)
    a = _q(rng, dtype, (2, 5, 16))
    b = _q(rng, "int8", (16, 6))
    bs = (
        np.float32(0.013) * (np.arange(6, dtype=np.float32) + 1) if per_column else np.float32(0.02)
    )
    inits = {
        "as": np.float32(0.031), "azp": np.array(7 if dtype == "uint8" else -3, dtype),
        "b": b, "bs": bs, "bzp": np.zeros(6 if per_column else (), np.int8),
        "ys": np.float32(0.9), "yzp": np.array(100 if dtype == "uint8" else 2, dtype),
    }  # fmt: skip
    node = h.make_node("QLinearMatMul", ["a", "as", "azp", "b", "bs", "bzp", "ys", "yzp"], ["y"])
    model = _model([node], {"a": a}, {"y": dtype}, inits)
    ours = _tvm(model, {"a": a})
    assert _differ_by_one(ours, _ort(model, {"a": a})) == off_by_one
    assert _differ_by_one(ours, _reference(model, {"a": a})) == off_by_one


# ---------------------------------------------------------------------------- ConvInteger


@pytest.mark.parametrize("dtype, per_channel", [("uint8", False), ("uint8", True), ("int8", True)])
def test_conv_integer_is_exact_int32(dtype, per_channel):
    rng = np.random.default_rng(2)
    x = _q(rng, dtype, (1, 3, 7, 7))
    w = _q(rng, dtype, (4, 3, 3, 3))
    zp = np.array(9 if dtype == "uint8" else -4, dtype)
    wzp = np.array([1, 2, 3, 4] if per_channel else 3, dtype)
    node = h.make_node("ConvInteger", ["x", "w", "xzp", "wzp"], ["y"], pads=[1, 2, 1, 0])
    model = _model([node], {"x": x}, {"y": "int32"}, {"w": w, "xzp": zp, "wzp": wzp}, opset=10)
    ours = _tvm(model, {"x": x})
    assert ours.dtype == np.int32
    assert np.array_equal(ours, _reference(model, {"x": x}))
    if not per_channel:  # ONNX Runtime's ConvInteger takes a per-tensor w_zero_point only
        assert np.array_equal(ours, _ort(model, {"x": x}))


# ---------------------------------------------------------------------------- com.microsoft


def _contrib(op, dtype, inputs, attrs=None, two=False):
    """A one-node model of ORT's ``op`` over quantized ``inputs`` with random scales."""
    zp = {"uint8": 120, "int8": -7}[dtype]
    names, inits, feeds = [], {}, {}
    for i, value in enumerate(inputs):
        names += [f"x{i}", f"x{i}_s", f"x{i}_zp"]
        feeds[f"x{i}"] = value
        inits[f"x{i}_s"] = np.float32(0.011 * (i + 1.7))
        inits[f"x{i}_zp"] = np.array(zp + i, dtype)
    inits["y_s"], inits["y_zp"] = np.float32(0.0237), np.array(zp - 3, dtype)
    if op == "QLinearConcat":
        names = ["y_s", "y_zp", *names]
    else:
        names += ["y_s", "y_zp"]
    node = h.make_node(op, names, ["y"], domain=MS, name=f"my_{op.lower()}", **(attrs or {}))
    return _model([node], feeds, {"y": dtype}, inits, opset=19), feeds


CONTRIB = {
    # op: (number of inputs, attributes, elements off by one for uint8, for int8)
    "QLinearAdd": (2, {}, 0, 0),
    "QLinearMul": (2, {}, 0, 0),
    "QLinearConcat": (3, {"axis": 1}, 0, 0),
    "QLinearGlobalAveragePool": (1, {}, 0, 0),
    "QLinearAveragePool": (
        1,
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        0,
        0,
    ),
    "QLinearSigmoid": (1, {}, 0, 0),
    "QLinearLeakyRelu": (1, {"alpha": 0.1}, 0, 0),
    # ORT's QLinearSoftmax looks exp up in a table of the 256 quantized inputs
    "QLinearSoftmax": (1, {"axis": -1, "opset": 19}, 1, 1),
}


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("op", list(CONTRIB))
def test_onnxruntime_contrib_operator_is_qdq_and_matches_onnxruntime(op, dtype):
    count, attrs, off_uint8, off_int8 = CONTRIB[op]
    rng = np.random.default_rng(3)
    feeds = [_q(rng, dtype, (1, 4, 5, 5)) for _ in range(count)]
    model, inputs = _contrib(op, dtype, feeds, attrs)
    ours = _tvm(model, inputs)
    assert _differ_by_one(ours, _ort(model, inputs)) == (
        off_uint8 if dtype == "uint8" else off_int8
    )
    # The QDQ form itself is standard ONNX here: its reference result is ours exactly.
    assert np.array_equal(ours, _reference(to_qdq(model), inputs))
    ops = [n.op_type for n in to_qdq(model).graph.node]
    assert ops[-1] == "QuantizeLinear" and ops.count("DequantizeLinear") == count


@pytest.mark.parametrize("per_channel, alpha", [(False, 1.0), (True, 1.0), (True, 0.5)])
def test_qgemm_with_int32_bias_matches_onnxruntime(per_channel, alpha):
    rng = np.random.default_rng(4)
    a = _q(rng, "uint8", (3, 16))
    b = _q(rng, "int8", (8, 16))
    bs = (
        np.float32(0.01) * (np.arange(8, dtype=np.float32) + 1) if per_channel else np.float32(0.02)
    )
    inits = {
        "as": np.float32(0.03), "azp": np.uint8(130), "b": b, "bs": bs,
        "bzp": np.zeros(8 if per_channel else (), np.int8),
        "c": rng.integers(-500, 500, 8).astype(np.int32),
        "ys": np.float32(0.7), "yzp": np.uint8(110),
    }  # fmt: skip
    node = h.make_node(
        "QGemm", ["a", "as", "azp", "b", "bs", "bzp", "c", "ys", "yzp"], ["y"],
        domain=MS, transB=1, alpha=alpha, name="fc",
    )  # fmt: skip
    model = _model([node], {"a": a}, {"y": "uint8"}, inits)
    assert _differ_by_one(_tvm(model, {"a": a}), _ort(model, {"a": a})) == 0


def test_qgemm_without_output_scale_gives_float():
    rng = np.random.default_rng(5)
    a, b = _q(rng, "uint8", (2, 8)), _q(rng, "int8", (8, 3))
    inits = {"as": np.float32(0.5), "azp": np.uint8(128), "b": b, "bs": np.float32(0.25),
             "bzp": np.int8(0)}  # fmt: skip
    node = h.make_node("QGemm", ["a", "as", "azp", "b", "bs", "bzp"], ["y"], domain=MS)
    model = _model([node], {"a": a}, {"y": "float32"}, inits)
    assert np.array_equal(_tvm(model, {"a": a}), _ort(model, {"a": a}))


# ---------------------------------------------------------------------------- quantize_static


def _small_net():
    """Conv+Relu, Conv, residual Add, GlobalAveragePool, Flatten, Gemm: float ONNX."""
    rng = np.random.default_rng(6)
    inits = {
        "w1": rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3,
        "b1": rng.standard_normal(8).astype(np.float32) * 0.1,
        "w2": rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2,
        "b2": rng.standard_normal(8).astype(np.float32) * 0.1,
        "fw": rng.standard_normal((10, 8)).astype(np.float32) * 0.5,
        "fb": rng.standard_normal(10).astype(np.float32) * 0.1,
    }
    nodes = [
        h.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        h.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        h.make_node("Add", ["c2", "r1"], ["s"], name="add"),
        h.make_node("GlobalAveragePool", ["s"], ["p"], name="pool"),
        h.make_node("Flatten", ["p"], ["f"], name="flatten"),
        h.make_node("Gemm", ["f", "fw", "fb"], ["y"], name="fc", transB=1),
    ]
    x = np.zeros((1, 3, 12, 12), np.float32)
    return _model(nodes, {"x": x}, {"y": "float32"}, inits, opset=13)


@pytest.mark.parametrize("per_channel, off_by_one", [(False, 0), (True, 0)])
def test_onnxruntime_quantize_static_operator_format(tmp_path, per_channel, off_by_one):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Calibration(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(7)
            self.batches = iter(
                [{"x": rng.standard_normal((1, 3, 12, 12)).astype(np.float32)} for _ in range(8)]
            )

        def get_next(self):
            return next(self.batches, None)

    onnx.save(_small_net(), tmp_path / "float.onnx")
    quantize_static(
        str(tmp_path / "float.onnx"), str(tmp_path / "q.onnx"), Calibration(),
        quant_format=QuantFormat.QOperator, per_channel=per_channel,
    )  # fmt: skip
    model = onnx.load(tmp_path / "q.onnx")
    kinds = {(n.domain, n.op_type) for n in model.graph.node}
    assert {("", "QLinearConv"), (MS, "QLinearAdd"), (MS, "QLinearGlobalAveragePool"),
            (MS, "QGemm")} <= kinds  # fmt: skip
    x = {"x": np.random.default_rng(8).standard_normal((1, 3, 12, 12)).astype(np.float32)}
    ours, theirs = _tvm(model, x), _ort(model, x)
    # The output is dequantized: compare in units of its scale.
    scale = next(float(nh.to_array(i)) for i in model.graph.initializer if i.name == "y_scale")
    units = np.rint(np.abs(ours - theirs) / scale).astype(np.int64)
    assert units.max() <= 1 and int(np.count_nonzero(units)) == off_by_one


# ---------------------------------------------------------------------------- refusals


def _quantize_linear(scale, zp, xshape=(1, 4), axis=None):
    node = h.make_node(
        "QuantizeLinear", ["x", "s", "zp"], ["y"], name="conv1_QuantizeLinear",
        **({} if axis is None else {"axis": axis}),
    )  # fmt: skip
    x = np.zeros(xshape, np.float32)
    return _model([node], {"x": x}, {"y": str(np.asarray(zp).dtype)}, {"s": scale, "zp": zp})


FIX = "a scale must be positive and finite: quantize the model again, or correct the value"
MALFORMED = {
    "zero scale": (
        _quantize_linear(np.float32(0), np.uint8(3)),
        "node 'conv1_QuantizeLinear' (QuantizeLinear): y_scale (initializer 's') is 0, "
        f"not positive; {FIX}",
    ),
    "negative scale": (
        _quantize_linear(np.float32(-0.5), np.uint8(3)),
        "node 'conv1_QuantizeLinear' (QuantizeLinear): y_scale (initializer 's') is -0.5, "
        f"not positive; {FIX}",
    ),
    "infinite per-channel scale": (
        _quantize_linear(
            np.array([0.1, np.inf, 0.2, 0.3], np.float32), np.zeros(4, np.int8), axis=1
        ),
        "node 'conv1_QuantizeLinear' (QuantizeLinear): y_scale (initializer 's') has inf at "
        f"index 1, not finite; {FIX}",
    ),
    "per-channel length": (
        _quantize_linear(np.full(3, 0.1, np.float32), np.zeros(3, np.int8), axis=1),
        "node 'conv1_QuantizeLinear' (QuantizeLinear): y_scale (initializer 's') has 3 values, "
        "but axis 1 of x (model input 'x') has 4 channels: give one scale per channel, or a "
        "single one",
    ),
    "zero point type": (
        _model(
            [h.make_node("DequantizeLinear", ["x", "s", "zp"], ["y"], name="dq")],
            {"x": np.zeros((2, 2), np.uint8)},
            {"y": "float32"},
            {"s": np.float32(0.1), "zp": np.int8(0)},
        ),
        "node 'dq' (DequantizeLinear): x_zero_point (initializer 'zp') is int8 but x (model "
        "input 'x') is uint8; ONNX requires the same type: store the zero point as uint8",
    ),
}


def _conv_with_int8_x_zero_point():
    model, _ = _qlinear_conv("uint8", False, True)
    for init in model.graph.initializer:
        if init.name == "xzp":
            init.CopyFrom(nh.from_array(np.int8(3), "xzp"))
    return model


MALFORMED["QLinearConv x_zero_point type"] = (
    _conv_with_int8_x_zero_point(),
    "node 'conv1' (QLinearConv): x_zero_point (initializer 'xzp') is int8 but x (model input "
    "'x') is uint8; ONNX requires the same type: store the zero point as uint8",
)


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_quantization_parameters_are_refused_naming_node_and_initializer(case):
    model, message = MALFORMED[case]
    with pytest.raises(UmahubError) as info:
        from_onnx(model)
    assert str(info.value) == message


def test_the_command_refuses_a_zero_scale_with_one_line_and_status_2(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.umahub]\nplugins = ["npu"]\n')
    onnx.save(MALFORMED["zero scale"][0], tmp_path / "model.onnx")
    result = subprocess.run(
        [sys.executable, "-m", "umahub", "compile", "model.onnx"],
        capture_output=True, text=True, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"umahub: error: model.onnx: {MALFORMED['zero scale'][1]}"
    ]


def test_an_operator_with_no_rewrite_and_no_converter_is_the_usual_error():
    x = np.zeros((1, 4), np.uint8)
    node = h.make_node("QLinearReduceMean", ["x", "s", "zp", "s", "zp"], ["y"], domain=MS)
    model = _model([node], {"x": x}, {"y": "uint8"}, {"s": np.float32(0.1), "zp": np.uint8(0)})
    with pytest.raises(UmahubError) as info:
        from_onnx(model)
    assert str(info.value) == (
        "TVM's ONNX frontend could not import the model: OpNotImplemented: The following "
        "operators are not supported for frontend ONNX: QLinearReduceMean"
    )
