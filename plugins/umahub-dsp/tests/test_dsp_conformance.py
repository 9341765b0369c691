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
