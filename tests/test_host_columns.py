"""The host's ``"columns"`` rule: reductions over other axes than the last, and the
report naming the host functions built without a schedule."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir
from tvm.script import relax as R

import umahub
from umahub.host.lowering import lower_host

_FOR_KINDS = {0: "serial", 1: "parallel", 2: "vectorized", 3: "unrolled"}  # tirx.ForKind


def _model(op, *shapes):
    bb = relax.BlockBuilder()
    xs = [relax.Var(f"x{i}", R.Tensor(s, "float32")) for i, s in enumerate(shapes)]
    with bb.function("main", xs):
        with bb.dataflow():
            out = bb.emit_output(op(*xs))
        bb.emit_func_output(out)
    return bb.get()


def _inputs(*shapes):
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s).astype("float32") for s in shapes]


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _grn(x, gamma, beta):
    """ConvNeXt-V2's global response norm, channels last (timm's)."""
    norm = relax.op.sqrt(relax.op.sum(relax.op.multiply(x, x), axis=[1, 2], keepdims=True))
    mean = relax.op.mean(norm, axis=[-1], keepdims=True)
    scaled = relax.op.multiply(x, relax.op.divide(norm, relax.op.add(mean, relax.const(1e-6))))
    return relax.op.add(x, relax.op.add(relax.op.multiply(gamma, scaled), beta))


def _grn_numpy(x, gamma, beta):
    norm = np.sqrt((x.astype("float64") ** 2).sum(axis=(1, 2), keepdims=True))
    return x + gamma * (x * (norm / (norm.mean(axis=-1, keepdims=True) + 1e-6))) + beta


def _group_norm_numpy(x, gamma, beta):
    x64 = x.astype("float64")
    mean, var = x64.mean(), x64.var()
    return (x64 - mean) / np.sqrt(var + 1e-5) * gamma[:, None, None] + beta[:, None, None]


@pytest.mark.parametrize(
    "op, shapes, expected, schedules",
    [
        # CoaT's factorized attention: a softmax over the tokens, axis 2 of 4
        (
            lambda x: relax.op.nn.softmax(x, axis=2),
            [(1, 4, 300, 8)],
            lambda x: _softmax(x, 2),
            {"fast_softmax": "columns"},
        ),
        (
            lambda x: relax.op.mean(x, axis=[1], keepdims=True),
            [(4, 48, 48)],
            lambda x: x.mean(axis=1, keepdims=True),
            {"mean": "columns"},
        ),
        # PoolFormer's norm: a group norm of one group, over a whole tensor
        (
            lambda x, g, b: relax.op.nn.group_norm(x, g, b, 1, 1, [2, 3]),
            [(1, 16, 20, 24), (16,), (16,)],
            _group_norm_numpy,
            {"group_norm": "columns"},
        ),
        # its last stage: rows of 7, too short for a vector, fused with the 7 before
        (
            lambda x, g, b: relax.op.nn.group_norm(x, g, b, 1, 1, [2, 3]),
            [(1, 64, 7, 7), (64,), (64,)],
            _group_norm_numpy,
            {"group_norm": "columns"},
        ),
        (
            _grn,
            [(1, 28, 28, 48), (48,), (48,)],
            _grn_numpy,
            {
                "fused_multiply_sum": "columns",
                "tir_sqrt": "elementwise",
                # the mean of 48 values, then the tensor's elementwise steps in parallel
                "fused_mean_add_divide_multiply1_multiply2_add1_add2": "columns",
            },
        ),
    ],
    ids=[
        "softmax_axis_2",
        "mean_middle_axis",
        "group_norm_one_group",
        "group_norm_rows_of_7",
        "global_response_norm",
    ],
)
def test_a_reduction_over_another_axis_than_the_last_is_columns_and_exact(
    op, shapes, expected, schedules
):
    mod = _model(op, *shapes)
    _, functions = lower_host(umahub.Hub(autoload=False), mod)
    assert functions == schedules
    xs = _inputs(*shapes)
    out = umahub.Hub(autoload=False).compile(mod).run(*xs)
    np.testing.assert_allclose(out, expected(*xs), rtol=2e-5, atol=2e-6)


def test_a_column_reduction_adds_contiguous_rows_slab_by_slab_in_parallel():
    mod = _model(lambda x: relax.op.nn.softmax(x, axis=2), (2, 8, 400, 16))
    lowered, _ = lower_host(umahub.Hub(autoload=False), mod)
    (func,) = [f for f in lowered.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    sch = s_tir.Schedule(func)
    block = sch.get_sblock("T_softmax_maxelem_update")
    loops = sch.get_loops(block)
    kinds = [_FOR_KINDS[int(sch.get(loop).kind)] for loop in loops]
    # (batch, head) fused in parallel; the 400 tokens; the 16 contiguous columns
    # innermost, one vector
    assert kinds == ["parallel", "serial", "vectorized"]
    assert [int(sch.get(loop).extent) for loop in loops] == [16, 400, 16]
    # every step of a (batch, head) slab under that one parallel loop
    for name in ("T_softmax_expsum_update", "T_softmax_norm"):
        assert sch.get(sch.get_loops(sch.get_sblock(name))[0]).same_as(sch.get(loops[0]))


def _pool_mixer_numpy(x):
    padded = np.pad(x.astype("float64"), ((0, 0), (0, 0), (1, 1), (1, 1)))
    ones = np.pad(np.ones_like(padded[..., 1:-1, 1:-1]), ((0, 0), (0, 0), (1, 1), (1, 1)))
    h, w = x.shape[2:]
    window = sum(padded[..., i : i + h, j : j + w] for i in range(3) for j in range(3))
    count = sum(ones[..., i : i + h, j : j + w] for i in range(3) for j in range(3))
    return window / count - x


def test_a_stride_one_average_pooling_runs_window_first_in_parallel_not_in_dlight():
    # PoolFormer's token mixer: an average pooling of stride 1, minus its input
    def mixer(x):
        pooled = relax.op.nn.avg_pool2d(x, 3, 1, 1, count_include_pad=False)
        return relax.op.subtract(pooled, x)

    mod = _model(mixer, (1, 16, 28, 28))
    _, functions = lower_host(umahub.Hub(autoload=False), mod)
    assert functions == {"fused_avg_pool2d_subtract": "parallel"}
    (x,) = _inputs((1, 16, 28, 28))
    out = umahub.Hub(autoload=False).compile(mod).run(x)
    np.testing.assert_allclose(out, _pool_mixer_numpy(x), rtol=1e-5, atol=1e-6)


def test_the_report_names_the_host_functions_built_without_a_schedule():
    # a sum of a small tensor into one value: no rule changes it
    mod = _model(lambda x: relax.op.sum(x), (3, 5))
    compiled = umahub.Hub(autoload=False).compile(mod)
    assert compiled.report.host_unscheduled == ["sum"]
    assert compiled.report.to_dict()["host_unscheduled"] == ["sum"]
    text = str(compiled.report)
    assert "host functions: 1 (unscheduled 1)" in text
    assert "  unscheduled (a loop nest on one thread, no vectors): sum" in text
    (x,) = _inputs((3, 5))
    np.testing.assert_allclose(compiled.run(x), x.sum(), rtol=1e-5)
