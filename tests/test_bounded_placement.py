"""Operators whose sizes are known only at run time, bounded (``tir_var_upper_bound``, as a
decoder's prefill has its prompt length bounded by the context), placed on accelerators:
a prefill's projection on the npu, sized by its bound; without a bound it stays on the host."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import umahub
from umahub._tvm import TensorType

BUNDLED = {"plugins": ["npu", "vanilla", "dsp"], "priority": ["npu", "vanilla_accel", "dsp_cpu"]}
WEIGHT = np.random.default_rng(0).standard_normal((64, 96)).astype("float32") / 8


def _projection(bound: int | None):
    """``relu(x @ W)`` over ``n`` tokens of 64 features."""
    n = tvm.tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((1, n, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(WEIGHT)), "y")
            z = bb.emit_output(relax.op.nn.relu(y), "z")
        bb.emit_func_output(z)
    main = bb.get()["main"]
    if bound is not None:
        main = main.with_attr("tir_var_upper_bound", {"n": bound})
    return tvm.IRModule({"main": main})


@pytest.fixture(scope="module")
def hub():
    return umahub.Hub(config=BUNDLED, project_config=False)


def test_a_bounded_prefill_projection_runs_on_the_npu_at_any_length(hub):
    compiled = hub.compile(_projection(32))
    assert {r.name: r.device for r in compiled.report.placement} == {"y": "npu:0", "z": "npu:0"}
    (part,) = compiled.report.partitions
    assert part.schedule == ["matmul: tiles fit npu.sram (256 KiB)"]
    dram = next(p for p in compiled.report.memory.pools if p.scope == "npu.dram")
    # the weight resident; input, matmul and output at 32 tokens (the bound)
    assert (dram.resident, dram.used) == (64 * 96 * 4, 64 * 96 * 4 + 32 * (64 + 96 + 96) * 4)
    for tokens in (1, 5, 32):
        x = np.random.default_rng(tokens).standard_normal((1, tokens, 64)).astype("float32")
        np.testing.assert_allclose(compiled.run(x), np.maximum(x @ WEIGHT, 0), rtol=1e-5, atol=1e-5)


def test_an_unbounded_prefill_projection_stays_on_the_host_saying_why(hub):
    report = hub.explain(_projection(None))
    assert {r.device for r in report.placement} == {"host"}
    matmul = next(r for r in report.placement if r.name == "y")
    assert matmul.refused["npu"] == (
        "a tensor whose size is known only at run time, with no upper bound "
        "(main's tir_var_upper_bound attribute bounds it)"
    )


def test_a_decoders_prefill_is_bounded_by_its_context():
    from umahub.frontends.decoders import bound_to_context
    from umahub.plugin.memory import size_bounds

    bounded = bound_to_context(_projection(None), 128)
    assert size_bounds(bounded["main"]) == {"n": 128}
    # a bound the import already gave (torch.export's Dim) is kept
    assert size_bounds(bound_to_context(_projection(16), 128)["main"]) == {"n": 16}
