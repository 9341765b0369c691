"""Weights packed at compile time: a schedule's packing block runs once, not per inference."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import umahub
from umahub._tvm import TensorType
from umahub.host.prepack import ANNOTATION, pack_weight

RNG = np.random.default_rng(0)
W = RNG.standard_normal((16, 32)).astype("float32")


class Panels:
    """An accelerator 'mx' taking matmul; its schedule packs B into 8-column panels."""

    UMAHUB_API = 1

    def __init__(self, layout=lambda k, j: (j // 8, k, j % 8)):
        self.layout = layout
        self.weights: list[frozenset[int]] = []

    @umahub.hookimpl
    def umahub_accelerators(self):
        return [umahub.Accelerator("mx")]

    @umahub.hookimpl
    def umahub_patterns(self, accelerator):
        from tvm.relax.dpl import is_op, wildcard

        return [("mx.matmul", is_op("relax.matmul")(wildcard(), wildcard()))]

    @umahub.hookimpl
    def umahub_schedule(self, accelerator, schedule, context):
        self.weights.append(context.weights)
        pack_weight(schedule, schedule.get_sblock("matmul"), 1, self.layout)
        return "B in panels"


def dense(weight_as_input: bool = False) -> tvm.IRModule:
    """relu(x @ W): W a constant, or the model's second input."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((4, 16), "float32"))
    w = relax.Var("w", TensorType((16, 32), "float32"))
    with bb.function("main", [x, w] if weight_as_input else [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, w if weight_as_input else relax.const(W)), "n0")
            out = bb.emit_output(relax.op.nn.relu(y), "n1")
        bb.emit_func_output(out)
    return bb.get()


def test_a_constant_weight_is_packed_once_at_compile_time():
    plugin = Panels()
    hub = umahub.Hub(autoload=False, plugins=[plugin], config={"verify": True})
    compiled = hub.compile(dense())
    (part,) = compiled.report.partitions
    assert plugin.weights == [frozenset({1})]
    assert part.packed == ["weight 1 (16x32 -> 4x16x8)"]
    assert "packed at compile time: weight 1 (16x32 -> 4x16x8)" in str(compiled.report)
    # the model holds the packed weight: the kernel receives it, and never packs
    (weight,) = compiled._runner.weights
    packed = weight.numpy()
    assert packed.shape == (4, 16, 8)
    np.testing.assert_array_equal(packed[1, :, 3], W[:, 8 + 3])
    x = RNG.standard_normal((4, 16)).astype("float32")
    np.testing.assert_allclose(compiled.run(x), np.maximum(x @ W, 0), rtol=1e-5, atol=1e-5)
    # verification gave the host the model's own weight, not the packed one
    assert part.verified.startswith("largest error") and part.max_error < 1e-5


def test_a_weight_given_at_run_time_is_packed_by_the_kernel_at_every_call():
    plugin = Panels()
    hub = umahub.Hub(autoload=False, plugins=[plugin])
    compiled = hub.compile(dense(weight_as_input=True))
    (part,) = compiled.report.partitions
    assert plugin.weights == [frozenset()]
    assert part.packed == [] and part.fallback == ""
    x = RNG.standard_normal((4, 16)).astype("float32")
    for seed in (1, 2):  # a different weight each call: nothing was packed ahead
        w = np.random.default_rng(seed).standard_normal((16, 32)).astype("float32")
        np.testing.assert_allclose(compiled.run(x, w), np.maximum(x @ w, 0), rtol=1e-5, atol=1e-5)


def test_a_packing_that_cannot_be_split_off_blames_the_schedule():
    class Misplaced(Panels):
        @umahub.hookimpl
        def umahub_schedule(self, accelerator, schedule, context):
            # the annotation on the computation itself, not on a copy of a parameter
            schedule.annotate(schedule.get_sblock("matmul"), ANNOTATION, True)
            return "annotated the matmul"

    hub = umahub.Hub(autoload=False, plugins=[Misplaced()])
    with pytest.warns(umahub.UmahubWarning) as caught:
        compiled = hub.compile(dense())
    (part,) = compiled.report.partitions
    message = str(caught[0].message)
    assert message == (
        "umahub: plugin 'Misplaced' failed in umahub_schedule for partition mx_0_matmul "
        "(mx.matmul) on mx:0: PluginOutputError: the blocks annotated "
        "meta_schedule.layout_rewrite_preproc in mx_0_matmul cannot be split off the kernel "
        "(InternalError: Check failed: (op->reads.size() == 1) is false: There should be only "
        "one read buffer in the layout rewrite): such a block must be at the root and copy one "
        "parameter into a new layout (see umahub.plugin.pack_weight); its partition runs on "
        "the host"
    )
    assert part.fallback.startswith("plugin 'Misplaced' failed in umahub_schedule")
    x = RNG.standard_normal((4, 16)).astype("float32")
    np.testing.assert_allclose(compiled.run(x), np.maximum(x @ W, 0), rtol=1e-5, atol=1e-5)
