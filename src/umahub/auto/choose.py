"""Placement by cost put together: candidates, costs, search; the choice and its reasons.

See :mod:`umahub.auto` for the method. :func:`run` is called by the pipeline
after the plan stage, when placement is by cost.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tvm import relax

from umahub.auto.cache import digest
from umahub.auto.candidates import Group, find_groups
from umahub.auto.costs import Cost, Costs
from umahub.auto.search import Assignment, Candidate, Problem, greedy, solve
from umahub.auto.starts import order_name
from umahub.compiler.composites import name_nodes, pattern_of
from umahub.compiler.operators import walk
from umahub.config import HOST
from umahub.plugin.context import Operator

__all__ = ["AutoChoice", "run"]


@dataclass
class AutoChoice:
    """What placement by cost chose, and why (``report.auto`` holds its :meth:`to_dict`).

    Attributes:
        chosen: node -> accelerator of every operator placed on one (the rest: the host).
        estimate: the estimated latency of the choice (seconds).
        baselines: starting point -> its estimated latency (``"priority npu > dsp"``).
        configured: the name of the configured claiming order among ``baselines``.
        groups: one dict per candidate group: nodes, accelerator, patterns,
            costs there and on the host, whether chosen and by priority, why.
        changed: node -> (device by priority, device by cost) where they differ.
        copies: the copy model per accelerator.
        counts: how many costs came from plugins, the cache, measurements, nowhere.
        seconds: time spent finding candidates, costing and searching.
        cache: the cost cache's path and its hits and misses.
        executor: the executor the estimate is for.
        contenders: the starting points that place differently from the choice
            (or alike, but merging neighbouring matches into one partition) and
            from each other, by estimate, best first (``"priority npu >
            dsp"``, ``"npu alone"``, ``"host alone"``): what the choice is
            measured against (:mod:`umahub.auto.finalists`).
        contenders_changed: per contender, what it changes against ``priority``.
        finalists: the choice and the contenders measured, or why not
            (:mod:`umahub.auto.finalists`).
        cache_base: what every cache key of this compile's costs depends on.
    """

    chosen: dict[str, str]
    estimate: float
    baselines: dict[str, float]
    configured: str
    groups: list[dict[str, Any]] = field(default_factory=list)
    changed: dict[str, tuple[str, str]] = field(default_factory=dict)
    copies: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    cache: dict[str, Any] = field(default_factory=dict)
    executor: str = "auto"
    contenders: list[str] = field(default_factory=list)
    contenders_changed: dict[str, dict[str, tuple[str, str]]] = field(default_factory=dict)
    finalists: dict[str, Any] = field(default_factory=dict)
    cache_base: tuple[Any, ...] = ()

    def key_of(self, *parts: Any) -> str:
        """A cache key for something this compile's costs determine."""
        return digest(*self.cache_base, *parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (milliseconds where people read them)."""
        return {
            "estimate_ms": self.estimate * 1e3,
            "baselines_ms": {k: v * 1e3 for k, v in self.baselines.items()},
            "configured": self.configured,
            "executor": self.executor,
            "groups": self.groups,
            "changed": {k: list(v) for k, v in self.changed.items()},
            "copies": self.copies,
            "costs": self.counts,
            "seconds": self.seconds,
            "cache": self.cache,
            "contenders": self.contenders,
            "finalists": self.finalists,
        }


def _operators(mod: Any) -> tuple[list[Operator], frozenset[str]]:
    """Every operator of ``main`` named as partitioning names them, and the model's outputs.

    Names need not be unique: an imported model names every operator a source node
    became after that node (PyTorch's ``features.0.2``, a Hardswish, is an add, a clip,
    a multiply and a divide). Placement places by name, so operators of one name are
    one node of the choice: its FLOPs summed, its inputs those from other nodes, its
    output the last one's. Counted apart, each was costed and copied as the whole.
    """
    named = name_nodes(relax.transform.ConvertToDataflow()(mod))
    rows, out = walk(named["main"], named, pattern_of)
    merged: dict[str, Operator] = {}
    for r in rows:
        seen = merged.get(r.node)
        if seen is None:
            merged[r.node] = Operator(r.node, r.op, inputs=r.inputs, flops=r.flops, bytes=r.bytes)
            continue
        inputs = (*seen.inputs, *(x for x in r.inputs if x != r.node and x not in seen.inputs))
        merged[r.node] = replace(
            seen, op=r.op, inputs=inputs, flops=seen.flops + r.flops, bytes=r.bytes
        )
    return list(merged.values()), frozenset(out)


def _weight(op: Operator) -> float:
    return float(max(op.flops, op.bytes // 4, 1))


def _host_seconds(
    operators: Sequence[Operator], measured: Sequence[tuple[Group, float]]
) -> dict[str, float]:
    """Each operator's seconds on the host: the measured groups holding it, shared out by
    weight (FLOPs, else elements); operators in no measured group at the median rate."""
    by_name = {o.name: o for o in operators}
    shares: dict[str, list[float]] = {}
    rates = []
    for group, seconds in measured:
        nodes = [n for n in dict.fromkeys(group.nodes) if n in by_name]  # a name once
        weights = [_weight(by_name[n]) for n in nodes]
        total = sum(weights) or 1.0
        rates.append(seconds / total)
        for n, w in zip(nodes, weights):
            shares.setdefault(n, []).append(seconds * w / total)
    rate = sorted(rates)[len(rates) // 2] if rates else 0.0
    return {
        o.name: sum(shares[o.name]) / len(shares[o.name]) if o.name in shares else rate * _weight(o)
        for o in operators
    }


def run(comp: Any, build: Any) -> None:
    """Choose the placement of ``comp`` by cost; set ``comp.auto`` and ``comp.pins.chosen``.

    ``build`` builds a candidate group alone to time it (see :class:`Costs`).
    """
    hub = comp.hub
    clock = {"candidates": time.perf_counter()}
    operators, outputs = _operators(comp.mod)
    position = {o.name: i for i, o in enumerate(operators)}
    by_name = {o.name: o for o in operators}
    planned: dict[str, list[Any]] = {}
    for p in comp.planned:
        planned.setdefault(p.accelerator.name, []).append(p)
    groups: list[Group] = []
    for acc in hub.accelerators:
        if acc.name in planned:
            found = find_groups(comp.mod, acc, planned[acc.name], comp.pins, position)
            groups.extend(found)
    clock["costs"] = time.perf_counter()
    costs = Costs(comp, build)
    on_accel: list[Cost] = []
    on_host: list[Cost] = []
    for g in groups:
        on_accel.append(costs.of(g, [by_name[n] for n in g.nodes if n in by_name]))
        on_host.append(costs.on_host(g))
    costs.cache.save()
    clock["search"] = time.perf_counter()
    known = [a.seconds is not None and h.seconds is not None for a, h in zip(on_accel, on_host)]
    host = _host_seconds(
        operators,
        [(g, h.seconds) for g, h, k in zip(groups, on_host, known) if k and h.seconds is not None],
    )
    copy_model = costs.copy_model(hub.accelerators)
    configured = [a.name for a in hub.claimants if a.name in planned]
    problem = _problem(comp, operators, outputs, host, groups, on_accel, copy_model)
    # A group without a cost stays where priority puts it.
    by_priority = greedy(problem, configured)
    candidates = [
        replace(c, forced=c.forced or (not k and i in by_priority.chosen))
        for i, (c, k) in enumerate(zip(problem.candidates, known))
    ]
    keep = [i for i, c in enumerate(candidates) if known[i] or c.forced]
    problem = replace(problem, candidates=[candidates[i] for i in keep])
    solution = solve(problem, configured)
    clock["end"] = time.perf_counter()

    chosen = {n: problem.candidates[i].accelerator for i in solution.assignment.chosen
              for n in problem.candidates[i].nodes}  # fmt: skip
    priority = greedy(problem, configured)

    # A starting point that places every operator as the choice does is still a
    # contender where it merges neighbouring matches: the choice keeps each match
    # a partition of its own, and a merged partition, lowered as one kernel, can
    # run much faster than its matches apart.
    contenders: list[str] = []
    choice, placements = tuple(solution.assignment.devices().values()), set()
    for name in sorted(solution.baselines, key=solution.baselines.__getitem__):
        assignment = solution.baseline_assignments[name]
        placed = tuple(assignment.devices().values())
        if placed in placements or (placed == choice and not _merges_neighbours(assignment)):
            continue
        placements.add(placed)
        contenders.append(name)
    comp.pins.chosen = chosen
    comp.auto = AutoChoice(
        chosen=chosen,
        estimate=solution.estimate,
        baselines=solution.baselines,
        configured=order_name(configured),
        groups=_group_rows(groups, keep, on_accel, on_host, solution.assignment, priority),
        changed=_changed(priority, solution.assignment),
        copies=copy_model.to_dict(),
        counts=dict(costs.counts),
        seconds={
            "candidates": clock["costs"] - clock["candidates"],
            "costs": clock["search"] - clock["costs"],
            "search": clock["end"] - clock["search"],
        },
        cache={
            "path": str(costs.cache.path),
            "hits": costs.cache.hits,
            "misses": costs.cache.misses,
        },
        executor=problem.executor,
        contenders=contenders,
        contenders_changed={
            name: _changed(priority, solution.baseline_assignments[name]) for name in contenders
        },
        cache_base=costs.base,
    )


def _changed(before: Assignment, after: Assignment) -> dict[str, tuple[str, str]]:
    """node -> (its device in ``before``, in ``after``), where the two differ."""
    nodes = before.problem.nodes
    return {
        n: (before.device(n), after.device(n)) for n in nodes if before.device(n) != after.device(n)
    }


def _merges_neighbours(assignment: Any) -> bool:
    """Whether a claiming order that placed these matches would lower two of
    them as one partition: a match feeding another on the same accelerator."""
    p = assignment.problem
    for node, i in assignment.owner.items():
        for reader in p.consumers.get(node, ()):
            j = assignment.owner.get(reader, i)
            if j != i and p.candidates[j].accelerator == p.candidates[i].accelerator:
                return True
    return False


def _problem(
    comp: Any,
    operators: Sequence[Operator],
    outputs: frozenset[str],
    host: Mapping[str, float],
    groups: Sequence[Group],
    on_accel: Sequence[Cost],
    copy_model: Any,
) -> Problem:
    hub = comp.hub
    return Problem(
        nodes=[o.name for o in operators],
        inputs={o.name: o.inputs for o in operators},
        bytes={o.name: o.bytes for o in operators},
        host=host,
        candidates=[
            Candidate(g.accelerator, tuple(dict.fromkeys(g.nodes)), c.seconds or 0.0, g.forced)
            for g, c in zip(groups, on_accel)
        ],
        copy_seconds=copy_model.seconds,
        copy_kind={a.name: (a.pool.copy if a.pool else "sync") for a in hub.accelerators},
        instances={a.name: a.instances for a in hub.accelerators},
        outputs=outputs,
        executor=comp.config.executor,
        shared_memory=frozenset(a.name for a in hub.accelerators if not a.has_device),
    )


def _source(source: str) -> str:
    """Where a cost came from, as the report says it: ``"plugin x"`` is x's cost model
    (its ``umahub_cost``), not a timing on this machine."""
    return (
        source.replace("plugin ", "cost model of ", 1) if source.startswith("plugin ") else source
    )


def _ms(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds * 1e3:.3f} ms"


def _group_rows(
    groups: Sequence[Group],
    keep: Sequence[int],
    on_accel: Sequence[Cost],
    on_host: Sequence[Cost],
    final: Assignment,
    priority: Assignment,
) -> list[dict[str, Any]]:
    """One row per candidate group, with why it went where it went."""
    index = {g: k for k, g in enumerate(keep)}  # group index -> candidate index in the problem
    rows = []
    for i, g in enumerate(groups):
        a, h = on_accel[i], on_host[i]
        k = index.get(i)
        taken = k is not None and k in final.chosen
        row: dict[str, Any] = {
            "accelerator": g.accelerator,
            "nodes": list(g.nodes),
            "patterns": list(g.patterns),
            "costs": {g.accelerator: a.to_dict(), HOST: h.to_dict()},
            "chosen": taken,
            "by_priority": k is not None and k in priority.chosen,
        }
        if k is None:
            why = a.why or h.why or "no cost"
            row["why"] = f"not considered: {why}; priority does not take it"
        elif g.forced:
            row["why"] = "pinned to it"
        elif a.seconds is None or h.seconds is None:
            row["why"] = f"no cost ({a.why or h.why}): placed as priority places it"
        else:
            delta = final.gain(k)
            where = "taking it" if not taken else "leaving it to the host"
            verdict = "would cost" if delta >= 0 else "would save"
            row["why"] = (
                f"{g.accelerator} {_ms(a.seconds)} ({_source(a.source)}), host "
                f"{_ms(h.seconds)} ({_source(h.source)}); {where} "
                f"{verdict} {abs(delta) * 1e3:.3f} ms, copies included"
            )
        rows.append(row)
    return rows
