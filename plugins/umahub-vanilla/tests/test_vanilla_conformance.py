"""umahub's conformance kit on the vanilla accelerator (``umahub.testing``).

``TestConformance`` runs every check of the kit for ``vanilla_accel`` on the
zoo's mlp (which has no convolution: it must take nothing and change nothing)
and cnn (two convolutions), and on random conv2d graphs; the test below it
uses the kit's fixtures for what only this plugin promises.
"""

from __future__ import annotations

import pytest

from umahub.testing import ConformanceSuite


@pytest.mark.umahub_conformance(accelerator="vanilla_accel", models=["mlp", "cnn"], examples=6)
class TestConformance(ConformanceSuite):
    """The kit's checks for vanilla_accel."""


@pytest.mark.umahub_conformance(accelerator="vanilla")
def test_takes_both_convolutions_with_their_bias_and_relu(umahub_conformance_hub):
    """Both convolutions of cnn, each with its bias add and ReLU, and nothing else."""
    import umahub.models as zoo

    report = umahub_conformance_hub().explain(zoo.get("cnn"))
    taken = sorted(o.name for o in report.placement if o.device != "host")
    assert taken == [
        "conv1",
        "conv1_bias_add",
        "conv1_relu",
        "conv2",
        "conv2_bias_add",
        "conv2_relu",
    ]
    assert {o.pattern for o in report.placement if o.device != "host"} == {
        "vanilla_accel.conv2d_bias_act"
    }
