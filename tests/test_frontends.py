"""PyTorch and ONNX as inputs: ``to_relax``, operator names from the source model, pins, CLI."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import umahub
from umahub.errors import UmahubError
from umahub.frontends import load_model, to_relax

# apache-tvm 0.25's PyTorch frontend drops the spans that name the operators:
# models import there with TVM's variable names (lv, lv1...), as the docs say.
# (ONNX models keep their names on every TVM.)
names_kept = pytest.mark.skipif(
    __import__("tvm").__version__.startswith("0.25"),
    reason="apache-tvm 0.25's PyTorch frontend keeps no operator names",
)

BUNDLED = {"plugins": ["npu", "vanilla", "dsp"]}


@pytest.fixture(scope="module")
def hub():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return umahub.Hub(config=BUNDLED, project_config=False)


def operators(mod) -> list[tuple[str, str]]:
    """(variable name, op) of main's operator calls, in order."""
    import tvm

    from umahub._tvm import name_of

    found = []
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            if hasattr(b.value, "op") and isinstance(b.value.op, tvm.ir.Op):
                span = b.value.span
                assert span is not None and str(span.source_name.name) == name_of(b.var)
                found.append((name_of(b.var), b.value.op.name))
    return found


def cli(*args, cwd):
    """Run ``umahub ARGS`` in ``cwd``, with the bundled plugins unless a pyproject says else."""
    if not (cwd / "pyproject.toml").exists():
        (cwd / "pyproject.toml").write_text('[tool.umahub]\nplugins = ["npu", "vanilla", "dsp"]\n')
    return subprocess.run(
        [sys.executable, "-m", "umahub", *args], capture_output=True, text=True, cwd=cwd
    )


# ---------------------------------------------------------------------------- ONNX


def onnx_cnn():
    """Conv 'stem' (3->8, bias), Relu 'act', Conv 'body' (8->8, bias), an unnamed Relu
    whose output is 'body_out', Flatten 'flat', Gemm 'head'."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = {
        "w1": rng.standard_normal((8, 3, 3, 3)),
        "b1": rng.standard_normal(8),
        "w2": rng.standard_normal((8, 8, 3, 3)) * 0.3,
        "b2": rng.standard_normal(8),
        "wf": rng.standard_normal((10, 8 * 8 * 8)) * 0.1,
        "bf": rng.standard_normal(10),
    }
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1", "b1"], ["s"], name="stem", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["s"], ["a"], name="act"),
            helper.make_node("Conv", ["a", "w2", "b2"], ["c"], name="body", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["body_out"]),
            helper.make_node("Flatten", ["body_out"], ["f"], name="flat"),
            helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], name="head", transB=1),
        ],
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        initializer=[numpy_helper.from_array(v.astype("float32"), k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model, weights


def onnx_reference(weights, x):
    """The ONNX CNN in numpy."""

    def conv(x, w, b):
        padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
        out = np.zeros((1, w.shape[0], 8, 8))
        for i in range(8):
            for j in range(8):
                out[0, :, i, j] = np.tensordot(w, padded[0, :, i : i + 3, j : j + 3], 3)
        return out + b[None, :, None, None]

    h = np.maximum(conv(x, weights["w1"], weights["b1"]), 0)
    h = np.maximum(conv(h, weights["w2"], weights["b2"]), 0)
    return h.reshape(1, -1) @ weights["wf"].T + weights["bf"]


def test_onnx_operators_are_named_after_their_nodes():
    model, _ = onnx_cnn()
    ops = operators(to_relax(model))
    names = [n for n, _ in ops]
    assert not [n for n in names if n.startswith("lv")]
    assert list(dict.fromkeys(names)) == ["stem", "act", "body", "body_out", "flat", "head"]
    # a node that becomes several operators names all of them
    assert ("head", "relax.matmul") in ops and ("head", "relax.add") in ops
    assert ("body", "relax.nn.conv2d") in ops and ("body", "relax.add") in ops
    assert ("body_out", "relax.nn.relu") in ops  # unnamed node: its first output


def test_an_onnx_node_read_by_two_nodes_is_computed_once(hub):
    """A ResNet's max pooling feeds a convolution and a residual add. TVM's
    converters hand such an output on as an unbound call; it is bound once,
    not once per reader (it was, and the pooling then ran twice: on the npu
    in one partition and again in another)."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(1).standard_normal((8, 8, 3, 3)).astype("float32") * 0.2
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"], name="act"),
            helper.make_node(
                "MaxPool", ["r"], ["p"], name="pool", kernel_shape=[3, 3], pads=[1, 1, 1, 1]
            ),
            helper.make_node("Conv", ["p", "w"], ["c"], name="body", pads=[1, 1, 1, 1]),
            helper.make_node("Add", ["c", "p"], ["y"], name="residual"),
        ],
        "shared",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ops = [op for _, op in operators(to_relax(model))]
    assert ops.count("relax.nn.max_pool2d") == 1 and ops.count("relax.nn.relu") == 1
    compiled = hub.compile(model)
    pools = [o for o in compiled.report.placement if o.op == "relax.nn.max_pool2d"]
    assert [(o.name, o.device) for o in pools] == [("pool", "npu:0")]
    x = np.random.default_rng(2).standard_normal((1, 8, 8, 8)).astype("float32")
    r = np.pad(np.maximum(x, 0), ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    p = np.max([r[:, :, i : i + 8, j : j + 8] for i in range(3) for j in range(3)], axis=0)
    pp = np.pad(p, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(pp, (3, 3), (2, 3))
    c = np.einsum("oikl,nihwkl->nohw", w, windows)
    np.testing.assert_allclose(compiled.run(x), c + p, rtol=1e-5, atol=1e-5)


def onnx_conv_clip(lo, hi):
    """Conv 'body' (8->8) then Clip 'act' with constant bounds ``lo``, ``hi`` (None: absent)."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(1).standard_normal((8, 8, 1, 1)).astype("float32") * 3
    bounds = {"lo": lo, "hi": hi}
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], name="body"),
            helper.make_node(
                "Clip",
                ["c", "lo" if lo is not None else "", "hi" if hi is not None else ""],
                ["y"],
                name="act",
            ),
        ],
        "clipped",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4, 4])],
        initializer=[numpy_helper.from_array(w, "w")]
        + [numpy_helper.from_array(np.float32(v), k) for k, v in bounds.items() if v is not None],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(2).standard_normal((1, 8, 4, 4)).astype("float32")
    return model, x, np.einsum("oi,nihw->nohw", w[:, :, 0, 0], x)


@pytest.mark.parametrize(
    "lo, hi, expected",
    [
        (0.0, 6.0, lambda c: np.clip(c, 0, 6)),  # ReLU6, as exporters write it
        (None, 1.0, lambda c: np.minimum(c, 1)),
        (float("nan"), 1.0, lambda c: np.minimum(c, 1)),  # a NaN bound is no bound
    ],
)
def test_an_onnx_clip_with_constant_bounds_is_relax_clip(hub, lo, hi, expected):
    """TVM's converter makes Clip two PrimFuncs of its own, which no pattern sees:
    MobileNets' ReLU6 from ONNX ran on the host, apart from their convolutions."""
    model, x, conv = onnx_conv_clip(lo, hi)
    ops = [op for _, op in operators(to_relax(model))]
    assert "relax.clip" in ops and "relax.call_tir" not in ops
    compiled = hub.compile(model)
    placed = {o.name: o.device for o in compiled.report.placement}
    assert placed == {"body": "npu:0", "act": "npu:0"}
    np.testing.assert_allclose(compiled.run(x), expected(conv), rtol=1e-5, atol=1e-5)


def test_an_onnx_clip_whose_min_exceeds_its_max_gives_max_as_onnx_defines(hub):
    model, x, _ = onnx_conv_clip(2.0, 1.0)
    np.testing.assert_array_equal(hub.compile(model).run(x), np.ones_like(x))


def test_a_pin_by_onnx_node_name_places_that_node_and_the_report_names_it(hub):
    model, weights = onnx_cnn()
    compiled = hub.compile(model, placement={"body": "vanilla_accel", "stem": "host"})
    rows = compiled.report.placement
    body = [o for o in rows if o.name == "body"]
    assert {o.op for o in body} >= {"relax.nn.conv2d", "relax.add"}
    assert all(o.pinned == "body" for o in body)
    assert {o.device for o in body if o.op != "relax.reshape"} == {"vanilla_accel:0"}
    # the unnamed ReLU after it goes with it: the vanilla kernel bounds what it stores
    assert {o.name for o in rows if o.device.startswith("vanilla")} == {"body", "body_out"}
    assert {o.device for o in rows if o.name == "stem"} == {"host"}
    assert [o.device for o in rows if o.name == "head" and o.op == "relax.matmul"] == ["npu:0"]
    assert "body" in str(compiled.report) and "(pinned by 'body')" in str(compiled.report)
    # the reshape of the node's bias stays on the host without a warning: the node is placed
    assert compiled.report.notes == []
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype("float32")
    np.testing.assert_allclose(compiled.run(x), onnx_reference(weights, x), rtol=1e-4, atol=1e-4)


def test_explain_takes_an_onnx_model(hub):
    model, _ = onnx_cnn()
    report = hub.explain(model)
    assert "head" in {o.name for o in report.placement}


@pytest.mark.parametrize(
    "thing, named",
    [
        ("model.onnx", "builtins.str"),
        (42, "builtins.int"),
        (np.zeros(3), "numpy.ndarray"),
    ],
)
def test_what_is_not_a_model_is_refused_naming_its_type_and_what_is_accepted(hub, thing, named):
    with pytest.raises(UmahubError) as info:
        hub.compile(thing)
    message = str(info.value)
    assert f"cannot compile a {named}" in message
    assert "torch.export.ExportedProgram" in message and "onnx.ModelProto" in message
    assert "Relax tvm.IRModule" in message


def test_importing_umahub_imports_neither_torch_nor_onnx():
    code = textwrap.dedent("""
        import sys
        import umahub, umahub.frontends, umahub.cli
        print(sorted(m for m in ("torch", "onnx") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_damaged_onnx_file_is_one_clear_line(tmp_path):
    pytest.importorskip("onnx")
    (tmp_path / "broken.onnx").write_bytes(b"\x08\x07not a protobuf at all\xff\xff")
    result = cli("explain", "broken.onnx", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("umahub: error: broken.onnx: not a readable ONNX model")


@pytest.mark.slow  # a new process importing PyTorch: several seconds
def test_a_damaged_pt2_file_is_one_clear_line(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "broken.pt2").write_bytes(b"PK\x03\x04 this is no archive")
    result = cli("compile", "broken.pt2", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(
        "umahub: error: broken.pt2: not a readable torch.export program"
    )


def test_a_pt2_file_without_torch_says_what_to_install(tmp_path):
    (tmp_path / "model.pt2").write_bytes(b"")
    code = (
        "import sys; sys.modules['torch'] = None; "  # as if PyTorch were not installed
        "from umahub.cli import main; sys.exit(main(['explain', 'model.pt2']))"
    )
    (tmp_path / "pyproject.toml").write_text('[tool.umahub]\nplugins = ["npu"]\n')
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "umahub: error: model.pt2: reading a torch.export program needs PyTorch: "
        "pip install 'umahub[torch]'"
    )


def test_load_model_names_a_missing_file(tmp_path):
    with pytest.raises(UmahubError, match=r"^nothere\.pt2: no such file$"):
        load_model("nothere.pt2")


# ---------------------------------------------------------------------------- PyTorch


def torch_net():
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(8, 8, 3, padding=1)
            self.relu = nn.ReLU()

        def forward(self, x):
            return self.relu(self.conv(x)) + x

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, padding=1)
            self.block = Block()
            self.head = nn.Linear(8 * 8 * 8, 10)

        def forward(self, x):
            x = self.block(torch.relu(self.stem(x)))
            return self.head(torch.flatten(x, 1))

    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return net, x, torch.export.export(net, (x,))


@names_kept
def test_pytorch_operators_are_named_after_their_layers():
    _, _, program = torch_net()
    ops = operators(to_relax(program))
    names = list(dict.fromkeys(n for n, _ in ops))
    assert names == ["stem", "relu", "block.conv", "block.relu", "block.add", "flatten", "head"]
    assert {op for n, op in ops if n == "head"} >= {"relax.matmul", "relax.add"}


@names_kept
def test_a_pin_by_pytorch_layer_places_that_layer_and_the_report_names_it(hub, tmp_path):
    torch = pytest.importorskip("torch")
    net, x, program = torch_net()
    compiled = hub.compile(program, placement={"block.conv": "vanilla_accel", "stem": "host"})
    rows = compiled.report.placement
    # the layer's ReLU goes with it: the vanilla kernel bounds what it stores
    assert {o.name for o in rows if o.device.startswith("vanilla")} == {"block.conv", "block.relu"}
    conv = [o for o in rows if o.name == "block.conv" and o.op == "relax.nn.conv2d"]
    assert [(o.device, o.pinned) for o in conv] == [("vanilla_accel:0", "block.conv")]
    assert "(pinned by 'block.conv')" in str(compiled.report)
    with torch.no_grad():
        expected = net(x).numpy()
    np.testing.assert_allclose(compiled.run(x.numpy()), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # a new process importing PyTorch: several seconds
def test_cli_explains_a_pt2_file_with_layer_names(tmp_path):
    torch = pytest.importorskip("torch")
    _, _, program = torch_net()
    torch.export.save(program, tmp_path / "net.pt2")
    (tmp_path / "pyproject.toml").write_text(
        '[tool.umahub]\nplugins = ["npu", "vanilla", "dsp"]\n'
        '[tool.umahub.placement]\n"block.*" = "host"\n'
    )
    result = cli("explain", "net.pt2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "block.conv" in result.stdout and "(pinned by 'block.*')" in result.stdout
