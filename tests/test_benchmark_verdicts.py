"""The verdicts of the benchmarks: ``benchmarks/auto.py``'s (auto against every
other placement, round by round, worse only when the rounds show it) and
``benchmarks/executors.py``'s (the default executor against the VM, paired in
one process, slower only beyond the VM's own noise)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import auto as bench_auto
import executors as bench_executors


def _row(auto: list[float], other: list[float], *, same: bool = False) -> dict:
    """A model's row: auto, one other placement, and two builds of a third
    placement that differ by 1% in every round (the noise)."""
    twin = [10.0] * len(auto)
    return {
        "twin a": {"rounds_ms": twin, "median_ms": 10.0, "placement_id": "t"},
        "twin b": {"rounds_ms": [t * 1.01 for t in twin], "median_ms": 10.1, "placement_id": "t"},
        "other": {"rounds_ms": other, "median_ms": min(other), "placement_id": "o"},
        "auto": {"rounds_ms": auto, "median_ms": min(auto), "placement_id": "o" if same else "x"},
    }


@pytest.mark.parametrize(
    ("auto", "same", "verdict", "paired"),
    [
        ([7.35, 7.35, 7.35, 7.35, 7.35], False, "worse", 1.05),  # 5% slower in every round
        ([7.35, 7.35, 7.35, 7.35, 5.6], False, "within the noise", 1.05),  # one round faster
        ([7.35, 7.35, 7.35, 7.35, 7.35], True, "the same placement", 1.05),
        ([7.05, 7.05, 7.05, 7.05, 7.05], False, "within the noise", 1.007),  # within the twins'
        ([6.9, 6.9, 6.9, 6.9, 6.9], False, "not worse", 0.986),
    ],
)
def test_auto_is_worse_only_beyond_the_noise_and_in_enough_rounds(auto, same, verdict, paired):
    # "other" is 7.0 ms in every round; "twin a" against "twin b" gives the 1% noise
    row = bench_auto.compare(_row(auto, [7.0] * 5, same=same))
    assert row["auto"]["noise"] == pytest.approx(1 - 10 / 10.1)
    judged = row["auto"]
    assert (judged["against"], judged["verdict"]) == ("other", verdict)
    assert judged["paired"]["other"] == pytest.approx(paired, abs=1e-3)


@pytest.mark.parametrize(
    ("auto", "verdict", "ratio"),
    [
        (10.0, "not slower", 1.0),  # the VM chosen: auto is the VM
        (10.4, "not slower", 1.04),  # within the VM's 5% against itself
        (11.0, "slower", 1.1),  # beyond it
    ],
)
def test_the_default_executor_is_judged_against_the_vm_in_its_own_process(auto, verdict, ratio):
    # the VM's two blocks around auto's differ by 5% (its noise), the mean 10 ms
    triples = [[9.75, auto, 10.25]] * 6
    judged = bench_executors.paired_verdict(triples)
    assert judged["verdict"] == verdict
    assert judged["auto_over_vm"] == pytest.approx(ratio)
    assert judged["noise"] == pytest.approx(10.25 / 9.75 - 1)
    assert judged["triples"] == 6


def test_the_paired_noise_is_at_least_two_percent():
    judged = bench_executors.paired_verdict([[10.0, 10.15, 10.0]] * 3)
    assert (judged["noise"], judged["verdict"]) == (0.02, "not slower")
    assert bench_executors.paired_verdict([[10.0, 10.25, 10.0]])["verdict"] == "slower"
