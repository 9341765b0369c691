"""Placement by cost, checked by measurement: the choice against the best claiming order.

The search chooses on estimates, and an estimate can be wrong where the model
differs from its parts: a claiming order merges neighbouring matches into one
partition (fewer copies, one kernel) where placement by cost keeps each match
apart, and a kernel timed alone is not always as fast amid the others. So,
unless the user pinned operators, the choice meets the runner-up: the
starting point of the search (a claiming order, an accelerator alone, the host
alone) with the lowest estimate whose placement differs. Both are built as
they would be compiled and timed on random inputs, interleaved; the faster is
kept. The verdict is cached with the costs, keyed by the model, so a second
compile builds only the winner.

The check is skipped, with the reason in ``report.auto["finalists"]``, when a
plugin's ``umahub_cost`` gave costs (a vendor's model of its hardware is not
overruled by timing its emulation here), when the placement is pinned, when
the model is built for another machine or timed on a board, or when the model
cannot run on random inputs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from umahub._tvm import structural_hash
from umahub.auto.cache import CostCache

__all__ = ["ROUNDS", "accelerators_of", "cached_winner", "measure", "skipped"]

#: Interleaved rounds of timing; each candidate's best round counts.
ROUNDS = 5

#: How long the timing may take, in all, before rounds are cut short (seconds).
BUDGET = 5.0


def accelerators_of(name: str) -> tuple[str, ...]:
    """The claiming order of a starting point's name (``"priority npu > dsp"``,
    ``"npu alone"``, ``"host alone"``)."""
    if name == "host alone":
        return ()
    if name.endswith(" alone"):
        return (name.removesuffix(" alone"),)
    return tuple(name.removeprefix("priority ").split(" > "))


def skipped(comp: Any) -> str:
    """Why the finalists of ``comp`` are not measured, or ""."""
    auto = comp.auto
    if auto is None or auto.runner_up is None:
        return "no other starting point places differently"
    if auto.counts.get("plugin"):
        return "costs come from a plugin's umahub_cost, which timing here would overrule"
    if comp.pins:
        return "operators are pinned (the claiming orders would ignore the pins)"
    if comp.foreign:
        return "the model is built for another machine"
    if comp.board is not None:
        return "the candidates are timed on a board"
    return ""


def _key(comp: Any) -> str:
    return comp.auto.key_of("finalists", str(structural_hash(comp.mod)))


def cached_winner(comp: Any, cache: CostCache) -> str | None:
    """The finalist that won when this model was compiled before: "auto", the
    runner-up's name, or None when it was not measured."""
    entry = cache.get(_key(comp))
    if not isinstance(entry, dict) or entry.get("runner_up") != comp.auto.runner_up:
        return None
    comp.auto.finalists = {**entry, "cached": True}
    return str(entry.get("kept"))


def _median_run(model: Any, inputs: Sequence[Any], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        model.run(*inputs)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def measure(
    comp: Any,
    chosen: Any,
    runner_up: Any,
    inputs: Callable[[Any], Sequence[Any]],
    cache: CostCache,
) -> str:
    """Time ``chosen`` and ``runner_up`` (compiled models) interleaved; return the
    winner ("auto" or the runner-up's name) and keep the verdict in ``comp.auto``
    and the cache. ``inputs(model)`` makes the random inputs."""
    name = comp.auto.runner_up
    xs = inputs(chosen)
    for model in (chosen, runner_up):  # warm up: the first calls make VMs and threads
        model.run(*xs)
    start = time.perf_counter()
    one = max(_median_run(chosen, xs, 1), _median_run(runner_up, xs, 1), 1e-6)
    runs = max(1, min(3, int(BUDGET / (2 * ROUNDS * one))))
    best = {"auto": float("inf"), name: float("inf")}
    for _ in range(ROUNDS):
        for label, model in (("auto", chosen), (name, runner_up)):
            best[label] = min(best[label], _median_run(model, xs, runs))
        if time.perf_counter() - start > BUDGET:
            break
    kept = name if best[name] < best["auto"] else "auto"
    verdict = {
        "runner_up": name,
        "auto_ms": best["auto"] * 1e3,
        "runner_up_ms": best[name] * 1e3,
        "kept": kept,
    }
    comp.auto.finalists = {**verdict, "cached": False}
    cache.put(_key(comp), verdict)
    cache.save()
    return kept
