"""PT2E-quantized PyTorch models through umahub's import, against PyTorch's converted model.

torchvision's mobilenet_v2 with random weights (seeded) is quantized by PT2E
(``torchao.quantization.pt2e``: ``prepare_pt2e`` with ``X86InductorQuantizer``,
int8 per-channel weights and uint8 activations, calibration on a fixed seeded
set, ``convert_pt2e``), exported by ``torch.export`` with every quantized
activation as an extra output (resnet18 cannot be quantized so: its blocks call one
``ReLU`` twice, which ``X86InductorQuantizer`` refuses), imported by umahub, compiled by plain
``tvm.compile`` and run on a new input. Every uint8 tensor is compared with
PyTorch's element for element: the input's quantization exactly, the others
within the counts the test states (the float operators between them sum in
another order than PyTorch's; and PyTorch quantizes ``round(x * (1 / scale))``
where Relax computes ``round(x / scale)``), the float output within 2%.

Slow (``-m slow``, ``tox -e slow``) and needs PyTorch and torchao (``pip
install 'umahub[torch,torchao]'``).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch", reason="needs PyTorch: pip install 'umahub[torch]'")
pt2e = pytest.importorskip(
    "torchao.quantization.pt2e.quantize_pt2e", reason="needs torchao: pip install 'umahub[torchao]'"
)

from umahub.errors import UmahubError  # noqa: E402
from umahub.frontends import from_exported_program  # noqa: E402


def _compile(program):
    import tvm
    from tvm import relax

    ex = tvm.compile(from_exported_program(program), target="llvm")
    return relax.VirtualMachine(ex, tvm.cpu())


def _outputs(vm, x):
    out = vm["main"](__import__("tvm").runtime.tensor(x.numpy()))
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def _with_quantized_outputs(module):
    """``module`` (a converted GraphModule) also returning each quantize call's result."""
    graph = module.graph
    quantized = [n for n in graph.nodes if "quantize_per_tensor" in str(n.target)]
    quantized = [n for n in quantized if not str(n.target).split(".")[1].startswith("de")]
    output = next(n for n in graph.nodes if n.op == "output")
    (result,) = output.args
    output.args = (
        (*result, *quantized) if isinstance(result, (list, tuple)) else (result, *quantized),
    )
    graph._codegen = torch.fx.graph.CodeGen()  # the exported output spec has one leaf
    graph.lint()
    module.recompile()
    return module, len(quantized)


def _mobilenet_v2():
    from test_torchvision import tv  # torchvision, also where its C ops do not load

    torch.manual_seed(0)
    model = tv.models.mobilenet_v2()
    for layer in model.modules():  # random batch norms, so that the folded biases differ
        if isinstance(layer, torch.nn.BatchNorm2d):
            torch.nn.init.uniform_(layer.weight, 0.5, 1.5)
            torch.nn.init.uniform_(layer.bias, -0.2, 0.2)
            layer.running_mean.uniform_(-0.2, 0.2)
            layer.running_var.uniform_(0.5, 1.5)
    return model.eval()


def calibrated_mobilenet_v2(shape):
    """mobilenet_v2 prepared by PT2E with PyTorch's X86 quantizer (u8 activations, s8
    weights per channel) and calibrated on 8 seeded inputs of ``shape``: ready for
    ``convert_pt2e``."""
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        captured = torch.export.export(_mobilenet_v2(), (torch.randn(shape),)).module()
        quantizer = X86InductorQuantizer()
        quantizer.set_global(get_default_x86_inductor_quantization_config())
        prepared = pt2e.prepare_pt2e(captured, quantizer)
        calibration = torch.Generator().manual_seed(1)
        for _ in range(8):
            prepared(torch.randn(shape, generator=calibration))
    return prepared


def test_pt2e_mobilenet_v2_matches_pytorch_int8_tensors_and_output():
    shape = (1, 3, 64, 64)
    prepared = calibrated_mobilenet_v2(shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        converted, count = _with_quantized_outputs(pt2e.convert_pt2e(prepared))
        x = torch.randn(shape, generator=torch.Generator().manual_seed(2))
        program = torch.export.export(converted, (x,))
        expected = [t.detach().numpy() for t in converted(x)]
    ops = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert "quantized_decomposed.dequantize_per_channel.default" in ops

    actual = _outputs(_compile(program), x)
    assert len(actual) == len(expected) == 1 + count and count >= 20
    diffs = []
    for ours, theirs in zip(actual[1:], expected[1:]):
        assert ours.dtype == theirs.dtype == np.uint8
        diffs.append(np.abs(ours.astype(np.int32) - theirs.astype(np.int32)).reshape(-1))
    every = np.concatenate(diffs)
    assert not diffs[0].any()  # the input's quantization: the same float input, the same ints
    # Measured here: the first 40 of 55 tensors identical; of 560,000 elements 1,569
    # differ by 1 and 2 by 2, where float convolutions (oneDNN's, TVM's) summed in
    # another order put an element on the other side of a half, deep in the network.
    assert every.max() <= 2
    assert np.count_nonzero(every) < every.size // 200
    error = np.abs(actual[0] - expected[0]).max() / np.abs(expected[0]).max()
    assert error < 0.02, error


class _QuantizeDequantize(torch.nn.Module):
    def __init__(self, scale, zero_point, quant_min, quant_max, dtype):
        super().__init__()
        self.args = (scale, zero_point, quant_min, quant_max, dtype)

    def forward(self, x):
        ops = torch.ops.quantized_decomposed
        q = ops.quantize_per_tensor(x, *self.args)
        return q, ops.dequantize_per_tensor(q, *self.args)


def test_a_range_narrower_than_the_dtype_is_exact():
    x = torch.linspace(-3, 3, 97)
    module = _QuantizeDequantize(0.01, 1, -127, 127, torch.int8)
    program = torch.export.export(module, (x,))
    q, dq = _outputs(_compile(program), x)
    want_q, want_dq = module(x)
    assert q.min() == -127 and np.array_equal(q, want_q.numpy())
    assert np.array_equal(dq, want_dq.numpy())


FIX = "a scale must be positive and finite: quantize the model again, or correct the value"


@pytest.mark.parametrize(
    "args, message",
    [
        (
            (0.0, 0, -128, 127, torch.int8),
            f"scale (argument) is 0, not positive; {FIX}",
        ),
        (
            (float("nan"), 0, 0, 255, torch.uint8),
            f"scale (argument) is nan, not finite; {FIX}",
        ),
        (
            (0.1, 200, -128, 127, torch.int8),
            "zero_point (argument) has 200, outside quant_min..quant_max -128..127; quantize "
            "the model again, or correct it",
        ),
        (
            (0.1, 0, -200, 127, torch.int8),
            "quant_min..quant_max -200..127 is not a range within int8's -128..127: quantize "
            "the model again with a quantizer for int8",
        ),
    ],
)
def test_malformed_pt2e_parameters_are_refused_naming_the_node(args, message):
    program = torch.export.export(_QuantizeDequantize(*args), (torch.zeros(4),))
    with pytest.raises(UmahubError) as info:
        from_exported_program(program)
    assert str(info.value) == (
        f"node 'quantize_per_tensor' (quantized_decomposed.quantize_per_tensor): {message}"
    )
