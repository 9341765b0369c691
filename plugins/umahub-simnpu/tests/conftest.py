"""The simnpu's runtime, registered for every test (whether or not its entry point is
installed)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def simnpu_runtime():
    """The simnpu runtime, found by name as its entry point would be (umahub keeps the
    devices it opens for the process)."""
    from umahub_simnpu_runtime import SimNpuRuntime

    from umahub.runtime import devices

    runtime = SimNpuRuntime()
    devices.register_runtime(runtime)
    return runtime
