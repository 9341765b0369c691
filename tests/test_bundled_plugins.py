"""The three plugins of plugins/ together, as the README's demo uses them."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import host_reference

import umahub
import umahub.models as zoo

THREE = ["npu", "vanilla", "dsp"]
TOL = {"rtol": 1e-5, "atol": 1e-5}


PRIORITY = ["npu", "vanilla_accel", "dsp_cpu"]


@pytest.fixture(scope="module")
def cnn_across_three():
    """The README's demo: conv1's ReLU pinned to a DSP core, so all three take a part."""
    config = {"plugins": THREE, "priority": PRIORITY, "placement": {"conv1_relu": "dsp_cpu:0"}}
    return umahub.Hub(config=config).compile(zoo.get("cnn"))


def test_unpinned_the_vanilla_kernel_takes_its_convolutions_relu():
    """Its kernel bounds what it stores: the ReLU does not cross to another device."""
    report = umahub.Hub(config={"plugins": THREE, "priority": PRIORITY}).explain(zoo.get("cnn"))
    rows = [(o.name, o.device, o.pattern) for o in report.placement][:3]
    assert rows == [
        ("conv1", "vanilla_accel:0", "vanilla_accel.conv2d_bias_act"),
        ("conv1_bias_add", "vanilla_accel:0", "vanilla_accel.conv2d_bias_act"),
        ("conv1_relu", "vanilla_accel:0", "vanilla_accel.conv2d_bias_act"),
    ]


def test_small_cnn_is_split_across_the_three_and_the_host(cnn_across_three):
    rows = [(o.name, o.device, o.pattern) for o in cnn_across_three.report.placement]
    assert rows == [
        # 3 input channels do not fill the npu's 8-wide array: vanilla takes conv1.
        ("conv1", "vanilla_accel:0", "vanilla_accel.conv2d_bias"),
        ("conv1_bias_add", "vanilla_accel:0", "vanilla_accel.conv2d_bias"),
        ("conv1_relu", "dsp_cpu:0", "dsp_cpu.relu"),  # pinned
        ("conv2", "npu:0", "npu.conv2d_bias_act"),
        ("conv2_bias_add", "npu:0", "npu.conv2d_bias_act"),
        ("conv2_relu", "npu:0", "npu.conv2d_bias_act"),
        # 3 x 8 KiB: more than the DSP's 16 KiB budget per match, stays on the host.
        ("residual", "host", ""),
        ("flatten", "host", ""),
        ("fc", "npu:0", "npu.matmul_bias"),
        ("gv", "npu:0", "npu.matmul_bias"),
    ]


def test_small_cnn_across_the_three_matches_the_host(cnn_across_three):
    np.testing.assert_allclose(
        cnn_across_three.run(*zoo.inputs("cnn")), host_reference("cnn"), **TOL
    )


def test_each_plugin_did_its_part(cnn_across_three):
    by_accel = {p.accelerator: p for p in cnn_across_three.report.partitions}
    assert by_accel["vanilla_accel"].hooks == {"umahub_tir_passes": ["vanilla"]}
    assert by_accel["dsp_cpu"].hooks == {"umahub_schedule": ["dsp"]}
    assert by_accel["dsp_cpu"].schedule == ["vectorized 1 block(s) by 8 lanes"]
    npu = by_accel["npu"]
    assert npu.hooks == {"umahub_schedule": ["npu"], "umahub_codegen": ["npu"]}
    devices = cnn_across_three.devices
    assert devices == ["host", "npu:0", "vanilla_accel:0", "dsp_cpu:0"]
    # (device type, runtime device index, target, memory scope) of each partition
    assert npu.virtual_device == "(cpu,1,llvm,npu.dram)"
    assert by_accel["vanilla_accel"].virtual_device == "(cpu,2,c,vanilla.mem)"


def test_changing_priority_changes_placement():
    hub = umahub.Hub(config={"plugins": THREE, "priority": ["vanilla_accel", "npu", "dsp_cpu"]})
    devices = {o.name: o.device for o in hub.explain(zoo.get("cnn")).placement}
    assert (devices["conv1"], devices["conv2"], devices["fc"]) == (
        "vanilla_accel:0",
        "vanilla_accel:0",
        "npu:0",
    )
    hub = umahub.Hub(config={"plugins": THREE, "priority": ["dsp_cpu"]})
    devices = {o.name: o.device for o in hub.explain(zoo.get("cnn")).placement}
    assert set(devices.values()) == {"host", "dsp_cpu:0", "dsp_cpu:1"}


def test_the_vanilla_kernel_library_is_called_from_the_generated_c(cnn_across_three):
    sources = [
        m.inspect_source() for m in _imported(cnn_across_three.executable.mod) if m.kind == "c"
    ]
    vanilla = [s for s in sources if "vanilla_conv2d_nchw" in s]
    assert len(vanilla) == 1
    # the small CNN's conv1 is followed by its bias add: one call for both
    assert "vanilla_conv2d_nchw_bias(" in vanilla[0]
    assert vanilla[0].startswith('#include "vanilla_conv2d.h"')


def _imported(module):
    yield module
    for m in module.imports:
        yield from _imported(m)


def test_report_carries_the_data_edges_and_flops(cnn_across_three):
    ops = {o.name: o for o in cnn_across_three.report.placement}
    assert ops["conv1"].inputs == ()  # reads the model input and a weight
    assert ops["conv1_relu"].inputs == ("conv1_bias_add",)
    assert ops["residual"].inputs == ("conv2_relu", "conv1_relu")
    assert ops["fc"].inputs == ("flatten",)
    # conv2: 8 output channels x 16 x 16 positions x (8 x 3 x 3) multiply-adds.
    assert ops["conv2"].flops == 2 * 8 * 16 * 16 * 8 * 3 * 3
    assert ops["fc"].flops == 2 * 10 * 2048
    assert ops["conv1_relu"].flops == 8 * 16 * 16


def test_npu_lowers_gelu_with_its_own_erf_and_matches_the_host():
    from graphs import reference
    from tvm import relax

    from umahub._tvm import TensorType

    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((16, 32), "float32"))
    w = relax.const(rng.standard_normal((32, 64)).astype("float32"))
    b = relax.const(rng.standard_normal((64,)).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.add(relax.op.matmul(x, w), b), "dense")
            out = bb.emit_output(relax.op.nn.gelu(h), "gelu")
        bb.emit_func_output(out)
    mod = bb.get()
    compiled = umahub.Hub(config={"plugins": ["npu"]}).compile(mod)
    (partition,) = compiled.report.partitions
    assert partition.hooks["umahub_relax_to_tir"] == ["npu"]
    xs = [rng.standard_normal((16, 32)).astype("float32")]
    np.testing.assert_allclose(compiled.run(*xs), reference(mod, xs), rtol=1e-5, atol=1e-5)


def _residual_block(hardswish=False):
    """x -> conv -> inference batch norm -> + x -> relu (or conv -> norm ->
    hardswish), 8 channels, weights and statistics as constants."""
    from tvm import relax

    from umahub._tvm import TensorType

    rng = np.random.default_rng(0)
    c = 8

    def const(*shape, lo=-1.0, hi=1.0):
        return relax.const(rng.uniform(lo, hi, shape).astype("float32"))

    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((1, c, 10, 10), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, const(c, c, 3, 3), padding=1), "conv")
            stats = [const(c, lo=0.5, hi=2), const(c), const(c), const(c, lo=0.5, hi=2)]
            norm = bb.emit(relax.op.nn.batch_norm(conv, *stats, axis=1, training=False), "bn")
            y = bb.emit(relax.TupleGetItem(norm, 0), "y")
            if hardswish:
                gate = relax.op.clip(relax.op.add(y, relax.const(3.0)), 0.0, 6.0)
                y = relax.op.divide(relax.op.multiply(y, bb.emit(gate, "gate")), relax.const(6.0))
            else:
                y = relax.op.nn.relu(bb.emit(relax.op.add(y, x), "residual"))
            out = bb.emit_output(bb.emit(y, "out"))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize(
    "hardswish, pattern",
    [(False, "npu.conv2d_bias_residual_act"), (True, "npu.conv2d_bias_hswish")],
)
def test_a_convolution_with_its_folded_norm_and_its_epilogue_is_one_npu_partition(
    hardswish, pattern
):
    """The batch norm folds into the convolution's weight and a bias; with the
    block's residual add and activation (or hardswish, whose "+ 3" is no
    residual) it is one match: no operator is left on the host between copies."""
    from graphs import reference

    mod = _residual_block(hardswish)
    compiled = umahub.Hub(config={"plugins": ["npu"]}).compile(mod)
    assert {(o.device, o.pattern) for o in compiled.report.placement} == {("npu:0", pattern)}
    (partition,) = compiled.report.partitions
    assert partition.patterns == (pattern,)
    xs = [np.random.default_rng(1).standard_normal((1, 8, 10, 10)).astype("float32")]
    np.testing.assert_allclose(compiled.run(*xs), reference(mod, xs), rtol=1e-5, atol=1e-5)


def _gated_convolution(silu=False):
    """A squeeze-and-excitation block's end: ``conv(x * gate) + b`` with the gate
    (1, 8, 1, 1) computed from x (mean, 1x1 convolution, sigmoid); or, with
    ``silu``, ``conv(y * sigmoid(y))`` for y a convolution of x, whose product is
    SiLU, not a gate."""
    from tvm import relax

    from umahub._tvm import TensorType

    rng = np.random.default_rng(2)

    def const(*shape):
        return relax.const(rng.uniform(-1.0, 1.0, shape).astype("float32"))

    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((1, 8, 6, 6), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            if silu:
                y = bb.emit(relax.op.nn.conv2d(x, const(8, 8, 1, 1)), "y")
                scaled = bb.emit(relax.op.multiply(y, bb.emit(relax.op.sigmoid(y), "s")), "silu")
            else:
                pooled = bb.emit(relax.op.mean(x, axis=[2, 3], keepdims=True), "pooled")
                squeezed = bb.emit(relax.op.nn.conv2d(pooled, const(8, 8, 1, 1)), "squeeze")
                gate = bb.emit(relax.op.sigmoid(squeezed), "gate")
                scaled = bb.emit(relax.op.multiply(gate, x), "scaled")
            conv = bb.emit(relax.op.nn.conv2d(scaled, const(16, 8, 1, 1)), "project")
            out = bb.emit_output(relax.op.add(conv, const(1, 16, 1, 1)))
        bb.emit_func_output(out)
    return bb.get()


def test_a_gate_on_a_convolutions_input_is_computed_on_the_npu_and_silu_stays_silu():
    from graphs import reference

    for silu, expected in (
        (False, {
            "pooled": ("npu:0", "npu.mean"), "squeeze": ("npu:0", "npu.conv2d"),
            "gate": ("host", ""),
            "scaled": ("npu:0", "npu.conv2d_scaled_bias"),
            "project": ("npu:0", "npu.conv2d_scaled_bias"),
            "gv": ("npu:0", "npu.conv2d_scaled_bias"),
        }),
        (True, {
            "y": ("npu:0", "npu.conv2d_act"), "s": ("npu:0", "npu.conv2d_act"),
            "silu": ("npu:0", "npu.conv2d_act"),
            "project": ("npu:0", "npu.conv2d_bias"), "gv": ("npu:0", "npu.conv2d_bias"),
        }),
    ):  # fmt: skip
        mod = _gated_convolution(silu)
        compiled = umahub.Hub(config={"plugins": ["npu"]}).compile(mod)
        placed = {o.name: (o.device, o.pattern) for o in compiled.report.placement}
        assert placed == expected
        xs = [np.random.default_rng(3).standard_normal((1, 8, 6, 6)).astype("float32")]
        np.testing.assert_allclose(compiled.run(*xs), reference(mod, xs), rtol=1e-5, atol=1e-5)


def test_a_mean_over_the_last_axes_is_summed_on_the_npu_in_vector_wide_partial_sums():
    """A global average pooling stays on the npu, next to what it reads; a mean
    over the channels is refused, saying why, and stays on the host."""
    from tvm import relax

    from umahub._tvm import TensorType

    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((1, 24, 16, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            pooled = bb.emit(relax.op.mean(x, axis=[2, 3], keepdims=True), "pooled")
            across = bb.emit(relax.op.mean(x, axis=[1]), "across")
            out = bb.emit_output(relax.Tuple([pooled, across]))
        bb.emit_func_output(out)
    mod = bb.get()
    compiled = umahub.Hub(config={"plugins": ["npu"]}).compile(mod)
    placed = {o.name: (o.device, o.pattern) for o in compiled.report.placement}
    assert placed["pooled"] == ("npu:0", "npu.mean")
    assert placed["across"] == ("host", "")
    (partition,) = compiled.report.partitions
    assert partition.schedule == ["sum: tiles fit npu.sram (256 KiB)"]
    from umahub.errors import PlacementError

    config = {"plugins": ["npu"], "placement": {"across": "npu"}, "on-error": "error"}
    pinned = umahub.Hub(config=config)
    with pytest.raises(PlacementError) as refused:
        pinned.explain(mod)
    assert str(refused.value) == (
        "pin 'across' -> 'npu': operator 'across' (relax.mean) runs on host, because pattern "
        "'npu.mean' refused it: a mean over axes [1]; the npu takes the last axes only; "
        "pin it elsewhere"
    )
    x = np.random.default_rng(4).standard_normal((1, 24, 16, 16)).astype("float32")
    got = compiled.run(x)
    want = (x.mean(axis=(2, 3), keepdims=True), x.mean(axis=1))
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-6)


def test_a_max_pooling_and_the_relu_before_it_run_on_the_npu():
    """SqueezeNet's stem: the 3-channel convolution stays on the host (the npu
    refuses 3 channels), its ReLU and max pooling go to the npu with the next
    convolution, so one tensor crosses; a dilated pooling is refused, saying why."""
    from tvm import relax

    from umahub._tvm import TensorType
    from umahub.errors import PlacementError

    rng = np.random.default_rng(6)

    def const(*shape):
        return relax.const(rng.standard_normal(shape).astype("float32") * 0.2)

    def model(dilation=1):
        bb = relax.BlockBuilder()
        x = relax.Var("x", TensorType((1, 3, 23, 23), "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                stem = bb.emit(relax.op.nn.conv2d(x, const(16, 3, 3, 3), strides=2), "stem")
                act = bb.emit(relax.op.nn.relu(stem), "act")
                pool = relax.op.nn.max_pool2d(act, 3, 2, dilation=dilation, ceil_mode=True)
                pooled = bb.emit(pool, "pooled")
                out = bb.emit_output(relax.op.nn.conv2d(pooled, const(8, 16, 1, 1)))
            bb.emit_func_output(out)
        return bb.get()

    mod = model()
    compiled = umahub.Hub(config={"plugins": ["npu"]}, project_config=False).compile(mod)
    placed = {o.name: (o.device, o.pattern) for o in compiled.report.placement}
    assert placed["stem"] == ("host", "")
    assert placed["act"] == placed["pooled"] == ("npu:0", "npu.relu_max_pool2d")
    (pooling,) = [p for p in compiled.report.partitions if "npu.relu_max_pool2d" in p.patterns]
    assert pooling.schedule == ["pooling: output rows in parallel, a row of column maxima each"]
    per_inference = sorted(
        (c.src, c.dst, c.bytes) for c in compiled.report.copies if c.when == "inference"
    )
    assert per_inference == [("host", "npu:0", 16 * 11 * 11 * 4), ("npu:0", "host", 8 * 5 * 5 * 4)]
    config = {"plugins": ["npu"], "placement": {"pooled": "npu"}, "on-error": "error"}
    with pytest.raises(PlacementError) as refused:
        umahub.Hub(config=config, project_config=False).explain(model(dilation=2))
    assert str(refused.value) == (
        "pin 'pooled' -> 'npu': operator 'pooled' (relax.nn.max_pool2d) runs on host, because "
        "patterns 'npu.relu_max_pool2d', 'npu.max_pool2d' refused it: a dilated max pooling; "
        "the npu takes dilation 1 only; pin it elsewhere"
    )
    import tvm

    x = rng.standard_normal((1, 3, 23, 23)).astype("float32")
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    want = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(compiled.run(x), want, rtol=1e-5, atol=1e-5)


def test_branches_meet_in_a_concatenation_on_the_npu_not_on_the_host():
    """SqueezeNet's fire module: the two expand branches are concatenated on the
    npu (its DMA gathers them), so nothing goes to the host between the
    convolutions; a concatenation of int32 tensors is refused, saying why."""
    from tvm import relax

    from umahub._tvm import TensorType
    from umahub.errors import PlacementError

    rng = np.random.default_rng(5)

    def const(*shape):
        return relax.const(rng.standard_normal(shape).astype("float32") * 0.2)

    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((1, 16, 9, 9), "float32"))
    ids = relax.Var("ids", TensorType((2, 3), "int32"))
    with bb.function("main", [x, ids]):
        with bb.dataflow():
            squeeze = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, const(8, 16, 1, 1))), "sq")
            one = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(squeeze, const(16, 8, 1, 1))), "e1")
            three = bb.emit(relax.op.nn.conv2d(squeeze, const(8, 8, 3, 3), padding=1), "e3")
            joined = bb.emit(relax.op.concat([one, three, squeeze], axis=1), "joined")
            out = bb.emit(relax.op.nn.conv2d(joined, const(8, 32, 1, 1)), "out")
            pair = bb.emit(relax.op.concat([ids, ids], axis=0), "pair")
            result = bb.emit_output(relax.Tuple([out, pair]))
        bb.emit_func_output(result)
    mod = bb.get()
    compiled = umahub.Hub(config={"plugins": ["npu"]}, project_config=False).compile(mod)
    placed = {o.name: (o.device, o.pattern) for o in compiled.report.placement}
    assert placed["joined"] == ("npu:0", "npu.concatenate")
    assert placed["pair"] == ("host", "")
    assert {o.device for o in compiled.report.placement if o.name != "pair"} == {"npu:0"}
    (concat,) = [p for p in compiled.report.partitions if list(p.patterns) == ["npu.concatenate"]]
    assert concat.schedule == ["elementwise: outer loops in parallel"]
    per_inference = sorted(
        (c.src, c.dst, c.bytes) for c in compiled.report.copies if c.when == "inference"
    )
    assert per_inference == [("host", "npu:0", 16 * 81 * 4), ("npu:0", "host", 8 * 81 * 4)]
    config = {"plugins": ["npu"], "placement": {"pair": "npu"}, "on-error": "error"}
    with pytest.raises(PlacementError) as refused:
        umahub.Hub(config=config, project_config=False).explain(mod)
    assert str(refused.value) == (
        "pin 'pair' -> 'npu': operator 'pair' (relax.concat) runs on host, because pattern "
        "'npu.concatenate' refused it: a int32 tensor; the npu computes float32 only; "
        "pin it elsewhere"
    )
    import tvm

    xs = [
        rng.standard_normal((1, 16, 9, 9)).astype("float32"),
        np.arange(6, dtype="int32").reshape(2, 3),
    ]
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    want = [w.numpy() for w in vm["main"](*[tvm.runtime.tensor(a) for a in xs])]
    got = compiled.run(*xs)
    np.testing.assert_allclose(np.asarray(got[0]), want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(got[1]), want[1])
