"""A kernel's stages that read only constants run once, at compile time."""

from __future__ import annotations

import numpy as np
import tvm
from test_prepack import Panels, W, dense
from tvm import te

import umahub
from umahub.host import constant_stages
from umahub.plugin.compat import param_buffers

RNG = np.random.default_rng(0)


def _kernel(size: int = 8, made=lambda w, i: w[i] * 2):
    """``out = x * s`` with ``s = made(w) + 1`` in two stages of ``w`` alone (``doubled``,
    ``plus_one``): a PrimFunc of ``x``, ``w`` and ``out``."""
    x = te.placeholder((size,), name="x")
    w = te.placeholder((8,), name="w")
    t = te.compute((size,), lambda i: made(w, i), name="doubled")
    s = te.compute((size,), lambda i: t[i] + 1, name="plus_one")
    out = te.compute((size,), lambda i: x[i] * s[i], name="out")
    return te.create_prim_func([x, w, out]).with_attr("global_symbol", "k")


_scaled = _kernel()


def _run(prim, *arrays):
    built = tvm.tirx.build(tvm.IRModule({"k": prim.with_attr("global_symbol", "k")}), "llvm")
    tensors = [tvm.runtime.tensor(a) for a in arrays]
    built["k"](*tensors)
    return [t.numpy() for t in tensors]


def test_split_takes_the_stages_of_constants_and_the_kernel_reads_their_results():
    mod, stages = constant_stages.split(tvm.IRModule({"k": _scaled}), "k", 2, frozenset({1}))
    assert stages is not None
    assert stages.names == ("doubled", "plus_one")
    assert stages.inputs == (1,)
    assert stages.results == (((8,), "float32"),)  # plus_one only: doubled is the stages' own
    assert constant_stages.describe(stages) == "doubled, plus_one (32 B)"
    assert [b.name for b in param_buffers(mod["k"])] == ["x", "w", "plus_one", "out"]
    x, w = RNG.standard_normal(8).astype("float32"), RNG.standard_normal(8).astype("float32")
    ((s,),) = constant_stages.compute([(stages, [None, tvm.runtime.tensor(w)])])
    np.testing.assert_array_equal(s.numpy(), w * 2 + 1)
    *_, out = _run(mod["k"], x, w, s.numpy(), np.zeros(8, "float32"))
    np.testing.assert_array_equal(out, x * (w * 2 + 1))


def test_split_leaves_a_kernel_whose_stages_read_an_input_given_at_run_time():
    for constants in (frozenset(), frozenset({0})):  # w (input 1) not a constant
        mod, stages = constant_stages.split(tvm.IRModule({"k": _scaled}), "k", 2, constants)
        assert stages is None and mod["k"].same_as(_scaled)


def test_split_leaves_results_larger_than_what_they_are_made_from():
    spread = _kernel(65536, made=lambda w, i: w[0])
    _, stages = constant_stages.split(tvm.IRModule({"k": spread}), "k", 2, frozenset({1}))
    assert stages is None  # 256 KiB made from 4 bytes: the kernel computes it


def test_split_leaves_the_large_stage_to_the_kernel_and_takes_the_small_ones():
    """One stage too large to take does not keep the small ones in the kernel."""
    size = 65536
    x = te.placeholder((size,), name="x")
    w = te.placeholder((8,), name="w")
    spread = te.compute((size,), lambda i: w[0], name="spread")  # 256 KiB from 4 bytes
    doubled = te.compute((8,), lambda i: w[i] * 2, name="doubled")
    out = te.compute((size,), lambda i: x[i] * spread[i] + doubled[i % 8], name="out")
    prim = te.create_prim_func([x, w, out]).with_attr("global_symbol", "k")
    mod, stages = constant_stages.split(tvm.IRModule({"k": prim}), "k", 2, frozenset({1}))
    assert stages is not None and stages.names == ("doubled",)
    assert [b.name for b in param_buffers(mod["k"])] == ["x", "w", "doubled", "out"]
    xs, ws = RNG.standard_normal(size).astype("float32"), RNG.standard_normal(8).astype("float32")
    ((d,),) = constant_stages.compute([(stages, [None, tvm.runtime.tensor(ws)])])
    *_, got = _run(mod["k"], xs, ws, d.numpy(), np.zeros(size, "float32"))
    np.testing.assert_allclose(got, xs * ws[0] + np.tile(ws * 2, size // 8), rtol=1e-6)


class Cached(Panels):
    """test_prepack's accelerator 'mx' taking matmul, its schedule copying B to a buffer
    of its own first (no packing): a stage that reads only the constant weight."""

    @umahub.hookimpl
    def umahub_schedule(self, accelerator, schedule, context):
        schedule.cache_read(schedule.get_sblock("matmul"), 1, "global")
        return "B copied"


def test_a_partitions_constant_stage_runs_at_compile_time_and_is_verified():
    hub = umahub.Hub(autoload=False, plugins=[Cached()], config={"verify": True})
    compiled = hub.compile(dense())
    (part,) = compiled.report.partitions
    assert part.precomputed == ["param_0_global (2 KiB)"]
    assert "computed at compile time: param_0_global (2 KiB)" in str(compiled.report)
    # the model holds the stage's result and passes it after the partition's inputs
    held = [w.numpy() for w in compiled._runner.weights]
    assert any(h.shape == W.shape and np.array_equal(h, W) for h in held)
    x = RNG.standard_normal((4, 16)).astype("float32")
    np.testing.assert_allclose(compiled.run(x), np.maximum(x @ W, 0), rtol=1e-5, atol=1e-5)
    assert part.verified.startswith("largest error") and part.max_error < 1e-5


def test_a_partitions_stage_of_a_weight_given_at_run_time_runs_at_every_call():
    hub = umahub.Hub(autoload=False, plugins=[Cached()])
    compiled = hub.compile(dense(weight_as_input=True))
    (part,) = compiled.report.partitions
    assert part.precomputed == [] and part.fallback == ""
    x = RNG.standard_normal((4, 16)).astype("float32")
    for seed in (1, 2):
        w = np.random.default_rng(seed).standard_normal((16, 32)).astype("float32")
        np.testing.assert_allclose(compiled.run(x, w), np.maximum(x @ w, 0), rtol=1e-5, atol=1e-5)
