"""Quantized models nobody here wrote, end to end (slow: PyTorch, torchvision, ONNX Runtime).

A torchvision architecture with random weights is exported to ONNX and
quantized by ONNX Runtime's own ``quantize_static`` (QDQ, per-channel, u8
activations and s8 weights, a fixed calibration set). umahub compiles it with
the bundled plugins: every quantized operator must land on the npu, the
model's integers must equal the host's bit for bit, and its outputs stay
within one quantization step of ONNX Runtime's (whose kernels round their
float requantization differently; how often is printed).
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
ort_quantization = pytest.importorskip("onnxruntime.quantization")

import onnx  # noqa: E402
import onnxruntime  # noqa: E402

import umahub  # noqa: E402

SHAPE = (1, 3, 96, 96)


def _qdq(tmp_path_factory, name: str) -> tuple[onnx.ModelProto, str]:
    """``name`` from torchvision (random weights) quantized by ONNX Runtime, and its path."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    folder = tmp_path_factory.mktemp(name)
    float_path, qdq_path = folder / "float.onnx", folder / "qdq.onnx"
    torch.onnx.export(
        model, (torch.randn(SHAPE),), str(float_path), input_names=["x"], dynamo=False
    )
    rng = np.random.default_rng(1)
    batches = [{"x": rng.standard_normal(SHAPE).astype("float32")} for _ in range(4)]

    class Calibration(CalibrationDataReader):
        def __init__(self):
            self.batches = iter(batches)

        def get_next(self):
            return next(self.batches, None)

    quantize_static(
        str(float_path),
        str(qdq_path),
        Calibration(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
    )
    return onnx.load(str(qdq_path)), str(qdq_path)


@pytest.fixture(scope="module", params=["mobilenet_v2", "resnet18"])
def quantized_model(request, tmp_path_factory):
    model, path = _qdq(tmp_path_factory, request.param)
    x = np.random.default_rng(2).standard_normal(SHAPE).astype("float32")
    hub = umahub.Hub()
    return (
        request.param,
        model,
        path,
        x,
        hub.compile(model),
        hub.compile(model, placement={"*": "host"}),
    )


def test_every_quantized_operator_is_on_the_npu(quantized_model):
    name, model, _, _, compiled, _ = quantized_model
    rows = compiled.report.quantized
    convs = sum(1 for n in model.graph.node if n.op_type == "Conv")
    gemms = sum(1 for n in model.graph.node if n.op_type in ("Gemm", "MatMul"))
    assert len(rows) == convs + gemms
    assert {(r["device"], r["why"]) for r in rows} == {("npu:0", "")}


def test_the_npus_integers_are_the_hosts(quantized_model):
    _, _, _, x, compiled, on_host = quantized_model
    np.testing.assert_array_equal(compiled.run(x), on_host.run(x))


def test_the_simnpu_takes_them_on_its_own_device_bit_for_bit_the_hosts(quantized_model):
    """The simulated NPU (a device of its own, programs run by its runtime) first: every
    quantized operator on one of its instances but the depthwise convolutions, which it
    refuses saying so; the model's integers the host's."""
    _, _, _, x, _, on_host = quantized_model
    name, model = quantized_model[0], quantized_model[1]
    compiled = umahub.Hub(config={"priority": ["simnpu"]}).compile(model)
    rows = compiled.report.quantized
    on_host = [r for r in rows if r["device"] == "host"]
    assert all("a grouped convolution" in r["why"] for r in on_host), on_host
    assert len(on_host) == (17 if name == "mobilenet_v2" else 0)
    assert {r["device"].split(":")[0] for r in rows if r not in on_host} == {"simnpu"}
    assert all(p.program for p in compiled.report.partitions), name
    np.testing.assert_array_equal(compiled.run(x), quantized_model[5].run(x))


def test_within_one_step_of_onnx_runtime(quantized_model):
    name, model, path, x, compiled, _ = quantized_model
    session = onnxruntime.InferenceSession(path)
    expected = session.run(None, {"x": x})[0]
    got = compiled.run(x)
    step = _output_scale(model)
    units = np.rint(np.abs(got - expected) / step).astype(int)
    print(f"{name}: {int((units == 1).sum())} of {units.size} outputs one step from ORT's")
    assert np.argmax(got) == np.argmax(expected)
    # differences in early layers travel: most outputs agree exactly, none is far off
    assert (units == 0).mean() > 0.5
    assert units.max() <= 8


def _output_scale(model: onnx.ModelProto) -> float:
    """The scale of the quantize whose dequantize gives the model's output."""
    from onnx import numpy_helper

    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    out = model.graph.output[0].name
    node = next(n for n in model.graph.node if out in n.output)
    return float(inits[node.input[1]])


def test_a_pt2e_model_places_its_quantized_operators_on_the_npu_bit_for_bit_the_hosts():
    """PyTorch's own quantization (PT2E, X86InductorQuantizer: u8 activations, s8
    weights per channel, float biases) of a torchvision architecture, through umahub."""
    pytest.importorskip("torchao")
    import warnings

    from test_quantized_torch import calibrated_mobilenet_v2
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

    shape = (1, 3, 64, 64)
    prepared = calibrated_mobilenet_v2(shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        converted = convert_pt2e(prepared)
        x = torch.randn(shape, generator=torch.Generator().manual_seed(2))
        program = torch.export.export(converted, (x,))
        expected = converted(x).detach().numpy()
    hub = umahub.Hub()
    compiled = hub.compile(program)
    rows = compiled.report.quantized
    assert len(rows) == 52  # its convolutions; the classifier gives float logits
    assert {(r["device"], r["why"]) for r in rows} == {("npu:0", "")}
    got = compiled.run(x.numpy())
    np.testing.assert_array_equal(got, hub.compile(program, placement={"*": "host"}).run(x.numpy()))
    assert np.argmax(got) == np.argmax(expected)
