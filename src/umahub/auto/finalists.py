"""Placement by cost, checked by measurement: the choice against the other starting points.

The search chooses on estimates, and an estimate can be wrong where the model
differs from its parts: a claiming order merges neighbouring matches into one
partition (fewer copies, one kernel) where placement by cost keeps each match
apart, and a kernel timed alone is not always as fast amid the others. So,
unless the user pinned operators, the choice meets the **contenders**: the
starting points of the search (each claiming order, each accelerator alone,
the host alone) that place differently from it and from each other, best
estimated first (one that places alike is a contender too where it merges
neighbouring matches into one partition, which the choice does not), at most
``auto-finalists`` of them (default 6), and none estimated more than
:data:`WITHIN` times slower than the choice: more than the estimate's known
error could make up.

The contenders meet the choice one at a time, as in a knockout: each is built
as it would be compiled, then it and the fastest so far are timed on random
inputs in interleaved rounds, and the one faster in most rounds (the median of
the rounds' ratios) stays. So at most two built models are
held at once, and a placement every starting point measured faster than the
choice cannot be kept over it. The verdict is cached with the costs, keyed by
the model, so a second compile builds only the winner.

The choice must earn its place: it keeps the lead against a contender only
when the rounds show it faster (:func:`slower_by_chance` under
:data:`SIGNIFICANCE`), or are too few to show anything. A tie goes to the
contender, a placement a claiming order or one accelerator makes, which the
user could have configured and which runs as it was timed; the estimate's own
mix of the two is the least proven: on a loaded machine, whether such a mix
beats the host alone can change from one compile to the next.

Why a bound on the estimate, and why that one: a contender runs faster than
the choice only if the estimate is off enough for both. The estimate of a
placement is known to be within :data:`ERROR` of its measurement, either way
(``benchmarks/auto.py`` prints each estimate over its measurement; the
largest error measured is what :data:`ERROR` holds); so a contender estimated ``r`` times
slower than the choice can still measure faster while ``r < (1 + ERROR) /
(1 - ERROR)`` (the contender estimated that much too slow, the choice that
much too fast), and not beyond. Building one beyond would cost a full compile
and tell nothing; a larger error keeps more contenders.

The check is skipped, with the reason in ``report.auto["finalists"]``, when a
plugin's ``umahub_cost`` gave costs (a vendor's model of its hardware is not
overruled by timing its emulation here), when the placement is pinned, when
the model is built for another machine or timed on a board, when
``auto-finalists = 0``, or when the model cannot run on random inputs.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from umahub._tvm import structural_hash
from umahub.auto.cache import CostCache
from umahub.auto.starts import accelerators_of

__all__ = [
    "BUDGET",
    "ERROR",
    "ROUNDS",
    "RUNS",
    "SIGNIFICANCE",
    "WITHIN",
    "Verdict",
    "accelerators_of",
    "cached_winner",
    "contenders",
    "measure",
    "skipped",
    "slower_by_chance",
]

#: Rounds of timing per match: each round times both models, the first to go alternating.
ROUNDS = 7

#: How long the timing of one match may take, in all, before rounds are cut short (s).
BUDGET = 3.0

#: The most runs of one model in one round (their median is the round's time).
RUNS = 20

#: The estimate's known error: a placement's estimate is within this share of its
#: measurement, either way (see the module's documentation). The aim is 30%; the
#: largest error measured (auto's estimate of mobilenetv2 at 0.61 of its measurement,
#: Intel Xeon, 2026-11-27) is 40%, and it is what keeps contenders in.
ERROR = 0.4

#: A contender estimated more than this many times slower than the choice is not built:
#: the most the estimate's known error (:data:`ERROR`) can make up.
WITHIN = (1 + ERROR) / (1 - ERROR)

#: Below this chance, rounds show one model slower than the other (:func:`slower_by_chance`).
SIGNIFICANCE = 0.05


def slower_by_chance(ratios: Sequence[float]) -> float:
    """How likely rounds at least this much in one model's disfavour are when
    two models are equally fast, ``ratios`` being its time over the other's in
    each round: Fisher's sign-flip test on the log ratios, exact over all 2**n
    sign assignments (beyond 16 rounds, over 65,536 of them drawn at random,
    always the same).

    Were the two equally fast, each round's ratio would be above 1 or below it
    by the machine's load alone, as likely one way as the other; the share of
    sign assignments whose sum reaches the observed one is that chance. With n
    rounds it is at least 2**-n: five rounds are the fewest that can show a
    difference at :data:`SIGNIFICANCE`.
    """
    logs = [math.log(r) for r in ratios]
    observed = sum(logs) - 1e-12
    if len(logs) <= 16:
        assignments: Iterable[Sequence[int]] = itertools.product((1, -1), repeat=len(logs))
        count = 2 ** len(logs)
    else:
        draw, count = random.Random(0), 2**16
        assignments = ([draw.choice((1, -1)) for _ in logs] for _ in range(count))
    sums = (sum(s * abs(x) for s, x in zip(signs, logs)) for signs in assignments)
    return sum(1 for total in sums if total >= observed) / count


def contenders(comp: Any) -> list[str]:
    """The starting points the choice of ``comp`` is measured against, in order."""
    auto = comp.auto
    limit = comp.hub.config.auto_finalists
    near = [n for n in auto.contenders if auto.baselines[n] <= WITHIN * auto.estimate]
    return near[:limit]


def skipped(comp: Any) -> str:
    """Why the finalists of ``comp`` are not measured, or ""."""
    auto = comp.auto
    if auto is None or not auto.contenders:
        return "no other starting point places differently"
    if auto.counts.get("plugin"):
        return "costs come from a plugin's umahub_cost, which timing here would overrule"
    if comp.pins:
        return "operators are pinned (the claiming orders would ignore the pins)"
    if comp.foreign:
        return "the model is built for another machine"
    if comp.board is not None:
        return "the candidates are timed on a board"
    if comp.hub.config.auto_finalists == 0:
        return "auto-finalists = 0: the estimate decides"
    if not contenders(comp):
        return (
            f"every other starting point is estimated more than {WITHIN:.2f}x slower, "
            f"more than the estimate's known error ({ERROR:.0%} either way) can make up "
            f"(the nearest, {auto.contenders[0]}, "
            f"{auto.baselines[auto.contenders[0]] / auto.estimate:.2f}x)"
        )
    return ""


def _key(comp: Any) -> str:
    return comp.auto.key_of("finalists", str(structural_hash(comp.mod)), *contenders(comp))


def cached_winner(comp: Any, cache: CostCache) -> str | None:
    """The finalist that won when this model was compiled before: "auto", a
    contender's name, or None when it was not measured."""
    entry = cache.get(_key(comp))
    if not isinstance(entry, dict) or entry.get("contenders") != contenders(comp):
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


def _match(a: Any, b: Any, xs: Sequence[Any]) -> tuple[float, float, list[float]]:
    """``a`` against ``b``: each one's best round (seconds), and ``b``'s time
    over ``a``'s in each round (their median decides).

    The decision rests on the ratio of each round, not on the best times: a
    load on the machine that comes and goes touches both models of a round
    alike, and a difference of a few percent (a partition more or less, a copy)
    is seen only that way.
    """
    for model in (a, b):
        model.warm_up(*xs)
    start = time.perf_counter()
    one = max(_median_run(a, xs, 1), _median_run(b, xs, 1), 1e-6)
    runs = max(1, min(RUNS, int(BUDGET / (2 * ROUNDS * one))))
    rounds: list[tuple[float, float]] = []
    for i in range(ROUNDS):
        if i % 2:
            tb, ta = _median_run(b, xs, runs), _median_run(a, xs, runs)
        else:
            ta, tb = _median_run(a, xs, runs), _median_run(b, xs, runs)
        rounds.append((ta, tb))
        if time.perf_counter() - start > BUDGET:
            break
    ratios = [tb / ta for ta, tb in rounds]
    return min(t for t, _ in rounds), min(t for _, t in rounds), ratios


def _shown_slower(ratios: Sequence[float]) -> bool:
    """Whether a match's rounds show the contender slower (``ratios``: its time
    over the leader's), or are too few to show either way."""
    return 2.0 ** -len(ratios) >= SIGNIFICANCE or slower_by_chance(ratios) < SIGNIFICANCE


class Verdict:
    """The knockout of the choice and its contenders, as it goes.

    ``leader`` is the name of the fastest so far ("auto" for the choice) and
    ``leader_model`` its built model; :meth:`meet` times the next contender
    against it.
    """

    def __init__(self, comp: Any, chosen: Any, inputs: Callable[[Any], Sequence[Any]]):
        self.comp = comp
        self.leader, self.leader_model = "auto", chosen
        self.xs = inputs(chosen)
        chosen.run(*self.xs)  # a model that cannot run on random inputs stops here
        self.measured_ms: dict[str, float] = {}
        self.left_out: dict[str, str] = {}
        self.tie = False  # the leader took the lead from the choice without being faster

    def leave_out(self, name: str, exc: BaseException) -> None:
        """Contender ``name`` failed to build or run: it is not a finalist."""
        self.left_out[name] = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]

    def meet(self, name: str, model: Any) -> bool:
        """Time contender ``name`` against the leader; True when it takes the lead."""
        try:
            lead, other, ratios = _match(self.leader_model, model, self.xs)
        except Exception as exc:  # the leader ran before: the contender failed
            self.leave_out(name, exc)
            return False
        self.measured_ms[self.leader] = min(
            self.measured_ms.get(self.leader, lead * 1e3), lead * 1e3
        )
        self.measured_ms[name] = other * 1e3
        faster = statistics.median(ratios) < 1.0
        if faster or (self.leader == "auto" and not _shown_slower(ratios)):
            self.leader, self.leader_model, self.tie = name, model, not faster
            return True
        return False

    def save(self, cache: CostCache) -> str:
        """Keep the verdict in ``comp.auto.finalists`` and the cache; return the winner."""
        verdict = {
            "contenders": contenders(self.comp),
            "measured_ms": self.measured_ms,
            "kept": self.leader,
            "tie": self.tie,
        }
        if self.left_out:
            verdict["left_out"] = self.left_out
        self.comp.auto.finalists = {**verdict, "cached": False}
        cache.put(_key(self.comp), verdict)
        cache.save()
        return self.leader


def measure(
    comp: Any,
    chosen: Any,
    build: Callable[[str], Any],
    inputs: Callable[[Any], Sequence[Any]],
    cache: CostCache,
) -> tuple[str, Any]:
    """The knockout: ``chosen`` (the built choice, a compiled model) against each
    contender, whose compilation ``build(name)`` returns built; returns the
    winner's name ("auto" or a contender's) and its compilation (None for the
    choice). ``inputs(model)`` makes the random inputs. A contender that fails
    to build or to run is left out, with the reason in the verdict; the choice
    failing to run raises."""
    verdict = Verdict(comp, chosen, inputs)
    kept: Any = None
    for name in contenders(comp):
        try:
            built = build(name)
        except Exception as exc:  # a contender that does not build: the others go on
            verdict.leave_out(name, exc)
            continue
        if verdict.meet(name, built.compiled):
            kept = built
    return verdict.save(cache), kept
