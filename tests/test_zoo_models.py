"""Every zoo model through the three bundled plugins, against plain tvm.compile.

Full-size models take a while to compile and to run unscheduled on the host:
these tests are marked slow (``tox -e slow``, or ``pytest -m slow``).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import host_reference

import umahub
import umahub.models as zoo

PRIORITY = ["npu", "vanilla_accel", "dsp_cpu"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenetv2", "bert", "bert2"])
def test_zoo_model_through_the_three_plugins_matches_the_host(name):
    hub = umahub.Hub(
        config={"plugins": ["npu", "vanilla", "dsp"], "priority": PRIORITY, "on-error": "error"}
    )
    compiled = hub.compile(zoo.get(name))
    taken = [o for o in compiled.report.placement if o.device != "host"]
    assert taken, "the plugins took no operator"
    out = compiled.run(*zoo.inputs(name))
    ref = host_reference(name)
    scale = max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * scale)
