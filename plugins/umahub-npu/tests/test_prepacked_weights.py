"""The npu's constant weights are packed once, at compile time (umahub.host.prepack):
convolution filters as ``[f/nr][c][kh][kw][nr]``, matmul B as ``[j/nr][k][nr]``;
a B computed at run time is still packed tile by tile. Numbers against plain TVM."""

from __future__ import annotations

import re

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
from tvm import relax  # noqa: E402
from tvm.script import relax as R  # noqa: E402

import umahub  # noqa: E402
from umahub.plugin import vector_lanes  # noqa: E402

RNG = np.random.default_rng(0)


def _matches_plain_tvm(compiled, mod, *shapes):
    """``compiled`` gives plain TVM's output on random inputs of ``shapes``."""
    xs = [RNG.standard_normal(shape).astype("float32") for shape in shapes]
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    want = vm["main"](*[tvm.runtime.tensor(a) for a in xs]).numpy()
    np.testing.assert_allclose(compiled.run(*xs), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _compile(mod):
    return umahub.Hub(config={"plugins": ["npu"], "verify": True}, project_config=False).compile(
        mod
    )


def _panels(packed: str, before: str, inner: str, columns: int) -> int:
    """The panel width of ``"weight 1 (<before> -> <n>x<inner>x<nr>)"``, checked whole:
    ``n`` panels of ``nr`` (one or two vectors) hold the ``columns``, padded to less
    than one more panel."""
    match = re.fullmatch(rf"weight 1 \({before} -> (\d+)x{inner}x(\d+)\)", packed)
    assert match, packed
    panels, nr = int(match[1]), int(match[2])
    assert nr in (vector_lanes(), 2 * vector_lanes())
    assert panels == -(-columns // nr)
    return nr


def test_a_convolution_filter_is_packed_at_compile_time():
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((1, 16, 14, 14), "float32"))
    weight = relax.const(RNG.standard_normal((32, 16, 3, 3)).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, weight, 1, 1))
            out = bb.emit_output(relax.op.nn.relu(conv))
        bb.emit_func_output(out)
    mod = bb.get()
    compiled = _compile(mod)
    (part,) = compiled.report.partitions
    assert part.schedule == ["conv2d: tiles fit npu.sram (256 KiB)"]
    (packed,) = part.packed
    _panels(packed, "32x16x3x3", "16x3x3", 32)
    assert part.max_error is not None and part.max_error < 1e-4
    _matches_plain_tvm(compiled, mod, (1, 16, 14, 14))


def test_a_dense_weight_is_packed_and_an_activation_is_not():
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((32, 64), "float32"))
    y = relax.Var("y", R.Tensor((64, 48), "float32"))
    weight = relax.const(RNG.standard_normal((64, 96)).astype("float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            dense = bb.emit(relax.op.matmul(x, weight), "dense")
            act = bb.emit(relax.op.nn.relu(dense), "act")
            # B is the model's input: nothing to pack ahead, the kernel packs per tile
            mixed = bb.emit(relax.op.matmul(x, y), "mixed")
            out = bb.emit_output(relax.Tuple([act, mixed]))
        bb.emit_func_output(out)
    mod = bb.get()
    compiled = _compile(mod)
    parts = {p.patterns[0]: p for p in compiled.report.partitions}
    assert sorted(parts) == ["npu.matmul", "npu.matmul_act"]
    (packed,) = parts["npu.matmul_act"].packed
    _panels(packed, "64x96", "64", 96)
    assert parts["npu.matmul"].packed == []
    assert all(p.max_error is not None and p.max_error < 1e-4 for p in parts.values())
    xs = [RNG.standard_normal(s).astype("float32") for s in ((32, 64), (64, 48))]
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    want = vm["main"](*[tvm.runtime.tensor(a) for a in xs])
    for got, ref in zip(compiled.run(*xs), want):
        np.testing.assert_allclose(got, ref.numpy(), rtol=1e-5, atol=1e-4)


def test_a_weight_no_register_tile_divides_is_padded_and_packed_at_compile_time():
    # 1000 classes: the padded copy of B is the packing, made once
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((1, 32), "float32"))
    w = RNG.standard_normal((32, 1000)).astype("float32")
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, relax.const(w)))
        bb.emit_func_output(out)
    compiled = _compile(bb.get())
    (part,) = compiled.report.partitions
    (packed,) = part.packed
    nr = _panels(packed, "32x1000", "32", 1000)
    assert 1000 % nr  # padded: the last panel has columns the weight has not
    assert part.max_error is not None and part.max_error < 1e-4
    xs = RNG.standard_normal((1, 32)).astype("float32")
    np.testing.assert_allclose(compiled.run(xs), xs @ w, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("channels", [1000, 72])
def test_a_filter_no_vector_divides_is_padded_with_its_packing_at_compile_time(channels):
    # SqueezeNet's 1000 classes, MobileNet's 72 channels: whole vectors of
    # channels, the padding's zeros made once with the packing, the extra
    # channels dropped in the epilogue
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((1, 64, 13, 13), "float32"))
    w = RNG.standard_normal((channels, 64, 1, 1)).astype("float32")
    b = RNG.standard_normal((1, channels, 1, 1)).astype("float32")
    with bb.function("main", [x]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, relax.const(w)))
            out = bb.emit_output(relax.op.nn.relu(relax.op.add(conv, relax.const(b))))
        bb.emit_func_output(out)
    mod = bb.get()
    compiled = _compile(mod)
    (part,) = compiled.report.partitions
    (packed,) = part.packed
    padded = -(-channels // 16) * 16
    nr = _panels(packed, f"{channels}x64x1x1", "64x1x1", padded)
    assert padded % nr == 0  # whole vectors, no half ones
    assert part.max_error is not None and part.max_error < 1e-4
    _matches_plain_tvm(compiled, mod, (1, 64, 13, 13))


def test_a_filter_passed_at_run_time_is_not_padded():
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((1, 64, 13, 13), "float32"))
    w = relax.Var("w", R.Tensor((72, 64, 1, 1), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(relax.op.nn.conv2d(x, w)))
        bb.emit_func_output(out)
    mod = bb.get()
    compiled = _compile(mod)
    (part,) = compiled.report.partitions
    assert part.packed == []  # packed tile by tile, as it comes
    _matches_plain_tvm(compiled, mod, (1, 64, 13, 13), (72, 64, 1, 1))


def test_a_one_by_one_filter_on_whole_vectors_of_positions_is_packed_unpadded():
    # the vectors hold positions (16x16 of them), the 72 channels are broadcast
    # in register tiles of 12 (AVX-512) or 6 (AVX2): no channel is padded
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((1, 64, 16, 16), "float32"))
    w = RNG.standard_normal((72, 64, 1, 1)).astype("float32")
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(relax.op.nn.conv2d(x, relax.const(w))))
        bb.emit_func_output(out)
    mod = bb.get()
    compiled = _compile(mod)
    (part,) = compiled.report.partitions
    assert part.schedule == ["pointwise: tiles fit npu.sram (256 KiB)"]
    mr = 12 if vector_lanes() >= 16 else 6
    assert part.packed == [f"weight 1 (72x64x1x1 -> {72 // mr}x64x1x1x{mr})"]
    assert part.max_error is not None and part.max_error < 1e-4
    _matches_plain_tvm(compiled, mod, (1, 64, 16, 16))


def test_the_filter_of_a_gated_one_by_one_convolution_is_packed_at_compile_time():
    # squeeze-and-excitation: the gate x * s[c] is read in place by the convolution,
    # which puts the scale's read before the filter's; the filter was looked up by
    # its index before that, the scale taken for it, and the filter left unpacked
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((1, 32, 16, 16), "float32"))
    w = RNG.standard_normal((48, 32, 1, 1)).astype("float32")
    with bb.function("main", [x]):
        with bb.dataflow():
            gate = bb.emit(relax.op.sigmoid(relax.op.mean(x, axis=[2, 3], keepdims=True)))
            conv = relax.op.nn.conv2d(bb.emit(relax.op.multiply(x, gate)), relax.const(w))
            out = bb.emit_output(relax.op.nn.relu(conv))
        bb.emit_func_output(out)
    mod = bb.get()
    compiled = _compile(mod)
    (part,) = [p for p in compiled.report.partitions if "conv2d" in p.symbol]
    assert part.schedule == ["pointwise: tiles fit npu.sram (256 KiB)"]
    mr = 12 if vector_lanes() >= 16 else 6
    assert part.packed == [f"weight 2 (48x32x1x1 -> {48 // mr}x32x1x1x{mr})"]
    _matches_plain_tvm(compiled, mod, (1, 32, 16, 16))
