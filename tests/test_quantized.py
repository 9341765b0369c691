"""Quantized operators: the arithmetic, the host's integer kernels, claims and refusals.

Every result is checked against :func:`reference`, the arithmetic of
:mod:`umahub.plugin.quantization` written out in numpy, exactly (integers, no
tolerance).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import tvm
from tvm import relax

import umahub
from umahub._tvm import TensorType
from umahub.host.quantized import lower_quantized
from umahub.plugin import requantization, requantize

# ------------------------------------------------------------------ the arithmetic


def test_the_multiplier_is_the_top_31_bits_of_the_significand():
    m, k = requantization(np.array([0.5, 0.75, 1.0, 3e-3]))
    assert m.tolist()[:3] == [2**30, 3 * 2**29, 2**30]
    assert k.tolist()[:3] == [31, 31, 30]
    assert m[3] * 2.0 ** -int(k[3]) == pytest.approx(3e-3, rel=2**-30)


def test_a_multiplier_below_two_to_the_minus_32_rounds_everything_to_zero():
    m, k = requantization(np.array([2.0**-40]))
    assert (m.tolist(), k.tolist()) == ([0], [62])
    assert requantize(np.array([2**31 - 1]), 2.0**-40, 3, -128, 127, "int8").tolist() == [3]


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan"), 2.0**30])
def test_a_multiplier_out_of_range_is_refused(bad):
    with pytest.raises(ValueError, match="out of range"):
        requantization(np.array([bad]))


def test_requantize_rounds_half_to_even_and_saturates():
    # multiplier 0.5: acc / 2, ties to even
    acc = np.array([1, 3, 5, -1, -3, 7, 1000, -1000])
    assert requantize(acc, 0.5, 0, -128, 127, "int8").tolist() == [0, 2, 2, 0, -2, 4, 127, -128]
    # zero point and bounds (a ReLU: low = zero point)
    assert requantize(acc, 0.5, 10, 10, 255, "uint8").tolist() == [10, 12, 12, 10, 10, 14, 255, 10]


def test_requantize_is_the_exact_rational_rounding_of_the_fixed_point_multiplier():
    rng = np.random.default_rng(0)
    acc = rng.integers(-(2**31), 2**31 - 1, size=2000)
    multiplier = rng.uniform(1e-6, 4.0, size=2000)
    got = requantize(acc, multiplier, 0, -(2**31), 2**31 - 1, "int32")
    m, k = requantization(multiplier)
    for a, mm, kk, g in zip(acc[:300], m[:300], k[:300], got[:300], strict=True):
        exact = Fraction(int(a) * int(mm), 2 ** int(kk))
        assert g == max(-(2**31), min(2**31 - 1, round(exact)))  # Python's round: half to even


# ------------------------------------------------------------------ graphs and reference


def _const(value, dtype):
    return relax.const(np.asarray(value, dtype=dtype), dtype)


def qconv_graph(
    x_dtype="uint8",
    x_zp=7,
    w_zp=0,
    channels=(8, 16),
    groups=1,
    bias="int32",
    activation="relu",
    strides=(1, 1),
    padding=(1, 1, 1, 1),
    dilation=(1, 1),
    per_channel=True,
    x_per_channel=False,
    y_scale=0.2,
    seed=0,
    size=10,
    bias_scale_per_channel=False,
    kernel=3,
):
    """A quantized convolution as ONNX Runtime's QDQ form has it (on a ``size`` x
    ``size`` input), and its parts; ``bias_scale_per_channel``: the int32 bias's scale
    one per channel even where the weight's is one per tensor."""
    rng = np.random.default_rng(seed)
    cin, cout = channels
    x_scale, y_scale, y_zp = np.float32(0.05), np.float32(y_scale), 3
    w = rng.integers(-127, 128, size=(cout, cin // groups, kernel, kernel)).astype("int8")
    w_scale = (
        rng.uniform(0.002, 0.02, cout).astype("float32")
        if per_channel
        else np.array(0.01, dtype="float32")
    )
    w_zps = np.full(w_scale.shape, w_zp, dtype="int8")
    parts = dict(w=w, w_scale=w_scale, w_zp=w_zps, x_scale=x_scale, x_zp=x_zp)
    parts.update(y_scale=y_scale, y_zp=y_zp, groups=groups, strides=strides)
    parts.update(padding=padding, dilation=dilation, activation=activation, bias=None)
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((1, cin, size, size), x_dtype))
    axis_scale = _const(w_scale, "float32")
    with bb.function("main", [x]):
        with bb.dataflow():
            if x_per_channel:  # one scale per input channel
                x_scales, x_zps = np.full(cin, x_scale), np.full(cin, x_zp)
                dx = relax.op.dequantize(
                    x, _const(x_scales, "float32"), _const(x_zps, x_dtype), axis=1
                )
            else:
                dx = relax.op.dequantize(x, _const(x_scale, "float32"), _const(x_zp, x_dtype))
            dx = bb.emit(dx)
            dw = bb.emit(
                relax.op.dequantize(_const(w, "int8"), axis_scale, _const(w_zps, "int8"), axis=0)
            )
            y = bb.emit(
                relax.op.nn.conv2d(
                    dx, dw, strides=strides, padding=padding, dilation=dilation, groups=groups
                )
            )
            if bias == "int32":
                b = rng.integers(-5000, 5000, size=(1, cout, 1, 1)).astype("int32")
                b_scale = (x_scale * w_scale).astype("float32")
                if bias_scale_per_channel:
                    b_scale = np.broadcast_to(b_scale, (cout,)).copy()
                db = bb.emit(
                    relax.op.dequantize(
                        _const(b, "int32"), _const(b_scale, "float32"), _const(0, "int32"), axis=1
                    )
                )
                parts["bias"] = b.astype(np.int64).reshape(-1)
                y = bb.emit(relax.op.add(y, db))
            elif bias == "float":
                b = rng.uniform(-2, 2, size=(1, cout, 1, 1)).astype("float32")
                units = np.float64(x_scale) * w_scale.astype(np.float64)
                parts["bias"] = np.rint(b.reshape(-1).astype(np.float64) / units).astype(np.int64)
                y = bb.emit(relax.op.add(y, _const(b, "float32")))
            if activation == "relu":
                y = bb.emit(relax.op.nn.relu(y))
            elif activation == "clip":
                y = bb.emit(relax.op.clip(y, 0.0, 6.0))
            q = bb.emit(
                relax.op.quantize(
                    y, _const(y_scale, "float32"), _const(y_zp, "uint8"), out_dtype="uint8"
                )
            )
            out = bb.emit_output(q)
        bb.emit_func_output(out)
    return bb.get(), parts


def reference(x, parts):
    """The module docs' arithmetic for a quantized convolution, in numpy int64."""
    w, groups = parts["w"].astype(np.int64), parts["groups"]
    top, left, bottom, right = parts["padding"]
    xi = x.astype(np.int64)
    xp = np.pad(
        xi,
        ((0, 0), (0, 0), (top, bottom), (left, right)),
        constant_values=parts["x_zp"],
    )
    xp = xp - parts["x_zp"]
    cout, cg, kh, kw = w.shape
    sh, sw = parts["strides"]
    dh, dw = parts["dilation"]
    oh = (xp.shape[2] - dh * (kh - 1) - 1) // sh + 1
    ow = (xp.shape[3] - dw * (kw - 1) - 1) // sw + 1
    w = w - parts["w_zp"].reshape(-1, 1, 1, 1).astype(np.int64)
    acc = np.zeros((1, cout, oh, ow), dtype=np.int64)
    per = cout // groups
    for o in range(cout):
        g = o // per
        for i in range(kh):
            for j in range(kw):
                patch = xp[0, g * cg : (g + 1) * cg, i * dh : i * dh + sh * oh : sh]
                patch = patch[:, :, j * dw : j * dw + sw * ow : sw]
                acc[0, o] += np.einsum("chw,c->hw", patch, w[o, :, i, j])
    if parts["bias"] is not None:
        acc += parts["bias"].reshape(1, -1, 1, 1)
    multiplier = (
        np.float64(parts["x_scale"])
        * np.broadcast_to(parts["w_scale"], (cout,)).astype(np.float64)
        / np.float64(parts["y_scale"])
    )
    low = {"relu": parts["y_zp"], "clip": parts["y_zp"]}.get(parts["activation"], 0)
    high = 255
    if parts["activation"] == "clip":
        high = int(np.rint(np.float32(6.0) / parts["y_scale"])) + parts["y_zp"]
    return requantize(acc, multiplier.reshape(1, -1, 1, 1), parts["y_zp"], low, high, "uint8")


def _run(mod, x):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def _input(dtype, seed=1):
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, info.max + 1, size=(1, 8, 10, 10))


# ------------------------------------------------------------------ the host's kernels


CASES = {
    "relu, int32 bias, per-channel": {},
    "clip, float bias": {"activation": "clip", "bias": "float"},
    "no bias, no activation, per-tensor": {"bias": None, "activation": None, "per_channel": False},
    # describe_quantized failed to compare a per-channel bias scale with a per-tensor
    # weight's, and the operator was left to TVM's float lowering
    "per-tensor weight, a bias scale per channel": {
        "per_channel": False,
        "bias_scale_per_channel": True,
    },
    "int8 input, asymmetric weights": {"x_dtype": "int8", "x_zp": -3, "w_zp": 5},
    "stride 2, uneven padding, dilation 2": {
        "strides": (2, 2),
        "padding": (0, 1, 2, 1),
        "dilation": (2, 2),
    },
    "depthwise": {"channels": (8, 8), "groups": 8},
}


@pytest.mark.parametrize("case", CASES)
def test_the_integer_kernel_is_the_arithmetic_exactly(case):
    options = CASES[case]
    mod, parts = qconv_graph(**options)
    x = _input(options.get("x_dtype", "uint8")).astype(options.get("x_dtype", "uint8"))
    lowered, count = lower_quantized(mod)
    assert count == 1
    assert "relax.nn.conv2d" not in lowered["main"].script()
    np.testing.assert_array_equal(_run(lowered, x), reference(x, parts))


def test_the_float_graph_rounds_differently_from_the_integers():
    """What TVM's legalization of the same graph gives: float sums, not the integers
    (why umahub computes quantized operators itself)."""
    mod, parts = qconv_graph(seed=3)
    x = _input("uint8", seed=3).astype("uint8")
    exact = reference(x, parts)
    assert np.array_equal(_run(lower_quantized(mod)[0], x), exact)
    assert np.abs(_run(mod, x).astype(int) - exact.astype(int)).max() <= 1


def qmatmul_graph(b_constant=True, seed=0, batch=(2,)):
    """``quantize(dequantize(a) @ dequantize(b) + bias)``, b a constant or a second input."""
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    a = relax.Var("a", TensorType((*batch, 5, 24), "int8"))
    params = [a]
    b_value = rng.integers(-127, 128, size=(24, 12)).astype("int8")
    if not b_constant:
        b_in = relax.Var("b", TensorType((24, 12), "int8"))
        params.append(b_in)
    with bb.function("main", params):
        with bb.dataflow():
            da = bb.emit(
                relax.op.dequantize(a, _const(0.03, "float32"), _const(2, "int8"), axis=-1)
            )
            b_expr = _const(b_value, "int8") if b_constant else b_in
            scales = rng.uniform(0.001, 0.01, 12).astype("float32")
            db = bb.emit(
                relax.op.dequantize(
                    b_expr, _const(scales, "float32"), _const(np.zeros(12), "int8"), axis=1
                )
            )
            y = bb.emit(relax.op.matmul(da, db))
            y = bb.emit(relax.op.add(y, _const(rng.uniform(-1, 1, 12), "float32")))
            q = bb.emit(
                relax.op.quantize(y, _const(0.07, "float32"), _const(-4, "int8"), out_dtype="int8")
            )
            out = bb.emit_output(q)
        bb.emit_func_output(out)
    return bb.get(), b_value, scales


def _matmul_reference(a, b, scales, bias):
    acc = np.matmul(a.astype(np.int64) - 2, b.astype(np.int64))
    units = np.float64(np.float32(0.03)) * scales.astype(np.float64)
    acc = acc + np.rint(bias.astype(np.float64) / units).astype(np.int64)
    multiplier = units / np.float64(np.float32(0.07))
    return requantize(acc, multiplier, -4, -128, 127, "int8")


@pytest.mark.parametrize("b_constant", [True, False], ids=["weight", "two inputs"])
def test_a_quantized_matmul_is_the_arithmetic_exactly(b_constant):
    mod, b, scales = qmatmul_graph(b_constant)
    lowered, count = lower_quantized(mod)
    assert count == 1
    rng = np.random.default_rng(5)
    a = rng.integers(-128, 128, size=(2, 5, 24)).astype("int8")
    vm = relax.VirtualMachine(tvm.compile(lowered, target="llvm"), tvm.cpu())
    args = [tvm.runtime.tensor(a)] + ([] if b_constant else [tvm.runtime.tensor(b)])
    got = vm["main"](*args).numpy()
    bias = np.random.default_rng(0)
    # the graph's bias: the same generator's draws after b and the scales
    bias.integers(-127, 128, size=(24, 12))
    bias.uniform(0.001, 0.01, 12)
    expected = _matmul_reference(a, b, scales, bias.uniform(-1, 1, 12).astype("float32"))
    np.testing.assert_array_equal(got, expected)


def test_per_channel_input_scales_are_left_to_tvms_float_lowering():
    mod, _ = qconv_graph(x_per_channel=True)
    assert lower_quantized(mod)[1] == 0


def test_what_umahub_does_not_compute_in_integers_runs_whole_on_the_host_and_says_why(npu_hub):
    mod, _ = qconv_graph(x_per_channel=True)
    compiled = npu_hub.compile(mod)
    # not even the npu's float conv2d patterns take its convolution
    assert {o.device for o in compiled.report.placement} == {"host"}
    (row,) = compiled.report.quantized
    assert (row["device"], row["integers"], row["why"]) == (
        "host",
        False,
        "umahub does not compute it in integers: a scale per channel on the input "
        "(one for the tensor is needed); it runs in float32 as written",
    )
    assert "quantized operators: 1, in integers (none), in float32 on the host 1" in str(
        compiled.report
    )


# ------------------------------------------------------------------ through umahub


@pytest.fixture(scope="module")
def npu_hub():
    return umahub.Hub(config={"plugins": ["npu"]})


def _placed(compiled):
    return {(o.op, o.device) for o in compiled.report.placement}


def test_the_npu_claims_a_quantized_convolution_whole_and_gives_the_hosts_integers(npu_hub):
    mod, parts = qconv_graph()
    x = _input("uint8").astype("uint8")
    on_npu = npu_hub.compile(mod)
    on_host = npu_hub.compile(mod, placement={"*": "host"})
    ops = [(o.op, o.device, o.pattern) for o in on_npu.report.placement]
    assert ops == [
        ("relax.dequantize", "npu:0", "npu.qconv2d_bias_act"),
        ("relax.dequantize", "npu:0", "npu.qconv2d_bias_act"),
        ("relax.nn.conv2d", "npu:0", "npu.qconv2d_bias_act"),
        ("relax.dequantize", "npu:0", "npu.qconv2d_bias_act"),
        ("relax.add", "npu:0", "npu.qconv2d_bias_act"),
        ("relax.nn.relu", "npu:0", "npu.qconv2d_bias_act"),
        ("relax.quantize", "npu:0", "npu.qconv2d_bias_act"),
    ]
    assert on_npu.report.quantized[0]["device"] == "npu:0"
    assert "quantized operators: 1, in integers (npu:0 1)" in str(on_npu.report)
    expected = reference(x, parts)
    np.testing.assert_array_equal(on_npu.run(x), expected)
    np.testing.assert_array_equal(on_host.run(x), expected)


def test_asymmetric_weights_stay_on_the_host_in_integers_with_the_npus_reason(npu_hub):
    mod, parts = qconv_graph(w_zp=3)
    x = _input("uint8").astype("uint8")
    with pytest.warns(umahub.UmahubWarning) as record:
        npu_hub.compile(mod, placement={"*": "npu"})
    conv = [str(w.message) for w in record if "(relax.nn.conv2d)" in str(w.message)]
    assert conv == [
        "umahub: pin '*' -> 'npu': operator 'lv2' (relax.nn.conv2d) runs on host, because "
        "pattern 'npu.qconv2d_bias_act' refused it: weights with a nonzero zero point; the npu "
        "takes symmetric weights; patterns 'npu.conv2d_bias_act', 'npu.conv2d_bias', "
        "'npu.conv2d' refused it: it holds part of the quantized operator ending at 'gv' and "
        "not the rest: a quantized operator is claimed whole (umahub.plugin.quantization); "
        "pin it elsewhere"
    ]
    compiled = npu_hub.compile(mod)
    # the npu's float conv2d patterns may not take the convolution out of it either
    assert {d for _, d in _placed(compiled)} == {"host"}
    assert compiled.report.quantized == [
        {
            "node": "gv",
            "kind": "conv2d",
            "device": "host",
            "pattern": "",
            "why": "npu.qconv2d_bias_act refused it: weights with a nonzero zero point; "
            "the npu takes symmetric weights",
            "integers": True,
        }
    ]
    text = str(compiled.report).splitlines()
    at = text.index("quantized operators: 1, in integers (host 1)")
    assert text[at + 1] == (
        "  gv (qconv2d) on host: npu.qconv2d_bias_act refused it: "
        "weights with a nonzero zero point; the npu takes symmetric weights"
    )
    np.testing.assert_array_equal(compiled.run(x), reference(x, parts))


def test_a_float_pattern_may_not_split_a_quantized_operator():
    from umahub.compiler.placement import quantized_parts

    mod, _ = qconv_graph(w_zp=3)
    parts = quantized_parts(mod["main"])
    bound = {b.var: b.value for block in mod["main"].body.blocks for b in block.bindings}
    assert sorted(bound[v].op.name for v in parts) == [
        "relax.add",
        "relax.nn.conv2d",
        "relax.nn.relu",
    ]
    assert {bound[r].op.name for r in parts.values()} == {"relax.quantize"}


@pytest.mark.parametrize(
    "scale, problem",
    [
        (0.0, "is 0, not positive"),
        (float("nan"), "is nan, not finite"),
        (-0.5, "is -0.5, not positive"),
    ],
)
def test_a_malformed_scale_in_any_model_is_one_line_naming_the_node(npu_hub, scale, problem):
    mod, _ = qconv_graph(y_scale=scale)
    with pytest.raises(umahub.errors.QuantizationError) as raised:
        npu_hub.compile(mod)
    assert str(raised.value) == (
        f"node 'lv6' (quantize): scale {problem}; a scale must be positive and finite: "
        "quantize the model again, or correct the value"
    )


def test_a_reshape_after_a_one_scale_dequantize_moves_under_it_whatever_its_axis():
    from umahub.host.quantized_form import canonicalize_quantized

    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((1, 4, 2, 2), "int8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            d = bb.emit(relax.op.dequantize(x, _const(0.1, "float32"), _const(0, "int8"), axis=3))
            out = bb.emit_output(bb.emit(relax.op.reshape(d, (1, 16))))
        bb.emit_func_output(out)
    moved = canonicalize_quantized(bb.get())["main"]
    values = [b.value for block in moved.body.blocks for b in block.bindings]
    calls = [v.op.name for v in values if isinstance(v, relax.Call)]
    assert calls == ["relax.reshape", "relax.dequantize"]


def test_a_dequantize_shared_by_two_convolutions_gives_each_its_own(npu_hub):
    """ONNX Runtime dequantizes a tensor once for all its readers; each quantized
    convolution still matches whole, with its own copy."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((1, 8, 6, 6), "uint8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            dx = bb.emit(relax.op.dequantize(x, _const(0.05, "float32"), _const(7, "uint8")))
            outs = []
            for _ in range(2):
                w = rng.integers(-127, 128, size=(8, 8, 1, 1)).astype("int8")
                dw = bb.emit(
                    relax.op.dequantize(
                        _const(w, "int8"), _const(0.01, "float32"), _const(0, "int8")
                    )
                )
                y = bb.emit(relax.op.nn.conv2d(dx, dw))
                outs.append(
                    bb.emit(
                        relax.op.quantize(
                            y, _const(0.1, "float32"), _const(3, "uint8"), out_dtype="uint8"
                        )
                    )
                )
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    mod = bb.get()
    compiled = npu_hub.compile(mod)
    assert [r["device"] for r in compiled.report.quantized] == ["npu:0", "npu:0"]
    data = _input("uint8")[:, :, :6, :6].astype("uint8")
    got = compiled.run(data)
    host = npu_hub.compile(mod, placement={"*": "host"}).run(data)
    for a, b in zip(got, host, strict=True):
        np.testing.assert_array_equal(a, b)


def qconv_residual_graph(seed=0, x_dtype="uint8", kernel=3, groups=1, strides=(1, 1)):
    """``quantize(relu(conv(dq(x), dq(w)) + b + dequantize(r)))``: a residual block's
    last convolution and its sum, as PyTorch's X86 quantizer fuses them (on a 6x6
    input; ``r`` of the output's shape)."""
    rng = np.random.default_rng(seed)
    w = rng.integers(-127, 128, size=(8, 8 // groups, kernel, kernel)).astype("int8")
    pad = kernel // 2
    w_scale = rng.uniform(0.002, 0.02, 8).astype("float32")
    b = rng.uniform(-1, 1, size=(1, 8, 1, 1)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((1, 8, 6, 6), x_dtype))
    out = [(6 + 2 * pad - kernel) // s + 1 for s in strides]
    r = relax.Var("r", TensorType((1, 8, *out), "uint8"))
    with bb.function("main", [x, r]):
        with bb.dataflow():
            dx = bb.emit(relax.op.dequantize(x, _const(0.05, "float32"), _const(5, x_dtype)))
            dw = bb.emit(
                relax.op.dequantize(
                    _const(w, "int8"),
                    _const(w_scale, "float32"),
                    _const(np.zeros(8), "int8"),
                    axis=0,
                )
            )
            y = bb.emit(
                relax.op.nn.conv2d(dx, dw, strides=strides, padding=(pad,) * 4, groups=groups)
            )
            y = bb.emit(relax.op.add(y, _const(b, "float32")))
            dr = bb.emit(relax.op.dequantize(r, _const(0.04, "float32"), _const(9, "uint8")))
            y = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(y, dr))))
            q = bb.emit(
                relax.op.quantize(y, _const(0.1, "float32"), _const(2, "uint8"), out_dtype="uint8")
            )
            out = bb.emit_output(q)
        bb.emit_func_output(out)
    parts = dict(w=w, w_scale=w_scale, w_zp=np.zeros(8, "int8"), x_scale=np.float32(0.05))
    parts.update(x_zp=5, y_scale=np.float32(0.1), y_zp=2, groups=groups, strides=strides)
    parts.update(padding=(pad,) * 4, dilation=(1, 1), activation="relu")
    units = np.float64(np.float32(0.05)) * w_scale.astype(np.float64)
    parts["bias"] = np.rint(b.reshape(-1).astype(np.float64) / units).astype(np.int64)
    return bb.get(), parts


def _residual_reference(x, res, parts):
    from umahub.plugin import requantization

    mod_parts = dict(parts, activation=None)
    # the accumulator (with its bias), from the convolution's reference before rounding
    w = parts["w"].astype(np.int64)
    kernel, pad = w.shape[2], parts["padding"][0]
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=5)
    xp = xp - 5
    (sy, sx), (oh, ow) = parts["strides"], res.shape[2:]
    acc = np.zeros((1, 8, oh, ow), np.int64)
    for i in range(kernel):
        for j in range(kernel):
            window = xp[0, :, i : i + sy * (oh - 1) + 1 : sy, j : j + sx * (ow - 1) + 1 : sx]
            if parts["groups"] == 1:
                acc[0] += np.einsum("chw,oc->ohw", window, w[:, :, i, j])
            else:  # depthwise
                acc[0] += window * w[:, 0, i, j].reshape(-1, 1, 1)
    acc += mod_parts["bias"].reshape(1, -1, 1, 1)
    m, k = requantization(units_multiplier(parts))
    m_r, k_r = requantization(np.float64(np.float32(0.04)) / np.float64(np.float32(0.1)))
    m, k = m.reshape(1, -1, 1, 1), k.reshape(1, -1, 1, 1)
    p = acc * m + (((res.astype(np.int64) - 9) * m_r) << (k - k_r))
    rounded = (p + (np.int64(1) << (k - 1)) - 1 + ((p >> k) & 1)) >> k
    return np.clip(rounded + 2, 2, 255).astype("uint8")


def units_multiplier(parts):
    return (
        np.float64(parts["x_scale"])
        * parts["w_scale"].astype(np.float64)
        / np.float64(parts["y_scale"])
    )


@pytest.mark.parametrize(
    "kernel, groups, strides",
    [(3, 1, (1, 1)), (1, 1, (1, 1)), (3, 8, (1, 1)), (3, 8, (2, 2))],
    ids=["3x3", "1x1", "3x3 depthwise", "3x3 depthwise, stride 2"],
)
def test_a_residual_added_before_the_activation_is_computed_in_integers(
    npu_hub, kernel, groups, strides
):
    # depthwise: the flat form (stride 1) and the paired one (stride 2), whose rows run
    # past the output's (the residual read clamped)
    mod, parts = qconv_residual_graph(kernel=kernel, groups=groups, strides=strides)
    x = _input("uint8")[:, :, :6, :6].astype("uint8")
    out = 6 if strides == (1, 1) else 3
    res = _input("uint8", seed=4)[:, :, :out, :out].astype("uint8")
    lowered, count = lower_quantized(mod)
    assert count == 1
    expected = _residual_reference(x, res, parts)
    vm = relax.VirtualMachine(tvm.compile(lowered, target="llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(res)).numpy()
    np.testing.assert_array_equal(got, expected)
    compiled = npu_hub.compile(mod)
    assert [(r["device"], r["pattern"]) for r in compiled.report.quantized] == [
        ("npu:0", "npu.qconv2d_bias_residual_act")
    ]
    if groups > 1:
        from umahub.host.int8 import has_vnni
        from umahub.host.quantized import has_quad_instructions
        from umahub.targets import host_target

        pairs = "vpdpwssd" if has_vnni() else "int32 vectors, 16 lanes (no VNNI)"
        form = {
            (1, 1): "exact float32 sums over the padded plane read flat",
            (2, 2): f"{pairs} over a row's positions, its taps in pairs",
        }[strides]
        if has_quad_instructions(host_target()):  # its weights are symmetric
            form = "vpermb, vpdpbusd over a row's positions, its taps in fours"
        assert [p.schedule for p in compiled.report.partitions] == [[f"int8 depthwise: {form}"]]
    np.testing.assert_array_equal(compiled.run(x, res), expected)


def test_16_bit_operands_are_not_computed_in_integers():
    mod, _ = qconv_graph(x_dtype="int16", x_zp=0)
    assert lower_quantized(mod)[1] == 0


def _pooled_graph(out_scale: float, out_zp: int, op: str = "max_pool2d"):
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((1, 2, 6, 6), "uint8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            d = bb.emit(relax.op.dequantize(x, _const(0.1, "float32"), _const(3, "uint8")))
            if op == "max_pool2d":
                p = bb.emit(relax.op.nn.max_pool2d(d, (3, 3), (2, 2), (1, 1, 1, 1)))
            else:
                p = bb.emit(relax.op.max(d, axis=[2, 3], keepdims=True))
            scale, zp = _const(out_scale, "float32"), _const(out_zp, "uint8")
            q = relax.op.quantize(p, scale, zp, out_dtype="uint8")
            out = bb.emit_output(bb.emit(q))
        bb.emit_func_output(out)
    return bb.get()


def _run_plain(mod, x):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


@pytest.mark.parametrize("op", ["max_pool2d", "max"])
def test_a_max_between_a_dequantize_and_a_quantize_of_the_same_parameters_runs_on_the_integers(op):
    from umahub.host.quantized_form import canonicalize_quantized

    mod = _pooled_graph(0.1, 3, op)
    rewritten = canonicalize_quantized(mod)
    bound = [b.value for block in rewritten["main"].body.blocks for b in block.bindings]
    values = [v for v in bound if isinstance(v, relax.Call)]
    from umahub.plugin.patterns import dtype_of

    assert [(v.op.name, dtype_of(v)) for v in values] == [
        (f"relax.{'nn.' if op == 'max_pool2d' else ''}{op}", "uint8")
    ]
    x = np.random.default_rng(0).integers(0, 256, size=(1, 2, 6, 6)).astype("uint8")
    x[0, 0] = 0  # the padding's value: a window of the smallest integers pools to it
    np.testing.assert_array_equal(_run_plain(rewritten, x), _run_plain(mod, x))


def test_a_max_requantized_to_other_parameters_stays_in_floats():
    from umahub.host.quantized_form import canonicalize_quantized

    for scale, zp in ((0.2, 3), (0.1, 4)):
        rewritten = canonicalize_quantized(_pooled_graph(scale, zp))
        bound = [b.value for block in rewritten["main"].body.blocks for b in block.bindings]
        assert [v.op.name for v in bound if isinstance(v, relax.Call)] == [
            "relax.dequantize",
            "relax.nn.max_pool2d",
            "relax.quantize",
        ]
