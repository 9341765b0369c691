"""``umahub compile``, ``run`` and ``explain`` as a user runs them: zoo, TVMScript, ONNX."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import host_reference

import umahub.models as zoo


def umahub_cli(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "umahub", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
    )


#: A TVMScript model: x -> relu (a) -> sigmoid (b).
RELU_SIGMOID = textwrap.dedent("""
    import tvm
    from tvm.script import relax as R

    @tvm.script.ir_module
    class Module:
        @R.function
        def main(x: R.Tensor((2, 8), "float32")) -> R.Tensor((2, 8), "float32"):
            with R.dataflow():
                a = R.nn.relu(x)
                b = R.sigmoid(a)
                R.output(b)
            return b
""")


@pytest.fixture
def project(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.umahub]\nplugins = ["alpha", "beta"]\n')
    return tmp_path


def test_compile_then_run_a_zoo_model(project):
    result = umahub_cli("compile", "cnn", "-o", "cnn.so", "--report", "report.json", cwd=project)
    assert result.returncode == 0, result.stderr
    assert re.search(r"^\[umahub +\d+\.\ds\] partition$", result.stderr, re.M)  # progress
    assert "wrote cnn.so" in result.stdout
    report = json.loads((project / "report.json").read_text())
    assert {o["device"] for o in report["placement"]} >= {"host", "alpha_accel:0"}
    np.savez(project / "x.npz", *zoo.inputs("cnn"))
    result = umahub_cli("run", "cnn.so", "--inputs", "x.npz", "-o", "y.npz", cwd=project)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("output 0: shape (1, 10) dtype float32")
    with np.load(project / "y.npz") as y:
        np.testing.assert_allclose(y["arr_0"], host_reference("cnn"), rtol=1e-5, atol=1e-5)


def test_explain_and_compile_print_the_report_as_json_alone_for_scripts(project):
    explained = umahub_cli("explain", "mlp", "--json", "-", cwd=project)
    assert explained.returncode == 0, explained.stderr
    report = json.loads(explained.stdout)
    assert report["format"] == 1 and report["built"] is False
    assert [o["name"] for o in report["placement"]][:2] == ["fc1", "fc1_bias_add"]
    compiled = umahub_cli(
        "compile", "mlp", "-o", "mlp.so", "--report", "-", "--report-format", "json", cwd=project
    )
    assert compiled.returncode == 0, compiled.stderr
    built = json.loads(compiled.stdout)
    assert built["built"] is True and built["placement"] == report["placement"]
    wrong = umahub_cli("compile", "mlp", "--report-format", "json", cwd=project)
    assert wrong.stderr.strip().splitlines()[-1] == (
        "umahub: error: --report-format says how --report - prints the report: give --report - "
        "too (a --report FILE is always JSON)"
    )


def test_explain_a_tvmscript_file_and_draw_it(project):
    (project / "model.py").write_text(RELU_SIGMOID)
    result = umahub_cli("explain", "model.py", "--out", "graph.html", cwd=project)
    assert result.returncode == 0, result.stderr
    assert "  a     relax.nn.relu  alpha_accel:0  alpha_accel.relu" in result.stdout
    picture = (project / "graph.html").read_text()
    assert "<svg" in picture
    assert "<title>model.py: umahub placement and timeline</title>" in picture  # the model's name


def test_unknown_model_is_one_clear_line(project):
    result = umahub_cli("compile", "resnet", cwd=project)
    assert result.returncode == 2
    assert result.stderr.strip().endswith(
        "umahub: error: unknown model 'resnet' (did you mean 'resnet18'?); known: bert, bert2, "
        "bert2_int8, bert_int8, cnn, cnn_int8, mlp, mlp_int8, mobilenetv2, mobilenetv2_int8, "
        "resnet18, resnet18_int8; or give a .py (TVMScript), .onnx or .pt2 (torch.export) file"
    )


def test_compile_an_onnx_model(project):
    onnx = pytest.importorskip("onnx", reason="reading ONNX needs the optional 'onnx' package")
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((8, 4)).astype("float32")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), project / "tiny.onnx"
    )
    result = umahub_cli("compile", "tiny.onnx", "-o", "tiny.so", cwd=project)
    assert result.returncode == 0, result.stderr
    x = np.random.default_rng(1).standard_normal((2, 8)).astype("float32")
    np.savez(project / "x.npz", x)
    assert (
        umahub_cli("run", "tiny.so", "--inputs", "x.npz", "-o", "y.npz", cwd=project).returncode
        == 0
    )
    with np.load(project / "y.npz") as y:
        np.testing.assert_allclose(y["arr_0"], np.maximum(x @ w, 0), rtol=1e-5, atol=1e-5)


def test_compile_with_verify_reports_each_partition(project):
    result = umahub_cli(
        "compile", "mlp", "-o", "mlp.so", "--verify", "--report", "r.json", cwd=project
    )
    assert result.returncode == 0, result.stderr
    assert re.search(r"^\[umahub +\d+\.\ds\] verify$", result.stderr, re.M)
    report = json.loads((project / "r.json").read_text())
    verified = [p["verified"] for p in report["partitions"]]
    assert verified and all(v.startswith("largest error ") for v in verified)
    assert all(p["max_error"] <= 1e-4 for p in report["partitions"])
    assert f"verify: {len(verified)} right\n" in result.stdout  # the summary


def test_explain_auto_prints_the_choice_by_cost(project):
    (project / "model.py").write_text(RELU_SIGMOID)
    result = umahub_cli("explain", "model.py", "--auto", cwd=project)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "placement by cost:" in text
    assert re.search(
        r"^ +[\d.]+ ms  priority alpha_accel > beta_accel +\(configured\)$", text, re.M
    )
    assert re.search(r"^  costs: plugin 0, measured \d+, cached 0, none 0; cache ", text, re.M)
    again = umahub_cli("explain", "model.py", "--auto", cwd=project)
    assert re.search(
        r"^  costs: plugin 0, measured 0, cached \d+, none 0; cache ", again.stdout, re.M
    )
