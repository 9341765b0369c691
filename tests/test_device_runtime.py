"""The runtime side of the contract, on the toy device (tests/toy_device.py): programs,
resident weights, transfers counted, export and load, a runtime found by entry point or
missing, and every way a device fails."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
import toy_device
import tvm
from tvm.script import relax as R

import umahub
import umahub.plugin as up
from umahub.errors import ExecutionError, UmahubError
from umahub.runtime import devices

WEIGHT = np.arange(32, dtype="float32").reshape(4, 8) / 8


def _model():
    @tvm.script.ir_module
    class Model:
        @R.function
        def main(x: R.Tensor((4, 8), "float32")) -> R.Tensor((4, 8), "float32"):
            with R.dataflow():
                a = R.add(x, R.const(WEIGHT))
                b = R.nn.relu(a)
                c = R.multiply(b, b)
                R.output(c)
            return c

    return Model


def _reference(x):
    return np.maximum(x + WEIGHT, 0) ** 2


X = np.random.default_rng(0).standard_normal((4, 8)).astype("float32")


@pytest.fixture
def runtime():
    """A fresh toy runtime, registered for this test."""
    rt = toy_device.ToyRuntime()
    devices.register_runtime(rt)
    return rt


def _compile(**config):
    hub = umahub.Hub(config=config, autoload=False, plugins=[toy_device.plugin])
    return hub.compile(_model())


def test_partitions_run_on_the_device_with_their_weights_resident(runtime):
    compiled = _compile()
    report = compiled.report
    assert [(p.name, p.device) for p in report.placement] == [
        ("a", "toy:0"),
        ("b", "host"),
        ("c", "toy:1"),
    ]
    np.testing.assert_allclose(compiled.run(X), _reference(X), rtol=1e-6)
    zero, one = runtime.opened[0], runtime.opened[1]
    # the weight once at load, then the input at each call; one run each
    assert (zero.writes, zero.reads, zero.runs) == (2, 1, 1)
    compiled.run(X)
    assert (zero.writes, zero.reads, zero.runs) == (3, 2, 2)
    assert (one.writes, one.reads, one.runs) == (2, 2, 2)
    # a device of its own has no TVM target: its codegen is shown as "device"
    assert [p.virtual_device for p in report.partitions] == [
        "(cpu,1,device,toy.dram)",
        "(cpu,2,device,toy.dram)",
    ]
    program = {p.symbol: p.program for p in report.partitions}
    assert program["toy_0_add"] == {
        "runtime": "toy",
        "bytes": 3,
        "resident_bytes": 128,
        "metadata": {"size": 32},
    }
    crossings = [(c.src, c.dst, c.bytes, c.when, c.constant) for c in report.copies]
    assert crossings == [
        ("host", "toy:0", 128, "load", True),  # the weight, resident from load on
        ("host", "toy:0", 128, "inference", False),
        ("toy:0", "host", 128, "inference", False),
        ("host", "toy:1", 128, "inference", False),
        ("toy:1", "host", 128, "inference", False),
    ]


def test_a_value_between_two_partitions_of_one_device_is_counted_as_it_crosses(runtime):
    @tvm.script.ir_module
    class Chained:
        @R.function
        def main(x: R.Tensor((4, 8), "float32")) -> R.Tensor((4, 8), "float32"):
            with R.dataflow():
                a = R.add(x, R.const(WEIGHT))
                c = R.multiply(a, a)
                R.output(c)
            return c

    hub = umahub.Hub(autoload=False, plugins=[toy_device.plugin])
    compiled = hub.compile(Chained, placement={"c": "toy:0"})  # both partitions on toy:0
    per_inference = [
        (c.src, c.dst, c.bytes, c.producer, c.consumer)
        for c in compiled.report.copies
        if c.when == "inference"
    ]
    # toy's runtime reads a back after the add and writes it again for the multiply
    assert per_inference == [
        ("host", "toy:0", 128, "", "toy_0_add"),
        ("toy:0", "host", 128, "toy_0_add", "toy_1_multiply"),
        ("host", "toy:0", 128, "toy_0_add", "toy_1_multiply"),
        ("toy:0", "host", 128, "toy_1_multiply", ""),
    ]
    np.testing.assert_allclose(compiled.run(X), (X + WEIGHT) ** 2, rtol=1e-6)
    device = runtime.opened[0]
    writes, reads = device.writes, device.reads
    compiled.run(X)
    assert (device.writes - writes, device.reads - reads) == (2, 2)  # the report's 2 and 2


def test_both_executors_and_many_threads_give_the_same_numbers(runtime):
    runtime.asynchronous = True
    compiled = _compile()
    inputs = [np.full((4, 8), i / 7, dtype="float32") for i in range(16)]
    want = [_reference(x) for x in inputs]
    assert np.array_equal(compiled.run(inputs[0], executor="vm"), want[0])
    assert np.array_equal(compiled.run(inputs[0], executor="concurrent"), want[0])
    results: dict[int, np.ndarray] = {}

    def work(i: int) -> None:
        results[i] = compiled.run(inputs[i], executor=("vm", "concurrent")[i % 2])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(np.array_equal(results[i], want[i]) for i in range(16))


def test_an_exported_library_carries_programs_and_weights(runtime, tmp_path):
    path = _compile().export_library(tmp_path / "toy.so")
    fresh = toy_device.ToyRuntime()
    devices.register_runtime(fresh)
    loaded = umahub.load(path)
    assert np.array_equal(loaded.run(X), _reference(X))
    assert fresh.opened[0].writes == 2  # the weight, from the library, and the input


def test_a_library_loads_with_the_runtime_package_alone(install, tmp_path):
    """In a new process: no plugin, the runtime found through its entry point; then with
    no runtime installed, one line naming the package to install."""
    rt = toy_device.ToyRuntime()
    devices.register_runtime(rt)
    path = _compile().export_library(tmp_path / "toy.so")
    site = install(
        "umahub-toy-runtime",
        "1.0",
        {"toy": "toy_device:ToyRuntime"},
        {},
        group="umahub.runtimes",
    )
    np.save(tmp_path / "x.npy", X)
    script = textwrap.dedent(
        f"""
        import numpy as np, umahub, sys
        out = umahub.load({str(path)!r}).run(np.load({str(tmp_path / "x.npy")!r}))
        np.save({str(tmp_path / "out.npy")!r}, out)
        print([m for m in ("umahub.compiler.pipeline", "umahub.hub.loading") if m in sys.modules])
        """
    )
    tests = str(Path(__file__).parent)
    env_path = ":".join([str(site), tests, *sys.path])
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert np.array_equal(np.load(tmp_path / "out.npy"), _reference(X))
    assert done.stdout.strip() == "[]"  # no compiler, no plugin discovery
    missing = subprocess.run(
        [sys.executable, "-m", "umahub", "run", str(path)],
        env={
            "PYTHONPATH": ":".join([tests, *(p for p in sys.path if p != str(site))]),
            "PATH": "/usr/bin:/bin",
        },
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode != 0
    assert missing.stderr.strip().splitlines()[-1] == (
        f"umahub: error: {path} runs partitions on the device runtime 'toy', which is not "
        "installed here: pip install umahub-toy-runtime"
    )


def test_a_process_that_loaded_a_library_twice_exits_cleanly(runtime, tmp_path):
    """Each load binds the device's functions again, in place of the last load's; a
    library TVM kept until exit then held the only reference to a replaced one, a Python
    callable released after Python was finalized: a segfault as the process exited
    (apache-tvm 0.25's tvm-ffi), every model's results already given."""
    path = _compile().export_library(tmp_path / "toy.so")
    script = textwrap.dedent(
        f"""
        import numpy as np, toy_device, umahub
        from umahub.runtime import devices
        devices.register_runtime(toy_device.ToyRuntime())
        for _ in range(2):
            umahub.load({str(path)!r}).run(np.ones((4, 8), "float32"))
        print("ran")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={
            "PYTHONPATH": ":".join([str(Path(__file__).parent), *sys.path]),
            "PATH": "/usr/bin:/bin",
        },
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, "ran\n"), done.stderr[-2000:]


def test_a_fault_mid_run_names_accelerator_instance_and_partition(runtime):
    compiled = _compile()
    runtime.opened[1].fault = "fault"
    for executor in ("vm", "concurrent"):
        with pytest.raises(ExecutionError) as caught:
            compiled.run(X, executor=executor)
        assert str(caught.value).splitlines()[-1] == (
            "toy:1, partition toy_1_multiply: running: fault at instruction 1: bus error"
        )


def test_a_device_that_goes_away(runtime):
    compiled = _compile()
    runtime.opened[0].fault = "gone"
    gone = r"^toy:0, partition toy_0_add: running: toy:0 is gone"
    with pytest.raises(ExecutionError, match=gone):
        compiled.run(X, executor="vm")


def test_a_run_that_never_completes_times_out_and_the_device_is_not_used_again(
    runtime, monkeypatch
):
    monkeypatch.setattr(devices, "TIMEOUT", 0.2)
    compiled = _compile()
    runtime.opened[0].fault = "hang"
    with pytest.raises(ExecutionError) as caught:
        compiled.run(X, executor="vm")
    assert str(caught.value).splitlines()[-1] == (
        "toy:0, partition toy_0_add: running: no completion within 0.2 s (UMAHUB_DEVICE_TIMEOUT)"
    )
    runtime.opened[0].fault = ""
    with pytest.raises(ExecutionError) as caught:
        compiled.run(X, executor="vm")
    assert str(caught.value).splitlines()[-1] == (
        "toy:0, partition toy_0_add: the device is not used again: it gave no completion "
        "within 0.2 s before; load the model again"
    )


def test_a_program_the_device_rejects_fails_the_load(runtime, tmp_path):
    path = _compile().export_library(tmp_path / "toy.so")
    rejecting = toy_device.ToyRuntime()
    devices.register_runtime(rejecting)
    original = toy_device.ToyRuntime.open

    def open_rejecting(self, instance):
        device = original(self, instance)
        device.fault = "reject"
        return device

    rejecting.open = open_rejecting.__get__(rejecting)
    with pytest.raises(ExecutionError) as caught:
        umahub.load(path)
    assert str(caught.value) == (
        "toy:0, partition toy_0_add: the program was not loaded: program rejected: "
        "unknown operation b'add'"
    )


def test_device_memory_is_not_the_hosts(runtime):
    device = runtime.open(0)
    buffer = device.allocate(16)
    with pytest.raises(up.DeviceError, match="not addressable by the host"):
        device.host_pointer(buffer)


def test_a_damaged_device_section_is_refused(runtime, tmp_path):
    path = _compile().export_library(tmp_path / "toy.so")
    data = bytearray(path.read_bytes())
    at = data.index(b"add")  # the first program, in the device section
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(UmahubError, match="bytes differ from those written at export"):
        umahub.load(path)


def test_a_device_codegen_that_gives_host_code_falls_back_naming_the_plugin(runtime):
    class Wrong(toy_device._Plugin):
        @up.hookimpl(accelerator="toy")
        def umahub_codegen(self, module, context):
            return None

    hub = umahub.Hub(autoload=False, plugins=[Wrong()])
    with pytest.warns(umahub.UmahubWarning):
        compiled = hub.compile(_model())
    fallback = {p.symbol: p.fallback for p in compiled.report.partitions}
    assert fallback["toy_0_add"] == (
        "plugin 'Wrong' failed in umahub_codegen for partition toy_0_add (toy.add) on toy:0: "
        "PluginOutputError: umahub_codegen returned None for 'toy', a device of its own "
        "(Accelerator(runtime=...)): expected a umahub.plugin.DeviceProgram (a device has no "
        "default codegen)"
    )
    np.testing.assert_allclose(compiled.run(X), _reference(X), rtol=1e-6)


def test_verify_checks_device_partitions_against_the_host(runtime):
    compiled = _compile(verify=True)
    verified = {p.symbol: p.verified for p in compiled.report.partitions}
    assert all(v.startswith("largest error 0,") for v in verified.values()), verified


def test_explain_counts_the_crossings_without_building(runtime):
    hub = umahub.Hub(autoload=False, plugins=[toy_device.plugin])
    explained = hub.explain(_model())
    loads = [c for c in explained.copies if c.when == "load"]
    assert [(c.dst, c.bytes, c.consumer) for c in loads] == [("toy:0", 128, "toy_0_add")]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"runtime": "toy", "codegen": "c"},
            "Accelerator 'x': codegen 'c' runs on the host, runtime 'toy' on a device of its "
            "own: leave codegen out for a device accelerator",
        ),
        (
            {"codegen": "device"},
            "Accelerator 'x': codegen 'device' needs runtime=<the name of its umahub.runtimes "
            "entry point>",
        ),
        (
            {"runtime": "toy", "c_sources": ("k.c",)},
            "Accelerator 'x': c_sources and c_includes are host code; a device accelerator's "
            "code is its runtime's",
        ),
        (
            {"runtime": "to y"},
            "Accelerator 'x': runtime 'to y' must be an entry point name of group "
            "umahub.runtimes (letters, digits, '_', '-', '.')",
        ),
    ],
)
def test_a_device_accelerator_is_declared_consistently(fields, message):
    with pytest.raises(ValueError) as caught:
        up.Accelerator("x", **fields)
    assert str(caught.value) == message


def test_a_device_program_holds_bytes_and_json():
    with pytest.raises(TypeError, match="must be bytes"):
        up.DeviceProgram("text")  # type: ignore[arg-type]
    program = up.DeviceProgram(bytearray(b"\x01"), {"version": 1})
    assert program.data == b"\x01" and json.dumps(program.metadata) == '{"version": 1}'


def test_a_pending_completion_waits_and_carries_the_devices_error():
    pending = up.Pending()
    with pytest.raises(TimeoutError):
        pending.wait(0.01)
    pending.finish(up.DeviceError("parity error"))
    with pytest.raises(up.DeviceError, match="parity error"):
        pending.wait(1)
    up.done().wait(0)


def _board(env_path: str):
    """``python -m umahub.boards.board`` in a process of its own, and its address."""
    command = ["-m", "umahub.boards.board", "--host", "127.0.0.1", "--port", "29400"]
    proc = subprocess.Popen(
        [sys.executable, *command, "--port-end", "29499"],
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    said = []
    for line in proc.stdout:
        said.append(line)  # until "umahub board: serving on 127.0.0.1:PORT"
        if line.startswith("umahub board: serving on"):
            return proc, line.strip().rsplit(" ", 1)[-1]
    raise AssertionError(f"the board did not start (exit code {proc.wait()}): {said[-3:]}")


def test_a_board_with_the_runtime_package_alone_runs_the_library(install, tmp_path):
    """Over TVM's RPC, on a board whose only device software is the runtime package; a
    board without it says which package to install."""
    from umahub.boards.rpc import RemoteError, connect

    devices.register_runtime(toy_device.ToyRuntime())
    path = _compile().export_library(tmp_path / "toy.so")
    site = install(
        "umahub-toy-runtime", "1.0", {"toy": "toy_device:ToyRuntime"}, {}, group="umahub.runtimes"
    )
    tests = str(Path(__file__).parent)
    others = [p for p in sys.path if p != str(site)]
    board, address = _board(":".join([str(site), tests, *others]))
    bare, bare_address = _board(":".join([tests, *others]))
    try:
        with connect(server=address, timeout=60) as remote:
            assert np.array_equal(remote.load(path).run(X), _reference(X))
        with connect(server=bare_address, timeout=60) as remote, pytest.raises(RemoteError) as e:
            remote.load(path)
        assert str(e.value) == (
            f"board {bare_address} cannot load {path}: this library runs partitions on the device "
            "runtime 'toy', which is not installed here: pip install umahub-toy-runtime"
        )
    finally:
        board.terminate()
        bare.terminate()
