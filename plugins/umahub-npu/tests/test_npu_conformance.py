"""umahub's conformance kit on the npu (``umahub.testing``), plus the npu's own claims.

``TestConformance`` runs every check of the kit for ``npu`` on the zoo's mlp
and cnn and on random graphs of the operators its patterns name; the tests
below it use the kit's fixtures for what only the npu promises.
"""

from __future__ import annotations

import pytest

from umahub.testing import ConformanceSuite, assert_matches_host


@pytest.mark.umahub_conformance(accelerator="npu", models=["mlp", "cnn"], examples=12)
class TestConformance(ConformanceSuite):
    """The kit's checks for the npu."""


@pytest.mark.umahub_conformance(accelerator="npu")
def test_takes_matmul_and_wide_conv2d_only(umahub_conformance_hub):
    """In cnn the npu takes conv2 (8 input channels) and the dense layer, never conv1 (RGB)."""
    import umahub.models as zoo

    report = umahub_conformance_hub().explain(zoo.get("cnn"))
    on_npu = {o.name for o in report.placement if o.device.startswith("npu")}
    assert {"conv2", "fc"} <= on_npu
    assert "conv1" not in on_npu
    assert {o.op for o in report.placement if o.name in on_npu} <= {
        "relax.nn.conv2d",
        "relax.matmul",
        "relax.add",
        "relax.nn.relu",
    }


@pytest.mark.umahub_conformance(accelerator="npu")
def test_dense_layers_with_bias_and_relu_fuse(umahub_conformance_hub, umahub_host_reference):
    """mlp's dense + bias + relu is one partition, by the bias_act pattern, and matches."""
    import umahub.models as zoo

    compiled = umahub_conformance_hub().compile(zoo.get("mlp"))
    patterns = {p for part in compiled.report.partitions for p in part.patterns}
    assert "npu.matmul_bias_act" in patterns
    assert_matches_host(compiled.run(*zoo.inputs("mlp")), umahub_host_reference("mlp"))
