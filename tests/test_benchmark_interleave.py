"""``benchmarks/_common.interleave``: engines in long-lived processes timed in turns,
and :func:`paired_ratio`, the median over rounds of one engine's time over another's."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _common

# A worker that sleeps SECONDS per call and writes one line to a shared log per call,
# so that the test sees in which order the engines ran.
_SLEEPER = r"""
import sys, time
from _common import serve
name, seconds, log = sys.argv[1], float(sys.argv[2]), sys.argv[3]
def run():
    time.sleep(seconds)
    with open(log, "a") as f:
        f.write(name + "\n")
serve(run, label=name)
"""


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(_common, "PAUSE_S", 0.0)


def test_engines_take_turns_round_by_round_in_a_rotating_order(tmp_path, quick):
    log = tmp_path / "calls.log"
    env = _common.worker_env(1)
    workers = {
        name: (_SLEEPER, [name, str(seconds), str(log)], env)
        for name, seconds in (("a", 0.002), ("b", 0.010))
    }
    results = _common.interleave(workers, rounds=3, repeat={"a": 2, "b": 1})
    # each turn: one untimed call, then the timed ones; b first in the second round
    turns = [("a", 3), ("b", 2), ("b", 2), ("a", 3), ("a", 3), ("b", 2)]
    assert log.read_text().split() == [name for name, calls in turns for _ in range(calls)]
    assert results["a"]["label"] == "a" and results["b"]["label"] == "b"
    assert len(results["a"]["round_ms"]) == len(results["b"]["round_ms"]) == 3
    # a sleep never ends early; how much later it ends is the machine's
    assert 2.0 <= results["a"]["min_ms"] <= results["a"]["ms"]
    assert 10.0 <= results["b"]["min_ms"] <= results["b"]["ms"]
    for name in ("a", "b"):
        assert results[name]["ms"] == statistics.median(results[name]["round_ms"])
    rounds = zip(results["b"]["round_ms"], results["a"]["round_ms"], strict=True)
    paired = statistics.median(b / a for b, a in rounds)
    assert _common.paired_ratio(results["b"], results["a"]) == paired


def test_an_engine_with_fewer_rounds_takes_its_turn_in_the_first_ones_only(tmp_path, quick):
    log = tmp_path / "calls.log"
    env = _common.worker_env(1)
    workers = {name: (_SLEEPER, [name, "0", str(log)], env) for name in ("a", "slow")}
    results = _common.interleave(workers, rounds=3, repeat=1, rounds_of={"slow": 1})
    assert log.read_text().split() == ["a", "a", "slow", "slow", "a", "a", "a", "a"]
    assert len(results["a"]["round_ms"]) == 3
    assert len(results["slow"]["round_ms"]) == 1
    assert _common.paired_ratio(results["a"], results["slow"]) is None


def test_a_worker_that_fails_to_start_is_an_error_with_its_last_words(tmp_path, quick):
    env = _common.worker_env(1)
    broken = "raise SystemExit('no model here: /nowhere.onnx')"
    workers = {
        "good": (_SLEEPER, ["good", "0", str(tmp_path / "log")], env),
        "broken": (broken, [], env),
    }
    results = _common.interleave(workers, rounds=2, repeat=1)
    assert results["broken"] == {"error": "no model here: /nowhere.onnx"}
    assert len(results["good"]["round_ms"]) == 2
    assert _common.paired_ratio(results["good"], results["broken"]) is None


def test_paired_ratio_divides_round_by_round():
    # the machine ran slow in the second round: both engines' times doubled
    a = {"round_ms": [2.0, 4.0, 2.2]}
    b = {"round_ms": [1.0, 2.0, 1.0]}
    assert _common.paired_ratio(a, b) == 2.0
    assert _common.paired_ratio(a, {"round_ms": [1.0]}) is None


def test_a_workers_state_after_each_round_is_kept_round_by_round(tmp_path, quick):
    """What an engine says of itself after each round (umahub: how "auto" runs it),
    so that a slow round can be told from a change of the engine's mind."""
    counting = r"""
import sys
from _common import serve
calls = []
serve(lambda: calls.append(1), state=lambda: f"{len(calls)} calls")
"""
    env = _common.worker_env(1)
    workers = {
        "counting": (counting, [], env),
        "silent": (_SLEEPER, ["silent", "0", str(tmp_path / "log")], env),
    }
    results = _common.interleave(workers, rounds=3, repeat=2)
    # each turn one untimed call and two timed
    assert results["counting"]["round_state"] == ["3 calls", "6 calls", "9 calls"]
    assert "round_state" not in results["silent"]
