"""The int8 zoo models and the quantizer that makes them; the kit's comparison in steps.

By default only ``mlp_int8`` and ``cnn_int8`` are compiled (once each, in a
session fixture); the full-size int8 models are checked under ``-m slow``.
Accuracy is stated as measured on inputs the calibration never saw
(``umahub.models.inputs(name, seed)`` for seeds 0..N-1): the top-1 class
against the float model's, and the largest error in units of the output's
quantization step.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import umahub.models as zoo
from umahub._tvm import Constant, TensorType, constant_value, name_of
from umahub.models import int8
from umahub.models._registry import spec
from umahub.models.quantize import (
    QuantizationError,
    activation_params,
    calibrate,
    quantization_params,
    quantize_static,
    weight_params,
)
from umahub.testing import STEPS, compare, output_steps, steps_apart

SMALL = ["mlp", "cnn"]


@pytest.fixture(scope="session")
def vms():
    """``vm(name)``: the Relax VM of a zoo model compiled by plain ``tvm.compile``, once."""
    cache: dict[str, relax.VirtualMachine] = {}

    def vm(name: str) -> relax.VirtualMachine:
        if name not in cache:
            cache[name] = relax.VirtualMachine(tvm.compile(zoo.get(name), target="llvm"), tvm.cpu())
        return cache[name]

    return vm


def _run(vm: relax.VirtualMachine, arrays) -> np.ndarray:
    return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


def _bindings(mod: tvm.IRModule) -> list:
    return [b for block in mod["main"].body.blocks for b in block.bindings]


def _calls(mod: tvm.IRModule, op: str) -> list:
    return [
        b
        for b in _bindings(mod)
        if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", None) == op
    ]


def _const(expr) -> np.ndarray:
    return constant_value(expr).numpy()


def _output_step(mod: tvm.IRModule) -> float:
    (step,) = output_steps(mod)
    return float(step)


# --- structure -------------------------------------------------------------------------------


def test_cnn_int8_quantizes_the_tensors_ort_would_and_binds_int8_weights():
    mod = zoo.get("cnn_int8")
    quantized = [(name_of(b.var), name_of(b.value.args[0])) for b in _calls(mod, "relax.quantize")]
    # The input, each conv after its relu, the residual add, the flatten, the dense layer.
    assert quantized == [
        ("x_q", "x"),
        ("conv1_relu_q", "conv1_relu"),
        ("conv2_relu_q", "conv2_relu"),
        ("residual_q", "residual"),
        ("flatten_q", "flatten"),
        ("fc_bias_add_q", "fc_bias_add"),
    ]
    dequantized = _calls(mod, "relax.dequantize")
    assert len(dequantized) == 12
    of_constants = [b for b in dequantized if isinstance(b.value.args[0], Constant)]
    summary = [
        (
            name_of(b.var),
            str(_const(b.value.args[0]).dtype),
            _const(b.value.args[0]).shape,
            _const(b.value.args[1]).shape,
            int(b.value.attrs.axis),
        )
        for b in of_constants
    ]
    assert summary == [
        ("conv1_weight", "int8", (8, 3, 3, 3), (8,), 0),
        ("conv1_bias", "int32", (1, 8, 1, 1), (8,), 1),
        ("conv2_weight", "int8", (8, 8, 3, 3), (8,), 0),
        ("conv2_bias", "int32", (1, 8, 1, 1), (8,), 1),
        ("fc_weight", "int8", (2048, 10), (10,), 1),
        ("fc_bias", "int32", (10,), (10,), 0),
    ]
    for b in of_constants:
        assert not _const(b.value.args[2]).any()  # symmetric: zero point 0
        if str(_const(b.value.args[0]).dtype) == "int8":
            q = _const(b.value.args[0])
            assert q.min() >= -127 and q.max() <= 127
            assert np.abs(q).max() == 127  # the largest weight maps to the end of the range
    assert {b.value.attrs.out_dtype for b in _calls(mod, "relax.quantize")} == {"uint8"}


def test_bias_scale_is_input_scale_times_weight_scale():
    params = quantization_params(zoo.get("cnn_int8"))
    for x, op in [("x_q", "conv1"), ("conv1_relu_q", "conv2"), ("flatten_q", "fc")]:
        expected = (params[x].scale * params[f"{op}_weight"].scale).astype(np.float32)
        np.testing.assert_array_equal(params[f"{op}_bias"].scale, expected)


def test_reshape_keeps_the_parameters_of_its_input():
    params = quantization_params(zoo.get("cnn_int8"))
    assert params["flatten_q"].scale == params["residual_q"].scale
    assert params["flatten_q"].zero_point == params["residual_q"].zero_point


def test_mlp_int8_counts():
    mod = zoo.get("mlp_int8")
    assert [name_of(b.var) for b in _calls(mod, "relax.quantize")] == [
        "x_q",
        "fc1_relu_q",
        "fc2_bias_add_q",
    ]
    of_constants = [
        (name_of(b.var), str(_const(b.value.args[0]).dtype))
        for b in _calls(mod, "relax.dequantize")
        if isinstance(b.value.args[0], Constant)
    ]
    assert of_constants == [
        ("fc1_weight", "int8"),
        ("fc1_bias", "int32"),
        ("fc2_weight", "int8"),
        ("fc2_bias", "int32"),
    ]


def test_per_tensor_weights_and_int8_activations():
    base = spec("cnn")
    mod = quantize_static(
        zoo.get("cnn"),
        int8.calibration_set(base, 4),
        activation_dtype="int8",
        per_channel=False,
    )
    params = quantization_params(mod)
    assert params["conv1_weight"].scale.shape == ()
    assert params["conv1_bias"].scale.shape == ()
    assert params["fc_weight"].axis == -1
    activations = [p for name, p in params.items() if name.endswith("_q")]
    assert len(activations) == 6
    assert {p.dtype for p in activations} == {"int8"}
    # conv1's relu output is >= 0: its range [0, max] puts zero at the bottom of int8.
    assert params["conv1_relu_q"].zero_point == -128


def test_every_scale_is_positive_and_finite():
    for name in SMALL:
        for key, p in quantization_params(zoo.get(f"{name}_int8")).items():
            assert np.all(p.scale > 0) and np.all(np.isfinite(p.scale)), key


# --- calibration -----------------------------------------------------------------------------


def test_calibration_is_deterministic():
    base = spec("cnn")
    first, second = int8.calibration_set(base, 32), int8.calibration_set(base, 32)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a[0], b[0])
    assert calibrate(zoo.get("cnn"), first) == calibrate(zoo.get("cnn"), second)
    again = quantize_static(zoo.get("cnn"), second)
    tvm.ir.assert_structural_equal(again["main"], zoo.get("cnn_int8")["main"])


def test_calibration_set_is_not_an_example_input():
    samples = int8.calibration_set(spec("cnn"), 32)
    for seed in range(32):
        x = zoo.inputs("cnn", seed)[0]
        assert not any(np.array_equal(x, s[0]) for s in samples)


def test_bert_calibration_keeps_the_padding_mask():
    samples = int8.calibration_set(spec("bert"), 2)
    np.testing.assert_array_equal(samples[0][1], zoo.inputs("bert")[1])
    assert not np.array_equal(samples[0][0], samples[1][0])


# --- the scale floor -------------------------------------------------------------------------


def test_an_all_zero_range_gets_scale_one():
    p = activation_params(0.0, 0.0)
    assert (float(p.scale), int(p.zero_point), p.dtype) == (1.0, 0, "uint8")
    q = activation_params(0.0, 0.0, "int8")
    assert (float(q.scale), int(q.zero_point), q.dtype) == (1.0, 0, "int8")


def test_the_range_is_widened_to_include_zero():
    p = activation_params(2.0, 4.0)
    assert float(p.scale) == np.float32(4.0 / 255) and int(p.zero_point) == 0
    n = activation_params(-5.1, -1.0)
    assert float(n.scale) == np.float32(5.1 / 255) and int(n.zero_point) == 255


def test_an_all_zero_weight_channel_gets_scale_one():
    w = np.ones((3, 2, 1, 1), np.float32)
    w[1] = 0.0
    p = weight_params(w, axis=0)
    np.testing.assert_array_equal(p.scale, np.float32([1 / 127, 1.0, 1 / 127]))
    assert p.zero_point.dtype == np.int8 and not p.zero_point.any()


def _dead_relu_model() -> tvm.IRModule:
    """x @ W + b with b = -100, then relu: zero on every input the test gives."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((1, 4), "float32"))
    rng = np.random.default_rng(0)
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(rng.uniform(-0.5, 0.5, (4, 3)).astype(np.float32))
            y = bb.emit(relax.op.matmul(x, w), name_hint="fc")
            y = bb.emit(relax.op.add(y, relax.const(np.full(3, -100.0, np.float32))), "fc_bias")
            y = bb.emit(relax.op.nn.relu(y), name_hint="dead")
            w2 = relax.const(np.ones((3, 2), np.float32))
            out = bb.emit_output(bb.emit(relax.op.matmul(y, w2), name_hint="out"))
        bb.emit_func_output(out)
    return bb.get()


def test_a_tensor_zero_on_every_sample_is_quantized_with_scale_one():
    mod = _dead_relu_model()
    samples = [
        [np.random.default_rng(i).uniform(-1, 1, (1, 4)).astype(np.float32)] for i in range(4)
    ]
    assert calibrate(mod, samples)["dead"] == (0.0, 0.0)
    quantized = quantize_static(mod, samples)
    params = quantization_params(quantized)
    assert (float(params["dead_q"].scale), int(params["dead_q"].zero_point)) == (1.0, 0)
    assert (float(params["out_q"].scale), int(params["out_q"].zero_point)) == (1.0, 0)
    vm = relax.VirtualMachine(tvm.compile(quantized, target="llvm"), tvm.cpu())
    np.testing.assert_array_equal(_run(vm, samples[0]), np.zeros((1, 2), np.float32))


# --- mistakes --------------------------------------------------------------------------------


def test_unknown_activation_dtype_is_refused():
    with pytest.raises(QuantizationError) as info:
        quantize_static(zoo.get("mlp"), [zoo.inputs("mlp")], activation_dtype="int4")
    assert str(info.value) == "activation_dtype='int4': use one of uint8, int8"


def test_an_empty_calibration_set_is_refused():
    with pytest.raises(QuantizationError) as info:
        quantize_static(zoo.get("mlp"), [])
    assert str(info.value) == "no calibration sample: give at least one list of inputs"


def test_a_non_finite_calibration_value_names_the_tensor():
    x = np.full((1, 64), np.inf, np.float32)
    with pytest.raises(QuantizationError) as info:
        quantize_static(zoo.get("mlp"), [[x]])
    assert str(info.value) == (
        "tensor 'x': range [inf, inf] is not finite: calibrate on inputs the float model "
        "computes finite values for"
    )


def test_torch_zoo_refuses_an_int8_model():
    from umahub.errors import UnknownModelError
    from umahub.models import torch_zoo

    with pytest.raises(UnknownModelError) as info:
        torch_zoo.torch_module("cnn_int8")
    assert str(info.value) == (
        "cnn_int8 is quantized and has no PyTorch twin: use its float model 'cnn'"
    )


# --- int8 against float ----------------------------------------------------------------------

#: (model, test inputs, top-1 agreements, inputs whose every output is within ``STEPS_BOUND``
#: steps of the float model's). mlp's one miss: an input whose hidden activations exceed
#: what the 32 calibration inputs reached, so that the int8 model saturates there.
ACCURACY = [("mlp", 32, 32, 31), ("cnn", 32, 32, 32)]
STEPS_BOUND = 3


@pytest.mark.parametrize(("name", "count", "top1", "within"), ACCURACY)
def test_int8_model_is_close_to_the_float_model(vms, name, count, top1, within):
    step = _output_step(zoo.get(f"{name}_int8"))
    agree, close = 0, 0
    for seed in range(count):
        xs = zoo.inputs(name, seed)
        got, expected = _run(vms(f"{name}_int8"), xs), _run(vms(name), xs)
        agree += int(got.argmax() == expected.argmax())
        close += int(np.abs(got - expected).max() <= STEPS_BOUND * step)
    assert (agree, close) == (top1, within)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "count", "bound"), [("resnet18", 8, 3), ("mobilenetv2", 8, 4)])
def test_large_int8_model_is_close_to_the_float_model(vms, name, count, bound):
    """Same top-1 class, every logit within ``bound`` steps (measured: resnet18 2.2 steps,
    mobilenetv2 3.4, over the 8 inputs)."""
    step = _output_step(zoo.get(f"{name}_int8"))
    for seed in range(count):
        xs = zoo.inputs(name, seed)
        got, expected = _run(vms(f"{name}_int8"), xs), _run(vms(name), xs)
        assert got.argmax() == expected.argmax()
        assert np.abs(got - expected).max() <= bound * step


@pytest.mark.slow
def test_bert_int8_is_close_to_the_float_model(vms):
    """BERT's output is a layer norm of hidden states, no class: the bound is on the relative
    L2 error (measured 2.8% on seed 1).

    Not seed 0: ``inputs("bert", 0)`` draws the hidden states from the generator the weights
    are drawn from, with the same seed, so they equal the query weight's rows and the query
    reaches 30 where calibration saw 5; the int8 model is 16% off there, a property of
    that input, not of the quantizer.
    """
    for seed in (1, 2):
        xs = zoo.inputs("bert", seed)
        got, expected = _run(vms("bert_int8"), xs), _run(vms("bert"), xs)
        assert np.linalg.norm(got - expected) <= 0.04 * np.linalg.norm(expected)


# --- the kit's comparison in steps -----------------------------------------------------------


def test_the_int8_models_output_steps_are_their_last_dequantize():
    params = quantization_params(zoo.get("cnn_int8"))
    assert output_steps(zoo.get("cnn_int8")) == [params["fc_bias_add_q"].scale]
    assert output_steps(zoo.get("cnn")) == [None]


def test_identical_quantized_outputs_pass_with_zero_units(vms):
    xs = zoo.inputs("cnn_int8")
    reference = _run(vms("cnn_int8"), xs)
    steps = output_steps(zoo.get("cnn_int8"))
    assert STEPS.units == 0
    assert compare(reference.copy(), reference, steps=steps) == (0.0, "")
    assert steps_apart(reference.copy(), reference, steps) == 0


def test_one_element_off_by_one_unit_fails_with_the_count(vms):
    reference = _run(vms("cnn_int8"), zoo.inputs("cnn_int8"))
    steps = output_steps(zoo.get("cnn_int8"))
    step = np.float32(steps[0])
    wrong = reference.copy()
    wrong[0, 3] += step
    largest, problem = compare(wrong, reference, steps=steps)
    assert largest == pytest.approx(float(step), rel=1e-5)
    assert problem == (
        "output: 1 element differs by 1 unit of its quantization step from the host "
        f"(0 units allowed); the largest at (0, 3): got {float(wrong[0, 3]):.6g}, "
        f"host {float(reference[0, 3]):.6g}"
    )
    assert steps_apart(wrong, reference, steps) == 1


def test_the_message_counts_the_elements_by_units():
    reference = np.zeros((1, 6), np.float32)
    wrong = reference + np.float32([0.5, 0.5, 1.5, 0.0, -0.5, 0.2])
    _, problem = compare(wrong, reference, "logits", steps=[np.float64(0.5)])
    # 0.2 is off the grid: it counts as the next whole unit up.
    assert problem == (
        "logits: 4 elements differ by 1 unit, 1 element differs by 3 units of its "
        "quantization step from the host (0 units allowed); the largest at (0, 2): "
        "got 1.5, host 0"
    )
    assert steps_apart(wrong, reference, [np.float64(0.5)]) == 3


def test_integer_outputs_are_compared_in_units_of_one():
    reference = np.array([[1, 2, 3]], np.int8)
    wrong = np.array([[1, 4, 3]], np.int8)
    _, problem = compare(wrong, reference, steps=[1.0])
    assert problem == (
        "output: 1 element differs by 2 units of its quantization step from the host "
        "(0 units allowed); the largest at (0, 1): got 4, host 2"
    )
