"""``main`` in one memory: the VM reads a tensor where its device wrote it, no copies.

Every device of this runtime is the host's memory (see
:mod:`umahub.compiler.one_memory`); the placement's copies stay as data (the
report, the concurrent executor's steps).
"""

from __future__ import annotations

import numpy as np
import pytest
from graphs import reference
from tvm import relax

import umahub
import umahub.compiler.stages.build as build
import umahub.runtime.compiled as compiled_module
from umahub._tvm import TensorType

BUNDLED = {"plugins": ["npu", "vanilla", "dsp"]}
PINS = {"conv": "npu", "flat": "host", "dense": "npu", "out": "host"}


def conv_flatten_dense(seed=0):
    """x -> conv2d (npu) -> reshape (host) -> matmul (npu) -> add (host)."""
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((1, 8, 6, 6), "float32"))
    w = relax.const(rng.standard_normal((8, 8, 3, 3)).astype("float32"))
    d = relax.const(rng.standard_normal((288, 16)).astype("float32"))
    b = relax.const(rng.standard_normal((1, 16)).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.conv2d(x, w, padding=1), name_hint="conv")
            h = bb.emit(relax.op.reshape(h, (1, 288)), name_hint="flat")
            h = bb.emit(relax.op.matmul(h, d), name_hint="dense")
            out = bb.emit_output(relax.op.add(h, b), name_hint="out")
        bb.emit_func_output(out)
    return bb.get()


X = np.random.default_rng(1).standard_normal((1, 8, 6, 6)).astype("float32")


@pytest.fixture(scope="module")
def model():
    hub = umahub.Hub(config=BUNDLED, project_config=False)
    return hub.compile(conv_flatten_dense(), placement=PINS)


def test_the_vm_reads_each_tensor_where_its_device_wrote_it(model):
    seconds, copies = model._executors.call_seconds([X], 1)
    assert copies == []
    assert "vm.builtin.to_device" not in seconds
    assert {"npu_0_conv2d", "npu_1_matmul"} <= set(seconds)
    np.testing.assert_allclose(
        model.run(X, executor="vm"), reference(conv_flatten_dense(), [X]), rtol=1e-5, atol=1e-4
    )


def test_the_placement_keeps_its_crossings_and_the_steps_their_copies(model):
    crossings = [(c.src, c.dst, c.in_place) for c in model.report.copies if c.when == "inference"]
    expected = [("host", "npu:0"), ("npu:0", "host"), ("host", "npu:0"), ("npu:0", "host")]
    assert crossings == [(*e, True) for e in expected]
    assert (
        "  npu:0 -> host: 2 copies, 1.2 KiB, async; in the host's memory: the VM reads "
        "them in place" in str(model.report)
    )
    steps = [(s.src, s.dst) for s in model.step_graph.steps if s.kind == "copy"]
    assert steps == expected
    assert np.array_equal(model.run(X, executor="concurrent"), model.run(X, executor="vm"))


def test_an_exported_library_runs_in_one_memory(model, tmp_path):
    path = model.export_library(tmp_path / "model.so")
    assert compiled_module._read_metadata(str(path))["umahub"] == 4
    loaded = umahub.load(path)
    assert np.array_equal(loaded.run(X, executor="vm"), model.run(X, executor="vm"))


def test_a_library_exported_with_copies_in_main_still_runs(monkeypatch, tmp_path):
    # what umahub wrote before format 4: main copies between tvm.cpu(i) devices
    monkeypatch.setattr(build, "in_one_memory", lambda mod: mod)
    monkeypatch.setattr(compiled_module, "_FORMAT", 2)
    hub = umahub.Hub(config=BUNDLED, project_config=False)
    old = hub.compile(conv_flatten_dense(), placement=PINS)
    path = old.export_library(tmp_path / "old.so")
    monkeypatch.undo()
    loaded = umahub.load(path)
    assert [str(d) for d in loaded._runner.devices] == ["cpu:0", "cpu:1"]
    expected = reference(conv_flatten_dense(), [X])
    np.testing.assert_allclose(loaded.run(X, executor="vm"), expected, rtol=1e-5, atol=1e-4)


def test_the_weights_are_read_where_the_library_holds_them(model):
    runner = model._runner
    held = runner.vm()["umahub_weights"]()
    assert len(runner.weights) == 2
    assert all(w.same_as(h) for w, h in zip(runner.weights, held))  # not copies
    loads = [(c.dst, c.bytes, c.in_place) for c in model.report.copies if c.when == "load"]
    assert loads == [("npu:0", 8 * 8 * 3 * 3 * 4, True), ("npu:0", 288 * 16 * 4, True)]
