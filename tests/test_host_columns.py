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
    ids=["softmax_axis_2", "mean_middle_axis", "group_norm_one_group", "global_response_norm"],
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


def test_a_column_reduction_adds_contiguous_rows_with_its_outer_axes_in_parallel():
    mod = _model(lambda x: relax.op.nn.softmax(x, axis=2), (2, 8, 400, 16))
    lowered, _ = lower_host(umahub.Hub(autoload=False), mod)
    (func,) = [f for f in lowered.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    sch = s_tir.Schedule(func)
    block = sch.get_sblock("T_softmax_maxelem_update")
    loops = sch.get_loops(block)
    kinds = [_FOR_KINDS[int(sch.get(loop).kind)] for loop in loops]
    # (batch, head) fused in parallel; the 400 tokens; the 16 contiguous columns innermost
    assert kinds == ["parallel", "serial", "serial"]
    assert [int(sch.get(loop).extent) for loop in loops] == [16, 400, 16]


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
