"""How ``benchmarks/engines.py`` judges an engine's outputs against PyTorch's: a relative
error past 1e-3, a shape that differs, non-finite numbers or an all-zero reference make
the engine's time no comparison."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import engines as bench_engines


def test_an_error_within_the_bound_is_valid_and_relative_to_the_reference_scale():
    want = np.array([[2.0, -4.0, 1.0]], dtype=np.float32)
    got = want + np.array([[0.0, 0.002, 0.0]], dtype=np.float32)
    result = bench_engines.agreement(got, want)
    assert result["reference_scale"] == 4.0
    assert result["max_error"] == pytest.approx(0.002, rel=1e-3)
    assert result["rel_error"] == pytest.approx(0.0005, rel=1e-3)
    assert result["valid"] is True


def test_a_tiny_reference_does_not_hide_a_wrong_answer():
    # outputs of order 1e-20 (efficientnet_b0 before its norms were calibrated): an
    # absolute error of 1e-20 looks like nothing and is 100% of the answer
    want = np.full((1, 4), 1e-20, dtype=np.float32)
    result = bench_engines.agreement(np.zeros_like(want), want)
    assert result["valid"] is False
    assert result["why"] == "relative error 1 against PyTorch, above 0.001"


@pytest.mark.parametrize(
    ("got", "want", "why"),
    [
        (np.zeros((1, 3)), np.zeros((1, 3)), "PyTorch's outputs are all zero: nothing to compare"),
        (np.ones((1, 4)), np.ones((1, 3)), "output shape (1, 4), PyTorch's (1, 3)"),
        (
            np.array([1.0, np.nan]),
            np.array([1.0, 1.0]),
            "relative error nan against PyTorch, above 0.001",
        ),
    ],
)
def test_outputs_that_cannot_be_compared_are_invalid(got, want, why):
    result = bench_engines.agreement(got, want)
    assert result["valid"] is False
    assert result["why"] == why
