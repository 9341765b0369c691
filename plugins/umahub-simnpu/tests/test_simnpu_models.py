"""Whole models through umahub with the simnpu: compiled, run, exported and loaded, their
integers the host's; a device that fails surfaces as umahub's error."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h
from simnpu_models import host_hub, quantized_model, simnpu_hub

import umahub
import umahub.models as zoo
from umahub.errors import ExecutionError
from umahub.runtime import devices


def _zoo_inputs(name: str) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s.shape).astype(s.dtype) for s in zoo.inputs(name)]


def test_cnn_int8_compiled_exported_and_loaded_gives_the_hosts_numbers(tmp_path):
    mod, xs = zoo.get("cnn_int8"), _zoo_inputs("cnn_int8")
    want = host_hub().compile(mod).run(*xs)
    compiled = simnpu_hub().compile(mod)
    placed = {p.device for p in compiled.report.placement}
    assert {"simnpu:0", "simnpu:1"} <= placed
    assert np.array_equal(compiled.run(*xs), want)
    path = compiled.export_library(tmp_path / "cnn_int8.so")
    loaded = umahub.load(path)
    assert np.array_equal(loaded.run(*xs), want)


def _float_net() -> onnx.ModelProto:
    """Conv+Relu, Conv, a residual Add, GlobalAveragePool, Flatten, Gemm, in float32."""
    rng = np.random.default_rng(6)
    inits = {
        "w1": rng.standard_normal((16, 3, 3, 3)).astype(np.float32) * 0.3,
        "b1": rng.standard_normal(16).astype(np.float32) * 0.1,
        "w2": rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.2,
        "b2": rng.standard_normal(16).astype(np.float32) * 0.1,
        "fw": rng.standard_normal((10, 16)).astype(np.float32) * 0.5,
        "fb": rng.standard_normal(10).astype(np.float32) * 0.1,
    }
    nodes = [
        h.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        h.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        h.make_node("Add", ["c2", "r1"], ["s"], name="add"),
        h.make_node("GlobalAveragePool", ["s"], ["p"], name="pool"),
        h.make_node("Flatten", ["p"], ["f"], name="flatten"),
        h.make_node("Gemm", ["f", "fw", "fb"], ["y"], name="fc", transB=1),
    ]
    graph = h.make_graph(
        nodes,
        "net",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])


@pytest.mark.parametrize("per_channel", [False, True])
def test_an_onnx_runtime_quantize_static_model_gives_the_hosts_numbers(tmp_path, per_channel):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Calibration(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(7)
            self.batches = iter(
                [{"x": rng.standard_normal((1, 3, 12, 12)).astype(np.float32)} for _ in range(4)]
            )

        def get_next(self):
            return next(self.batches, None)

    onnx.save(_float_net(), tmp_path / "float.onnx")
    quantize_static(
        str(tmp_path / "float.onnx"),
        str(tmp_path / "q.onnx"),
        Calibration(),
        quant_format=QuantFormat.QDQ,
        per_channel=per_channel,
    )
    model = onnx.load(tmp_path / "q.onnx")
    x = np.random.default_rng(8).standard_normal((1, 3, 12, 12)).astype(np.float32)
    want = host_hub().compile(model).run(x)
    compiled = simnpu_hub().compile(model)
    claimed = [r["device"] for r in compiled.report.quantized]
    assert claimed and all(d.startswith("simnpu:") for d in claimed), claimed
    assert np.array_equal(compiled.run(x), want)


def test_a_device_fault_is_umahubs_execution_error_naming_the_device():
    mod, inputs = quantized_model("matmul", x_shape=(2, 16))
    compiled = simnpu_hub().compile(mod)
    compiled.run(*inputs)  # the device is open and the program loaded
    device = devices.instance(devices.runtime_named("simnpu"), 0).device
    before = device.counters()["instructions"]
    device.inject_fault(after_instructions=3)
    with pytest.raises(ExecutionError, match=r"simnpu:0, partition .*fault at instruction 3"):
        compiled.run(*inputs)
    # the modules run side by side: whatever issued before instruction 3 did, nothing after
    assert before < device.counters()["instructions"] <= before + 3
    compiled.run(*inputs)  # a fault ends its run, not the device


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("fault:5@0", "simnpu:0, partition .*: running: simnpu:0: fault at instruction 5"),
        ("hang", "no completion within 1 s"),
    ],
)
def test_a_library_on_a_board_whose_device_fails(tmp_path, fault, message):
    """The exported library loaded in another process (a board) whose device the
    environment tells to fault, or to never complete a run (umahub's time limit)."""
    import os
    import re
    import subprocess
    import sys
    import textwrap

    mod, (x,) = quantized_model("matmul", x_shape=(2, 16))
    path = simnpu_hub().compile(mod).export_library(tmp_path / "m.so")
    np.save(tmp_path / "x.npy", x)
    code = f"""
        import numpy as np
        import umahub
        from umahub.runtime import devices
        from umahub_simnpu_runtime import SimNpuRuntime
        devices.register_runtime(SimNpuRuntime())  # as its entry point would give it
        model = umahub.load({str(path)!r})
        try:
            model.run(np.load({str(tmp_path / "x.npy")!r}))
        except umahub.errors.ExecutionError as exc:
            print(exc)
        """
    env = {**os.environ, "UMAHUB_SIMNPU_FAULT": fault, "UMAHUB_DEVICE_TIMEOUT": "1"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert re.search(message, done.stdout), done.stdout + done.stderr
