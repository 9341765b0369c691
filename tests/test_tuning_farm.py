"""``umahub tune --rpc``: one tuning run measures on both boards of a farm at once.

TVM's tracker and two ``python -m umahub.board`` processes on the loopback
interface, one key; each board logs every library it loads (TVM's server
logs ``load_module``), so both logs name the kernels they measured.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import umahub
import umahub.models as zoo
from umahub.tuning.tune import FINAL_ROUNDS

pytestmark = pytest.mark.slow

KEY = "umahub-tune-farm"


@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    """A tracker and two boards of one key, and the boards' log files."""
    from tvm import rpc
    from tvm.rpc.tracker import Tracker

    tracker = Tracker("127.0.0.1", port=29300, port_end=29400, silent=True)
    logs = [tmp_path_factory.mktemp("boards") / f"board{i}.log" for i in range(2)]
    boards = []
    for i, log in enumerate(logs):
        command = [sys.executable, "-m", "umahub.board", "--host", "127.0.0.1"]
        command += ["--port", str(29400 + 20 * i), "--port-end", str(29419 + 20 * i)]
        command += ["--tracker", f"127.0.0.1:{tracker.port}", "--key", KEY]
        with open(log, "w") as out:
            boards.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 60
    free = 0
    while time.monotonic() < deadline and free < 2:
        time.sleep(0.5)
        summary = rpc.connect_tracker("127.0.0.1", tracker.port).summary()
        free = summary["queue_info"].get(KEY, {}).get("free", 0)
    assert free == 2, "the two boards did not register with the tracker within a minute"
    yield {"tracker": f"127.0.0.1:{tracker.port}", "logs": logs}
    for board in boards:
        board.terminate()
        board.wait(timeout=30)
    tracker.terminate()


def test_one_tuning_run_measures_on_both_boards(farm, tmp_path):
    hub = umahub.Hub(project_config=False, autoload=False)
    result = hub.tune(
        zoo.get("mlp"), database=str(tmp_path / "db"), trials=8, rpc=farm["tracker"], key=KEY
    )
    assert result.where == f"2 boards with key '{KEY}' at tracker {farm['tracker']}"
    assert all(v.hook_seconds and v.hook_seconds > 0 for v in result.verdicts)
    loaded = [log.read_text().count("load_module") for log in farm["logs"]]
    assert all(n > 0 for n in loaded), f"libraries loaded per board: {loaded}"
    # each candidate and each hook's schedule measured once, then the best and the hook's
    # in turn, on one board or the other
    judged = sum(v.tuned_seconds is not None for v in result.verdicts)
    assert sum(loaded) == result.trials + len(result.verdicts) + 2 * FINAL_ROUNDS * judged
    compiled = umahub.Hub(
        config={"tuning-database": str(tmp_path / "db")}, project_config=False, autoload=False
    ).compile(zoo.get("mlp"))
    assert [k["name"] for k in compiled.report.tuned_kernels] == [v.name for v in result.verdicts]
    assert os.path.exists(tmp_path / "db" / "umahub-tuning.json")


def test_an_accelerators_partition_is_measured_on_the_farm_too(farm, tmp_path):
    hub = umahub.Hub(config={"plugins": ["npu"]}, project_config=False)
    result = hub.tune(
        zoo.get("cnn"), database=str(tmp_path / "db"), trials=6, rpc=farm["tracker"], key=KEY
    )
    (conv,) = [v for v in result.verdicts if v.name == "npu_0_conv2d_add_relu on npu:0"]
    assert conv.hook_seconds and conv.hook_seconds > 0  # its library loaded and ran on a board
    assert conv.tuned_seconds is not None and conv.script is not None
