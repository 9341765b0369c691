"""The npu takes a convolution's batch norm, residual add and SiLU/hardswish/hardsigmoid with it;
numbers against plain ``tvm.compile`` of the same model."""

from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
from tvm import relax  # noqa: E402
from tvm.script import relax as R  # noqa: E402

import umahub  # noqa: E402

RNG = np.random.default_rng(0)


def _const(*shape, low=None, high=None):
    if low is None:
        return relax.const(RNG.standard_normal(shape).astype("float32"))
    return relax.const(RNG.uniform(low, high, shape).astype("float32"))


def _batch_norm(bb, x, channels):
    gamma, beta = _const(channels, low=0.5, high=2.0), _const(channels)
    mean, var = _const(channels), _const(channels, low=0.2, high=3.0)
    norm = bb.emit(
        relax.op.nn.batch_norm(x, gamma, beta, mean, var, axis=1, epsilon=1e-5, training=False)
    )
    return bb.emit(relax.TupleGetItem(norm, 0))


def _silu(bb, y):
    return bb.emit(relax.op.multiply(y, bb.emit(relax.op.sigmoid(y))))


def _hardswish(bb, y):
    # as torch.export writes it: x * clip(clip(x + 3, 0, inf), -inf, 6) / 6
    three = bb.emit(relax.op.add(y, relax.const(3.0, "float32")))
    low = bb.emit(relax.op.clip(three, 0.0, float("inf")))
    six = bb.emit(relax.op.clip(low, float("-inf"), 6.0))
    gated = bb.emit(relax.op.multiply(y, six))
    return bb.emit(relax.op.divide(gated, relax.const(6.0, "float32")))


def _hardswish_frontend(bb, y):
    # as TVM's torch and ONNX frontends write it: x * (clip(x + 3, 0, 6) / 6)
    return bb.emit(relax.op.multiply(y, _hardsigmoid(bb, y)))


def _hardsigmoid(bb, y):
    # as TVM's torch frontends write it: clip(x + 3, 0, 6) / 6
    three = bb.emit(relax.op.add(y, relax.const(3.0, "float32")))
    return bb.emit(relax.op.divide(bb.emit(relax.op.clip(three, 0.0, 6.0)), relax.const(6.0)))


def _hardsigmoid_onnx(bb, y):
    # as TVM's ONNX frontend writes HardSigmoid: clip(alpha * x + beta, 0, 1)
    scaled = bb.emit(relax.op.multiply(relax.const(0.2, "float32"), y))
    return bb.emit(relax.op.clip(bb.emit(relax.op.add(scaled, relax.const(0.5))), 0.0, 1.0))


def _model(channels, out_channels, size, *, groups=1, stride=1, epilogue=None, residual=False):
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((1, channels, size, size), "float32"))
    weight = _const(out_channels, channels // groups, 3, 3)
    with bb.function("main", [x]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, weight, stride, 1, groups=groups))
            y = _batch_norm(bb, conv, out_channels)
            if residual:
                y = bb.emit(relax.op.add(y, x))
            if epilogue is not None:
                y = epilogue(bb, y)
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _plain(mod, xs):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in xs]).numpy()


def _relu(bb, y):
    return bb.emit(relax.op.nn.relu(y))


CASES = {
    "conv2d_bn_relu": dict(channels=16, out_channels=32, size=14, epilogue=_relu),
    "conv2d_bn_residual_relu": dict(
        channels=32, out_channels=32, size=14, residual=True, epilogue=_relu
    ),
    "conv2d_bn_silu_strided": dict(channels=16, out_channels=24, size=15, stride=2, epilogue=_silu),
    "depthwise_bn_hardswish": dict(
        channels=32, out_channels=32, size=14, groups=32, epilogue=_hardswish
    ),
    "conv2d_bn_hardsigmoid": dict(channels=16, out_channels=24, size=7, epilogue=_hardsigmoid),
    "conv2d_bn_hardswish_frontend": dict(
        channels=16, out_channels=16, size=9, epilogue=_hardswish_frontend
    ),
    "depthwise_bn_hardsigmoid_onnx": dict(
        channels=24, out_channels=24, size=10, groups=24, epilogue=_hardsigmoid_onnx
    ),
    "depthwise_bn_silu": dict(channels=24, out_channels=24, size=9, groups=24, epilogue=_silu),
    # strided: the padded rows are stored column phase by column phase
    "depthwise_bn_relu_strided": dict(
        channels=32, out_channels=32, size=28, groups=32, stride=2, epilogue=_relu
    ),
    "depthwise_bn_relu_strided_odd": dict(
        channels=16, out_channels=16, size=15, groups=16, stride=2, epilogue=_relu
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_convolution_epilogues_run_on_the_npu_and_match_plain_tvm(case):
    spec = CASES[case]
    mod = _model(**spec)
    compiled = umahub.Hub(config={"plugins": ["npu"]}, project_config=False).compile(mod)
    on_npu = [o for o in compiled.report.placement if o.device == "npu:0"]
    assert len(on_npu) == len(compiled.report.placement), [
        (o.name, o.device) for o in compiled.report.placement
    ]
    (partition,) = compiled.report.partitions
    assert not partition.fallback
    strategy = "depthwise" if spec.get("groups", 1) > 1 else "conv2d"
    assert partition.schedule == [f"{strategy}: tiles fit npu.sram (256 KiB)"]
    xs = [RNG.standard_normal((1, spec["channels"], spec["size"], spec["size"])).astype("float32")]
    want = _plain(mod, xs)
    np.testing.assert_allclose(compiled.run(*xs), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_a_batch_norm_the_model_also_returns_is_an_output_of_the_npu_too():
    """The normalised value escapes (it is also an output): it is written as
    computed, per tile, and the rest of the epilogue reads it there."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((1, 16, 12, 12), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, _const(16, 1, 3, 3), 1, 1, groups=16))
            y = _batch_norm(bb, conv, 16)
            act = _hardswish(bb, y)
            out = bb.emit_output(relax.Tuple([y, act]))
        bb.emit_func_output(out)
    mod = bb.get()
    compiled = umahub.Hub(config={"plugins": ["npu"]}, project_config=False).compile(mod)
    (partition,) = compiled.report.partitions
    assert partition.schedule == ["depthwise: tiles fit npu.sram (256 KiB)"]
    xs = [RNG.standard_normal((1, 16, 12, 12)).astype("float32")]
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    want = vm["main"](tvm.runtime.tensor(xs[0]))
    for got, ref in zip(compiled.run(*xs), want):
        np.testing.assert_allclose(got, ref.numpy(), rtol=1e-5, atol=1e-5)
