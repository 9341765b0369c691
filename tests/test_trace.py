"""A measured run as a Chrome trace (umahub.runtime.trace): one named track per device and
per DMA lane, copies with their bytes, durations that are the measured spans exactly,
every profiled run; from ``profile(trace=...)`` and ``umahub bench --trace``."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import toy_device
import tvm
from tvm import relax
from tvm.script import relax as R

import umahub
from umahub._tvm import TensorType
from umahub.boards.bench import bench
from umahub.cli import main
from umahub.errors import UmahubError
from umahub.lanes import ordered
from umahub.runtime import devices
from umahub.runtime.compiled import example_inputs
from umahub.runtime.trace import chrome_trace, save_trace

BUNDLED = {"plugins": ["npu", "vanilla", "dsp"]}


def two_branches(heavy: bool):
    """x -> branch a (a0, a1) and branch b (b0, b1) -> out = a1 + b1; matmuls when heavy."""
    rng = np.random.default_rng(0)
    shape = (32, 32) if heavy else (4, 16)
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            ends = []
            for br in "ab":
                h = x
                for i in range(2):
                    c = relax.const(rng.standard_normal(shape).astype("float32"))
                    op = relax.op.matmul if heavy else (relax.op.add, relax.op.multiply)[i]
                    h = bb.emit(op(h, c), name_hint=f"{br}{i}")
                ends.append(h)
            out = bb.emit_output(relax.op.add(*ends), name_hint="out")
        bb.emit_func_output(out)
    return bb.get()


def pins(a: str, b: str) -> dict[str, str]:
    return {"a0": a, "a1": a, "b0": b, "b1": b, "out": "host"}


@pytest.fixture(scope="module")
def hub():
    return umahub.Hub(config=BUNDLED, project_config=False)


@pytest.fixture(scope="module")
def npu_model(hub):
    """A matmul branch on the npu (async copies: a DMA lane), one on the host."""
    return hub.compile(two_branches(heavy=True), placement=pins("npu", "host"))


def tracks(trace) -> dict[int, str]:
    """tid -> the track's name, in the order the trace names them."""
    return {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}


def steps(trace) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def check_against(trace, measured):
    """Every span of every inference is one event on its lane's track, ``dur`` exactly the
    span's, ``ts`` the inference's start plus the span's; each track's events in time order."""
    named = tracks(trace)
    events = steps(trace)
    want = sorted(
        (
            s["lane"],
            s["label"],
            n,
            (run["start"] + s["start"]) * 1e6,
            (s["end"] - s["start"]) * 1e6,
        )
        for n, run in enumerate(measured["inferences"], 1)
        for s in run["spans"]
    )
    got = sorted(
        (named[e["tid"]], e["name"], e["args"]["inference"], e["ts"], e["dur"]) for e in events
    )
    assert got == want  # exact: the JSON holds the floats as they were
    for tid in named:
        times = [e["ts"] for e in events if e["tid"] == tid]
        assert times == sorted(times)
    assert {e["pid"] for e in trace["traceEvents"]} == {1}


def test_profile_writes_a_trace_with_a_track_per_device_and_dma_lane(npu_model, tmp_path):
    path = tmp_path / "npu.json"
    measured = npu_model.profile(*example_inputs(npu_model.input_info), runs=3, trace=path)
    trace = json.loads(path.read_text())
    assert trace["displayTimeUnit"] == "ms"
    assert list(tracks(trace).values()) == ["host", "npu:0", "npu:0 DMA"]
    assert len(measured["inferences"]) == 3
    check_against(trace, measured)
    assert npu_model.report.measured is measured  # kept for the report's JSON and picture
    copies = {(e["name"], e["args"]["inference"]): e for e in steps(trace) if e["cat"] == "copy"}
    copy_in = copies["copy x host->npu:0", 3]
    assert tracks(trace)[copy_in["tid"]] == "npu:0 DMA"
    assert copy_in["args"] == {
        "device": "npu:0",
        "lane": "npu:0 DMA",
        "kind": "async",
        "inference": 3,
        "bytes": 32 * 32 * 4,
    }
    partitions = [e for e in steps(trace) if e["name"].startswith("npu_")]
    assert partitions and {tracks(trace)[e["tid"]] for e in partitions} == {"npu:0"}
    assert all(e["cat"] == "compute" and "bytes" not in e["args"] for e in partitions)
    assert [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"] == [
        "umahub"
    ]
    assert trace["otherData"]["inferences"] == 3
    assert trace["otherData"]["executor"] == "concurrent"


def test_sync_copies_are_on_their_device_s_track(hub):
    compiled = hub.compile(two_branches(heavy=False), placement=pins("dsp_cpu:0", "dsp_cpu:1"))
    measured = compiled.profile(*example_inputs(compiled.input_info), runs=2)
    trace = chrome_trace(measured, name="branches")
    assert list(tracks(trace).values()) == ["host", "dsp_cpu:0", "dsp_cpu:1"]  # no DMA lane
    check_against(trace, measured)
    copies = [e for e in steps(trace) if e["cat"] == "copy"]
    # each way (the label's last word: src->dst) on the track of its accelerator end
    assert {
        (tracks(trace)[e["tid"]], e["name"].split()[-1], e["args"]["bytes"]) for e in copies
    } == {
        ("dsp_cpu:0", "host->dsp_cpu:0", 4 * 16 * 4),
        ("dsp_cpu:1", "host->dsp_cpu:1", 4 * 16 * 4),
        ("dsp_cpu:0", "dsp_cpu:0->host", 4 * 16 * 4),
        ("dsp_cpu:1", "dsp_cpu:1->host", 4 * 16 * 4),
    }
    assert len(copies) == 2 * 4
    assert {e["args"]["kind"] for e in copies} == {"sync"}
    assert trace["traceEvents"][0]["args"] == {"name": "umahub branches"}


def test_a_device_of_its_own_runs_its_partitions_on_its_track():
    @tvm.script.ir_module
    class Model:
        @R.function
        def main(x: R.Tensor((4, 8), "float32")) -> R.Tensor((4, 8), "float32"):
            with R.dataflow():
                a = R.add(x, R.const(np.ones((4, 8), "float32")))
                b = R.nn.relu(a)
                c = R.multiply(b, b)
                R.output(c)
            return c

    devices.register_runtime(toy_device.ToyRuntime())
    hub = umahub.Hub(config={}, autoload=False, plugins=[toy_device.plugin])
    compiled = hub.compile(Model)
    measured = compiled.profile(*example_inputs(compiled.input_info), runs=2)
    trace = chrome_trace(measured)
    named = tracks(trace)
    assert list(named.values()) == ["host", "toy:0", "toy:0 DMA", "toy:1", "toy:1 DMA"]
    check_against(trace, measured)
    on = {e["name"]: named[e["tid"]] for e in steps(trace)}
    assert (on["toy_0_add"], on["toy_1_multiply"]) == ("toy:0", "toy:1")
    assert on["copy x host->toy:0"] == "toy:0 DMA"


def test_data_without_every_run_is_one_inference_from_zero():
    """A report's ``measured`` written before every run was kept: its median run alone."""
    measured = {
        "executor": "concurrent",
        "lanes": {"host": [0], "npu:0": [1], "dsp:0": [1], "npu:0 DMA": [0]},
        "spans": [
            {"lane": "host", "start": 0.0, "end": 0.25, "label": "host: a", "kind": "compute"},
            {"lane": "npu:0 DMA", "start": 0.25, "end": 0.5, "label": "copy a host->npu:0",
             "kind": "async"},
            {"lane": "npu:0", "start": 0.5, "end": 1.0, "label": "npu_0_b", "kind": "compute"},
        ],
    }  # fmt: skip
    trace = chrome_trace(measured)
    assert list(tracks(trace).values()) == ["host", "npu:0", "npu:0 DMA", "dsp:0"]
    assert [(e["name"], e["ts"], e["dur"], e["args"]["inference"]) for e in steps(trace)] == [
        ("host: a", 0.0, 250000.0, 1),
        ("npu_0_b", 500000.0, 500000.0, 1),
        ("copy a host->npu:0", 250000.0, 250000.0, 1),
    ]
    assert steps(trace)[2]["args"]["bytes"] == 0  # not measured then


def test_lanes_are_ordered_each_device_then_its_dma_lane():
    assert ordered(["host", "npu:0", "dsp:0", "npu:0 DMA", "dsp:0"]) == [
        "host", "npu:0", "npu:0 DMA", "dsp:0",
    ]  # fmt: skip
    assert ordered(["b DMA", "a", "b"], devices=["host", "b", "a"]) == ["b", "b DMA", "a"]


def test_nothing_to_trace_and_an_unwritable_path_are_one_line_errors(npu_model, tmp_path):
    with pytest.raises(UmahubError) as info:
        chrome_trace({"executor": "vm", "why": "one device only", "spans": []})
    assert str(info.value) == (
        "nothing to trace: the model runs on TVM's VM alone (one device only), which times no "
        "steps; a trace shows the concurrent executor's steps, on a model placed on more than "
        "one device"
    )
    with pytest.raises(UmahubError) as info:
        chrome_trace({})
    assert str(info.value) == (
        "nothing to trace: no measured run; profile the model first (Compiled.profile, "
        "LoadedModel.profile, or profile = true in [tool.umahub])"
    )
    measured = npu_model.report.measured or npu_model.profile(
        *example_inputs(npu_model.input_info), runs=1
    )
    missing = tmp_path / "no" / "such" / "dir" / "t.json"
    with pytest.raises(UmahubError) as info:
        save_trace(measured, missing)
    assert str(info.value) == (
        f"cannot write the trace to {missing}: No such file or directory; give a file in a "
        "directory that exists and that you can write to"
    )


def test_bench_refuses_a_trace_it_cannot_give_before_running():
    ran = []
    board = SimpleNamespace(board_seconds=lambda: 0.0, run=lambda *a: ran.append(a))
    with pytest.raises(UmahubError, match=r"^a trace is for a run here: a board runs the model"):
        bench(board, [], repeat=1, trace="t.json")
    vm_only = SimpleNamespace(
        step_graph=SimpleNamespace(unsupported="one device only"), run=lambda *a: ran.append(a)
    )
    with pytest.raises(UmahubError, match=r"^nothing to trace: the model runs on TVM's VM alone"):
        bench(vm_only, [], repeat=1, trace="t.json")
    assert ran == []


@pytest.fixture(scope="module")
def libraries(hub, tmp_path_factory):
    """The npu model exported, and one that runs on the host alone."""
    where = tmp_path_factory.mktemp("trace")
    two = hub.compile(two_branches(heavy=True), placement=pins("npu", "host"))
    one = hub.compile(two_branches(heavy=False), placement=pins("host", "host"))
    return two.export_library(where / "two.so"), one.export_library(where / "one.so")


def test_bench_trace_writes_the_file(libraries, tmp_path, capsys):
    two, _ = libraries
    out = tmp_path / "bench.json"
    assert main(["bench", str(two), "--repeat", "2", "--trace", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[-1] == f"wrote {out} (open it in https://ui.perfetto.dev)"
    trace = json.loads(out.read_text())
    assert list(tracks(trace).values()) == ["host", "npu:0", "npu:0 DMA"]
    assert trace["traceEvents"][0]["args"] == {"name": "umahub two.so"}
    assert trace["otherData"]["inferences"] == 5  # bench profiles five runs
    copies = [e for e in steps(trace) if e["name"] == "copy x host->npu:0"]
    assert len(copies) == 5 and {e["args"]["bytes"] for e in copies} == {32 * 32 * 4}


def test_bench_trace_errors_are_one_line(libraries, tmp_path, capsys):
    two, one = libraries
    missing = tmp_path / "nowhere" / "t.json"
    assert main(["bench", str(two), "--trace", str(missing)]) == 2
    assert capsys.readouterr().err == (
        f"umahub: error: --trace {missing}: the directory {missing.parent} does not exist; "
        "create it first\n"
    )
    assert main(["bench", str(one), "--repeat", "1", "--trace", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("umahub: error: nothing to trace: the model runs on TVM's VM alone")
    assert err.count("\n") == 1
    assert not (tmp_path / "t.json").exists()
