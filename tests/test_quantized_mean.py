"""The quantized mean (``quantize(mean(dequantize(x)))``, a global average pooling in QDQ
form) in integers: an int32 sum and one fixed-point rounding, the same integers on the
npu (whose sum adds in vector lanes) and on the host (umahub.plugin.integer_mean)."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

import umahub
import umahub.plugin as up
from umahub._tvm import TensorType


def _const(value, dtype):
    return relax.const(np.asarray(value, dtype=dtype))


def quantized_mean(shape, dtype="uint8", axes=(2, 3), keepdims=True, scale=0.0235, zp=3,
                   out_scale=0.0171, out_zp=0, axis=1):  # fmt: skip
    """``quantize(mean(dequantize(x)))``; ``scale`` and ``zp`` one value each, or one per
    channel of ``axis``."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType(shape, dtype))
    scale = np.asarray(scale, dtype="float32")
    zero = np.broadcast_to(np.asarray(zp), scale.shape)
    with bb.function("main", [x]):
        with bb.dataflow():
            d = bb.emit(
                relax.op.dequantize(x, _const(scale, "float32"), _const(zero, dtype), axis=axis)
            )
            m = bb.emit(relax.op.mean(d, axis=list(axes), keepdims=keepdims))
            q = bb.emit_output(
                relax.op.quantize(
                    m, _const(out_scale, "float32"), _const(out_zp, "uint8"), out_dtype="uint8"
                )
            )
        bb.emit_func_output(q)
    return bb.get()


def reference(x, axes, keepdims, scale=0.0235, zp=3, out_scale=0.0171, out_zp=0):
    """The definition, in numpy: the int32 sum, then requantize (umahub.plugin); a
    scale and zero point per channel are along axis 1, which the mean keeps."""
    per_channel = np.ndim(scale) == 1
    at = (1, -1, *[1] * (x.ndim - 2)) if per_channel else ()
    zero = np.asarray(zp, dtype=np.int64).reshape(at)
    acc = (x.astype(np.int64) - zero).sum(axis=tuple(axes), keepdims=True)
    count = int(np.prod([x.shape[a] for a in axes]))
    scale = np.asarray(scale, dtype=np.float32).astype(np.float64).reshape(at)
    multiplier = scale / (np.float64(np.float32(out_scale)) * count)
    out = up.requantize(acc, multiplier, out_zp, 0, 255, "uint8")
    return out if keepdims else out.squeeze(axis=tuple(axes))


@pytest.fixture(scope="module")
def npu_hub():
    return umahub.Hub(config={"plugins": ["npu"], "on-error": "error"}, project_config=False)


CASES = {
    # 1280 channels of 2x2: a float32 sum in the npu's order and one in the host's
    # differed in the last bit of 1 mean in 25,600 here, and quantized a step apart
    "pooling 2x2": ((20, 1280, 2, 2), "uint8", (2, 3), True),
    "pooling 7x7, int8": ((4, 96, 7, 7), "int8", (2, 3), False),
    "last axis": ((3, 10, 50), "uint8", (2,), True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_npus_quantized_mean_is_the_definitions_integers_and_the_hosts(npu_hub, case):
    shape, dtype, axes, keepdims = CASES[case]
    model = quantized_mean(shape, dtype, axes, keepdims)
    compiled = npu_hub.compile(model)
    on_host = npu_hub.compile(model, placement={"*": "host"})
    assert [(o.op, o.device, o.pattern) for o in compiled.report.placement] == [
        ("relax.dequantize", "npu:0", "npu.qmean"),
        ("relax.mean", "npu:0", "npu.qmean"),
        ("relax.quantize", "npu:0", "npu.qmean"),
    ]
    (part,) = compiled.report.partitions
    assert part.schedule == ["sum: tiles fit npu.sram (256 KiB)"]  # the int32 sum, in lanes
    low, high = (0, 256) if dtype == "uint8" else (-128, 128)
    x = np.random.default_rng(0).integers(low, high, shape).astype(dtype)
    expected = reference(x, axes, keepdims)
    np.testing.assert_array_equal(on_host.run(x), expected)
    np.testing.assert_array_equal(compiled.run(x), expected)


def test_a_mean_over_other_axes_is_the_hosts_in_integers(npu_hub):
    compiled = npu_hub.compile(quantized_mean((2, 24, 5, 5), axes=(1,), keepdims=False))
    (mean,) = [o for o in compiled.report.placement if o.op == "relax.mean"]
    assert (mean.device, mean.refused["npu"]) == (
        "host",
        "a mean over axes [1]; the npu takes the last axes only",
    )
    x = np.random.default_rng(1).integers(0, 256, (2, 24, 5, 5)).astype("uint8")
    np.testing.assert_array_equal(compiled.run(x), reference(x, (1,), False))


def test_a_scale_and_zero_point_per_kept_channel_are_in_integers_on_the_npu(npu_hub):
    scales, zeros = np.linspace(0.01, 0.03, 8), np.arange(8) * 7
    model = quantized_mean((2, 8, 9, 9), scale=scales, zp=zeros, keepdims=False)
    compiled = npu_hub.compile(model)
    assert {(o.device, o.pattern) for o in compiled.report.placement} == {("npu:0", "npu.qmean")}
    x = np.random.default_rng(2).integers(0, 256, (2, 8, 9, 9)).astype("uint8")
    expected = reference(x, (2, 3), False, scale=scales, zp=zeros)
    np.testing.assert_array_equal(compiled.run(x), expected)
    np.testing.assert_array_equal(npu_hub.compile(model, placement={"*": "host"}).run(x), expected)


def test_a_scale_per_channel_of_a_summed_axis_is_not_in_integers_and_the_npu_says_so(npu_hub):
    model = quantized_mean((1, 8, 4, 4), scale=np.linspace(0.01, 0.03, 4), zp=0, axis=2)
    bound = {b.var: b.value for b in model["main"].body.blocks[0].bindings}
    root = model["main"].body.blocks[0].bindings[-1].value
    with pytest.raises(ValueError) as info:
        up.describe_quantized_mean(root, bound.get)
    assert str(info.value) == "a scale per channel along axis 2, which the mean sums over"
    compiled = npu_hub.compile(model)
    # whole on the host: not even the npu's pattern for a float tensor's quantized mean
    # (quantize(mean(x))) takes its mean and quantize, to sum them in its own order
    assert {(o.op, o.device) for o in compiled.report.placement} == {
        ("relax.dequantize", "host"),
        ("relax.mean", "host"),
        ("relax.quantize", "host"),
    }
    (dequantize,) = [o for o in compiled.report.placement if o.op == "relax.dequantize"]
    assert dequantize.refused["npu"] == (
        "umahub cannot compute it in integers: "
        "a scale per channel along axis 2, which the mean sums over"
    )
    whole = umahub.Hub(autoload=False, plugins=[FloatMean("qmean")], project_config=False)
    alone = whole.compile(model)
    (quantize,) = [o for o in alone.report.placement if o.op == "relax.quantize"]
    assert (quantize.device, quantize.refused["fmean"]) == (
        "host",
        "it holds the quantized operator ending at 'gv', which umahub does not compute in "
        "integers (a scale per channel along axis 2, which the mean sums over): it runs on "
        "the host as written",
    )


class FloatMean:
    """An accelerator with float32 mean patterns, as a vendor writes them: ``"mean"``
    alone, ``"mean_quantize"`` (the quantize after it) or ``"qmean"`` (with the
    dequantize before it too)."""

    UMAHUB_API = 1

    def __init__(self, *names: str):
        self.names = names or ("mean",)

    @up.hookimpl
    def umahub_accelerators(self):
        return [up.Accelerator("fmean")]

    @up.hookimpl
    def umahub_patterns(self, accelerator):
        from tvm.relax.dpl import is_const, is_op, wildcard

        if accelerator.name != "fmean":
            return None

        def quantized(mean):
            return is_op("relax.quantize")(mean, is_const(), is_const())

        forms = {
            "mean": is_op("relax.mean")(wildcard()),
            "mean_quantize": quantized(is_op("relax.mean")(wildcard())),
            "qmean": quantized(is_op("relax.mean")(up.dequantized())),
        }
        return [(f"fmean.{name}", forms[name]) for name in self.names]


def test_a_float_mean_pattern_cannot_take_a_quantized_means_mean():
    hub = umahub.Hub(autoload=False, plugins=[FloatMean()], project_config=False)
    with pytest.warns(umahub.UmahubWarning) as said:
        compiled = hub.compile(quantized_mean((1, 16, 3, 3)), placement={"lv1": "fmean"})
    assert [str(w.message) for w in said] == [
        "umahub: pin 'lv1' -> 'fmean': operator 'lv1' (relax.mean) runs on host, because "
        "pattern 'fmean.mean' refused it: it holds part of the quantized operator ending at "
        "'gv' and not the rest: a quantized operator is claimed whole "
        "(umahub.plugin.quantization); pin it elsewhere"
    ]
    assert {o.device for o in compiled.report.placement} == {"host"}
    x = np.random.default_rng(3).integers(0, 256, (1, 16, 3, 3)).astype("uint8")
    np.testing.assert_array_equal(compiled.run(x), reference(x, (2, 3), True))


def test_a_plugins_own_pattern_with_the_quantize_gets_the_integers_by_the_default_lowering():
    hub = umahub.Hub(autoload=False, plugins=[FloatMean("qmean")], project_config=False)
    compiled = hub.compile(quantized_mean((2, 16, 6, 6)))
    assert [(o.op, o.device, o.pattern) for o in compiled.report.placement] == [
        ("relax.dequantize", "fmean:0", "fmean.qmean"),
        ("relax.mean", "fmean:0", "fmean.qmean"),
        ("relax.quantize", "fmean:0", "fmean.qmean"),
    ]
    # without its dequantize, a match would sum float32 values in its own order
    alone = umahub.Hub(autoload=False, plugins=[FloatMean("mean_quantize")], project_config=False)
    with pytest.warns(umahub.UmahubWarning) as said:
        placed = alone.compile(quantized_mean((2, 16, 6, 6)), placement={"lv1": "fmean"})
    assert {o.device for o in placed.report.placement} == {"host"}
    assert str(said[0].message) == (
        "umahub: pin 'lv1' -> 'fmean': operator 'lv1' (relax.mean) runs on host, because "
        "pattern 'fmean.mean_quantize' refused it: it holds part of the quantized operator "
        "ending at 'gv' and not the rest: a quantized operator is claimed whole "
        "(umahub.plugin.quantization); pin it elsewhere"
    )
    x = np.random.default_rng(4).integers(0, 256, (2, 16, 6, 6)).astype("uint8")
    np.testing.assert_array_equal(compiled.run(x), reference(x, (2, 3), True))
