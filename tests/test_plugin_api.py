"""``umahub.plugin``: the one package a plugin imports, its pattern factories and TIR helpers,
and the old module paths that still lead to the moved modules."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys

import pytest

import umahub
import umahub.plugin as up


def test_importing_the_plugin_api_imports_no_tvm():
    code = (
        "import sys, umahub.plugin as up\n"
        "up.hookimpl, up.Accelerator, up.epilogues, up.human_size\n"
        "print(sorted(m for m in sys.modules if m == 'tvm' or m.startswith('tvm.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_name_of_the_plugin_api_resolves_and_is_documented():
    assert len(up.__all__) == len(set(up.__all__))
    missing = [name for name in up.__all__ if getattr(up, name, None) is None]
    assert missing == []
    undocumented = [name for name in up.__all__ if name not in (up.__doc__ or "")]
    assert undocumented == []
    assert set(up.__all__) <= set(dir(up))


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(
        AttributeError, match=re.escape("module 'umahub.plugin' has no attribute 'nope'")
    ):
        up.nope  # noqa: B018


def test_the_markers_are_the_ones_the_user_api_exports():
    assert up.hookimpl is umahub.hookimpl
    assert up.Accelerator is umahub.Accelerator
    assert up.Refusal is umahub.Refusal


# ----------------------------------------------------------------- pattern factories


def test_epilogues_are_named_and_ordered_largest_first():
    names = [p[0] for p in up.epilogues("my", "conv2d", up.conv2d(), check=None)]
    assert names == [
        "my.conv2d_bias_hswish",
        "my.conv2d_hswish",
        "my.conv2d_bias_hsigmoid",
        "my.conv2d_hsigmoid",
        "my.conv2d_bias_residual_act",
        "my.conv2d_bias_residual",
        "my.conv2d_bias_act",
        "my.conv2d_bias",
        "my.conv2d_act",
        "my.conv2d",
    ]


def _claimed(build, patterns) -> list[str]:
    """The composite names FuseOpsByPattern gives ``build``'s operators under ``patterns``."""
    from tvm import relax
    from tvm.relax.transform import FusionPattern

    fusion = [FusionPattern(name, pattern) for name, pattern, *_ in patterns]
    mod = relax.transform.FuseOpsByPattern(fusion, bind_constants=False)(build())
    return sorted(
        str(f.attrs["Composite"])
        for f in mod.functions.values()
        if f.attrs is not None and "Composite" in f.attrs
    )


def _conv(epilogue):
    from tvm import relax
    from tvm.script import relax as R

    def build():
        bb = relax.BlockBuilder()
        x = relax.Var("x", R.Tensor((1, 8, 8, 8), "float32"))
        w = relax.Var("w", R.Tensor((8, 8, 3, 3), "float32"))
        b = relax.Var("b", R.Tensor((1, 8, 1, 1), "float32"))
        with bb.function("main", [x, w, b]):
            with bb.dataflow():
                y = bb.emit(relax.op.nn.conv2d(x, w, padding=1))
                y = bb.emit(relax.op.add(y, b))
                y = epilogue(bb, y)
                out = bb.emit_output(y)
            bb.emit_func_output(out)
        return bb.get()

    return build


def _relu6(bb, y):
    from tvm import relax

    return bb.emit(relax.op.clip(y, 0.0, 6.0))


def _torch_hardswish(bb, y):
    """torch.export's hardswish: x * relu6(x + 3) / 6, the relu6 as two clips."""
    from tvm import relax

    shifted = bb.emit(relax.op.add(y, relax.const(3.0, "float32")))
    clipped = bb.emit(relax.op.clip(bb.emit(relax.op.clip(shifted, 0.0, 1e30)), -1e30, 6.0))
    gated = bb.emit(relax.op.multiply(y, clipped))
    return bb.emit(relax.op.divide(gated, relax.const(6.0, "float32")))


@pytest.mark.parametrize(
    ("epilogue", "claimed"),
    [(_relu6, "my.conv2d_bias_act"), (_torch_hardswish, "my.conv2d_bias_hswish")],
    ids=["relu6", "torch hardswish"],
)
def test_a_convolution_and_its_epilogue_are_one_match(epilogue, claimed):
    patterns = up.epilogues("my", "conv2d", up.conv2d())
    assert _claimed(_conv(epilogue), patterns) == [claimed]


def _silu(bb, y):
    from tvm import relax

    return bb.emit(relax.op.multiply(y, bb.emit(relax.op.sigmoid(y))))


def test_silu_is_an_activation_unless_it_is_left_out():
    with_silu = up.epilogues("my", "conv2d", up.conv2d())
    assert _claimed(_conv(_silu), with_silu) == ["my.conv2d_bias_act"]
    relu_only = up.epilogues(
        "my", "conv2d", up.conv2d(), activations=("relax.nn.relu",), silu=False
    )
    assert _claimed(_conv(_silu), relu_only) == ["my.conv2d_bias"]


def test_op_gives_each_operator_its_arguments():
    from tvm.relax.dpl import CallPattern

    for name, arity in (("relax.add", 2), ("relax.clip", 3), ("relax.nn.relu", 1)):
        pattern = up.op(name)
        assert isinstance(pattern, CallPattern)
        assert len(pattern.args) == arity, name


# ----------------------------------------------------------------- TIR helpers


@pytest.fixture(scope="module")
def fused():
    """relu(x) + relu(x) over a 4 x 8 tensor, lowered and fused as umahub lowers a partition."""
    from tvm import relax, tirx
    from tvm.script import relax as R

    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.relu(x))
            out = bb.emit_output(bb.emit(relax.op.add(a, a)))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    mod = relax.transform.AnnotateTIROpPattern()(mod)
    mod = relax.transform.FuseTIR()(relax.transform.FuseOps()(mod))
    (func,) = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    return func


def test_the_root_block_its_statements_and_their_nests(fused):
    import tvm

    root = up.root_block(fused)
    assert root is not None
    assert len(root.stmts) == 2
    assert [b.name_hint for b in up.blocks(fused)] == ["compute", "T_add", "root"]
    loops, realize = up.perfect_nest(root.stmts[1])
    assert (len(loops), realize.block.name_hint) == (2, "T_add")
    sch = tvm.s_tir.Schedule(fused)
    block = sch.get_child_blocks(sch.get_sblock("root"))[1]
    assert up.loop_extents(sch, sch.get_loops(block)) == [4, 8]


def test_a_loop_nest_replaced_by_a_kernel_call(fused):
    import tvm

    root = up.root_block(fused)
    x, out = (b for b in up.param_buffers(fused) if b is not None)
    (middle,) = root.block.alloc_buffers
    call = up.extern_block(
        "my_relu",
        [up.data_pointer(x), up.data_pointer(middle), tvm.tirx.const(32, "int32")],
        reads=[x],
        writes=[middle],
    )
    rewritten = up.with_root_body(fused, [call, root.stmts[1]])
    assert [b.name_hint for b in up.blocks(rewritten)] == ["my_relu", "T_add", "root"]
    source = tvm.tirx.build(rewritten.with_attr("global_symbol", "f"), target="c").inspect_source()
    assert "my_relu(" in source


def test_rewrite_replaces_every_node_of_a_kind(fused):
    from tvm import tirx

    def one(node):
        return tirx.const(1.0, "float32") if float(node.value) == 0.0 else node

    body = up.rewrite(fused.body, tirx.FloatImm, one)
    floats = [float(f.value) for f in up.nodes_in(body, tirx.FloatImm)]
    assert floats == [1.0]
    assert [float(f.value) for f in up.nodes_in(fused.body, tirx.FloatImm)] == [0.0]


def test_rewrite_takes_an_expression_as_well_as_a_statement():
    from tvm import tirx

    x, y = tirx.Var("x", "int32"), tirx.Var("y", "int32")
    three = tirx.const(3, "int32")
    out = up.rewrite(x + y * x, tirx.Var, lambda v: three if v.same_as(x) else v)
    assert isinstance(out, tirx.Add)
    assert [v.name for v in up.vars_in(out)] == ["y"]
    assert [int(c.value) for c in up.nodes_in(out, tirx.IntImm)] == [3, 3]
    # an expression holds no statement to replace
    assert isinstance(up.rewrite(x + 1, tirx.Evaluate, lambda s: tirx.Evaluate(three)), tirx.Add)


def test_static_ints_are_none_where_one_is_symbolic():
    from tvm import tirx

    three, four = tirx.IntImm("int64", 3), tirx.IntImm("int32", 4)
    assert up.static_ints([three, four]) == [3, 4]
    assert up.static_ints([three, tirx.Var("n", "int64")]) is None
    assert up.static_int(tirx.Var("n", "int64") + 1) is None


def test_with_root_body_refuses_a_function_without_a_root_block(fused):
    lowered = fused.with_body(up.root_block(fused).stmts[0])
    assert up.root_block(lowered) is None
    with pytest.raises(ValueError, match="the PrimFunc has no root block to rewrite"):
        up.with_root_body(lowered, [])


# ----------------------------------------------------------------- old module paths


def test_an_old_module_path_is_the_new_module_with_a_warning(monkeypatch):
    from umahub.plugin import hookspecs

    monkeypatch.delitem(sys.modules, "umahub.hookspecs", raising=False)
    with pytest.warns(
        DeprecationWarning,
        match=re.escape("umahub.hookspecs is now umahub.plugin.hookspecs; the old name goes away"),
    ):
        import umahub.hookspecs as old
    assert old is hookspecs
    assert old.__spec__.name == "umahub.plugin.hookspecs"


def test_an_old_name_of_a_moved_package_reaches_its_submodules(monkeypatch):
    timeline = importlib.import_module("umahub.report.picture.timeline")
    for name in ("umahub.picture", "umahub.picture.timeline"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.warns(
        DeprecationWarning,
        match=re.escape("umahub.picture.timeline is now umahub.report.picture.timeline"),
    ):
        from umahub.picture.timeline import schedule
    assert schedule is timeline.schedule


def test_the_boards_server_still_starts_under_its_old_name():
    out = subprocess.run(
        [sys.executable, "-m", "umahub.board", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: python -m umahub.boards.board")


def test_the_base_error_is_at_the_top_level_as_the_warning_is():
    from umahub.errors import CompileError, PluginFailure, UmahubError

    assert umahub.UmahubError is UmahubError
    assert issubclass(CompileError, umahub.UmahubError)
    assert issubclass(PluginFailure, umahub.UmahubError)
    assert "UmahubError" in umahub.__all__


def test_tensor_bytes_takes_an_operand_as_shape_of_does():
    import numpy as np
    from tvm import relax

    weight = relax.const(np.zeros((16, 8), "float32"))  # a constant operand of a match
    x = relax.Var("x", up.TensorType((4, 16), "int8"))
    assert (up.shape_of(weight), up.tensor_bytes(weight)) == ((16, 8), 512)
    assert up.tensor_bytes(x) == 64 == up.tensor_bytes(up.type_of(x))
    assert up.tensor_bytes(relax.Tuple([x, weight])) == 576


def test_the_old_names_module_runs_with_its_file_as_argv0():
    """``python -m umahub.board`` once ran with ``sys.argv[0] = None`` (its alias had no
    origin), and ``import tvm`` crashed on it: a board never started under its old name."""
    spec = importlib.util.find_spec("umahub.board")
    assert spec is not None and spec.origin is not None
    assert spec.origin.endswith(os.path.join("umahub", "boards", "board.py"))
