"""The concurrent executor: the same numbers as the VM, errors that name the culprit, threads.

Speed is measured in ``benchmarks/concurrency.py``, never asserted here.
"""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
import tvm
from tvm import relax

import umahub
import umahub.models as zoo
from umahub._tvm import TensorType
from umahub.errors import ConfigError, UmahubError
from umahub.runtime.choosing import AUTO_TRIALS, choose
from umahub.runtime.executor import ExecutionError, plan_cores
from umahub.runtime.spares import only_reference
from umahub.runtime.threadpool import vm_threads

BUNDLED = {"plugins": ["npu", "vanilla", "dsp"]}


def branches(shape=(4, 16), heavy=False, seed=0):
    """x -> two branches (a0, a1) and (b0, b1) -> out = a1 + b1.

    ``heavy``: the branches are matmuls (npu or host); else elementwise (DSP).
    """
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            ends = []
            for br in "ab":
                h = x
                for i in range(2):
                    size = shape[-1:] * 2 if heavy else shape
                    c = relax.const(rng.standard_normal(size).astype("float32"))
                    op = relax.op.matmul if heavy else (relax.op.add, relax.op.multiply)[i]
                    h = bb.emit(op(h, c), name_hint=f"{br}{i}")
                ends.append(h)
            out = bb.emit_output(relax.op.add(*ends), name_hint="out")
        bb.emit_func_output(out)
    return bb.get()


def pins(a: str, b: str, out: str = "host") -> dict[str, str]:
    """Branch a on ``a``, branch b on ``b`` (node names: a glob like "a*" would match ops)."""
    return {"a0": a, "a1": a, "b0": b, "b1": b, "out": out}


@pytest.fixture(scope="module")
def hub():
    return umahub.Hub(config=BUNDLED, project_config=False)


@pytest.fixture(scope="module")
def dsp_model(hub):
    """Two elementwise branches, one on each DSP core, joined on the host."""
    return hub.compile(branches(), placement=pins("dsp_cpu:0", "dsp_cpu:1"))


@pytest.fixture(scope="module")
def npu_model(hub):
    """A matmul branch on the npu (async copies), one on the host, joined on the host."""
    mod = branches((32, 32), heavy=True)
    return hub.compile(mod, placement=pins("npu", "host"))


def inputs(compiled, seed=0):
    return umahub.runtime.compiled.example_inputs(compiled.input_info, seed)


def same(a, b):
    """Bit-identical outputs (a list for several)."""
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)


# ------------------------------------------------------------------ the graph


def test_dsp_branches_are_steps_on_two_cores(dsp_model):
    graph = dsp_model.step_graph
    assert graph.unsupported == ""
    calls = {s.label: s.device for s in graph.steps if s.kind == "call" and s.partition}
    assert sorted(calls.values()) == ["dsp_cpu:0", "dsp_cpu:1"]
    copies = [s for s in graph.steps if s.kind == "copy"]
    assert {(s.src, s.dst, s.mode) for s in copies} == {
        ("host", "dsp_cpu:0", "sync"),
        ("host", "dsp_cpu:1", "sync"),
        ("dsp_cpu:0", "host", "sync"),
        ("dsp_cpu:1", "host", "sync"),
    }
    assert all(s.device != "host" for s in copies)  # a sync copy runs on its DSP core's worker
    assert graph.lanes == ["host", "dsp_cpu:0", "dsp_cpu:1"]


def test_npu_copies_get_a_dma_lane(npu_model):
    graph = npu_model.step_graph
    copies = [s for s in graph.steps if s.kind == "copy"]
    assert {(s.src, s.dst, s.mode) for s in copies} == {
        ("host", "npu:0", "async"),
        ("npu:0", "host", "async"),
    }
    assert graph.lanes == ["host", "npu:0", "npu:0 DMA"]
    host_steps = [s.label for s in graph.steps if s.kind == "call" and not s.partition]
    # the host branch's first matmul is a step that does not wait for the npu; its
    # second is fused with the join's add, in main as in the steps (the fused
    # kernel's binding is main's output, gv)
    assert host_steps == ["host: b0", "host: gv"]


def test_cores_accelerators_pinned_one_each_when_there_are_enough():
    lanes = ["host", "dsp_cpu:0", "dsp_cpu:1", "npu:0 DMA"]
    assert plan_cores(lanes, "host", [0, 1]) == {
        "host": {0, 1},
        "dsp_cpu:0": {1},
        "dsp_cpu:1": {0},
        "npu:0 DMA": {0, 1},
    }
    three = ["host", "dsp_cpu:0", "dsp_cpu:1", "npu:0"]
    assert plan_cores(three, "host", [0, 1]) == {lane: {0, 1} for lane in three}


# ------------------------------------------------------------------ the same numbers


@pytest.mark.parametrize("which", ["dsp_model", "npu_model"])
def test_concurrent_equals_the_vm(which, request):
    compiled = request.getfixturevalue(which)
    for seed in range(3):
        xs = inputs(compiled, seed)
        assert same(compiled.run(*xs, executor="concurrent"), compiled.run(*xs, executor="vm"))


def test_auto_times_both_then_keeps_the_faster_and_vm_for_one_device(hub):
    compiled = hub.compile(branches(), placement=pins("dsp_cpu:0", "dsp_cpu:1"))
    assert (compiled.executor, compiled.executor_in_use) == ("auto", "auto")
    xs = inputs(compiled)
    want = compiled.run(*xs, executor="vm")
    auto = compiled._executors.auto
    counts, reason = vm_threads()  # TVM_NUM_THREADS set: the VM alone; else its threads and one
    assert list(auto.ways) == (["vm", "vm1"] if len(counts) == 2 else ["vm"]) + ["concurrent"]
    for _ in range(auto.trial_calls):
        assert same(compiled.run(*xs), want)
    timed = auto._trials
    assert [len(t) for t in timed.values()] == [AUTO_TRIALS] * len(auto.ways)
    chosen, why = choose(timed, auto.ways)
    assert compiled._executors.auto.chosen == chosen
    assert compiled.executor_in_use == ("vm" if chosen.startswith("vm") else "concurrent")
    threads = dict(zip(["vm", "vm1"], counts))
    runs = compiled.executor_in_use
    if chosen in threads:
        runs += f" on {'one thread' if threads[chosen] == 1 else f'{threads[chosen]} threads'}"
    said = f" ({reason})" if reason else ""
    assert compiled.executor_why() == (
        f"{runs}, chosen by auto: timed on the first calls, in blocks of 3: {why}{said}"
    )
    assert compiled.executor_why("vm") == "vm: asked for (executor = 'vm')"
    alone = hub.compile(branches(), placement={"*": "host"})
    assert alone.devices == ["host"]
    alone.warm_up(*inputs(alone))
    assert alone.executor_in_use == "vm"
    cannot = "the concurrent executor cannot run it (one device only)"
    if len(counts) < 2:  # one way: the VM as it is, or on its one thread
        runs = "vm on one thread" if counts else "vm"
        assert alone.executor_why() == f"{runs}: {reason}; {cannot}"
    else:  # timed like the first (a model of microsecond kernels may keep one thread)
        chosen, why = choose(alone._executors.auto._trials, alone._executors.auto.ways)
        runs = f"vm on {'one thread' if chosen == 'vm1' else f'{counts[0]} threads'}"
        assert alone.executor_why() == (
            f"{runs}, chosen by auto: timed on the first calls, in blocks of 3: {why} ({cannot})"
        )
    with pytest.raises(UmahubError) as info:
        alone.run(*inputs(alone), executor="concurrent")
    assert str(info.value) == (
        'the concurrent executor cannot run this model: one device only; use executor="vm"'
    )


def test_warm_up_runs_until_auto_has_chosen_and_once_otherwise(hub):
    compiled = hub.compile(branches(), placement=pins("dsp_cpu:0", "dsp_cpu:1"))
    xs = inputs(compiled)
    assert compiled.warm_up(*xs, executor="vm") == 1  # a chosen executor: the first run
    assert compiled.executor_in_use == "auto"
    assert compiled.warm_up(*xs) == compiled._executors.auto.trial_calls  # every trial
    assert compiled.executor_in_use in ("vm", "concurrent")
    assert compiled.warm_up(*xs, at_least=3) == 3
    assert compiled.warm_up(*xs, at_least=0) == 0
    alone = hub.compile(branches(), placement={"*": "host"})
    # one device: the VM from the start, or after timing its thread counts
    assert alone.warm_up(*inputs(alone)) == max(1, alone._executors.auto.trial_calls)


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_zoo_models_identical_under_both_executors(hub, name):
    compiled = hub.compile(zoo.get(name))
    assert len(compiled.devices) > 1 and compiled.step_graph.unsupported == ""
    xs = zoo.inputs(name)
    assert same(compiled.run(*xs, executor="concurrent"), compiled.run(*xs, executor="vm"))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenetv2", "bert", "bert2"])
def test_full_size_zoo_models_identical_under_both_executors(name):
    hub = umahub.Hub(
        config={**BUNDLED, "priority": ["npu", "vanilla_accel", "dsp_cpu"]}, project_config=False
    )
    compiled = hub.compile(zoo.get(name))
    assert compiled.step_graph.unsupported == ""
    xs = zoo.inputs(name)
    assert same(compiled.run(*xs, executor="concurrent"), compiled.run(*xs, executor="vm"))


def _random_graphs(examples: int) -> int:
    from hypothesis import given
    from hypothesis import strategies as st

    from umahub.testing._cross import cross_config, cross_vocabulary, likely_pins
    from umahub.testing._graphs import (
        build,
        graph_inputs,
        graphs,
        kit_settings,
        pin_choices,
        placements,
    )

    accelerators = ("npu", "vanilla_accel", "dsp_cpu")
    instances = {"npu": 1, "vanilla_accel": 1, "dsp_cpu": 2}
    hub = umahub.Hub(
        config=cross_config(("npu", "vanilla", "dsp"), accelerators), project_config=False
    )
    ops, mentioned = cross_vocabulary(hub, accelerators)
    likely = likely_pins(mentioned, instances)
    choices = pin_choices(instances.items())
    multi = []

    @kit_settings(examples)
    @given(st.data())
    def run(data):
        spec = data.draw(graphs(ops, dag=True, max_steps=7), label="graph")
        pins = data.draw(placements(spec, choices, likely), label="pins")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", umahub.UmahubWarning)  # pins not taken
                compiled = hub.compile(build(spec), placement=pins)
        except umahub.errors.PlacementError:  # two instances pinned inside one match
            return
        xs = graph_inputs(spec)
        vm = compiled.run(*xs, executor="vm")
        several = len(compiled.devices) > 1
        if several:
            assert compiled.step_graph.unsupported == ""
            multi.append(spec)
        got = compiled.run(*xs, executor="concurrent" if several else "auto")
        assert same(got, vm), f"{spec!r} pins={pins!r}"

    run()
    return len(multi)


def test_random_graphs_with_random_pins_identical():
    assert _random_graphs(10) > 0


def test_a_host_multiply_and_add_fused_in_main_are_one_step_too():
    """Found by the random search below (``-m slow``): a multiply on the host whose
    only reader is an add on the host, with a DSP step between them. Main fuses
    them (LLVM contracts them into one multiply-add); steps cut before the host's
    fusion ran them apart, rounded once more (1.2e-7 off)."""
    from umahub.testing._cross import cross_config
    from umahub.testing._graphs import GraphSpec, Step, build, graph_inputs

    def step(op, other=None, src=None, const=None):
        return Step(op=op, other=other, features=0, kernel=1, bias=False, src=src, const=const)

    spec = GraphSpec(
        shape=(1, 16, 4, 4),
        steps=(
            step("relax.nn.gelu"),
            step("relax.add", other=1),
            step("relax.multiply", other=1, src=0),
            step("relax.multiply", other=2, src=0),
            step("relax.add", other=3),
            step("relax.tanh"),
            step("relax.add", const=1),
        ),
        seed=2,
    )
    pins = {"n0": "host", "n1": "dsp_cpu:0", "n2": "host", "n3": "dsp_cpu:0", "n4": "host"}
    config = cross_config(("npu", "vanilla", "dsp"), ("npu", "vanilla_accel", "dsp_cpu"))
    compiled = umahub.Hub(config=config, project_config=False).compile(build(spec), placement=pins)
    xs = graph_inputs(spec)
    assert same(compiled.run(*xs, executor="concurrent"), compiled.run(*xs, executor="vm"))


def test_a_value_returned_twice_is_two_outputs(hub):
    """Found by a language model's decode step (TVM's RemoveRedundantReshape merges
    the two layers' identical position counters): ``main`` returns ``(y, x, y)``
    bound in its dataflow block, a tuple step that read ``y`` once and built
    itself from what it read: two outputs, where the VM gives three."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((8, 16), "float32"))
    w = relax.const(np.eye(16, dtype="float32") * 2)
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, w), name_hint="y")
            out = bb.emit_output(relax.Tuple([y, x, y]))
        bb.emit_func_output(out)
    compiled = hub.compile(bb.get(), placement={"y": "npu"})
    xs = np.arange(128, dtype="float32").reshape(8, 16)
    got = compiled.run(xs, executor="concurrent")
    assert [g.tolist() for g in got] == [(xs * 2).tolist(), xs.tolist(), (xs * 2).tolist()]
    assert same(got, compiled.run(xs, executor="vm"))


@pytest.mark.slow
def test_random_graphs_with_random_pins_identical_many():
    assert _random_graphs(200) > 100


# ------------------------------------------------------------------ exported libraries


def test_a_loaded_library_runs_concurrently_without_the_plugins(npu_model, tmp_path):
    path = npu_model.export_library(tmp_path / "model.so")
    loaded = umahub.load(path)
    assert loaded.step_graph == npu_model.step_graph
    assert loaded.executor_in_use == "auto"  # it has a step graph: auto will time both
    xs = inputs(npu_model, 5)
    assert same(loaded.run(*xs), npu_model.run(*xs, executor="vm"))


# ------------------------------------------------------------------ streams and threads


def test_a_stream_gives_each_result_in_order(npu_model):
    batches = [inputs(npu_model, seed) for seed in range(12)]
    want = [npu_model.run(*xs, executor="vm") for xs in batches]
    got = list(npu_model.stream(batches, depth=4))
    assert len(got) == len(want) and all(same(g, w) for g, w in zip(got, want))
    # a model of one input takes arrays as they are, too
    one = list(npu_model.stream((xs[0] for xs in batches[:3]), executor="vm"))
    assert all(same(g, w) for g, w in zip(one, want[:3]))


def test_a_stream_checks_each_input(npu_model):
    with pytest.raises(UmahubError) as info:
        list(npu_model.stream([np.zeros((2, 2), "float32")]))
    assert str(info.value) == "input 0: expected shape (32, 32) float32, got (2, 2) float32"


def test_many_calls_from_several_threads(dsp_model, npu_model):
    cases = {
        m: [(xs, m.run(*xs, executor="vm")) for xs in (inputs(m, s) for s in range(6))]
        for m in (dsp_model, npu_model)
    }
    wrong: list = []
    errors: list = []
    start = threading.Barrier(6)

    def work(t: int) -> None:
        start.wait()
        try:
            for i in range(20):
                model = (dsp_model, npu_model)[(t + i) % 2]
                xs, want = cases[model][(t * 5 + i) % 6]
                if not same(model.run(*xs, executor="concurrent"), want):
                    wrong.append((t, i))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == [] and wrong == []


# ------------------------------------------------------------------ copies' destinations


def test_only_reference_sees_every_other_holder():
    tensor = tvm.runtime.empty((4, 4), "float32", tvm.cpu())
    assert only_reference(tensor)
    view = np.from_dlpack(tensor)  # numpy over the same memory holds the tensor
    assert not only_reference(tensor)
    del view
    assert only_reference(tensor)
    held = tvm.runtime.convert([tensor])  # so does a TVM container
    assert not only_reference(tensor)
    del held
    assert not only_reference(object())


def _address(tensor) -> int:
    """Where a TVM tensor's data is (0.25's tensors have no ``data_ptr``)."""
    return np.from_dlpack(tensor).__array_interface__["data"][0]


def test_a_copy_writes_into_the_destination_of_an_earlier_inference(hub):
    """A copy's destination, once its inference no longer needs it, is the next copy's:
    no new buffer (page-faulted in as the copy writes it) at every inference."""
    compiled = hub.compile(branches(), placement=pins("dsp_cpu:0", "dsp_cpu:1"))
    ex = compiled._executors.concurrent()
    copies = [i for i, s in enumerate(ex.graph.steps) if s.kind == "copy"]
    xs = inputs(compiled)
    want = compiled.run(*xs, executor="vm")
    assert same(compiled.run(*xs, executor="concurrent"), want)
    kept = {i: [_address(t) for t in ex.spares.kept.get(i, [])] for i in copies}
    assert all(len(pointers) == 1 for pointers in kept.values()), kept  # all four copies
    for seed in range(3):
        xs = inputs(compiled, seed)
        assert same(compiled.run(*xs, executor="concurrent"), compiled.run(*xs, executor="vm"))
        assert {i: [_address(t) for t in ex.spares.kept[i]] for i in copies} == kept


def test_a_copy_that_is_an_output_keeps_no_destination(hub):
    """A model output made by a copy (the last op on a DSP core, copied to the host) is
    the caller's: it is never written again by a later inference."""
    compiled = hub.compile(branches(), placement=pins("dsp_cpu:0", "dsp_cpu:1", "dsp_cpu:0"))
    ex = compiled._executors.concurrent()
    graph = ex.graph
    outputs = set(graph.output if isinstance(graph.output, list) else [graph.output])
    last = [i for i, s in enumerate(graph.steps) if s.kind == "copy" and s.outputs[0] in outputs]
    assert last, [s.label for s in graph.steps]
    args = [tvm.runtime.tensor(x) for x in inputs(compiled)]
    first = ex.run(args).numpy().copy()
    held = ex.run(args)
    for seed in range(1, 4):
        ex.run([tvm.runtime.tensor(x) for x in inputs(compiled, seed)])
    assert np.array_equal(held.numpy(), first)
    assert all(not ex.spares.kept.get(i) for i in last)


# ------------------------------------------------------------------ failures


def _failing(monkeypatch, function: str, fail):
    """Make the VM's ``function`` call ``fail`` instead (in every worker's VM)."""
    original = relax.VirtualMachine.__getitem__

    def getitem(vm, name):
        return fail if name == function else original(vm, name)

    monkeypatch.setattr(relax.VirtualMachine, "__getitem__", getitem)


def _step(compiled, partition):
    return next(s for s in compiled.step_graph.steps if s.partition == partition)


def test_a_failing_partition_names_itself_and_its_device(hub, monkeypatch):
    # a fresh model: its workers' VMs look the step functions up after the patch
    compiled = hub.compile(branches(), placement=pins("dsp_cpu:0", "dsp_cpu:1"))
    symbol = next(
        s.partition for s in compiled.step_graph.steps if s.partition and s.device == "dsp_cpu:1"
    )

    def fail(*args):
        raise tvm.error.InternalError("TCM parity error")

    _failing(monkeypatch, _step(compiled, symbol).function, fail)
    xs = inputs(compiled)
    with pytest.raises(ExecutionError) as info:
        compiled.run(*xs, executor="concurrent", timeout=60)
    assert str(info.value) == f"partition {symbol} on dsp_cpu:1 failed: TCM parity error"
    monkeypatch.undo()
    fresh = hub.compile(branches(), placement=pins("dsp_cpu:0", "dsp_cpu:1"))
    assert same(fresh.run(*xs), fresh.run(*xs, executor="vm"))  # later inferences are fine


def test_a_failing_copy_names_itself(npu_model, monkeypatch):
    # only the copy to the npu fails: the host branch reads the same input and
    # must not fail first (a broken input object made the two race)
    copy = next(s for s in npu_model.step_graph.steps if s.kind == "copy" and s.dst == "npu:0")
    xs = inputs(npu_model)
    ex = npu_model._executors.concurrent()
    original = ex.copy

    def failing(index, step, tensor):
        if step == copy:  # every device is tvm.cpu(0): the step, not the device, tells it
            raise RuntimeError("DMA descriptor ring full")
        return original(index, step, tensor)

    monkeypatch.setattr(ex, "copy", failing)
    with pytest.raises(ExecutionError) as info:
        ex.run([tvm.runtime.tensor(x) for x in xs], timeout=60)
    assert str(info.value) == (
        f"the async copy {copy.label.removeprefix('copy ')} (on npu:0) failed: "
        "DMA descriptor ring full"
    )
    monkeypatch.undo()
    assert same(npu_model.run(*xs), npu_model.run(*xs, executor="vm"))


def test_a_stuck_partition_times_out_with_a_message(hub, monkeypatch):
    compiled = hub.compile(branches((32, 32), heavy=True), placement=pins("npu", "host"))
    release = threading.Event()
    symbol = next(s.partition for s in compiled.step_graph.steps if s.partition)
    original = relax.VirtualMachine.__getitem__

    def getitem(vm, name):
        real = original(vm, name)
        if name != _step(compiled, symbol).function:
            return real

        def stuck(*args):
            release.wait(30)
            return real(*args)

        return stuck

    monkeypatch.setattr(relax.VirtualMachine, "__getitem__", getitem)
    try:
        with pytest.raises(ExecutionError) as info:
            compiled.run(*inputs(compiled), executor="concurrent", timeout=0.5)
    finally:
        release.set()
    message = str(info.value)
    assert message.startswith("the inference did not finish within 0.5 s: ")
    assert message.endswith(f"running: partition {symbol} on npu:0")


# ------------------------------------------------------------------ choosing, profiling


def test_the_executor_comes_from_the_config_and_the_api(dsp_model):
    hub = umahub.Hub(config={**BUNDLED, "executor": "vm"}, project_config=False)
    compiled = hub.compile(branches(), placement=pins("dsp_cpu:0", "host"))
    assert compiled.executor == "vm"
    assert hub.compile(branches(), executor="concurrent").executor == "concurrent"
    with pytest.raises(ConfigError) as info:
        umahub.Hub(config={"executor": "paralel"}, autoload=False, project_config=False)
    assert str(info.value) == (
        "config=: [tool.umahub] executor: expected one of 'auto', 'vm', 'concurrent', got 'paralel'"
    )
    with pytest.raises(UmahubError) as info:
        dsp_model.run(*inputs(dsp_model), executor="threads")
    assert str(info.value) == "unknown executor 'threads'; known: auto, vm, concurrent"


def test_profile_puts_the_measured_timeline_in_the_report_and_picture(hub, tmp_path):
    compiled = hub.compile(
        branches((32, 32), heavy=True), placement=pins("npu", "host"), profile=True
    )
    measured = compiled.report.to_dict()["measured"]
    assert measured["executor"] == "concurrent" and measured["runs"] == 5
    assert measured["vm_seconds"] > 0 and measured["concurrent_seconds"] > 0
    graph = compiled.step_graph
    want = sorted((compiled._executors.concurrent().lane_of(s), s.label) for s in graph.steps)
    assert sorted((s["lane"], s["label"]) for s in measured["spans"]) == want
    assert all(0 <= s["start"] <= s["end"] for s in measured["spans"])
    assert "measured: vm " in str(compiled.report)
    auto = measured["auto"]
    assert auto["executor"] in ("vm", "concurrent")
    assert (
        auto["why"].startswith("the concurrent executor ") and "(medians of 5 and 5)" in auto["why"]
    )
    assert f'executor "auto" keeps: {auto["executor"]}: {auto["why"]}' in str(compiled.report)
    from umahub.report.picture.timeline import measured as measured_items

    items = measured_items(compiled.report)
    assert [(i.lane, i.label) for i in items] == [
        (s["lane"], s["label"]) for s in measured["spans"]
    ]
    copy_in = next(i for i in items if i.label == "copy x host->npu:0")
    assert (copy_in.kind, copy_in.bytes) == ("async", 32 * 32 * 4)
    svg = compiled.report.save_picture(str(tmp_path / "model.svg"))
    text = open(svg).read()
    assert "Timeline estimate of one inference" in text
    assert "Measured: one inference on the concurrent executor" in text
    assert text.count('class="span compute" data-lane="npu:0"') >= 2  # estimate and measured


def test_sizes_known_only_at_run_time_run_on_the_vm(hub):
    n = tvm.tirx.Var("n", "int64") if hasattr(tvm, "tirx") else tvm.tir.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((n, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.relu(x), name_hint="a")
            out = bb.emit_output(relax.op.sigmoid(a), name_hint="out")
        bb.emit_func_output(out)
    mod = bb.get()
    mod["main"] = mod["main"].with_attr("tir_var_upper_bound", {"n": 64})  # fits the TCM
    compiled = hub.compile(mod, placement={"a": "dsp_cpu:0"})
    assert compiled.devices == ["host", "dsp_cpu:0"]
    assert compiled.step_graph.unsupported == "input x has a size known only at run time"
    x = np.random.default_rng(0).standard_normal((3, 16)).astype("float32")
    compiled.warm_up(x)  # "auto" may time the VM's thread counts first
    assert compiled.executor_in_use == "vm"
    np.testing.assert_allclose(compiled.run(x), 1 / (1 + np.exp(-np.maximum(x, 0))), rtol=1e-5)


def test_the_graph_survives_its_json_and_refuses_another_version():
    from umahub.runtime.steps import FORMAT, Step, StepGraph

    graph = StepGraph(
        ("host", "npu:0"),
        params=1,
        values=4,
        steps=(
            Step("call", "host", (), (1,), "umahub_step_0", "host: shape"),  # reads no value
            Step(
                "copy",
                "npu:0",
                (1,),
                (2,),
                label="copy a host->npu:0",
                mode="async",
                src="host",
                dst="npu:0",
                dst_index=1,
            ),
            Step("alias", "host", (0, 1), (3,), mode="tuple", fields=(1, 0, 1), label="t"),
        ),
        output=[2, [0, 1], 3],
        copy_kind={"npu:0": "async"},
    )
    assert StepGraph.from_json(graph.to_json()) == graph
    other = graph.to_json().replace(f'"umahub_steps":{FORMAT}', '"umahub_steps":99')
    assert StepGraph.from_json(other).unsupported == (
        "its step graph was written by another umahub version"
    )


def test_the_estimate_overlaps_a_host_branch_with_the_npu(hub):
    """An operator waits only for the copies it reads, not for its group's others."""
    from umahub.report.picture.timeline import timeline

    report = hub.explain(branches((32, 32), heavy=True), placement=pins("npu", "host"))
    spans = {s.label: s for s in timeline(report)}
    assert spans["b0"].start == 0.0 < spans["a1"].start  # side by side with the npu
    back = next(s for label, s in spans.items() if label.endswith("npu:0->host"))
    assert spans["out"].start == max(back.end, spans["b1"].end)
