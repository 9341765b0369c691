"""Never worse than plain TVM: models that ``tvm.compile`` handles go through umahub.

One test (or a few) per class of failure found on material nobody here wrote
(the ONNX node tests, torchvision through ``torch.export``): module functions
called from ``main``, partitions with several outputs, symbolic and
data-dependent shapes, 0-d inputs, modules where nothing matched or that
hold control flow, and generated C with infinities. Each compares with plain
``tvm.compile`` on the host.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import umahub
from umahub._tvm import TensorType
from umahub.errors import CompileError, UmahubError

BUNDLED = {"plugins": ["npu", "vanilla", "dsp"]}
TOL = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(scope="module")
def hub():
    return umahub.Hub(config=BUNDLED, project_config=False)


def plain(mod, *arrays):
    """The outputs of plain ``tvm.compile`` on the host."""
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in arrays])
    return out.numpy() if hasattr(out, "numpy") else [o.numpy() for o in out]


def devices(compiled):
    return {o.name: o.device for o in compiled.report.placement}


def quiet_compile(hub, mod, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hub.compile(mod, **options)


# ------------------------------------------------------- 1. functions of the input module


def _with_prim_func():
    """What TVM's ONNX importer makes of Conv with auto_pad: main calls a PrimFunc "pad"."""
    from tvm import topi

    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((1, 8, 6, 6), "float32"))
    w = relax.Var("w", TensorType((8, 8, 3, 3), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            r = bb.emit(relax.op.nn.relu(x), "r")
            p = bb.emit_te(topi.nn.pad, r, [0, 0, 1, 1], [0, 0, 1, 1], primfunc_name_hint="pad")
            y = bb.emit(relax.op.nn.conv2d(p, w), "y")
            z = bb.emit_output(relax.op.nn.relu(y), "z")
        bb.emit_func_output(z)
    return bb.get()


def test_functions_that_main_calls_are_kept(hub):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 8, 6, 6)).astype("float32")
    w = rng.standard_normal((8, 8, 3, 3)).astype("float32")
    mod = _with_prim_func()
    assert "pad" in [gv.name_hint for gv in mod.get_global_vars()]
    compiled = quiet_compile(hub, mod)
    assert devices(compiled)["y"] == "npu:0"  # the convolution after the module's own pad
    np.testing.assert_allclose(compiled.run(x, w), plain(mod, x, w), **TOL)


# ------------------------------------------------------- 2. a partition with several outputs


def _shared_square():
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            n0 = bb.emit(relax.op.multiply(x, x), "n0")
            n1 = bb.emit(relax.op.nn.relu(n0), "n1")
            n2 = bb.emit(relax.op.exp(n0), "n2")
            n3 = bb.emit_output(relax.op.add(n1, n2), "n3")
        bb.emit_func_output(n3)
    return bb.get()


def test_a_value_computed_inside_a_partition_and_read_outside(hub):
    mod = _shared_square()
    x = np.random.default_rng(1).standard_normal((4, 8)).astype("float32")
    # The DSP does not take exp: the partition of n0 and n1 also returns n0, for the host.
    compiled = quiet_compile(hub, mod, placement={"n0": "dsp_cpu:0", "n1": "dsp_cpu:0"})
    assert devices(compiled) == {
        "n0": "dsp_cpu:0",
        "n1": "dsp_cpu:0",
        "n2": "host",
        "n3": "dsp_cpu:0",
    }
    assert [p.symbol for p in compiled.report.partitions] == [
        "dsp_cpu_0_multiply_relu",
        "dsp_cpu_1_add",
    ]
    np.testing.assert_allclose(compiled.run(x), plain(mod, x), **TOL)


def test_the_smallest_multi_output_graph_with_the_default_config(hub):
    mod = _shared_square()
    x = np.random.default_rng(2).standard_normal((4, 8)).astype("float32")
    compiled = quiet_compile(hub, mod)
    # The DSP takes multiply and relu (one partition that also returns n0), not exp.
    assert devices(compiled) == {
        "n0": "dsp_cpu:0",
        "n1": "dsp_cpu:0",
        "n2": "host",
        "n3": "dsp_cpu:1",
    }
    np.testing.assert_allclose(compiled.run(x), plain(mod, x), **TOL)
    assert [o.name for o in hub.explain(mod).placement] == ["n0", "n1", "n2", "n3"]


def test_a_multi_output_partition_feeding_another_accelerator(hub):
    mod = _shared_square()
    x = np.random.default_rng(3).standard_normal((4, 8)).astype("float32")
    pins = {"n0": "dsp_cpu:1", "n1": "dsp_cpu:1", "n2": "host", "n3": "dsp_cpu:0"}
    compiled = quiet_compile(hub, mod, placement=pins)
    assert devices(compiled) == pins
    np.testing.assert_allclose(compiled.run(x), plain(mod, x), **TOL)


# ------------------------------------------------------- 3. symbolic and data-dependent shapes


def _dynamic_batch(bound=None):
    n = tvm.tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((n, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.relu(x), "a")
            b = bb.emit(relax.op.add(a, a), "b")
            c = bb.emit_output(relax.op.sigmoid(b), "c")
        bb.emit_func_output(c)
    mod = bb.get()
    if bound is not None:
        main = mod["main"].with_attr("tir_var_upper_bound", {"n": bound})
        mod = tvm.IRModule({"main": main})
    return mod


def test_a_symbolic_batch_compiles_and_runs_at_any_size(hub):
    mod = _dynamic_batch()
    compiled = quiet_compile(hub, mod)
    for batch in (1, 3, 7):
        x = np.random.default_rng(batch).standard_normal((batch, 16)).astype("float32")
        np.testing.assert_allclose(compiled.run(x), plain(mod, x), **TOL)
    assert compiled.input_info == [(("n", 16), "float32")]
    # A size the DSP's memory check cannot know: it does not claim, and the report says why.
    assert set(devices(compiled).values()) == {"host"}
    assert compiled.report.notes == [
        "sizes n are known only at run time: pattern checks count tensors of those sizes as "
        "unbounded (umahub.plugin.memory.UNBOUNDED) and memory pools plan the tensors of static "
        "shape only; bound the sizes with main's tir_var_upper_bound attribute to place and "
        "check them"
    ]
    with pytest.raises(UmahubError, match=r"input 0: expected shape \('n', 16\) float32"):
        compiled.run(np.zeros((2, 3), "float32"))


def test_a_bounded_symbolic_batch_is_placed_and_planned_by_its_bound(hub):
    mod = _dynamic_batch(bound=8)
    compiled = quiet_compile(hub, mod)
    assert set(devices(compiled).values()) == {"dsp_cpu:0"}
    pool = next(p for p in compiled.report.memory.pools if p.device == "dsp_cpu:0")
    # relu, add and sigmoid outputs plus the input, 8 x 16 float32 each at the bound
    assert pool.used == 4 * 8 * 16 * 4
    assert compiled.report.notes == []
    x = np.random.default_rng(5).standard_normal((5, 16)).astype("float32")
    np.testing.assert_allclose(compiled.run(x), plain(mod, x), **TOL)


def _match_cast():
    """A size defined inside main by a match_cast, as ONNX's Unsqueeze, Tile or Expand make
    when their axes, repeats or shape come from a tensor."""
    n, m = tvm.tirx.Var("n", "int64"), tvm.tirx.Var("m", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((n, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            r = bb.emit(relax.op.nn.relu(x), "r")
            c = bb.match_cast(r, TensorType((m, 4), "float32"), "c")
            e = bb.emit(relax.op.exp(c), "e")
            z = bb.emit_output(relax.op.add(e, c), "z")
        bb.emit_func_output(z)
    return bb.get()


def test_a_size_defined_by_a_match_cast_survives_partitioning(hub):
    mod = _match_cast()
    x = np.random.default_rng(6).standard_normal((3, 4)).astype("float32")
    compiled = quiet_compile(hub, mod, placement={"r": "dsp_cpu", "e": "dsp_cpu"})
    np.testing.assert_allclose(compiled.run(x), plain(mod, x), **TOL)


# ------------------------------------------------------- 4. 0-d inputs


def _scalar_model():
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((), "float32"))
    y = relax.Var("y", TensorType((4,), "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.relu(x), "a")
            b = bb.emit_output(relax.op.multiply(y, a), "b")
        bb.emit_func_output(b)
    return bb.get()


def test_a_scalar_input_stays_a_scalar(hub, tmp_path):
    mod = _scalar_model()
    x, y = np.array(1.5, "float32"), np.arange(4, dtype="float32")
    compiled = quiet_compile(hub, mod)
    assert compiled.input_info == [((), "float32"), ((4,), "float32")]
    np.testing.assert_allclose(compiled.run(x, y), plain(mod, x, y), **TOL)
    loaded = umahub.load(compiled.export_library(tmp_path / "scalar.so"))
    np.testing.assert_allclose(loaded.run(x, y), y * 1.5, **TOL)


# ------------------------------------------------------- 5. nothing matched; control flow


@I.ir_module
class WithIf:
    @R.function
    def main(c: R.Tensor((), "bool"), x: R.Tensor((4, 8), "float32")):
        with R.dataflow():
            a = R.nn.relu(x)
            R.output(a)
        if c:
            b = R.exp(a)
            r = R.add(b, a)
        else:
            r = R.multiply(a, a)
        return r


@pytest.mark.parametrize("flag", [True, False])
def test_control_flow_in_main(hub, flag):
    x = np.random.default_rng(7).standard_normal((4, 8)).astype("float32")
    c = np.array(flag)
    compiled = quiet_compile(hub, WithIf)
    np.testing.assert_allclose(compiled.run(c, x), plain(WithIf, c, x), **TOL)
    assert devices(compiled)["a"] == "dsp_cpu:0"


def test_a_model_no_accelerator_claims_compiles_like_plain_tvm(hub):
    mod = WithIf
    x = np.random.default_rng(8).standard_normal((4, 8)).astype("float32")
    compiled = quiet_compile(hub, mod, placement={"*": "host"})
    assert set(devices(compiled).values()) == {"host"}
    c = np.array(True)
    np.testing.assert_allclose(compiled.run(c, x), plain(mod, c, x), **TOL)


# ------------------------------------------------------- 6. generated C


def _clips():
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.clip(x, 0.0, math.inf), "hardswish_clip")
            b = bb.emit(relax.op.clip(x, -math.inf, 0.5), "low_clip")
            c = bb.emit_output(relax.op.add(a, b), "sum")
        bb.emit_func_output(c)
    return bb.get()


def test_infinite_clip_bounds_compile_as_c(hub):
    mod = _clips()
    x = np.random.default_rng(9).standard_normal((4, 8)).astype("float32")
    hub_error = umahub.Hub(config={**BUNDLED, "on-error": "error"}, project_config=False)
    compiled = hub_error.compile(mod, placement={"*": "dsp_cpu:0"})
    assert set(devices(compiled).values()) == {"dsp_cpu:0"}
    np.testing.assert_allclose(compiled.run(x), plain(mod, x), **TOL)


def test_special_floats_are_written_as_c():
    from umahub.compiler.codegen import c_special_floats

    source = (
        'y = (v) < (inff) ? v : -inff; z = nanf + inf * nan; s = "inf"; w = nanf(""); q = infx;'
    )
    assert c_special_floats(source) == (
        "y = (v) < (INFINITY) ? v : -INFINITY; z = NAN + ((double)INFINITY) * ((double)NAN); "
        's = "inf"; w = nanf(""); q = infx;'
    )


class BrokenC:
    """A plugin whose codegen returns C that no compiler takes."""

    UMAHUB_API = 1

    @umahub.hookimpl
    def umahub_accelerators(self):
        return [umahub.Accelerator("broken_c", codegen="c")]

    @umahub.hookimpl
    def umahub_patterns(self, accelerator):
        from tvm.relax.dpl import is_op, wildcard

        if accelerator.name == "broken_c":
            return [("broken_c.relu", is_op("relax.nn.relu")(wildcard()))]
        return None

    @umahub.hookimpl
    def umahub_codegen(self, accelerator, module, context):
        create = tvm.get_global_func("runtime.CSourceModuleCreate")
        source = f"int {context.symbol}(void) {{ return undeclared_name; }}\n"
        return create(source, "c", [context.symbol], [])


def test_c_that_does_not_compile_falls_back_at_compile_time():
    from graphs import chain

    mod = chain(ops=("relu", "sigmoid"))
    x = np.random.default_rng(10).standard_normal((4, 16)).astype("float32")
    hub = umahub.Hub(config={}, autoload=False, plugins=[BrokenC()], project_config=False)
    with pytest.warns(umahub.UmahubWarning, match="the generated C does not compile"):
        compiled = hub.compile(mod)
    assert devices(compiled) == {"n0": "host", "n1": "host"}
    (note,) = compiled.report.notes
    assert note.startswith(
        "plugin 'BrokenC' failed in umahub_codegen for partition broken_c_0_relu "
        "(broken_c.relu) on broken_c:0: CompileError: the generated C does not compile:"
    )
    assert "undeclared_name" in note
    np.testing.assert_allclose(compiled.run(x), plain(mod, x), **TOL)
    strict = umahub.Hub(
        config={"on-error": "error"}, autoload=False, plugins=[BrokenC()], project_config=False
    )
    with pytest.raises(CompileError, match="undeclared_name"):
        strict.compile(mod)


def test_a_shape_output_is_an_int64_array(hub):
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((2, 3), "float32"))
    with bb.function("main", [x]):
        bb.emit_func_output(relax.ShapeExpr([]))
    out = quiet_compile(hub, bb.get()).run(np.zeros((2, 3), "float32"))
    assert out.dtype == np.int64 and out.shape == (0,)


# ------------------------------------------------------- overlapping matches


def _conv_read_by_two_adds():
    """A convolution read by two adds: two "conv2d + bias" matches share the convolution."""
    rng = np.random.default_rng(11)
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((1, 8, 6, 6), "float32"))
    w = relax.const(rng.standard_normal((8, 8, 3, 3)).astype("float32"))
    b = relax.const(rng.standard_normal((1, 8, 6, 6)).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            n0 = bb.emit(relax.op.nn.conv2d(x, w, padding=1), "n0")
            n1 = bb.emit(relax.op.add(n0, b), "n1")
            n2 = bb.emit(relax.op.add(x, n0), "n2")
            out = bb.emit_output(relax.Tuple([n1, n2]), "out")
        bb.emit_func_output(out)
    return bb.get()


def test_a_convolution_read_by_two_adds_is_in_one_match_only(hub):
    mod = _conv_read_by_two_adds()
    x = np.random.default_rng(12).standard_normal((1, 8, 6, 6)).astype("float32")
    compiled = quiet_compile(hub, mod)
    # First claimant wins: one "conv2d + bias" partition; the other add goes on to
    # the DSP, not into a "conv2d + bias" composite without its convolution (which
    # TVM's FuseOpsByPattern made of it).
    assert [(o.name, o.device, o.pattern) for o in compiled.report.placement] == [
        ("n0", "npu:0", "npu.conv2d_bias"),
        ("n1", "npu:0", "npu.conv2d_bias"),
        ("n2", "dsp_cpu:0", "dsp_cpu.add"),
    ]
    for got, want in zip(compiled.run(x), plain(mod, x)):
        np.testing.assert_allclose(got, want, **TOL)
