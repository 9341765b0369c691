"""umahub's conformance kit on the simnpu (``umahub.testing``): a device of its own, so the
kit's device checks run too (transfers, programs, a library run with the runtime alone)."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

from umahub.testing import ConformanceSuite

if "simnpu" not in {ep.name for ep in entry_points(group="umahub.plugins")}:
    # a source checkout on PYTHONPATH: the kit finds plugins by their entry points
    pytest.skip(
        "umahub-simnpu is not installed (pip install -e plugins/umahub-simnpu-runtime "
        "-e plugins/umahub-simnpu): the kit finds plugins by entry point",
        allow_module_level=True,
    )


@pytest.mark.umahub_conformance(accelerator="simnpu", models=["cnn_int8"])
class TestConformance(ConformanceSuite):
    """The kit's checks for the simnpu, on the zoo's cnn_int8."""

    @pytest.mark.skip(
        reason="the kit's random graphs are float32; the simnpu takes quantized operators "
        "only (its exactness tests cover them)"
    )
    def test_random_graphs(self, request: pytest.FixtureRequest, accelerator: str) -> None:
        """Skipped: see the reason."""
