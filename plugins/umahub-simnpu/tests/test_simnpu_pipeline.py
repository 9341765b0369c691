"""The simnpu built as its hardware is: tiles cut for the on-chip buffers, placed in their
scopes, double-buffered, ordered by dependency tokens, and the cycles it takes."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tvm
from simnpu_models import host_hub, quantized_model, simnpu_hub
from umahub_simnpu.lowering import Tiling, lower, tiling
from umahub_simnpu.operator import plan
from umahub_simnpu.passes import double_buffer
from umahub_simnpu.schedule import place_tiles
from umahub_simnpu_runtime import SimNpuRuntime

import umahub
import umahub.models as zoo
from umahub.plugin.device import DeviceError
from umahub.report.picture import render_svg
from umahub.report.picture.svg import fmt_time

SINGLE = {"options": {"simnpu": {"double-buffering": False}}}


def _compile(mod, **config):
    compiled = simnpu_hub(**config).compile(mod)
    return compiled, [p for p in compiled.report.partitions if not p.fallback]


@pytest.fixture(scope="module")
def cnn_both_ways():
    """cnn_int8 compiled with double buffering and without, and the host's outputs."""
    mod, xs = zoo.get("cnn_int8"), zoo.inputs("cnn_int8")
    on, off = simnpu_hub().compile(mod), simnpu_hub(**SINGLE).compile(mod)
    return on, off, xs, host_hub().compile(mod).run(*xs)


def test_double_buffering_takes_fewer_cycles_for_the_same_integers(cnn_both_ways):
    on, off, xs, want = cnn_both_ways
    assert np.array_equal(on.run(*xs), want) and np.array_equal(off.run(*xs), want)
    pairs = list(zip(on.report.partitions, off.report.partitions))
    assert [p.symbol for p, _ in pairs] == [q.symbol for _, q in pairs] and len(pairs) == 3
    for p, q in pairs:
        # the same work: every module as busy either way, only the overlap differs
        assert p.program["busy"] == q.program["busy"]
        assert p.program["cycles"] <= q.program["cycles"] <= q.program["serial_cycles"]
        assert q.program["notes"][0] == "single-buffered"
    convs = [(p.program["cycles"], q.program["cycles"]) for p, q in pairs[:2]]
    assert all(double < single for double, single in convs), convs
    # each tile twice in its buffer when double-buffered, once when not
    first_on, first_off = pairs[0][0].buffers, pairs[0][1].buffers
    assert {s: u for s, (u, _) in first_on.items()} == {s: 2 * u for s, (u, _) in first_off.items()}
    assert first_on["local.simnpu.inp"][1] == 64 << 10


def test_the_report_says_what_each_hook_did(cnn_both_ways):
    on = cnn_both_ways[0]
    conv = on.report.partitions[0]
    assert conv.schedule == [
        "tiles of 4 rows x 16 output positions x 16 channels: INP 1728 B, WGT 2304 B, "
        "ACC 1088 words, x2 (double-buffered); tiles placed: inp -> local.simnpu.inp, "
        "wgt -> local.simnpu.wgt, acc -> local.simnpu.acc"
    ]
    assert conv.passes == [
        "phase 0: simnpu.double_buffer (umahub_simnpu)",
        "phase 1: simnpu.dependency_tokens (umahub_simnpu)",
    ]
    assert conv.buffers == {
        "local.simnpu.inp": [3456, 65536],
        "local.simnpu.wgt": [4608, 65536],
        "local.simnpu.acc": [8704, 65536],
    }
    text = str(on.report)
    assert "      on-chip: local.simnpu.inp 3.4 KiB of 64 KiB" in text
    cycles = conv.program["cycles"]
    assert f"      cycles: {cycles:,} (busy: load " in text
    assert f", {cycles / 1e3:,.1f} us at 1 GHz" in text
    lanes = conv.program["lanes"]
    assert set(lanes) == {"load", "compute", "store"}
    assert max(end for spans in lanes.values() for _, end in spans) == cycles
    svg = render_svg(on.report)
    assert ">Device programs, by the vendor&#x27;s cycle model</text>" in svg
    assert "; host " not in svg  # nothing measured yet
    assert svg.count('<g class="program" ') == 3
    assert svg.count('class="span module"') == sum(
        len(spans) for p in on.report.partitions for spans in p.program["lanes"].values()
    )
    # next to the model's cycles, what this machine took for each call, once measured
    measured = on.profile(*cnn_both_ways[2], runs=3)
    took = {s["label"]: s["end"] - s["start"] for s in measured["spans"] if s["kind"] == "compute"}
    assert f"; measured here: {took[conv.symbol] * 1e3:.3f} ms for the call" in str(on.report)
    assert f"; host {fmt_time(took[conv.symbol])}</text>" in render_svg(on.report)


def test_a_wide_convolution_is_tiled_smaller_and_stays_exact():
    # 11x11 taps over a 300-wide row: 256 positions need an input window of 46,816 bytes,
    # more than half of INP (double-buffered); 128 take 24,288
    mod, xs = quantized_model(
        "conv2d", x_shape=(1, 3, 12, 300), kernel=(11, 11), padding=(5, 5, 5, 5)
    )
    compiled, (part,) = _compile(mod)
    assert part.schedule[0].startswith("tiles of 128 output positions x 16 channels: INP 24288 B")
    assert np.array_equal(compiled.run(*xs), host_hub().compile(mod).run(*xs))
    # one copy of each tile has the whole buffer: 256 positions fit
    _, (single,) = _compile(mod, **SINGLE)
    assert single.schedule[0].startswith("tiles of 256 output positions x 16 channels")


def test_a_kernel_whose_weights_cannot_fit_is_refused_with_the_reason():
    # 12x12 taps: 36,864 bytes of weight tiles per 16 input channels; a WGT copy has 32,768
    mod, xs = quantized_model("conv2d", x_shape=(1, 3, 14, 14), kernel=(12, 12))
    with warnings.catch_warnings():
        warnings.simplefilter("error", umahub.UmahubWarning)  # a refusal, not a failure
        hub = umahub.Hub(autoload=False, plugins=[__import__("umahub_simnpu")])
        compiled = hub.compile(mod)
    (part,) = compiled.report.partitions
    assert part.fallback == (
        f"plugin 'umahub_simnpu' refused partition {part.symbol} in umahub_relax_to_tir: a "
        "12x12 kernel's weight tiles (36864 bytes per 16 input channels) do not fit WGT "
        "(32768 bytes per copy, double-buffered)"
    )
    assert np.array_equal(compiled.run(*xs), host_hub().compile(mod).run(*xs))
    _, (fits,) = _compile(mod, **SINGLE)  # a single copy has all 65,536 bytes
    assert fits.buffers["local.simnpu.wgt"] == [36864, 65536]


def test_tiles_the_buffers_cannot_hold_are_refused_by_the_tiling():
    mod, _ = quantized_model("matmul", x_shape=(4, 64))
    from umahub_simnpu.lowering import Capacities
    from umahub_simnpu.operator import Unsupported

    operator, _ = _plan(mod)
    assert tiling(operator, Capacities(inp=4096, wgt=4096, acc=4096)) == Tiling(
        4, 64, 256, 1024, 128, 2
    )
    with pytest.raises(
        Unsupported, match=r"^one 16x16 weight tile does not fit WGT \(128 bytes per copy"
    ):
        tiling(operator, Capacities(wgt=256))


def _plan(mod):
    """The plan of the one partition the simnpu makes of ``mod``."""
    from test_codegen import _partition

    function, constants = _partition(mod)
    return plan(function, constants), function


def test_without_its_tokens_the_program_faults_as_a_hazard():
    mod, xs = quantized_model("conv2d", x_shape=(1, 20, 9, 9))
    from test_codegen import _partition
    from umahub_simnpu.codegen import generate

    function, constants = _partition(mod)
    schedule = tvm.s_tir.Schedule(lower(plan(function, constants), function, "part"))
    place_tiles(schedule, "part")
    program = generate(double_buffer()(schedule.mod), "part")  # double-buffered, no tokens
    device = SimNpuRuntime(dram_bytes=1 << 22).open(3)
    try:
        loaded = device.load(program)
        buffers = []
        for value in [xs[0], *(constants[i] for i in sorted(constants))]:
            array = np.ascontiguousarray(value)
            buffers.append(device.allocate(max(array.nbytes, 1)))
            device.write(buffers[-1], memoryview(array).cast("B")).wait(10)
        out = device.allocate(20 * 9 * 9)
        with pytest.raises(
            DeviceError,
            match=r"fault: hazard: instruction \d+ \(\w+, \w+\) .* a missing dependency token",
        ):
            device.execute(loaded, [*buffers, out]).wait(10)
    finally:
        device.close()


def test_whole_rows_share_a_weight_tile_while_the_pipeline_keeps_steps():
    # 7x7 output, 64 channels in and out: every row in one tile, so each weight tile is
    # loaded once for all 49 positions; 16 steps of the reduction remain to pipeline
    deep, _ = _plan(quantized_model("conv2d", x_shape=(1, 64, 7, 7), out_channels=64)[0])
    assert (tiling(deep).rows, tiling(deep).positions) == (7, 7)
    # 9x9 output, 5 channels in, 20 out: 2 blocks of one step each; rows of 3 give 6 steps
    small, _ = _plan(quantized_model("conv2d")[0])
    assert (tiling(small).rows, tiling(small).positions) == (3, 9)
