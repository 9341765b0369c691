"""``umahub tune``: the zoo's mlp tuned here with a handful of trials, and what compile makes of it.

The tuned kernel is used only where it measured faster than the hook's
schedule; the report names each kernel, the schedule used and why. The
databases that cannot be used (a wrong path, another machine's) and the
farms that cannot be reached are one line each, never a traceback.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import umahub
import umahub.models as zoo
from umahub.cli import main
from umahub.tuning import TuningDatabase, TuningError
from umahub.tuning.database import FILE, decide

TRIALS = 4


def _hub(**config):
    return umahub.Hub(config=config or None, project_config=False, autoload=False)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """The mlp tuned into a database, and the plain compile's outputs."""
    path = tmp_path_factory.mktemp("tuning") / "db"
    result = _hub().tune(zoo.get("mlp"), database=str(path), trials=TRIALS)
    inputs = zoo.inputs("mlp")
    return {
        "path": path,
        "result": result,
        "inputs": inputs,
        "plain": _hub().compile(zoo.get("mlp")),
    }


def _entries(path):
    return json.loads((path / FILE).read_text())["entries"]


def test_every_host_kernel_is_tuned_within_the_budget(tuned):
    result = tuned["result"]
    assert [v.name for v in result.verdicts] == ["fused_matmul1_add1", "fused_matmul_add_relu"]
    assert result.trials <= TRIALS
    assert result.where == "this machine"
    for v in result.verdicts:
        assert v.hook_seconds and v.hook_seconds > 0
        assert (v.trace is not None) == (v.tuned_seconds is not None)
    (entry,) = _entries(tuned["path"])
    assert set(entry["key"]) == {"target", "tvm", "plugins"}
    assert len(entry["kernels"]) == 2


def test_compile_uses_the_database_as_its_verdicts_say(tuned):
    compiled = _hub(**{"tuning-database": str(tuned["path"])}).compile(zoo.get("mlp"))
    report = compiled.report
    verdicts = tuned["result"].verdicts
    assert report.tuned_kernels == [
        {"name": v.name, "used": v.used, "why": v.why} for v in verdicts
    ]
    assert report.host_schedules.get("tuned", 0) == sum(v.used == "tuned" for v in verdicts)
    text = str(report).splitlines()
    at = text.index("tuned kernels (tuning-database):")
    assert text[at + 1 : at + 3] == [f"  {v.name}: {v.used} ({v.why})" for v in verdicts]
    np.testing.assert_allclose(
        compiled.run(*tuned["inputs"]), tuned["plain"].run(*tuned["inputs"]), rtol=1e-4, atol=1e-5
    )


def test_a_tie_or_a_slower_tuned_kernel_keeps_the_hooks_schedule(tuned, tmp_path):
    """The measurements rewritten: the first kernel's tuned schedule measured 1% faster (a tie),
    the second's twice as fast; only the second is compiled tuned."""
    data = json.loads((tuned["path"] / FILE).read_text())
    kernels = data["entries"][0]["kernels"]
    first, second = sorted(kernels.values(), key=lambda k: k["name"])
    for kernel, tuned_ms in ((first, 0.99), (second, 0.5)):
        kernel["hook_seconds"], kernel["tuned_seconds"] = 1e-3, tuned_ms * 1e-3
        kernel["used"], kernel["why"] = decide(
            kernel["name"], kernel["hook"], 1e-3, tuned_ms * 1e-3, 4
        )
    assert second["trace"] is not None
    (tmp_path / FILE).write_text(json.dumps(data))
    compiled = _hub(**{"tuning-database": str(tmp_path)}).compile(zoo.get("mlp"))
    assert compiled.report.tuned_kernels == [
        {
            "name": "fused_matmul1_add1",
            "used": "hook",
            "why": "tuned 0.99 ms against columns 1 ms: a tie (within 2%) keeps columns",
        },
        {
            "name": "fused_matmul_add_relu",
            "used": "tuned",
            "why": "tuned 0.5 ms against matmul 1 ms (2.00x faster)",
        },
    ]
    assert compiled.report.host_schedules == {"columns": 1, "tuned": 1}
    np.testing.assert_allclose(
        compiled.run(*tuned["inputs"]), tuned["plain"].run(*tuned["inputs"]), rtol=1e-4, atol=1e-5
    )


def test_the_verdicts_words():
    assert decide("k", "matmul", 2e-3, 1e-3, 8) == (
        "tuned",
        "tuned 1 ms against matmul 2 ms (2.00x faster)",
    )
    assert decide("k", "matmul", 1e-3, 1.5e-3, 8) == (
        "hook",
        "tuned 1.5 ms against matmul 1 ms: matmul is faster",
    )
    assert decide("k", "matmul", 1e-3, 1e-3, 8) == (
        "hook",
        "tuned 1 ms against matmul 1 ms: a tie (within 2%) keeps matmul",
    )
    assert decide("k", "matmul", 1e-3, None, 8) == (
        "hook",
        "no tuned candidate built and ran in 8 trials",
    )


def test_a_wrong_database_path_is_a_warning_and_the_hooks_schedules(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.warns(umahub.UmahubWarning) as caught:
        compiled = _hub(**{"tuning-database": str(missing)}).compile(zoo.get("mlp"))
    assert str(caught[0].message) == (
        f"umahub: [tool.umahub] tuning-database '{missing}': tuning database '{missing}' does "
        f"not exist (no {FILE} in it); run `umahub tune MODEL --database PATH` to make it, or "
        "fix the path; the compile uses the hooks' schedules"
    )
    assert compiled.report.host_schedules == {"columns": 1, "matmul": 1}
    assert compiled.report.tuned_kernels == []


def test_a_database_of_another_target_is_not_used(tuned, tmp_path):
    data = json.loads((tuned["path"] / FILE).read_text())
    data["entries"][0]["key"]["tvm"] = "0.1.0"
    (tmp_path / FILE).write_text(json.dumps(data))
    with pytest.warns(umahub.UmahubWarning) as caught:
        compiled = _hub(**{"tuning-database": str(tmp_path)}).compile(zoo.get("mlp"))
    message = str(caught[0].message)
    assert message.startswith(
        f"umahub: [tool.umahub] tuning-database '{tmp_path}' has no kernels tuned for target "
    )
    assert "(it holds: target " in message and ", TVM 0.1.0, plugins none)" in message
    assert message.endswith(
        "run `umahub tune MODEL` for this machine, TVM and plugins; the compile uses the "
        "hooks' schedules"
    )
    assert compiled.report.host_schedules == {"columns": 1, "matmul": 1}


def test_tune_without_a_database_says_how_to_name_one():
    with pytest.raises(TuningError) as caught:
        _hub().tune(zoo.get("mlp"))
    assert str(caught.value) == (
        "no tuning database: give --database DIR, or set tuning-database in [tool.umahub]"
    )


def test_an_unreachable_tracker_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("UMAHUB_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.chdir(tmp_path)
    code = main(["tune", "mlp", "--database", "db", "--rpc", "127.0.0.1:9", "--key", "x"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("umahub: error: tracker 127.0.0.1:9 does not answer (")
    assert err.rstrip().endswith(
        "); start it with `python -m tvm.exec.rpc_tracker --host 0.0.0.0 --port PORT` or fix --rpc"
    )
    assert "Traceback" not in err
    code = main(["tune", "mlp", "--database", "db", "--rpc", "127.0.0.1:9"])
    assert code == 2
    assert capsys.readouterr().err == (
        "umahub: error: --rpc and --key go together: the tracker and the kind of board\n"
    )


def test_a_database_path_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(TuningError) as caught:
        TuningDatabase(tmp_path / "file", create=True)
    assert str(caught.value) == (
        f"tuning database '{tmp_path / 'file'}' is a file; give a directory (umahub tune makes it)"
    )


def test_no_warning_without_a_database():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = _hub().compile(zoo.get("mlp")).report
    assert report.tuned_kernels == []


def test_a_verdict_says_what_its_candidate_drew():
    from tvm import s_tir, te

    from umahub.tuning.search import SHOWN_DRAWS, draws

    a = te.placeholder((64, 64), name="a")
    b = te.compute((64, 64), lambda i, j: a[i, j] * 2.0, name="b")
    sch = s_tir.Schedule(te.create_prim_func([a, b]), seed=3)
    i, j = sch.get_loops(sch.get_sblock("b"))
    assert draws(sch.trace) == ""
    sch.sample_categorical([4, 8, 16], [0.0, 1.0, 0.0])
    sch.sample_perfect_tile(i, 2, decision=[32, 2])
    assert draws(sch.trace) == "8, 32x2"
    for _ in range(SHOWN_DRAWS):
        sch.sample_categorical([5], [1.0])
    assert draws(sch.trace) == "8, 32x2, 5, 5, 5, 5, 5, 5 and 2 more"


def test_local_measurements_run_on_the_pool_a_model_runs_on(monkeypatch):
    # the workers start TVM's pool as a model's is started: one thread per physical core
    # where no count is set (TVM alone: half the logical CPUs on x86)
    from umahub.runtime.threadpool import default_threads
    from umahub.tuning.runners import local

    monkeypatch.delenv("TVM_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    pool = local().runner.pool
    size = pool.submit(lambda: __import__("tvm").get_global_func("runtime.NumThreads")())
    assert size.result() == default_threads()
