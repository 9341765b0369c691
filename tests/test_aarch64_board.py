"""A cross-built library run on an emulated aarch64 board, against the native run.

The board is Debian's aarch64 Python under user-mode QEMU, with TVM's aarch64 wheel of
this machine's version and this umahub (the repo's ``src/``, no plugins), serving
``python -m umahub.boards.board`` on the loopback interface and registered with a TVM
tracker there. ``.ci/aarch64-board.sh`` builds that environment (``tox -e aarch64``
builds it and runs this file; CI runs that). The zoo's models are built here for
``llvm -mtriple=aarch64-linux-gnu`` across the bundled plugins with Debian's cross
compiler, and again for this machine; the aarch64 library is uploaded, loaded and run
on the board through umahub's RPC client and the command line, and its outputs are
compared with the native library's run here (and the CNN's with plain ``tvm.compile``'s):
floats within a relative error (the two architectures' code need not round alike), the
int8 model's outputs (its quantized integers, dequantized) exactly.

Without the board's environment or the cross compiler the tests skip, saying what to
run, except in CI (``CI`` set), where they fail.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import host_reference

import umahub
from umahub.boards.rpc import RemoteError
from umahub.cli import main
from umahub.targets import this_machine

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
BOARD_DIR = Path(os.environ.get("UMAHUB_AARCH64_BOARD", REPO / ".aarch64-board"))
BOARD_PYTHON = BOARD_DIR / "bin" / "python3"
CROSS = shutil.which("aarch64-linux-gnu-g++") or shutil.which("aarch64-linux-gnu-gcc")
TARGET = "llvm -mtriple=aarch64-linux-gnu"
KEY = "umahub-qemu-aarch64"
HERE = this_machine()
PLUGINS = {"plugins": ["npu", "vanilla", "dsp"], "priority": ["npu", "vanilla_accel", "dsp_cpu"]}
# as the README's demo: conv1's ReLU pinned to a DSP core, so that all three take a part (in
# cnn_int8 that ReLU is part of a quantized operator, claimed whole)
PINS = {"cnn": {"conv1_relu": "dsp_cpu:0"}, "cnn_int8": {}}
STARTUP = 300.0  # seconds for the emulated board to import TVM twice (its server and worker)
TIMEOUT = 300.0  # one call on the board, emulated on a machine that may be busy


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must run this test: .ci/run installs what it needs)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    """TVM's tracker here, and the emulated aarch64 board registered with it."""
    if HERE == "aarch64":
        pytest.skip("this machine is aarch64: the board would not be emulated")
    if CROSS is None:
        _unavailable("no aarch64 cross compiler: run bash .ci/aarch64-board.sh")
    if not BOARD_PYTHON.exists():
        _unavailable(f"no emulated aarch64 board at {BOARD_DIR}: run bash .ci/aarch64-board.sh")
    from tvm import rpc
    from tvm.rpc.tracker import Tracker

    tracker = Tracker("127.0.0.1", port=29300, port_end=29400, silent=True)
    address = f"127.0.0.1:{tracker.port}"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}  # umahub, and no plugin
    env.pop("PYTHONHOME", None)
    argv = [str(BOARD_PYTHON), "-m", "umahub.boards.board", "--host", "127.0.0.1"]
    argv += ["--port", "29400", "--port-end", "29499", "--tracker", address, "--key", KEY]
    log = tmp_path_factory.mktemp("board") / "board.log"
    # a session of its own: the server and its worker are stopped together
    with open(log, "wb") as out:
        server = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + STARTUP
        while time.monotonic() < deadline:
            if (
                rpc.connect_tracker("127.0.0.1", tracker.port)
                .summary()["queue_info"]
                .get(KEY, {})
                .get("free")
            ):
                break
            if server.poll() is not None:
                pytest.fail(f"the board exited: {log.read_text()[-2000:]}")
            time.sleep(1)
        else:
            pytest.fail(
                f"the board did not register with the tracker within {STARTUP:.0f} s: "
                f"{log.read_text()[-2000:]}"
            )
        yield address
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        tracker.terminate()


def _built(name: str, directory: Path) -> dict:
    """``name`` built for aarch64 (exported) and for this machine (run here)."""
    import umahub.models as zoo

    hub = umahub.Hub(config={**PLUGINS, "placement": PINS[name]}, project_config=False)
    arm = hub.compile(zoo.get(name), target=TARGET, cc=CROSS)
    native = hub.compile(zoo.get(name))
    assert arm.devices == native.devices
    assert all(not p.fallback for p in arm.report.partitions)
    inputs = zoo.inputs(name)
    return {
        "arm": str(arm.export_library(directory / f"{name}-aarch64.so")),
        "native": str(native.export_library(directory / f"{name}-{HERE}.so")),
        "devices": arm.devices,
        "inputs": inputs,
        "outputs": native.run(*inputs),
    }


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    return _built("cnn", tmp_path_factory.mktemp("cnn"))


@pytest.fixture(scope="module")
def cnn_int8(tmp_path_factory):
    return _built("cnn_int8", tmp_path_factory.mktemp("cnn_int8"))


def _on_board(board: str, built: dict) -> tuple[np.ndarray, dict]:
    with umahub.remote(tracker=board, key=KEY, timeout=TIMEOUT) as session:
        model = session.load(built["arm"])
        assert model.devices == built["devices"]
        outputs = model.run(*built["inputs"])
        assert model.board_seconds() > 0
        return outputs, session.info


def test_the_board_is_aarch64_with_this_machines_tvm(board):
    with umahub.remote(tracker=board, key=KEY, timeout=TIMEOUT) as session:
        info = session.info
    assert info["machine"] == "aarch64"
    for dist in ("apache-tvm", "apache-tvm-ffi"):
        assert info[dist] == importlib.metadata.version(dist)


def test_cnn_across_the_bundled_plugins_matches_the_native_run(board, cnn):
    # the npu's LLVM partitions and the host part for aarch64, the vanilla and dsp C ones
    assert cnn["devices"] == ["host", "npu:0", "vanilla_accel:0", "dsp_cpu:0"]
    outputs, _ = _on_board(board, cnn)
    native = cnn["outputs"]
    assert outputs.shape == native.shape and outputs.dtype == native.dtype
    scale = float(np.abs(native).max())
    assert scale > 0.1  # real numbers, not zeros
    np.testing.assert_allclose(outputs, native, rtol=1e-5, atol=1e-5 * scale)
    # and the reference: the model built by plain tvm.compile for this machine
    np.testing.assert_allclose(outputs, host_reference("cnn"), rtol=1e-5, atol=1e-5 * scale)


def test_cnn_int8_on_the_board_equals_the_native_run_bit_for_bit(board, cnn_int8):
    # the npu's quantized convolutions and matmul: computed in integers, on any machine alike
    assert cnn_int8["devices"] == ["host", "npu:0"]
    outputs, _ = _on_board(board, cnn_int8)
    native = cnn_int8["outputs"]
    assert np.abs(native).max() > 0
    np.testing.assert_array_equal(outputs, native)


def test_the_command_line_runs_and_times_it_on_the_board(board, cnn, tmp_path, capsys):
    np.savez(tmp_path / "inputs.npz", *cnn["inputs"])
    argv = ["--inputs", str(tmp_path / "inputs.npz"), "--rpc", board, "--key", KEY]
    argv += ["--timeout", str(TIMEOUT)]
    assert main(["run", cnn["arm"], "-o", str(tmp_path / "out.npz"), *argv]) == 0
    assert capsys.readouterr().out.startswith(f"on board '{KEY}' from tracker {board} (aarch64)")
    with np.load(tmp_path / "out.npz") as saved:
        np.testing.assert_allclose(saved["arr_0"], cnn["outputs"], rtol=1e-5, atol=1e-5)
    assert main(["bench", cnn["arm"], "--repeat", "3", "--json", "-", *argv]) == 0
    result = json.loads(capsys.readouterr().out)  # JSON alone on stdout
    assert result["repeat"] == 3 and result["where"] == f"board '{KEY}' from tracker {board}"
    assert 0 < result["board_latency_ms"]["min"] <= result["latency_ms"]["min"]
    assert result["board"]["machine"] == "aarch64" and result["machine"]["machine"] == HERE


def test_a_library_for_this_machine_is_refused_by_the_board(board, cnn):
    with umahub.remote(tracker=board, key=KEY, timeout=TIMEOUT) as session:
        with pytest.raises(RemoteError) as caught:
            session.load(cnn["native"])
        name = session.name
    assert str(caught.value) == (
        f"{name} cannot load {cnn['native']}: the library is built for {HERE}, the board "
        "is aarch64 (wrong architecture); compile for the board: umahub compile MODEL --target "
        '"llvm -mtriple=aarch64-linux-gnu" --cc aarch64-linux-gnu-gcc'
    )
