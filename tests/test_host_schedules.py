"""The host's part is fused and scheduled: by a plugin's ``umahub_host_schedule``, or umahub."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir
from tvm.script import relax as R

import umahub
from umahub.host.schedules import default_schedule


def _host_model() -> tvm.IRModule:
    """softmax, a convolution, an elementwise chain: nothing an accelerator takes here."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((1, 4, 32, 32), "float32"))
    w = relax.Var("w", R.Tensor((8, 4, 3, 3), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            s = bb.emit(relax.op.nn.softmax(x, axis=-1))
            c = bb.emit(relax.op.nn.conv2d(s, w, padding=1))
            e = bb.emit(relax.op.multiply(relax.op.sigmoid(c), c))
            out = bb.emit_output(e)
        bb.emit_func_output(out)
    return bb.get()


_FOR_KINDS = {0: "serial", 1: "parallel", 2: "vectorized", 3: "unrolled"}  # tirx.ForKind


def _kinds(sch, block) -> list[str]:
    return [_FOR_KINDS[int(sch.get(loop).kind)] for loop in sch.get_loops(block)]


def _inputs():
    rng = np.random.default_rng(0)
    return [
        rng.standard_normal((1, 4, 32, 32)).astype("float32"),
        rng.standard_normal((8, 4, 3, 3)).astype("float32"),
    ]


def _plain(mod, inputs):
    vm = tvm.relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in inputs]).numpy()


@pytest.fixture(scope="module")
def reference():
    return _plain(_host_model(), _inputs())


def test_the_host_is_fused_and_scheduled_and_computes_the_same(reference):
    compiled = umahub.Hub(autoload=False).compile(_host_model())
    # fused as TVM's CPU pipeline fuses: the softmax, a row kernel; the
    # convolution with its activation as epilogue
    assert compiled.report.host_schedules == {"rows": 1, "conv2d": 1}
    assert "host functions: 2 (conv2d 1, rows 1)" in str(compiled.report)
    np.testing.assert_allclose(compiled.run(*_inputs()), reference, rtol=1e-5, atol=1e-6)


class SoftmaxKernels:
    """A CPU vendor's plugin that schedules softmax itself and leaves the rest to umahub."""

    UMAHUB_API = 1

    @umahub.hookimpl
    def umahub_host_schedule(self, schedule, target):
        names = {
            schedule.get(b).name_hint
            for b in schedule.get_child_blocks(schedule.get_sblock("root", func_name="main"))
        }
        if "T_softmax_norm" not in names:
            return None
        for block in schedule.get_child_blocks(schedule.get_sblock("root", func_name="main")):
            outer = schedule.get_loops(block)[0]
            schedule.parallel(outer)
            break
        return "rows in parallel"


def test_a_plugin_replaces_the_host_schedule_of_the_functions_it_takes(reference):
    hub = umahub.Hub(autoload=False, plugins=[SoftmaxKernels()])
    compiled = hub.compile(_host_model())
    assert compiled.report.host_schedules == {
        "SoftmaxKernels: rows in parallel": 1,
        "conv2d": 1,
    }
    np.testing.assert_allclose(compiled.run(*_inputs()), reference, rtol=1e-5, atol=1e-6)


class Broken:
    UMAHUB_API = 1

    @umahub.hookimpl
    def umahub_host_schedule(self, schedule, target):
        raise RuntimeError("no such block")


def test_a_plugin_failing_at_the_host_schedule_is_named_and_the_default_used(reference):
    hub = umahub.Hub(autoload=False, plugins=[Broken()])
    with pytest.warns(umahub.UmahubWarning) as warned:
        compiled = hub.compile(_host_model())
    messages = [str(w.message) for w in warned]
    assert any(
        m.startswith(
            "umahub: plugin 'Broken' failed in umahub_host_schedule for the host function '"
        )
        and m.endswith("': RuntimeError: no such block; umahub's own schedule is used instead")
        for m in messages
    ), messages
    assert compiled.report.host_schedules == {"rows": 1, "conv2d": 1}
    np.testing.assert_allclose(compiled.run(*_inputs()), reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("shape", "kinds"),
    [
        ((64, 1024), ["parallel", "serial"]),  # rows in parallel; LLVM vectorizes each row
        ((4, 8, 2048), ["parallel", "serial"]),  # outer loops fused until every thread has work
        ((16, 256), ["serial"]),  # 4096 elements: one thread is faster, one run
        # short rows are one run too: LLVM's ends of 14-wide rows computed on the
        # denormals another kernel left in the registers' other lanes (6x the time)
        ((1, 96, 14, 14), ["serial"]),
    ],
)
def test_an_elementwise_chain_is_one_loop_nest_with_parallel_rows(shape, kinds):
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.add(relax.op.sigmoid(x), x)))
        bb.emit_func_output(out)
    seq = tvm.transform.Sequential(
        [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
         relax.transform.FuseOps(), relax.transform.FuseTIR()]
    )  # fmt: skip
    mod = seq(bb.get())
    func = next(f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc))
    scheduled, how = default_schedule(func, tvm.target.Target("llvm"))
    assert how == "elementwise"
    sch = s_tir.Schedule(scheduled)
    (block,) = sch.get_child_blocks(sch.get_sblock("root"))  # the chain, inlined
    assert _kinds(sch, block) == kinds


def test_what_dlight_does_not_take_gets_its_spatial_loops_in_parallel():
    from umahub.host.schedules import _parallel

    mod = relax.transform.LegalizeOps()(_host_model())
    conv = next(
        f for gv, f in mod.functions.items()
        if isinstance(f, tvm.tirx.PrimFunc) and "conv2d" in gv.name_hint
    )  # fmt: skip
    scheduled, how = _parallel(conv)
    assert how == "parallel"
    sch = s_tir.Schedule(scheduled)
    block = sch.get_sblock("conv2d_nchw")
    # n, f, y, x fused and parallel; the reduction over c, ky, kx serial
    assert _kinds(sch, block) == ["parallel", "serial", "serial", "serial"]


def _one_op_model(op, shape):
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(op(x))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize(
    "op, shape",
    [
        (lambda x: relax.op.nn.max_pool2d(x, 3, 2, 1), (1, 16, 28, 28)),
        (lambda x: relax.op.nn.max_pool2d(x, 2, 2, 0), (1, 8, 15, 15)),
        (lambda x: relax.op.nn.avg_pool2d(x, 3, 1, 1), (1, 8, 13, 13)),
    ],
)
def test_a_pooling_reduces_its_window_over_whole_rows_and_computes_the_same(op, shape):
    mod = _one_op_model(op, shape)
    compiled = umahub.Hub(autoload=False).compile(mod)
    x = np.random.default_rng(1).standard_normal(shape).astype("float32")
    np.testing.assert_allclose(compiled.run(x), _plain(mod, [x]), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "pool, shape",
    [
        (dict(pool_size=3, strides=2, padding=1), (1, 16, 28, 28)),  # ResNet's
        (dict(pool_size=3, strides=2, padding=0, ceil_mode=True), (1, 8, 27, 27)),  # SqueezeNet's
        (dict(pool_size=(3, 2), strides=(2, 1), padding=(1, 0, 1, 1)), (2, 4, 15, 12)),
    ],
    ids=["resnet", "ceil_mode", "uneven"],
)
def test_a_max_pool_is_two_one_dimensional_ones_row_by_row_and_exact(pool, shape):
    from umahub.host.lowering import lower_host

    mod = _one_op_model(lambda x: relax.op.nn.max_pool2d(x, **pool), shape)
    lowered, functions = lower_host(umahub.Hub(autoload=False), mod)
    assert list(functions.values()) == ["pooling"]
    (func,) = [f for f in lowered.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    sch = s_tir.Schedule(func)
    rows, out = sch.get_sblock("pool_rows"), sch.get_sblock("pool_max")
    # each output row (n, c, y): its column maxima, then its windows, under one loop
    assert sch.get(sch.get_loops(rows)[0]).same_as(sch.get(sch.get_loops(out)[0]))
    assert len(sch.get_loops(rows)) == 3 and len(sch.get_loops(out)) == 3
    x = np.random.default_rng(7).standard_normal(shape).astype("float32")
    np.testing.assert_array_equal(umahub.Hub(autoload=False).compile(mod).run(x), _plain(mod, [x]))


def test_a_max_pool_in_another_layout_keeps_tvms_legalization():
    from umahub.host.lowering import lower_host

    mod = _one_op_model(lambda x: relax.op.nn.max_pool2d(x, 3, 2, 1, layout="NHWC"), (1, 28, 28, 8))
    _, functions = lower_host(umahub.Hub(autoload=False), mod)
    assert list(functions.values()) == ["parallel"]


def test_a_max_pool_has_its_padding_inlined_and_its_window_outside_the_row():
    from umahub.host.schedules import _parallel

    mod = relax.transform.LegalizeOps()(
        _one_op_model(lambda x: relax.op.nn.max_pool2d(x, 3, 2, 1), (1, 16, 28, 28))
    )
    func = next(f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc))
    scheduled, how = _parallel(func)
    assert how == "parallel"
    sch = s_tir.Schedule(scheduled)
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    assert "pad_temp" not in names  # computed where the window reads it
    update = sch.get_sblock("pool_max_update")
    # (n, c, y) fused and parallel; the window's two loops; the output row, contiguous
    assert _kinds(sch, update) == ["parallel", "serial", "serial", "serial"]


def test_an_inference_batch_norm_on_the_host_is_a_scale_and_shift_and_computes_the_same():
    rng = np.random.default_rng(2)

    def const(low, high, n=6):
        return relax.const(rng.uniform(low, high, n).astype("float32"))

    def norm(x):
        bn = relax.op.nn.batch_norm(
            x, const(0.5, 2), const(-1, 1), const(-1, 1), const(0.2, 3), axis=1, training=False
        )
        return relax.TupleGetItem(bn, 0)

    mod = _one_op_model(norm, (1, 6, 9, 9))
    compiled = umahub.Hub(autoload=False).compile(mod)
    # the per-channel scale and shift folded at compile time: one elementwise function
    assert compiled.report.host_schedules == {"elementwise": 1}
    x = rng.standard_normal((1, 6, 9, 9)).astype("float32")
    np.testing.assert_allclose(compiled.run(x), _plain(mod, [x]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "op",
    [
        relax.op.nn.gelu,
        relax.op.nn.gelu_tanh,
        relax.op.sigmoid,
        relax.op.tanh,
        relax.op.exp,
        relax.op.erf,  # ONNX's GELU: x * 0.5 * (1 + erf(x / sqrt(2)))
        lambda x: relax.op.nn.softmax(x, axis=-1),
        lambda x: relax.op.nn.softmax(x, axis=1),
    ],
    ids=["gelu", "gelu_tanh", "sigmoid", "tanh", "exp", "erf", "softmax", "softmax_axis1"],
)
def test_transcendental_functions_on_the_host_are_polynomials_and_compute_the_same(op):
    from umahub.host.lowering import lower_host

    mod = _one_op_model(op, (2, 24, 40))
    lowered, _ = lower_host(umahub.Hub(autoload=False), mod)
    code = "\n".join(
        f.script() for f in lowered.functions.values() if isinstance(f, tvm.tirx.PrimFunc)
    )
    # no call of the C library's scalar exp, erf or tanh per element
    assert not any(f"T.{fn}(" in code for fn in ("exp", "erf", "tanh")), code
    compiled = umahub.Hub(autoload=False).compile(mod)
    x = (np.random.default_rng(3).standard_normal((2, 24, 40)) * 4).astype("float32")
    np.testing.assert_allclose(compiled.run(x), _plain(mod, [x]), rtol=1e-5, atol=1e-6)


def _layer_norm(x):
    from umahub.plugin.compat import type_of

    n = int(type_of(x).shape[-1])
    rng = np.random.default_rng(5)
    gamma, beta = (relax.const(rng.standard_normal(n).astype("float32")) for _ in range(2))
    return relax.op.nn.layer_norm(x, gamma, beta, axes=[-1])


def _safe_softmax(x):
    """PyTorch's exported attention softmax: a row of -inf gives zeros, not NaN."""
    s = relax.op.nn.softmax(x, axis=-1)
    live = relax.op.logical_not(relax.op.equal(x, relax.const(float("-inf"), "float32")))
    any_live = relax.op.max(relax.op.astype(live, "int8"), axis=[-1], keepdims=True)
    dead = relax.op.logical_not(relax.op.astype(any_live, "bool"))
    return relax.op.where(dead, relax.op.zeros_like(s), s)


@pytest.mark.parametrize(
    "op, shape, schedules, partial_sums",
    [
        (_layer_norm, (8, 64, 64), {"rows": 1}, ["x_sum", "x_var_sum"]),
        (
            lambda x: relax.op.nn.softmax(x, axis=-1),
            (4, 4, 48, 48),
            {"rows": 1},
            ["T_softmax_maxelem", "T_softmax_expsum"],
        ),
        # the mask's any-live reduction is a function of its own (int8, small)
        (
            _safe_softmax,
            (4, 4, 48, 48),
            {"rows": 1, "parallel": 1},
            ["T_softmax_maxelem", "T_softmax_expsum"],
        ),
        # no vector divides 37 (ViT's 197 neither): the reductions stay serial
        (lambda x: relax.op.nn.softmax(x, axis=-1), (2, 12, 37, 37), {"rows": 1}, []),
        # a middle axis: not a row (the "columns" rule's)
        (lambda x: relax.op.nn.softmax(x, axis=1), (4, 48, 48), {"columns": 1}, None),
    ],
    ids=["layer_norm", "softmax", "safe_softmax", "rows_no_vector_divides", "middle_axis"],
)
def test_a_row_kernel_runs_row_by_row_with_its_reductions_in_vector_partial_sums(
    op, shape, schedules, partial_sums
):
    from umahub.host.lowering import lower_host

    mod = _one_op_model(op, shape)
    lowered, functions = lower_host(umahub.Hub(autoload=False), mod)
    assert dict(Counter(functions.values())) == schedules
    if partial_sums is not None:
        rows = ("norm", "softmax")
        (func,) = [
            f for gv, f in lowered.functions.items()
            if isinstance(f, tvm.tirx.PrimFunc) and any(r in gv.name_hint for r in rows)
        ]  # fmt: skip
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        # one parallel loop over the rows, every step of a row inside it
        assert all(_kinds(sch, b)[0] == "parallel" for b in blocks)
        assert len({sch.get(sch.get_loops(b)[0]) for b in blocks}) == 1
        from umahub.plugin import vector_lanes

        # per reduction: a vector of partial sums per step along the row, then that
        # vector's halves added, down to two values (16 lanes: widths 16, 8, 4, 2)
        widths: dict[str, list[int]] = {}
        for b in blocks:
            name = sch.get(b).name_hint
            if name.endswith("_rf_update"):
                assert _kinds(sch, b) == ["parallel", "serial", "vectorized"]
                extent = int(sch.get(sch.get_loops(b)[-1]).extent)
                widths.setdefault(name[: -len("_rf_update")], []).append(extent)
        lanes = vector_lanes()
        halving = [lanes >> k for k in range(lanes.bit_length() - 1)]
        assert widths == {name: halving for name in partial_sums}
        # the elementwise steps (exponentials, scaling) in vectors of the CPU's width
        # where the row is whole vectors; else contiguous loops for LLVM
        steps = {
            sch.get(b).name_hint: _kinds(sch, b)[-1]
            for b in blocks
            if all(int(iv.iter_type) == 0 for iv in sch.get(b).iter_vars)
        }
        whole = shape[-1] % lanes == 0
        assert set(steps.values()) == {"vectorized" if whole else "serial"}, steps
    x = (np.random.default_rng(6).standard_normal(shape) * 3).astype("float32")
    x.reshape(-1, shape[-1])[1] = -np.inf  # a dead row (the safe softmax gives zeros)
    want = _plain(mod, [x])
    got = umahub.Hub(autoload=False).compile(mod).run(x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_chain_of_polynomial_functions_compiles_quickly_and_computes_the_same():
    """Each polynomial reads its input a dozen times: inlined one into the next,
    the chain would grow exponentially (it took minutes and gigabytes)."""
    import time

    def chain(x):
        for op in (relax.op.sigmoid, relax.op.nn.gelu, relax.op.tanh, relax.op.nn.gelu_tanh):
            x = op(x)
        return x

    mod = _one_op_model(chain, (4, 32))
    start = time.perf_counter()
    compiled = umahub.Hub(autoload=False).compile(mod)
    assert time.perf_counter() - start < 30
    assert compiled.report.host_schedules == {"elementwise": 1}
    x = np.random.default_rng(4).standard_normal((4, 32)).astype("float32")
    np.testing.assert_allclose(compiled.run(x), _plain(mod, [x]), rtol=1e-5, atol=1e-6)


def test_a_small_step_behind_a_reshape_is_inlined_into_the_polynomial_that_reads_it():
    """GELU reads ``x * 0.7071`` a dozen times; behind a reshape its indices are
    divisions and remainders, which do not count towards what inlining copies."""
    from umahub.host.lowering import lower_host

    def gelu(x):
        return relax.op.reshape(relax.op.nn.gelu(relax.op.reshape(x, (12, 64))), (1, 12, 64))

    mod = _one_op_model(gelu, (1, 12, 64))
    lowered, how = lower_host(umahub.Hub(autoload=False), mod)
    assert list(how.values()) == ["elementwise"]
    (func,) = [f for f in lowered.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    assert len(sch.get_child_blocks(sch.get_sblock("root"))) == 1  # one block: x read in place
    x = np.random.default_rng(2).standard_normal((1, 12, 64)).astype("float32")
    compiled = umahub.Hub(autoload=False).compile(mod)
    np.testing.assert_allclose(compiled.run(x), _plain(mod, [x]), rtol=1e-5, atol=1e-6)


def _matmul_model(m, k, n, *, epilogue=False, batch=(), transposed=False):
    """x @ W (+ bias, GELU): W a constant; or, with ``batch``, x @ y (y stored
    transposed when asked), as attention multiplies two activations."""
    rng = np.random.default_rng(1)
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((*batch, m, k), "float32"))
    params = [x]
    if batch:
        y = relax.Var("y", R.Tensor((*batch, *((n, k) if transposed else (k, n))), "float32"))
        params.append(y)
        b = relax.op.permute_dims(y, [*range(len(batch)), len(batch) + 1, len(batch)])
        b = b if transposed else y
    else:
        b = relax.const(rng.standard_normal((k, n)).astype("float32"))
    with bb.function("main", params):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(x, b))
            if epilogue:
                bias = relax.const(rng.standard_normal(n).astype("float32"))
                h = bb.emit(relax.op.nn.gelu(bb.emit(relax.op.add(h, bias))))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize(
    "case, spec, schedules",
    [
        ("dense_bias_gelu", dict(m=64, k=96, n=128, epilogue=True), {"matmul": 1}),
        ("rows_known_at_run_time", dict(m=tvm.tirx.Var("m", "int64"), k=64, n=96), {"matmul": 1}),
        ("one_row", dict(m=1, k=128, n=200), {"matmul": 1}),
        (
            "attention_scores",
            dict(m=32, k=16, n=32, batch=(2, 3), transposed=True),
            {"elementwise": 1, "matmul": 1},
        ),
        ("attention_context", dict(m=32, k=32, n=16, batch=(2, 3)), {"matmul": 1}),
        # no vector divides 1001 columns: not this rule's; "columns" adds a row of W
        # at a time into the output row, rows in parallel
        ("odd_columns", dict(m=8, k=16, n=1001), {"columns": 1}),
    ],
)
def test_a_matmul_on_the_host_is_register_tiled_and_computes_the_same(case, spec, schedules):
    mod = _matmul_model(**spec)
    compiled = umahub.Hub(autoload=False).compile(mod)
    assert compiled.report.host_schedules == schedules
    rng = np.random.default_rng(2)
    rows = 5 if isinstance(spec["m"], tvm.tirx.Var) else spec["m"]
    batch = spec.get("batch", ())
    xs = [rng.standard_normal((*batch, rows, spec["k"])).astype("float32")]
    if batch:
        other = (spec["n"], spec["k"]) if spec.get("transposed") else (spec["k"], spec["n"])
        xs.append(rng.standard_normal((*batch, *other)).astype("float32"))
    want = _plain(mod, xs)
    np.testing.assert_allclose(compiled.run(*xs), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_a_host_matmul_keeps_its_accumulators_in_a_register_tile():
    mod = relax.transform.LegalizeOps()(_matmul_model(64, 96, 128))
    func = next(f for gv, f in mod.functions.items() if gv.name_hint != "main")
    scheduled, how = default_schedule(func.with_attr("global_symbol", "main"), "llvm")
    assert how == "matmul"
    sch = s_tir.Schedule(scheduled)
    # [j0] parallel | i0 | k | i1 unrolled | j1 vectorized
    assert _kinds(sch, sch.get_sblock("matmul_update")) == [
        "parallel",
        "serial",
        "serial",
        "unrolled",
        "vectorized",
    ]


def _conv_model(channels, size, filters, kernel, stride, padding, groups=1):
    """conv2d + bias + relu, weights constant."""
    rng = np.random.default_rng(3)
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((1, channels, size, size), "float32"))
    w = rng.standard_normal((filters, channels // groups, kernel, kernel)).astype("float32")
    bias = rng.standard_normal((1, filters, 1, 1)).astype("float32")
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(w), stride, padding, groups=groups))
            y = bb.emit(relax.op.add(y, relax.const(bias)))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize(
    "case, spec",
    [
        ("3x3", (8, 12, 16, 3, 1, 1)),
        ("stem_7x7_stride_2", (3, 20, 8, 7, 2, 3)),
        ("3x3_stride_2_odd_width", (4, 13, 8, 3, 2, 1)),
        ("1x1_unpadded", (16, 7, 24, 1, 1, 0)),
        ("grouped", (8, 10, 8, 3, 1, 1, 4)),
        ("depthwise", (6, 9, 6, 3, 1, 1, 6)),
    ],
)
def test_a_convolution_on_the_host_is_register_tiled_and_computes_the_same(case, spec):
    mod = _conv_model(*spec)
    compiled = umahub.Hub(autoload=False).compile(mod)
    assert compiled.report.host_schedules == {"conv2d": 1}
    xs = [
        np.random.default_rng(4).standard_normal((1, spec[0], spec[1], spec[1])).astype("float32")
    ]
    want = _plain(mod, xs)
    np.testing.assert_allclose(compiled.run(*xs), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _host_conv(mod: tvm.IRModule) -> tvm.tirx.PrimFunc:
    """``mod``'s convolution, fused as the host's part is, as the host schedules it."""
    mod = relax.transform.FuseTIR()(
        relax.transform.FuseOps()(
            relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(mod))
        )
    )
    func = next(f for gv, f in mod.functions.items() if gv.name_hint != "main")
    scheduled, how = default_schedule(func.with_attr("global_symbol", "main"), "llvm")
    assert how == "conv2d"
    return scheduled


def test_a_host_convolution_tiles_channels_by_columns_and_reads_strided_columns_in_phases():
    scheduled = _host_conv(_conv_model(8, 16, 16, 3, 2, 1))
    sch = s_tir.Schedule(scheduled)
    # [n, f0, y] parallel | x0 | c | ry | rx | f1 unrolled | x1 vectorized
    update = next(
        b
        for b in sch.get_child_blocks(sch.get_sblock("root"))
        if _kinds(sch, b)[-1] == "vectorized" and len(sch.get_loops(b)) == 7
    )
    assert _kinds(sch, update) == [
        "parallel",
        "serial",
        "serial",
        "serial",
        "serial",
        "unrolled",
        "vectorized",
    ]
    # the padded input: [n, c, y, x % 2, x // 2], so a vector of outputs reads consecutive columns
    (padded,) = [b for b in scheduled.body.block.alloc_buffers if len(b.shape) == 5]
    assert [int(d) for d in padded.shape] == [1, 8, 18, 2, 9]


def test_read_in_place_inlines_a_copy_and_with_gates_a_gate_only():
    from tvm import te, topi

    from umahub.plugin import read_in_place

    x, s = te.placeholder((1, 4, 6, 6), name="x"), te.placeholder((1, 4, 1, 1), name="s")
    copy = te.compute(x.shape, lambda *i: x[i], name="copy")
    gate = topi.multiply(copy, s)  # "T_multiply"
    padded = topi.nn.pad(gate, (0, 0, 1, 1), name="padded")
    flipped = te.compute(padded.shape, lambda n, c, h, w: padded[n, c, w, h], name="flipped")
    out = te.compute(flipped.shape, lambda *i: flipped[i], name="out")  # a copy too

    def schedule():
        return s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([x, s, out])}))

    sch = schedule()
    assert read_in_place(sch, sch.get_sblock("copy"))
    assert not read_in_place(sch, sch.get_sblock("T_multiply"))  # a gate: only with gates
    assert not read_in_place(sch, sch.get_sblock("padded"), gates=True)  # computes zeros
    assert not read_in_place(sch, sch.get_sblock("flipped"))  # a transposed copy
    assert not read_in_place(sch, sch.get_sblock("out"))  # writes the output: refused
    sch = schedule()
    assert read_in_place(sch, sch.get_sblock("T_multiply"), gates=True)
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    assert names == ["copy", "padded", "flipped", "out"]


@pytest.mark.parametrize(
    ("kernel", "padding", "stages"),
    [
        # an unpadded convolution's "padding" is a copy of its input: read in place,
        # where a stage of its own took a pass over it and a parallel launch
        (1, 0, []),
        (3, 0, []),
        (3, 1, ["pad_temp"]),  # a real padding keeps its stage
    ],
)
def test_a_host_convolution_reads_an_unpadded_input_in_place(kernel, padding, stages):
    mod = _conv_model(16, 14, 24, kernel, 1, padding)
    sch = s_tir.Schedule(_host_conv(mod))
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    assert [n for n in names if n.startswith("pad_temp")] == stages
    compiled = umahub.Hub(autoload=False).compile(mod)
    xs = [np.random.default_rng(4).standard_normal((1, 16, 14, 14)).astype("float32")]
    want = _plain(mod, xs)
    np.testing.assert_allclose(compiled.run(*xs), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize(
    "op, channels, extents",
    [  # the (1, 64, 55, 55) output's loops below the parallel (n, c) one
        (lambda x: relax.op.concat([x, x], axis=1), 32, [3025]),
        (lambda x: relax.op.add(x, relax.const(np.ones((1, 64, 1, 1), "float32"))), 64, [3025]),
        (lambda x: relax.op.permute_dims(x, [0, 1, 3, 2]), 64, [55, 55]),  # a transposed read
        (lambda x: relax.op.add(x, relax.const(np.ones((1, 1, 55, 1), "float32"))), 64, [55, 55]),
    ],
)
def test_the_loops_every_access_reads_contiguously_are_one_row(op, channels, extents):
    """A row is as long as the run every tensor of the block is read and written
    in: a concatenation's rows, of 55 floats, are one of 3025 (LLVM vectorizes
    its select then); not where an operand is transposed or broadcast inside it."""
    shape = (1, channels, 55, 55)
    mod = _one_op_model(op, shape)
    (func,) = [
        f for f in relax.transform.LegalizeOps()(mod).functions.values()
        if isinstance(f, tvm.tirx.PrimFunc)
    ]  # fmt: skip
    scheduled, how = default_schedule(func, tvm.target.Target("llvm"))
    assert how == "elementwise"
    sch = s_tir.Schedule(scheduled)
    (block,) = sch.get_child_blocks(sch.get_sblock("root"))
    loops = sch.get_loops(block)
    assert _kinds(sch, block)[0] == "parallel"
    assert [int(sch.get(loop).extent) for loop in loops[1:]] == extents
    compiled = umahub.Hub(autoload=False).compile(mod)
    x = np.random.default_rng(1).standard_normal(shape).astype("float32")
    np.testing.assert_allclose(compiled.run(x), _plain(mod, [x]), rtol=1e-6, atol=1e-6)
