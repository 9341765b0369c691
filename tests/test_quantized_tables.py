"""A quantized operator with the table after it (a SiLU, a sigmoid made a lookup by
umahub.host.lookup_tables) on the npu: the lookup in the kernel's epilogue, a
vector of entries at once (vpermi2b) where the CPU has AVX-512 VBMI, integers bit
for bit the host's. And the rest of a squeeze-and-excitation block in QDQ form: its gate
and its pooling, quantized, on the npu too."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

import umahub
import umahub.plugin as up
from umahub._tvm import TensorType
from umahub.host.lookup_tables import has_vbmi


def _const(value, dtype):
    return relax.const(np.asarray(value, dtype=dtype))


def qconv_silu(dtype="uint8", shape=(1, 16, 14, 14), out_channels=32, depthwise=False, k=3):
    """``x -> quantized conv (+ bias) -> SiLU as ONNX Runtime writes it`` in QDQ form:
    umahub makes the SiLU a table of 256 entries before partitioning."""
    rng = np.random.default_rng(0)
    channels = shape[1]
    out_channels = channels if depthwise else out_channels
    w = rng.integers(-100, 100, (out_channels, 1 if depthwise else channels, k, k))
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType(shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            dx = bb.emit(relax.op.dequantize(x, _const(0.05, "float32"), _const(3, dtype)))
            dw = bb.emit(
                relax.op.dequantize(
                    _const(w, "int8"),
                    _const(np.full(out_channels, 0.01), "float32"),
                    _const(np.zeros(out_channels), "int8"),
                    axis=0,
                )
            )
            groups = channels if depthwise else 1
            y = bb.emit(relax.op.nn.conv2d(dx, dw, padding=k // 2, groups=groups))
            bias = _const(rng.standard_normal((1, out_channels, 1, 1)), "float32")
            q = bb.emit(
                relax.op.quantize(
                    bb.emit(relax.op.add(y, bias)),
                    _const(0.2, "float32"),
                    _const(5, dtype),
                    out_dtype=dtype,
                )
            )
            d = bb.emit(relax.op.dequantize(q, _const(0.2, "float32"), _const(5, dtype)))
            s = bb.emit(
                relax.op.quantize(
                    bb.emit(relax.op.sigmoid(d)),
                    _const(1 / 255, "float32"),
                    _const(0, dtype),
                    out_dtype=dtype,
                )
            )
            ds = bb.emit(relax.op.dequantize(s, _const(1 / 255, "float32"), _const(0, dtype)))
            out = bb.emit_output(
                relax.op.quantize(
                    bb.emit(relax.op.multiply(d, ds)),
                    _const(0.1, "float32"),
                    _const(2, dtype),
                    out_dtype=dtype,
                )
            )
        bb.emit_func_output(out)
    return bb.get()


def _input(dtype, shape=(1, 16, 14, 14)):
    info = np.iinfo(dtype)
    return np.random.default_rng(1).integers(info.min, info.max + 1, shape).astype(dtype)


@pytest.fixture(scope="module")
def npu_hub():
    return umahub.Hub(config={"plugins": ["npu"], "on-error": "error"})


@pytest.mark.parametrize("depthwise", [False, True], ids=["dense", "depthwise"])
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_the_table_after_a_quantized_convolution_is_read_on_the_npu_bit_for_bit(
    npu_hub, dtype, depthwise
):
    mod = qconv_silu(dtype, depthwise=depthwise)
    on_npu = npu_hub.compile(mod)
    on_host = npu_hub.compile(mod, placement={"*": "host"})
    table = ["relax.take"] if dtype == "uint8" else ["relax.astype", "relax.take"]
    ops = [(o.op, o.device, o.pattern) for o in on_npu.report.placement]
    assert ops == [
        (op, "npu:0", "npu.qconv2d_bias_table")
        for op in [
            "relax.dequantize",
            "relax.dequantize",
            "relax.nn.conv2d",
            "relax.add",
            "relax.quantize",
            *table,
        ]
    ]
    assert on_npu.report.quantized[0]["device"] == "npu:0"
    (said,) = on_npu.report.partitions[0].schedule
    if has_vbmi():  # a depthwise convolution's flat plane is unflattened by a stage of its own
        read = "in the epilogue (vpermi2b" if not depthwise else "64 entries a step (vpermi2b)"
        assert f"its table read {read}" in said
    x = _input(dtype)
    np.testing.assert_array_equal(on_npu.run(x), on_host.run(x))


def test_a_table_of_fewer_entries_than_a_step_is_read_an_entry_at_a_time(npu_hub):
    """Eight outputs (a squeeze-and-excitation block's): no whole vector of 64."""
    mod = qconv_silu(shape=(1, 16, 1, 1), out_channels=8, k=1)
    on_npu = npu_hub.compile(mod)
    on_host = npu_hub.compile(mod, placement={"*": "host"})
    assert {o.device for o in on_npu.report.placement} == {"npu:0"}
    (said,) = on_npu.report.partitions[0].schedule
    assert said.endswith("its table read an entry at a time")
    x = _input("uint8", (1, 16, 1, 1))
    np.testing.assert_array_equal(on_npu.run(x), on_host.run(x))


def test_the_table_patterns_come_first_and_are_only_made_when_asked():
    plain = up.quantized("acc", "conv2d")
    both = up.quantized("acc", "conv2d", tables=True)
    names = [p[0] for p in both]
    assert names[: len(plain)] == [f"{p[0]}_table" for p in plain]
    assert names[len(plain) :] == [p[0] for p in plain]
    assert not any(n.endswith("_table") for n, *_ in plain)


def root_input(root, lookup):
    """The tensor a lookup's index is made of: ``x``, before its ``astype``."""
    index = root.args[1]
    value = lookup(index)
    return value.args[0] if value is not None else index


def _lookup(table_entries, index_dtype, cast):
    """``take(table, i)`` of an 8-bit ``i`` (through ``astype(uint8)`` with ``cast``)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((4,), index_dtype))
    with bb.function("main", [x]):
        index = bb.emit(relax.op.astype(x, "uint8")) if cast else x
        table = _const(np.arange(table_entries) % 256, "uint8")
        out = bb.emit(relax.op.take(table, index, axis=0))
        bb.emit_func_output(out)
    main = bb.get()["main"]
    bound = {b.var: b.value for block in main.body.blocks for b in block.bindings}
    return bound[out], bound.get


@pytest.mark.parametrize(
    "entries, dtype, cast, problem",
    [
        (256, "uint8", False, None),
        (256, "int8", True, None),
        (256, "int8", False, "indexed by int8"),
        (128, "uint8", False, "not 256 entries"),
    ],
)
def test_a_lookup_that_could_read_outside_its_table_is_refused(entries, dtype, cast, problem):
    root, lookup = _lookup(entries, dtype, cast)
    if problem is None:
        table, data = up.table_of(root, lookup)
        assert table.same_as(root.args[0])
        assert data.same_as(root_input(root, lookup))
        return
    with pytest.raises(ValueError, match=problem):
        up.table_of(root, lookup)


def squeeze_excitation(order="gate first", data="uint8"):
    """A squeeze-and-excitation block's tail in QDQ form: the pooling of ``x``
    quantized, and ``x`` times its dequantized per-channel gate, quantized. ``x``
    is dequantized from ``data`` (8-bit), or is ``data`` (float32)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((1, 32, 14, 14), data))
    g = relax.Var("g", TensorType((1, 32, 1, 1), "uint8"))
    with bb.function("main", [x, g]):
        with bb.dataflow():
            dx = x
            if data != "float32":
                dx = bb.emit(relax.op.dequantize(x, _const(0.05, "float32"), _const(3, data)))
            pooled = bb.emit(relax.op.mean(dx, axis=[2, 3], keepdims=True))
            qm = bb.emit(
                relax.op.quantize(
                    pooled, _const(0.01, "float32"), _const(7, "uint8"), out_dtype="uint8"
                )
            )
            dg = bb.emit(relax.op.dequantize(g, _const(1 / 255, "float32"), _const(0, "uint8")))
            gated = (
                relax.op.multiply(dg, dx) if order == "gate first" else relax.op.multiply(dx, dg)
            )
            qp = bb.emit(
                relax.op.quantize(
                    bb.emit(gated), _const(0.04, "float32"), _const(2, "uint8"), out_dtype="uint8"
                )
            )
            out = bb.emit_output(relax.Tuple([qm, qp]))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("order", ["gate first", "gate second"])
def test_a_quantized_gate_and_pooling_stay_on_the_npu_bit_for_bit(npu_hub, order):
    compiled = npu_hub.compile(squeeze_excitation(order))
    on_host = npu_hub.compile(squeeze_excitation(order), placement={"*": "host"})
    # x's dequantize, read by both, is copied for each (named as it is): each takes
    # its own into its kernel, and x stays 8-bit, where its float tensor (four
    # times the bytes) went to the host and back
    assert [(o.name, o.op, o.device, o.pattern) for o in compiled.report.placement] == [
        ("lv", "relax.dequantize", "npu:0", "npu.qmean"),
        ("lv1", "relax.mean", "npu:0", "npu.qmean"),
        ("lv2", "relax.quantize", "npu:0", "npu.qmean"),
        ("lv3", "relax.dequantize", "npu:0", "npu.qgate_both"),
        ("lv", "relax.dequantize", "npu:0", "npu.qgate_both"),
        ("lv4", "relax.multiply", "npu:0", "npu.qgate_both"),
        ("lv5", "relax.quantize", "npu:0", "npu.qgate_both"),
    ]
    # the inputs go to the npu and the results come back, and nothing else does
    copied = [(c.tensor, c.src, c.dst) for c in compiled.report.copies if c.when == "inference"]
    assert copied == [
        ("x", "host", "npu:0"),
        ("g", "host", "npu:0"),
        ("lv1", "npu:0", "host"),
        ("lv3", "npu:0", "host"),
    ]
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (1, 32, 14, 14)).astype("uint8")
    g = rng.integers(0, 256, (1, 32, 1, 1)).astype("uint8")
    for got, expected in zip(compiled.run(x, g), on_host.run(x, g), strict=True):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("order", ["gate first", "gate second"])
def test_a_float_tensors_quantized_gate_and_pooling_stay_on_the_npu_bit_for_bit(npu_hub, order):
    compiled = npu_hub.compile(squeeze_excitation(order, data="float32"))
    on_host = npu_hub.compile(squeeze_excitation(order, data="float32"), placement={"*": "host"})
    gate = "npu.qgate"  # the product's pattern matches its operands in either order
    assert [(o.op, o.device, o.pattern) for o in compiled.report.placement] == [
        ("relax.mean", "npu:0", "npu.mean_quantize"),
        ("relax.quantize", "npu:0", "npu.mean_quantize"),
        ("relax.dequantize", "npu:0", gate),
        ("relax.multiply", "npu:0", gate),
        ("relax.quantize", "npu:0", gate),
    ]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1, 32, 14, 14)).astype("float32")
    g = rng.integers(0, 256, (1, 32, 1, 1)).astype("uint8")
    for got, expected in zip(compiled.run(x, g), on_host.run(x, g), strict=True):
        np.testing.assert_array_equal(got, expected)


def test_a_product_of_two_whole_tensors_is_no_gate(npu_hub):
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((1, 32, 14, 14), "uint8"))
    y = relax.Var("y", TensorType((1, 32, 14, 14), "uint8"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            dx = bb.emit(relax.op.dequantize(x, _const(0.05, "float32"), _const(3, "uint8")))
            dy = bb.emit(relax.op.dequantize(y, _const(0.05, "float32"), _const(3, "uint8")))
            out = bb.emit_output(
                relax.op.quantize(
                    bb.emit(relax.op.multiply(dx, dy)),
                    _const(0.04, "float32"),
                    _const(2, "uint8"),
                    out_dtype="uint8",
                )
            )
        bb.emit_func_output(out)
    compiled = npu_hub.compile(bb.get())
    assert {o.device for o in compiled.report.placement} == {"host"}
    refused = [o.refused for o in compiled.report.placement if o.op == "relax.multiply"]
    assert "not one per channel" in str(refused)


def residual_add(dtype="uint8", relu=False, y_shape=(1, 16, 14, 14), y_scale=0.07):
    """A residual block's add in QDQ form: ``quantize([relu](dequantize(x) +
    dequantize(y)))``, as ONNX Runtime's quantizer writes MobileNetV2's and ResNet's."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((1, 16, 14, 14), dtype))
    y = relax.Var("y", TensorType(y_shape, dtype))
    zero = 3 if dtype == "uint8" else -3
    with bb.function("main", [x, y]):
        with bb.dataflow():
            dx = bb.emit(relax.op.dequantize(x, _const(0.05, "float32"), _const(zero, dtype)))
            dy = bb.emit(
                relax.op.dequantize(y, _const(y_scale, "float32"), _const(5, dtype), axis=1)
            )
            total = bb.emit(relax.op.add(dx, dy))
            if relu:
                total = bb.emit(relax.op.nn.relu(total))
            q = relax.op.quantize(
                total, _const(0.09, "float32"), _const(zero, dtype), out_dtype=dtype
            )
            out = bb.emit_output(q)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("relu", [False, True], ids=["add", "add and relu"])
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_a_residual_add_in_qdq_form_stays_on_the_npu_bit_for_bit(npu_hub, dtype, relu):
    """The add between two partitions' outputs took them to the host and back (29
    copies per MobileNetV2 inference, 10 of its adds); on the npu it computes the
    host's float arithmetic, so its bytes are the host's."""
    compiled = npu_hub.compile(residual_add(dtype, relu))
    on_host = npu_hub.compile(residual_add(dtype, relu), placement={"*": "host"})
    pattern = "npu.qadd_relu" if relu else "npu.qadd"
    ops = ["relax.dequantize", "relax.dequantize", "relax.add"]
    ops += ["relax.nn.relu"] * relu + ["relax.quantize"]
    assert [(o.op, o.device, o.pattern) for o in compiled.report.placement] == [
        (op, "npu:0", pattern) for op in ops
    ]
    info = np.iinfo(dtype)
    rng = np.random.default_rng(3)
    x, y = (rng.integers(info.min, info.max + 1, (1, 16, 14, 14)).astype(dtype) for _ in "xy")
    expected = on_host.run(x, y)
    assert len(np.unique(expected)) > 50  # neither saturated nor constant
    np.testing.assert_array_equal(compiled.run(x, y), expected)


@pytest.mark.parametrize(
    "options, reason",
    [
        ({"y_shape": (1, 16, 1, 1)}, "a sum of tensors of different or unknown shapes"),
        ({"y_scale": np.full(16, 0.07)}, "a quantize or dequantize with a scale per channel"),
    ],
    ids=["broadcast", "scale per channel"],
)
def test_a_quantized_add_the_npu_does_not_take_stays_on_the_host(npu_hub, options, reason):
    compiled = npu_hub.compile(residual_add(**options))
    assert {o.device for o in compiled.report.placement} == {"host"}
    refused = {str(o.refused) for o in compiled.report.placement if o.op == "relax.add"}
    assert any(reason in r for r in refused), refused
