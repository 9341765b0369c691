"""``umahub tune`` on accelerators' partitions: the plugin's search space, measured against its
hook's schedule, and the compile that uses the verdict.

The npu offers its matmul/conv2d schedule with the tile sizes drawn; the zoo's
cnn has one npu convolution that it tunes, and one matrix-vector product it
offers no space for. Spaces that cannot be used (a plugin's garbage, a device
of its own) are one line each, and the partition keeps its hooks' schedule.
"""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
from tvm import relax
from tvm.script import relax as R

import umahub
import umahub.models as zoo
import umahub.plugin as up
from umahub.tuning import partitions, tasks
from umahub.tuning.database import FILE

TRIALS = 6
CONV = "npu_0_conv2d_add_relu on npu:0"
GEMV = "npu_1_matmul_add on npu:0"


def _hub(plugins, **config):
    return umahub.Hub(config={"plugins": plugins, **config}, project_config=False)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """The cnn tuned with the npu, its database, and the plain compile's outputs."""
    path = tmp_path_factory.mktemp("tuning") / "db"
    result = _hub(["npu"]).tune(zoo.get("cnn"), database=str(path), trials=TRIALS)
    inputs = zoo.inputs("cnn")
    plain = _hub(["npu"]).compile(zoo.get("cnn")).run(*inputs)
    return {"path": path, "result": result, "inputs": inputs, "plain": np.asarray(plain)}


def _kernels(path):
    (entry,) = json.loads((path / FILE).read_text())["entries"]
    return entry["kernels"]


def test_the_npu_convolution_is_tuned_in_its_space_and_the_rest_said(tuned):
    result = tuned["result"]
    names = [v.name for v in result.verdicts]
    assert names[0] == CONV  # the partitions first, then the host's kernels
    assert "fused_conv2d_add_relu" in names  # the host's convolution (3 input channels)
    conv = result.verdicts[0]
    assert conv.hook == "npu's schedule"
    assert conv.hook_seconds and conv.hook_seconds > 0
    assert 1 <= conv.trials <= TRIALS
    assert (conv.script is not None) == (conv.tuned_seconds is not None)
    assert conv.trace is None  # a partition's schedule is kept as TVMScript
    if conv.tuned_seconds is not None:  # the npu's tile sizes, as drawn: channels, positions...
        drew = "it drew" if conv.used == "tuned" else "the best candidate drew"
        assert re.search(rf"; {drew} \d+(, \d+)*$", conv.why), conv.why
    assert result.lines()[len(names)] == (
        f"{GEMV}: not tuned (npu offers no search space for it; its hooks' schedule is kept)"
    )
    kept = _kernels(tuned["path"])
    (key,) = [k for k in kept if k.startswith("npu:")]
    assert kept[key]["name"] == CONV
    assert kept[key]["used"] == conv.used


def _edited_copy(tuned, tmp_path, **changes):
    """A copy of the tuned database with the npu convolution's verdict changed: its path,
    and the verdict as it was."""
    path = tmp_path / "db"
    shutil.copytree(tuned["path"], path)
    kernels = json.loads((path / FILE).read_text())
    (entry,) = kernels["entries"]
    (key,) = [k for k in entry["kernels"] if k.startswith("npu:")]
    before = dict(entry["kernels"][key])
    entry["kernels"][key].update(changes)
    (path / FILE).write_text(json.dumps(kernels))
    return path, before


def test_compile_uses_the_partitions_verdict_and_computes_the_same(tuned, tmp_path):
    path, before = _edited_copy(tuned, tmp_path, used="tuned", why="made tuned by the test")
    assert before["script"] is not None  # the best candidate, kept whatever the verdict
    compiled = _hub(["npu"], tuning_database=str(path)).compile(zoo.get("cnn"))
    report = compiled.report
    assert {"name": CONV, "used": "tuned", "why": "made tuned by the test"} in report.tuned_kernels
    (conv,) = [p for p in report.partitions if p.symbol == "npu_0_conv2d_add_relu"]
    assert conv.schedule == ["tuning-database: made tuned by the test"]
    assert f"  {CONV}: tuned (made tuned by the test)" in str(report)
    np.testing.assert_allclose(
        np.asarray(compiled.run(*tuned["inputs"])), tuned["plain"], rtol=1e-5, atol=1e-5
    )


def test_a_tuned_partition_that_no_longer_fits_is_a_warning_and_its_hooks_schedule(tuned, tmp_path):
    path, _ = _edited_copy(
        tuned,
        tmp_path,
        used="tuned",
        why="x",
        script=(  # a kernel of other parameters than the partition's
            "# from tvm.script import ir as I\n# from tvm.script import tirx as T\n"
            "@I.ir_module\nclass Module:\n    @T.prim_func\n"
            '    def main(a: T.Buffer((2,), "float32")):\n        T.evaluate(0)\n'
        ),
    )
    with pytest.warns(umahub.UmahubWarning) as warned:
        compiled = _hub(["npu"], tuning_database=str(path)).compile(zoo.get("cnn"))
    assert (
        f"umahub: [tool.umahub] tuning-database '{path}': the tuned schedule of '{CONV}' does "
        "not replay; run `umahub tune MODEL` again"
    ) in [str(w.message) for w in warned]
    assert {
        "name": CONV,
        "used": "hook",
        "why": "the tuned schedule does not replay (ValueError)",
    } in compiled.report.tuned_kernels
    (conv,) = [p for p in compiled.report.partitions if p.symbol == "npu_0_conv2d_add_relu"]
    assert conv.schedule[0].startswith("conv2d: tiles fit npu.sram")
    np.testing.assert_allclose(
        np.asarray(compiled.run(*tuned["inputs"])), tuned["plain"], rtol=1e-5, atol=1e-5
    )


def test_a_warning_on_a_partitions_worker_thread_points_at_the_users_call(tmp_path):
    hub = _hub(["npu"], tuning_database=str(tmp_path / "nowhere"))
    with pytest.warns(umahub.UmahubWarning) as warned:
        hub.compile(zoo.get("cnn"))  # the line the warning names
    (warning,) = warned
    assert "does not exist" in str(warning.message)
    lines = open(__file__).read().splitlines()
    assert (warning.filename, warning.lineno) == (
        __file__,
        1
        + next(i for i, line in enumerate(lines) if line.endswith("# the line the warning names")),
    )


# --------------------------------------------------------------------------- other spaces


class _Relus:
    """An LLVM accelerator that takes ReLUs, with a search space of its own."""

    UMAHUB_API = 1

    def __init__(self, space):
        self.space = space

    @up.hookimpl
    def umahub_accelerators(self):
        return [up.Accelerator("relus", codegen="llvm")]

    @up.hookimpl(accelerator="relus")
    def umahub_patterns(self):
        return [("relus.relu", up.op("relax.nn.relu"))]

    @up.hookimpl(accelerator="relus")
    def umahub_tuning_space(self, function):
        return self.space


def _relu_model():
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((1, 16, 64, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(x))
        bb.emit_func_output(out)
    return bb.get()


def test_metaschedules_rules_as_a_plugins_space_are_drawn_and_built(tmp_path):
    hub = umahub.Hub(autoload=False, plugins=[_Relus(up.TuningSpace(rules="llvm"))])
    (task,), skipped = tasks.extract(hub, _relu_model())
    assert skipped == []
    assert task.name == "relus_0_relu on relus:0"
    assert task.hook == "relus's schedule"
    drawn, failure = partitions.candidates(task.partition, task.space, 3, 0)
    assert failure == ""
    assert drawn
    scheduled = [task.hooked, *((task.partition.named(s.mod["main"]), []) for s in drawn)]
    built, funcs = partitions.build(task.partition, scheduled, str(tmp_path))
    assert [error for _, error in built] == [""] * len(scheduled)
    assert all(f is not None for f in funcs)


def _never(schedule):
    raise ValueError("never")


@pytest.mark.parametrize(
    ("space", "why"),
    [
        (
            _never,
            "plugin '_Relus' failed in umahub_tuning_space: PluginOutputError: "
            "umahub_tuning_space returned the function _never: expected None or an "
            "umahub.plugin.TuningSpace (a design space is given as "
            "TuningSpace(schedule=function)); its hooks' schedule is kept",
        ),
        (None, "_Relus offers no search space for it; its hooks' schedule is kept"),
    ],
)
def test_a_space_that_cannot_be_used_leaves_the_partition_to_its_hooks(space, why):
    hub = umahub.Hub(autoload=False, plugins=[_Relus(space)])
    found, skipped = tasks.extract(hub, _relu_model())
    assert found == []
    assert [(s.name, s.why) for s in skipped] == [("relus_0_relu on relus:0", why)]


def test_a_space_whose_every_draw_fails_is_the_plugins_failure_said(tmp_path):
    hub = umahub.Hub(autoload=False, plugins=[_Relus(up.TuningSpace(schedule=_never))])
    why = (
        "plugin '_Relus' failed in its tuning space (umahub_tuning_space): ValueError: never "
        "(each of 12 draws); its hooks' schedule is kept"
    )
    with pytest.warns(umahub.UmahubWarning) as warned:
        result = hub.tune(_relu_model(), database=str(tmp_path / "db"), trials=3)
    (verdict,) = result.verdicts
    assert (verdict.name, verdict.used, verdict.why) == ("relus_0_relu on relus:0", "hook", why)
    assert f"umahub: relus_0_relu on relus:0: {why}" in [str(w.message) for w in warned]


class _RelusWithLanes(_Relus):
    @up.hookimpl
    def umahub_accelerators(self):
        return [up.Accelerator("relus", codegen="llvm", options=[up.Option("lanes", 8)])]


def test_a_database_tuned_with_other_backend_options_is_not_used(tmp_path):
    plugin = _RelusWithLanes(up.TuningSpace(rules="llvm"))
    path = tmp_path / "db"
    umahub.Hub(autoload=False, plugins=[plugin]).tune(_relu_model(), database=str(path), trials=2)
    hub = umahub.Hub(
        config={"tuning-database": str(path), "options": {"relus": {"lanes": 4}}},
        autoload=False,
        plugins=[plugin],
    )
    with pytest.warns(umahub.UmahubWarning) as warned:
        compiled = hub.compile(_relu_model())
    (message,) = [str(w.message) for w in warned]
    assert ", options relus.lanes=4 (it holds: target " in message
    assert compiled.report.tuned_kernels == []


class _FailingRelus(_Relus):
    @up.hookimpl(accelerator="relus")
    def umahub_codegen(self):
        raise RuntimeError("no code today")


def test_a_partition_that_went_back_to_the_host_is_tuned_as_the_hosts():
    hub = umahub.Hub(autoload=False, plugins=[_FailingRelus(up.TuningSpace(rules="llvm"))])
    with pytest.warns(umahub.UmahubWarning, match="no code today"):
        found, skipped = tasks.extract(hub, _relu_model())
    assert skipped == []
    assert [(t.name, t.partition) for t in found] == [("relu", None)]


def test_a_device_of_its_own_is_not_tuned():
    found, skipped = tasks.extract(_hub(["simnpu"]), zoo.get("cnn_int8"))
    assert all(t.partition is None for t in found)
    assert {s.why for s in skipped} == {
        "simnpu has a device of its own (simnpu); its kernels are not tuned: the runners "
        "measure in a process the device's runtime is not loaded in"
    }
    assert len(skipped) == 3


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            {},
            "TuningSpace takes exactly one of schedule= (a design space) and rules= "
            "(MetaSchedule's schedule rules)",
        ),
        (
            {"schedule": _never, "rules": "llvm"},
            "TuningSpace takes exactly one of schedule= "
            "(a design space) and rules= (MetaSchedule's schedule rules)",
        ),
        (
            {"rules": "cuda"},
            "TuningSpace(rules='cuda'): MetaSchedule's rule sets here are "
            "'llvm'; or give a list of ScheduleRule",
        ),
        ({"schedule": 3}, "TuningSpace(schedule=...) takes a function of a schedule, not int"),
    ],
)
def test_a_wrong_space_names_what_is_wrong(given, message):
    with pytest.raises(ValueError) as raised:
        up.TuningSpace(**given)
    assert str(raised.value) == message
