"""The requantization in float64 where it is exact (host.quantized.requantizes_in_double).

Its integers are the fixed point's, bit for bit: checked on the arithmetic near
every rounding tie, and on flat depthwise kernels whose multipliers sit at the
bound and past it; the other forms keep the int64 one.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_quantized import _run, qconv_graph, reference

from umahub.host.quantized import lower_quantized
from umahub.plugin import requantization, requantize


def _in_double(acc, multiplier, zero, low, high, dtype):
    """The float64 form as the kernel computes it: ``nearbyint(a * (m * 2**-k))``."""
    m, k = requantization(np.asarray([multiplier]))
    scale = float(m[0]) * 2.0 ** -int(k[0])
    rounded = np.rint(acc.astype(np.float64) * scale) + zero  # rint: half to even
    return np.clip(rounded, low, high).astype(dtype)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("k", range(31, 45))
def test_the_float64_form_is_the_fixed_point_up_to_a_shift_of_44(k, dtype):
    rng = np.random.default_rng(k)
    multiplier = rng.uniform(1.0, 2.0) * 2.0 ** (30 - k)  # m from 2**30 to 2**31
    m, shift = requantization(np.asarray([multiplier]))
    assert int(shift[0]) == k
    # every accumulator within one of a tie (n + 1/2) * 2**k / m, over the unclamped
    # range and past it, and random ones from all of int32
    ties = (np.arange(-700, 700) + 0.5) * 2.0**k / int(m[0])
    near = np.floor(ties).astype(np.int64)[:, None] + np.arange(-1, 3)
    wide = rng.integers(-(2**31), 2**31, size=20000)
    acc = np.concatenate([near.ravel(), wide]).clip(-(2**31), 2**31 - 1)
    info = np.iinfo(dtype)
    for zero in (int(info.min), 0, int(info.max) // 2, int(info.max)):
        want = requantize(acc, multiplier, zero, int(info.min), int(info.max), dtype)
        got = _in_double(acc, multiplier, zero, int(info.min), int(info.max), dtype)
        np.testing.assert_array_equal(got, want)


# x_scale 0.05 and weight scales 0.002 .. 0.02: multipliers 1e-4 .. 1e-3 / y_scale
@pytest.mark.parametrize(
    ("y_scale", "in_double"),
    [(0.2, True), (1.5, True), (40.0, False)],
    ids=["shift 38 or less", "shift 44 or less", "a shift past 44"],
)
def test_a_flat_depthwise_requantizes_in_float64_only_within_the_bound(y_scale, in_double):
    mod, parts = qconv_graph(y_scale=y_scale, channels=(16, 16), groups=16, size=12)
    m, k = requantization(
        np.float64(parts["x_scale"]) * parts["w_scale"].astype(np.float64) / np.float64(y_scale)
    )
    assert (int(k.max()) <= 44) == in_double
    lowered, count = lower_quantized(mod)
    assert count == 1
    script = lowered.script()
    assert "acc_flat" in script  # the flat form
    assert ("requant_double" in script) == in_double
    x = np.random.default_rng(7).integers(0, 256, size=(1, 16, 12, 12)).astype("uint8")
    np.testing.assert_array_equal(_run(lowered, x), reference(x, parts))


@pytest.mark.parametrize(
    "options",
    [
        {"channels": (8, 16)},
        {"channels": (8, 16), "kernel": 1, "padding": (0, 0, 0, 0)},
        {"channels": (16, 16), "groups": 16, "strides": (2, 2)},
    ],
    ids=["3x3", "1x1", "strided depthwise"],
)
def test_the_other_forms_keep_the_int64_requantization(options):
    # slower in float64 there (see requantizes_in_double), though as exact
    mod, parts = qconv_graph(y_scale=0.2, **options)
    lowered, _ = lower_quantized(mod)
    assert "requant_double" not in lowered.script()
    cin = options["channels"][0]
    x = np.random.default_rng(7).integers(0, 256, size=(1, cin, 10, 10)).astype("uint8")
    np.testing.assert_array_equal(_run(lowered, x), reference(x, parts))
