"""umahub's conformance kit on the DSP (``umahub.testing``).

``TestConformance`` runs every check of the kit for ``dsp_cpu`` on the zoo's
mlp and cnn, on both cores, and on random elementwise graphs; the test below
it uses the kit's fixtures for what only this plugin promises: a match whose
tensors do not fit a quarter of the TCM stays on the host.
"""

from __future__ import annotations

import pytest

from umahub.testing import ConformanceSuite


@pytest.mark.umahub_conformance(accelerator="dsp", models=["mlp", "cnn"], examples=6)
class TestConformance(ConformanceSuite):
    """The kit's checks for dsp_cpu."""


@pytest.mark.umahub_conformance(accelerator="dsp_cpu")
def test_only_what_fits_the_tcm_budget(umahub_conformance_hub):
    """cnn's activations are (1, 8, 16, 16), 8 KiB: a relu on them touches 16 KiB and fits
    the budget (a quarter of the TCM), the residual add touches 24 KiB and stays on the host."""
    from umahub_dsp import MATCH_BUDGET

    import umahub.models as zoo

    assert MATCH_BUDGET == 16 * 1024
    report = umahub_conformance_hub().explain(zoo.get("cnn"))
    device = {o.name: o.device for o in report.placement}
    assert device["conv1_relu"].startswith("dsp_cpu:")
    assert device["conv2_relu"].startswith("dsp_cpu:")
    assert device["residual"] == "host"


def test_dsp_takes_every_elementwise_operator_it_names():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
    from graphs import chain

    import umahub

    mod = chain(ops=("relu", "sigmoid", "tanh", "add", "subtract", "multiply"))
    report = umahub.Hub(config={"plugins": ["dsp"]}).explain(mod)
    assert [o.pattern for o in report.placement] == [
        "dsp_cpu.relu",
        "dsp_cpu.sigmoid",
        "dsp_cpu.tanh",
        "dsp_cpu.add",
        "dsp_cpu.subtract",
        "dsp_cpu.multiply",
    ]


def test_dsp_takes_clip():
    import numpy as np
    from tvm import relax

    import umahub
    from umahub._tvm import TensorType

    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((4, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.clip(x, 0.0, 6.0), "relu6")
        bb.emit_func_output(out)
    compiled = umahub.Hub(config={"plugins": ["dsp"]}).compile(bb.get())
    assert [(o.name, o.device, o.pattern) for o in compiled.report.placement] == [
        ("relu6", "dsp_cpu:0", "dsp_cpu.clip")
    ]
    xs = np.linspace(-8, 8, 64, dtype="float32").reshape(4, 16)
    np.testing.assert_allclose(compiled.run(xs), np.clip(xs, 0, 6))
