"""The ``umahub`` command as installed, on bad input: one line, exit status 2, no traceback.

And the options that make it usable: global options anywhere, ``--version``,
``--quiet``, progress with counts, the summary and ``--report -``, the latency
of ``run``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import umahub.models as zoo
from umahub.runtime.choosing import AUTO_BLOCK, AUTO_TRIALS

UMAHUB = str(Path(sys.executable).parent / "umahub")  # the console script pip installed
HOW = "write one with numpy.savez(path, x0, x1, ...) or numpy.save(path, x)"
#: Calls of "auto"'s trials per way it times.
PER_WAY = AUTO_TRIALS * AUTO_BLOCK


def umahub(*args, cwd, env=None):
    return subprocess.run(
        [UMAHUB, *args], capture_output=True, text=True, cwd=cwd, env=env, check=False
    )


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A project using the npu only, with the zoo's mlp compiled by the command."""
    path = tmp_path_factory.mktemp("cli")
    (path / "pyproject.toml").write_text('[tool.umahub]\nplugins = ["npu"]\n')
    result = umahub("compile", "mlp", "-o", "mlp.so", cwd=path)
    assert result.returncode == 0, result.stderr
    (path / "text.txt").write_text("not numbers\n")
    np.save(path / "wrong.npy", np.zeros(3))
    np.save(path / "objects.npy", np.array([{"a": 1}], dtype=object))
    np.savez(path / "empty.npz")
    (path / "garbage.onnx").write_bytes(b"\x08garbage, not protobuf")
    (path / "empty.onnx").write_bytes(b"")
    return path


def _external_weights_without_their_file(path: Path) -> str:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [numpy_helper.from_array(np.ones((64, 64), np.float32), "w")],
    )
    onnx.save_model(
        helper.make_model(graph),
        str(path / "ext.onnx"),
        save_as_external_data=True,
        location="ext.onnx.data",
        size_threshold=0,
    )
    (path / "ext.onnx.data").unlink()
    return "ext.onnx"


BAD = {
    "missing library": (
        ["run", "missing.so"],
        "umahub: error: missing.so: no such file",
    ),
    "not a library": (
        ["run", "text.txt"],
        "umahub: error: text.txt was not written by umahub (no umahub metadata at its end; "
        "a library cut short loses it too)",
    ),
    "missing inputs": (
        ["run", "mlp.so", "--inputs", "missing.npz"],
        "umahub: error: --inputs missing.npz: no such file",
    ),
    "npy of the wrong shape": (
        ["run", "mlp.so", "--inputs", "wrong.npy"],
        "umahub: error: input 0: expected shape (1, 64) float32, got (3,) float64",
    ),
    "text as inputs": (
        ["run", "mlp.so", "--inputs", "text.txt"],
        f"umahub: error: --inputs text.txt: not a NumPy .npz or .npy file; {HOW}",
    ),
    "pickled objects as inputs": (
        ["run", "mlp.so", "--inputs", "objects.npy"],
        "umahub: error: --inputs objects.npy: a damaged or unreadable NumPy file (Object "
        f"arrays cannot be loaded when allow_pickle=False); {HOW}",
    ),
    "npz without arrays": (
        ["run", "mlp.so", "--inputs", "empty.npz"],
        f"umahub: error: --inputs empty.npz: holds no arrays; {HOW}",
    ),
    "run -o in a missing directory": (
        ["run", "mlp.so", "-o", "nowhere/y.npz"],
        "umahub: error: -o nowhere/y.npz: the directory nowhere does not exist; create it first",
    ),
    "garbage onnx": (
        ["compile", "garbage.onnx"],
        "umahub: error: garbage.onnx: not a readable ONNX model",
    ),
    "empty onnx": (
        ["compile", "empty.onnx"],
        "umahub: error: empty.onnx: not a readable ONNX model (no graph in it)",
    ),
    "compile -o in a missing directory": (
        ["compile", "mlp", "-o", "nowhere/mlp.so"],
        "umahub: error: -o nowhere/mlp.so: the directory nowhere does not exist; create it first",
    ),
    "compile -o a directory": (
        ["compile", "mlp", "-o", "."],
        "umahub: error: -o .: is a directory; give a file name",
    ),
    "report in a missing directory": (
        ["compile", "mlp", "--report", "nowhere/r.json"],
        "umahub: error: --report nowhere/r.json: the directory nowhere does not exist; "
        "create it first",
    ),
    "picture in a missing directory": (
        ["explain", "mlp", "--out", "nowhere/m.svg"],
        "umahub: error: --out nowhere/m.svg: the directory nowhere does not exist; create it first",
    ),
    "usage mistake": (
        ["compile"],
        "umahub compile: error: the following arguments are required: model "
        "(see umahub compile --help)",
    ),
    "stream on a board": (
        ["run", "mlp.so", "--stream", "3", "--rpc-server", "127.0.0.1:1"],
        "umahub: error: --stream is for a run here; a board runs the model on TVM's VM",
    ),
    "repeat zero": (
        ["run", "mlp.so", "--repeat", "0"],
        "umahub run: error: argument --repeat: must be 1 or more, not 0 (see umahub run --help)",
    ),
}


def _one_clear_line(result, expected: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(expected), lines[0]


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_and_status_2(workdir, case):
    args, expected = BAD[case]
    result = umahub(*args, cwd=workdir)
    _one_clear_line(result, expected)
    assert "[umahub" not in result.stderr  # refused before any work started


def test_onnx_whose_weights_file_is_missing(workdir):
    name = _external_weights_without_their_file(workdir)
    result = umahub("compile", name, cwd=workdir)
    _one_clear_line(
        result,
        "umahub: error: ext.onnx: its weights are in a separate file, ext.onnx.data, "
        "which does not exist (1 tensor(s), e.g. 'w'); copy it next to the model",
    )


def test_traceback_on_request(workdir):
    result = umahub("-v", "compile", "garbage.onnx", cwd=workdir)
    assert result.returncode == 2
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("umahub: error: garbage.onnx:")
    env = dict(os.environ, UMAHUB_DEBUG="1")
    assert "Traceback" in umahub("compile", "garbage.onnx", cwd=workdir, env=env).stderr


@pytest.mark.parametrize("unbuffered", ["1", ""])  # written as it goes, or all at exit
def test_a_closed_pipe_ends_quietly(workdir, unbuffered):
    env = dict(os.environ, PYTHONUNBUFFERED=unbuffered)
    proc = subprocess.Popen(
        [UMAHUB, "plugins"], cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    proc.stdout.close()  # the reader is gone before umahub writes: `umahub plugins | head -0`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0
    assert err == ""


def test_an_internal_error_is_one_line_that_asks_for_a_report(monkeypatch, capsys):
    from umahub import cli
    from umahub.cli import commands

    def broken(args):
        # as TVM's errors are: a C++ backtrace, then the message on the last line
        raise RuntimeError("Traceback:\n  0: tvm::Frame\nInternalError: the cache is stale")

    monkeypatch.setattr(commands, "cmd_plugins", broken)
    assert cli.main(["plugins"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "umahub: internal error: RuntimeError: InternalError: the cache is stale (this is a bug in "
        "umahub or a plugin: rerun with -v for the traceback, and report it)\n"
    )
    assert cli.main(["plugins", "-v"]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_global_options_after_the_subcommand_and_quiet(workdir):
    result = umahub("compile", "mlp", "-o", "m2.so", "--strict", "-q", cwd=workdir)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    result = umahub("run", "m2.so", "--quiet", cwd=workdir)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    result = umahub("plugins", "--strict", cwd=workdir.parent)  # all installed plugins
    if "zz_bad_argument" in umahub("plugins", cwd=workdir.parent).stdout:
        assert result.returncode == 2
        assert result.stderr.startswith("umahub: error: plugin 'zz_bad_argument'")


def test_version_names_umahub_tvm_python_and_the_plugins(workdir):
    import importlib.metadata as md
    import platform

    result = umahub("--version", cwd=workdir)
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0] == "umahub 0.1.0"
    assert lines[1].startswith(f"apache-tvm {md.version('apache-tvm')} (apache-tvm-ffi ")
    assert lines[2].startswith(f"Python {platform.python_version()} ")
    assert f"  npu              umahub-npu {md.version('umahub-npu')}" in lines


def test_help_has_no_markup_and_names_the_zoo(workdir):
    for args in (["--help"], ["compile", "--help"], ["explain", "--help"], ["run", "--help"]):
        text = umahub(*args, cwd=workdir).stdout
        assert "``" not in text and ":func:" not in text
    text = " ".join(umahub("compile", "--help", cwd=workdir).stdout.split())
    assert f"a zoo model ({', '.join(zoo.names())})" in text


def test_compile_prints_counted_progress_and_a_summary(workdir):
    result = umahub("compile", "cnn", "-o", "cnn.so", cwd=workdir)
    assert result.returncode == 0, result.stderr
    steps = re.findall(r"^\[umahub +\d+\.\ds\] (\S+)(.*)$", result.stderr, re.M)
    assert [s for s, _ in steps] == [
        "import", "plan", "partition", "memory", "lower", "lower", "build", "load", "export",
    ]  # fmt: skip
    assert steps[4][1] == " 1/2 npu_0_conv2d_add_relu on npu:0"
    assert steps[5][1] == " 2/2 npu_1_matmul_add on npu:0"
    assert re.fullmatch(r" cnn: \d+\.\ds", steps[0][1])  # a step of its own: its duration
    assert re.fullmatch(r" cnn.so \(compile and link\): \d+\.\ds", steps[-1][1])
    lines = result.stdout.splitlines()
    assert lines[0] == ("placement: 5 of 10 operators on accelerators (npu:0 5), 5 on the host")
    assert lines[1] == "partitions: 2 placed"
    assert lines[-1] == "wrote cnn.so"
    assert "relax.nn.conv2d" not in result.stdout  # the full table is on request
    full = umahub("compile", "mlp", "-o", "mlp.so", "--report", "-", cwd=workdir).stdout
    assert re.search(r"^  fc1 +relax.matmul +npu:0 +npu.matmul_bias", full, re.M)


def test_bench_times_only_once_the_auto_executor_has_chosen(workdir):
    result = umahub("bench", "mlp.so", "--repeat", "3", "--json", "-", cwd=workdir)
    assert result.returncode == 0, result.stderr
    timed = json.loads(result.stdout)  # JSON alone on stdout
    assert timed["repeat"] == 3
    assert timed["warmup"] in (2 * PER_WAY, 3 * PER_WAY)  # the VM on one or two thread counts
    assert 0 < timed["latency_ms"]["min"] <= timed["latency_ms"]["max"]
    executor = timed["executor"]
    assert executor["in_use"] in ("vm", "concurrent")
    assert re.match(
        rf"{executor['in_use']}( on \S+ threads?)?, chosen by auto: timed on the first",
        executor["why"],
    )


def test_run_prints_the_latency(workdir):
    result = umahub("run", "mlp.so", cwd=workdir)
    assert re.search(r"^latency: \d+\.\d{3} ms \(the first run", result.stdout, re.M)
    # npu and host: the auto executor times both on its first runs, none of them timed here
    result = umahub("run", "mlp.so", "--repeat", "3", cwd=workdir)
    assert re.search(
        r"^latency: median \d+\.\d{3} ms, min \d+\.\d{3} ms, max \d+\.\d{3} ms "
        rf"over 3 runs after ({2 * PER_WAY}|{3 * PER_WAY}) warm-up runs$",
        result.stdout,
        re.M,
    ), result.stdout
    assert re.search(
        r"^executor: (vm|concurrent)( on \S+ threads?)?, chosen by auto: timed on the first "
        r"calls, in blocks of 3: the ",
        result.stdout,
        re.M,
    ), result.stdout
    result = umahub("run", "mlp.so", "--repeat", "3", "--executor", "vm", cwd=workdir)
    assert re.search(r" over 3 runs after one warm-up run$", result.stdout, re.M), result.stdout
    assert "\nexecutor: vm: asked for (executor = 'vm')\n" in result.stdout
    result = umahub("run", "mlp.so", "--executor", "vm", "--stream", "5", cwd=workdir)
    assert re.search(r"^stream: 5 inferences in \d+\.\d{3} s, [\d.]+/s \(executor vm\)$",
                     result.stdout, re.M), result.stdout  # fmt: skip
    x = zoo.inputs("mlp")[0]
    np.save(workdir / "x.npy", x)
    one = umahub("run", "mlp.so", "--inputs", "x.npy", "-o", "y.npz", cwd=workdir)
    assert one.returncode == 0, one.stderr
    np.savez(workdir / "x.npz", x)
    assert umahub("run", "mlp.so", "--inputs", "x.npz", "-o", "z.npz", cwd=workdir).returncode == 0
    with np.load(workdir / "y.npz") as y, np.load(workdir / "z.npz") as z:
        np.testing.assert_array_equal(y["arr_0"], z["arr_0"])


FAILING = """
import umahub
UMAHUB_API = 1

@umahub.hookimpl
def umahub_accelerators():
    return [umahub.Accelerator("failing")]

@umahub.hookimpl(accelerator="failing")
def umahub_patterns():
    raise RuntimeError("no licence")
"""
FAILED = (
    "plugin 'failing_vendor' failed in umahub_patterns for accelerator 'failing': "
    "RuntimeError: no licence"
)


@pytest.fixture
def failing(tmp_path):
    (tmp_path / "failing_vendor.py").write_text(FAILING)
    (tmp_path / "pyproject.toml").write_text('[tool.umahub]\nplugins = ["failing_vendor"]\n')
    env = {
        **os.environ,
        "UMAHUB_PLUGINS": "failing_vendor",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    return tmp_path, env


@pytest.mark.parametrize("command", ["compile", "explain"])
def test_on_error_error_on_the_command_line_stops_at_a_plugins_failure(failing, command):
    path, env = failing
    result = umahub(command, "mlp", "--on-error", "error", "-q", cwd=path, env=env)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == f"umahub: error: {FAILED}"


def test_verbose_shows_a_plugin_failures_traceback_under_fallback(failing):
    path, env = failing
    quiet = umahub("explain", "mlp", "-q", cwd=path, env=env)
    verbose = umahub("explain", "mlp", "-q", "-v", cwd=path, env=env)
    assert quiet.returncode == verbose.returncode == 0
    warning = f"umahub: warning: {FAILED}; 'failing' claims nothing in this compile"
    assert quiet.stderr.strip() == warning
    lines = verbose.stderr.strip().splitlines()
    assert lines[0] == warning
    assert lines[1].strip() == "Traceback (most recent call last):"
    assert lines[-2].strip() == 'raise RuntimeError("no licence")'
    assert lines[-1].strip() == "RuntimeError: no licence"
