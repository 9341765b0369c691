"""Remote runs over TVM's RPC: a tracker and two boards on the loopback interface.

The boards are TVM's ``rpc.Server`` with umahub's loader registered (what
``python -m umahub.boards.board`` starts); one plain TVM server shows the message a
board without it gets. All are shut down at the end of the session.
"""

from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import pytest

from umahub.boards.rpc import RemoteError, connect, parse_address
from umahub.cli import main

pytest_plugins = ["pytester"]

# as the README's demo: conv1's ReLU pinned to a DSP core, so that all three take a part
BUNDLED = {
    "plugins": ["npu", "vanilla", "dsp"],
    "priority": ["npu", "vanilla_accel", "dsp_cpu"],
    "placement": {"conv1_relu": "dsp_cpu:0"},
}
KEY = "umahub-test-cpu"


def _server(**kwargs):
    from tvm import rpc

    return rpc.Server(host="127.0.0.1", port=29090, port_end=29190, silent=True, **kwargs)


@pytest.fixture(scope="session")
def farm():
    """TVM's tracker and two umahub boards with one key, and one plain TVM server."""
    from tvm.rpc.tracker import Tracker

    import umahub.boards.board

    tracker = Tracker("127.0.0.1", port=29190, port_end=29290, silent=True)
    address = ("127.0.0.1", tracker.port)
    boards = [
        _server(tracker_addr=address, key=KEY, server_init_callback=umahub.boards.board.register)
        for _ in range(2)
    ]
    plain = _server()
    deadline = time.monotonic() + 30
    from tvm import rpc

    while time.monotonic() < deadline:  # the boards register with the tracker within seconds
        summary = rpc.connect_tracker(*address).summary()
        if summary["queue_info"].get(KEY, {}).get("free", 0) == 2:
            break
        time.sleep(0.2)
    yield {"tracker": f"127.0.0.1:{tracker.port}", "plain": f"127.0.0.1:{plain.port}"}
    for server in [*boards, plain]:
        server.terminate()
    tracker.terminate()


@pytest.fixture(scope="session")
def cnn(tmp_path_factory):
    """The zoo's cnn compiled across the bundled plugins, exported, and its local outputs."""
    import umahub
    import umahub.models as zoo

    compiled = umahub.Hub(config=BUNDLED, project_config=False).compile(zoo.get("cnn"))
    assert {d.split(":")[0] for d in compiled.devices} == {
        "host",
        "npu",
        "vanilla_accel",
        "dsp_cpu",
    }
    path = compiled.export_library(tmp_path_factory.mktemp("remote") / "cnn.so")
    inputs = zoo.inputs("cnn")
    local = umahub.load(path).run(*inputs)
    return {"path": str(path), "inputs": inputs, "local": local, "devices": compiled.devices}


def test_cnn_through_the_tracker_matches_the_local_run(farm, cnn):
    with connect(tracker=farm["tracker"], key=KEY, timeout=30) as board:
        assert board.name == f"board '{KEY}' from tracker {farm['tracker']}"
        assert board.info["machine"] == os.uname().machine
        model = board.load(cnn["path"])
        assert model.devices == cnn["devices"]
        out = model.run(*cnn["inputs"])
        assert model.board_seconds() > 0
    np.testing.assert_allclose(out, cnn["local"], rtol=1e-6, atol=1e-6)
    assert np.abs(out).max() > 0.1  # real numbers, not zeros


def test_two_boards_at_once_and_a_third_request_waits_then_gives_up(farm, cnn):
    with connect(tracker=farm["tracker"], key=KEY, timeout=30) as a:
        with connect(tracker=farm["tracker"], key=KEY, timeout=30) as b:
            outs = [board.load(cnn["path"]).run(*cnn["inputs"]) for board in (a, b)]
            with pytest.raises(RemoteError) as caught:
                connect(tracker=farm["tracker"], key=KEY, timeout=1.5)
    assert str(caught.value) == (
        f"no board with key '{KEY}' became free at tracker {farm['tracker']} within 1.5 s "
        "(2 registered, all busy); wait, add boards, or allow more time (--timeout)"
    )
    for out in outs:
        np.testing.assert_allclose(out, cnn["local"], rtol=1e-6, atol=1e-6)


def test_the_library_object_runs_several_inferences(farm, cnn):
    import umahub

    with umahub.remote(tracker=farm["tracker"], key=KEY) as board:
        model = board.load(cnn["path"])
        x = [np.ones_like(a) for a in cnn["inputs"]]
        first, again = model.run(*x), model.run(*x)
        local = umahub.load(cnn["path"]).run(*x)
    np.testing.assert_allclose(first, local, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(first, again)


def test_a_board_without_umahubs_loader_is_named_with_the_fix(farm):
    with pytest.raises(RemoteError) as caught:
        connect(server=farm["plain"], timeout=10)
    assert str(caught.value) == (
        f"board {farm['plain']} runs TVM's plain RPC server, which cannot keep a model's "
        "weights on its accelerator devices; start it with `python -m umahub.boards.board "
        "--tracker HOST:PORT --key KEY` (TVM's server with umahub's loader; umahub on the "
        "board, no plugins)"
    )


def test_unknown_key_no_tracker_no_server(farm):
    with pytest.raises(RemoteError) as caught:
        connect(tracker=farm["tracker"], key="rk3588", timeout=5)
    assert str(caught.value) == (
        f"tracker {farm['tracker']} has no board with key 'rk3588' (boards by key: "
        f"{KEY} (2)); start one with `python -m umahub.boards.board --tracker HOST:PORT --key KEY` "
        "or use one of those keys"
    )
    start = time.monotonic()
    with pytest.raises(RemoteError) as caught:
        connect(tracker="127.0.0.1:9", key="x", timeout=5)
    assert time.monotonic() - start < 5  # refused at once, not TVM's minute of retries
    assert str(caught.value) == (
        "no tracker at 127.0.0.1:9 (connection refused); start one there (python -m "
        "tvm.exec.rpc_tracker --host 0.0.0.0 --port PORT) or check the address"
    )
    with pytest.raises(RemoteError, match=r"^no RPC server at 127.0.0.1:9 \(connection refused"):
        connect(server="127.0.0.1:9", timeout=5)
    with pytest.raises(RemoteError, match="give the key of the boards"):
        connect(tracker=farm["tracker"])
    with pytest.raises(RemoteError, match="not both nor neither"):
        connect(tracker=farm["tracker"], server=farm["plain"], key=KEY)
    with pytest.raises(RemoteError, match=r"^tracker 'farm': expected HOST:PORT"):
        parse_address("farm", "tracker")


def test_a_library_of_another_architecture_is_refused_before_upload(farm, cnn):
    with connect(tracker=farm["tracker"], key=KEY, timeout=30) as board:
        board.info["machine"] = "aarch64"  # as an arm board answers
        with pytest.raises(RemoteError) as caught:
            board.load(cnn["path"])
    assert str(caught.value) == (
        f"board '{KEY}' from tracker {farm['tracker']} cannot load {cnn['path']}: the "
        f"library is built for {os.uname().machine}, the board is aarch64 (wrong "
        'architecture); compile for the board: umahub compile MODEL --target "llvm '
        '-mtriple=aarch64-linux-gnu" --cc aarch64-linux-gnu-gcc'
    )


def _serving_children(server):
    import psutil

    return psutil.Process(server.proc._proc.pid).children(recursive=True)


@pytest.mark.parametrize(
    ("text", "lost"),
    [
        ("Check failed: (code == RPCCode::kReturn) is false: code=1", True),
        ("Check failed: (code == RPCCode::kReturn) is false: code=kShutdown", True),
        ("Socket recv error: connection reset by peer", True),
        ("Check failed: (code == RPCCode::kReturn) is false: code=5", False),
        ("ValueError: the input 0 has shape (1, 3) where the model takes (1, 4)", False),
    ],
)
def test_a_session_that_ended_is_told_from_a_call_that_failed(text, lost):
    """TVM's RPC client reports a session that died under a call either as a socket
    error or as the protocol's shutdown code in place of a return, depending on when
    it died; both are a board that went away."""
    from umahub.boards.rpc import _connection_lost

    assert _connection_lost(RuntimeError(text)) is lost


def test_a_board_that_goes_away_mid_run(cnn):
    import umahub.boards.board

    server = _server(server_init_callback=umahub.boards.board.register)
    try:
        board = connect(server=f"127.0.0.1:{server.port}", timeout=20)
        model = board.load(cnn["path"])
        model.run(*cnn["inputs"])
        for child in _serving_children(server):  # the board's session process dies
            child.kill()
        with pytest.raises(RemoteError) as caught:
            model.run(*cnn["inputs"])
        message = str(caught.value)
        assert message.startswith(f"board 127.0.0.1:{server.port} went away while running cnn.so")
        assert message.endswith("check that the board and its RPC server are up, then run again")
        with pytest.raises(RemoteError) as again:  # the session stays closed
            model.run(*cnn["inputs"])
        assert str(again.value) == message
    finally:
        server.terminate()


def test_a_board_that_stops_answering_times_out(cnn):
    import umahub.boards.board

    server = _server(server_init_callback=umahub.boards.board.register)
    stopped = []
    try:
        board = connect(server=f"127.0.0.1:{server.port}", timeout=2)
        model = board.load(cnn["path"])
        for child in _serving_children(server):
            os.kill(child.pid, signal.SIGSTOP)
            stopped.append(child.pid)
        with pytest.raises(RemoteError) as caught:
            model.run(*cnn["inputs"])
        assert str(caught.value) == (
            f"board 127.0.0.1:{server.port} did not answer within 2 s while running cnn.so: "
            "it is hung, overloaded or unreachable; check the board, or allow more time "
            "(--timeout)"
        )
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        server.terminate()


def test_cli_run_and_bench_on_a_board(farm, cnn, capsys, tmp_path):
    np.savez(tmp_path / "x.npz", *cnn["inputs"])
    out_file, json_file = tmp_path / "out.npz", tmp_path / "bench.json"
    args = ["--rpc", farm["tracker"], "--key", KEY, "--timeout", "30"]
    assert (
        main(["run", cnn["path"], "--inputs", str(tmp_path / "x.npz"), "-o", str(out_file), *args])
        == 0
    )
    printed = capsys.readouterr().out
    assert printed.startswith(f"on board '{KEY}' from tracker {farm['tracker']} (")
    with np.load(out_file) as saved:
        np.testing.assert_allclose(saved["arr_0"], cnn["local"], rtol=1e-6, atol=1e-6)
    assert main(["bench", cnn["path"], "--repeat", "5", "--json", str(json_file), *args]) == 0
    result = json.loads(json_file.read_text())
    assert result["repeat"] == 5 and result["where"].startswith(f"board '{KEY}'")
    assert set(result["latency_ms"]) == {"min", "median", "p90", "max", "mean"}
    lat, board = result["latency_ms"], result["board_latency_ms"]
    assert 0 < lat["min"] <= lat["median"] <= lat["p90"] <= lat["max"]
    assert 0 < board["min"] <= board["max"]
    assert result["board"]["apache-tvm"] == result["machine"]["apache-tvm"]
    capsys.readouterr()
    assert main(["bench", cnn["path"], "--repeat", "2", "--json", "-", *args]) == 0
    assert json.loads(capsys.readouterr().out)["repeat"] == 2  # JSON alone, no "on board ..."


def test_cli_errors_are_one_line(farm, cnn, capsys):
    assert main(["run", cnn["path"], "--rpc", farm["tracker"]]) == 2
    assert capsys.readouterr().err == (
        f"umahub: error: --rpc {farm['tracker']}: give --key, the kind of board to ask the "
        "tracker for\n"
    )
    assert main(["bench", cnn["path"], "--rpc", farm["tracker"], "--key", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"umahub: error: tracker {farm['tracker']} has no board with key 'nope'")
    assert err.count("\n") == 1
    assert main(["run", cnn["path"], "--key", KEY]) == 2
    assert "give --rpc HOST:PORT" in capsys.readouterr().err
    assert main(["run", "missing.so", "--rpc-server", farm["plain"]]) == 2
    assert capsys.readouterr().err == "umahub: error: missing.so: no such file\n"


def test_bench_here(cnn, capsys, tmp_path):
    assert main(["bench", cnn["path"], "--repeat", "3", "--json", "-", "-q"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["where"] == "this machine" and result["repeat"] == 3
    assert result["machine"]["apache-tvm"]
    assert "device_ms" in result or "device_ms_why" in result


def test_the_kit_runs_its_numeric_checks_on_a_board(farm, cnn):
    from umahub.testing._session import ConformanceSession

    session = ConformanceSession(["npu"], ["cnn"], 1, None, rpc=(farm["tracker"], KEY))
    compiled = session.compiled("npu", "cnn")
    remote = session.run(compiled, cnn["inputs"])
    np.testing.assert_allclose(remote, compiled.run(*cnn["inputs"]), rtol=1e-6, atol=1e-6)
    assert session._board.name == f"board '{KEY}' from tracker {farm['tracker']}"
    session._board.close()


def test_the_kit_options_go_together(pytester):
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest("--umahub-rpc", "127.0.0.1:9")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: --umahub-rpc HOST:PORT and --umahub-rpc-key KEY go together: the tracker, "
            "and the kind of board to ask it for"
        ]
    )


def test_placement_by_cost_times_the_candidate_groups_on_the_board(farm):
    from graphs import chain

    import umahub

    hub = umahub.Hub(config={"plugins": ["dsp"]}, project_config=False)
    mod = chain(shape=(4, 64), ops=("relu", "add", "sigmoid"))
    with connect(tracker=farm["tracker"], key=KEY, timeout=60) as board:
        on_board = hub.explain(mod, placement="auto", board=board).auto
    assert on_board["costs"]["measured"] == 2 * len(on_board["groups"]) > 0
    here = hub.explain(mod, placement="auto").auto  # keyed apart: measured again, here
    assert here["costs"]["measured"] == on_board["costs"]["measured"]
    assert here["costs"]["cached"] == 0
    for group in on_board["groups"]:
        assert group["costs"]["dsp_cpu"]["seconds"] > 0
        assert group["costs"]["host"]["source"] == "measured"


def test_explain_and_compile_by_cost_on_a_board_print_their_json_alone(farm, capsys, tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.umahub]\nplugins = ["dsp"]\n')
    board = ["mlp", "--auto", "--rpc", farm["tracker"], "--key", KEY]
    assert main(["explain", *board, "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == 1  # no "on board ..." line first
    argv = ["compile", *board, "-o", "mlp.so", "--report", "-", "--report-format", "json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["format"] == 1


def test_compile_with_a_board_needs_auto(farm, capsys):
    status = main(["compile", "cnn", "--rpc", farm["tracker"], "--key", KEY])
    assert status == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "umahub: error: --rpc with compile: the board times the candidate groups of placement "
        "by cost; give --auto too (to run a library on a board: umahub run LIBRARY --rpc ...)"
    )


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except FileNotFoundError:
        return []


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads /proc (Linux)")
def test_a_board_stopped_by_sigterm_stops_its_server_process(tmp_path):
    ports = ["--port", "29600", "--port-end", "29650"]
    import subprocess
    import sys

    log = tmp_path / "board.log"
    with open(log, "w") as out:
        board = subprocess.Popen(
            [sys.executable, "-m", "umahub.boards.board", "--host", "127.0.0.1", *ports],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "serving on" not in log.read_text():
        time.sleep(0.2)
    servers = _children(board.pid)
    assert servers, f"the board started no server process: {log.read_text()}"
    board.send_signal(signal.SIGTERM)
    assert board.wait(timeout=30) == 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in servers):
        time.sleep(0.1)
    assert [p for p in servers if _alive(p)] == []
