"""The choice itself: which candidate groups run where, for the lowest estimated latency.

This module knows nothing of TVM: a :class:`Problem` is the model's operators
in model order (what each reads, how many bytes it makes, what it costs on the
host) and the *candidate groups*: the matches an accelerator's patterns make,
each with its measured (or vendor-given) seconds. An *assignment* chooses a set
of candidates that do not overlap; every operator no chosen candidate holds
runs on the host.

The estimate of an assignment is the latency of the executor that runs it:

* **sequential** (the VM): the sum of every chosen candidate's seconds, every
  host operator's seconds and every copy's seconds: a tensor is copied once per
  device that reads it and is not where it was made (a model output made on an
  accelerator goes back to the host), except between two devices in the
  host's memory (``shared_memory``), where the VM reads it in place
  (:mod:`umahub.compiler.one_memory`);
* **concurrent** (:mod:`umahub.runtime.executor`): the same tasks list-scheduled in
  model order, one lane per device instance, a sync copy on the lane of its
  accelerator end's instance, an async copy on that instance's DMA lane, where it
  overlaps compute: the lane model of :mod:`umahub.lanes`.

``executor = "auto"`` runs whichever is faster, so the estimate is the lower of
the two.

The search (defended in the user guide's "Placement" page, docs/guide/placement.md): choosing
non-overlapping groups with copy costs between them is a labelling problem on a
DAG, NP-hard in general (it contains multiway cut); a dynamic program over the
model order is exact only for chains, where the copies to a skip connection's
far end do not matter. So:

1. every claiming order of the accelerators (all permutations up to
   :data:`MAX_PERMUTED` accelerators, else the configured one), every
   accelerator alone and the host alone are built as greedy assignments, as
   ``priority`` would place them, and estimated;
2. from the best few, a local search takes or drops one candidate at a time
   (taking one drops those it overlaps) while the sequential estimate falls;
   each move is evaluated on the operators it touches and their neighbours
   only, so a sweep is linear in the model's size;
3. the finalists are ranked by the full estimate.

The result's estimate is therefore never above that of any claiming order or
single accelerator: the guarantee ``placement = "auto"`` gives.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from umahub.auto.starts import alone_name, order_name
from umahub.config import HOST
from umahub.lanes import Lanes, accelerator_end, copy_lane

__all__ = ["MAX_PERMUTED", "Assignment", "Candidate", "Problem", "Solution", "solve"]

#: With up to this many accelerators every claiming order is a starting point.
MAX_PERMUTED = 4
#: Local searches start from this many of the best starting points.
STARTS = 3
#: A local search stops after this many sweeps over the candidates.
MAX_SWEEPS = 20


@dataclass(frozen=True)
class Candidate:
    """A group of operators one accelerator's patterns can take, with what it costs there.

    Attributes:
        accelerator: where it would run.
        nodes: its operators (node names), in model order.
        seconds: its cost on ``accelerator``.
        forced: it holds an operator pinned to ``accelerator``: always chosen.
    """

    accelerator: str
    nodes: tuple[str, ...]
    seconds: float
    forced: bool = False


@dataclass
class Problem:
    """What the search chooses over (see the module's documentation).

    Attributes:
        nodes: every operator, in model order.
        inputs: node -> the nodes whose outputs it reads.
        bytes: node -> the size of its output.
        host: node -> its seconds on the host.
        candidates: the candidate groups.
        copy_seconds: ``(src, dst, bytes) -> seconds`` of one copy between two
            devices (accelerator names or ``"host"``).
        copy_kind: accelerator -> ``"sync"`` or ``"async"``.
        instances: accelerator -> how many instances (lanes) it has.
        outputs: the nodes whose values leave the model.
        executor: ``"vm"``, ``"concurrent"`` or ``"auto"``: which estimate counts.
        shared_memory: the accelerators in the host's memory (no device runtime
            of their own): the VM copies nothing between them and the host.
    """

    nodes: Sequence[str]
    inputs: Mapping[str, Sequence[str]]
    bytes: Mapping[str, int]
    host: Mapping[str, float]
    candidates: Sequence[Candidate]
    copy_seconds: Callable[[str, str, int], float]
    copy_kind: Mapping[str, str] = field(default_factory=dict)
    instances: Mapping[str, int] = field(default_factory=dict)
    outputs: frozenset[str] = frozenset()
    executor: str = "auto"
    shared_memory: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        self.position = {n: i for i, n in enumerate(self.nodes)}
        #: the devices the VM reads each other's tensors from in place
        self.in_host_memory = self.shared_memory | {HOST}
        consumers: dict[str, list[str]] = {n: [] for n in self.nodes}
        for node in self.nodes:
            for p in self.inputs.get(node, ()):
                if p in consumers:
                    consumers[p].append(node)
        self.consumers = consumers
        self.of_node: dict[str, list[int]] = {}
        for i, c in enumerate(self.candidates):
            for n in c.nodes:
                self.of_node.setdefault(n, []).append(i)

    @property
    def accelerators(self) -> list[str]:
        """The accelerators with candidates, in order of first appearance."""
        return list(dict.fromkeys(c.accelerator for c in self.candidates))


class Assignment:
    """A set of chosen, non-overlapping candidates (indices into ``problem.candidates``)."""

    def __init__(self, problem: Problem, chosen: Iterable[int] = ()):
        self.problem = problem
        self.owner: dict[str, int] = {}
        self.chosen: set[int] = set()
        for i in chosen:
            self.take(i)

    def device(self, node: str) -> str:
        """Where ``node`` runs: an accelerator name or ``"host"``."""
        i = self.owner.get(node)
        return HOST if i is None else self.problem.candidates[i].accelerator

    def overlapping(self, index: int) -> set[int]:
        """The chosen candidates that share an operator with candidate ``index``."""
        return {self.owner[n] for n in self.problem.candidates[index].nodes if n in self.owner} - {
            index
        }

    def take(self, index: int) -> set[int]:
        """Choose candidate ``index``, dropping those it overlaps; returns the dropped."""
        dropped = self.overlapping(index)
        for j in dropped:
            self.drop(j)
        self.chosen.add(index)
        for n in self.problem.candidates[index].nodes:
            self.owner[n] = index
        return dropped

    def drop(self, index: int) -> None:
        """Unchoose candidate ``index`` (its operators go to the host)."""
        self.chosen.discard(index)
        for n in self.problem.candidates[index].nodes:
            if self.owner.get(n) == index:
                del self.owner[n]

    def flip(self, index: int) -> set[int]:
        """Drop candidate ``index`` if chosen, else take it; returns what taking it dropped."""
        if index in self.chosen:
            self.drop(index)
            return set()
        return self.take(index)

    def gain(self, index: int) -> float:
        """How :meth:`sequential` changes when candidate ``index`` is flipped (see
        :meth:`flip`), from the operators it touches; the assignment is left as it was."""
        was_chosen = index in self.chosen
        touched = set(self.problem.candidates[index].nodes)
        for j in self.overlapping(index):
            touched.update(self.problem.candidates[j].nodes)
        before = self.local(touched)
        dropped = self.flip(index)
        after = self.local(touched)
        self.flip(index)
        if not was_chosen:
            for j in dropped:
                self.take(j)
        return after - before

    def copy(self) -> Assignment:
        """An independent copy."""
        other = Assignment(self.problem)
        other.owner = dict(self.owner)
        other.chosen = set(self.chosen)
        return other

    def devices(self) -> dict[str, str]:
        """node -> device, for every operator."""
        return {n: self.device(n) for n in self.problem.nodes}

    # ---------------------------------------------------------------- estimates

    def _copies_of(self, producer: str) -> float:
        p = self.problem
        src = self.device(producer)
        readers = {self.device(c) for c in p.consumers.get(producer, ())}
        if producer in p.outputs:
            readers.add(HOST)
        readers.discard(src)
        if src in p.in_host_memory:  # the VM reads it in place
            readers -= p.in_host_memory
        size = p.bytes.get(producer, 0)
        return sum(p.copy_seconds(src, dst, size) for dst in readers)

    def _compute_of(self, nodes: Iterable[str]) -> float:
        p = self.problem
        total, seen = 0.0, set()
        for n in nodes:
            i = self.owner.get(n)
            if i is None:
                total += p.host.get(n, 0.0)
            elif i not in seen:
                seen.add(i)
                total += p.candidates[i].seconds
        return total

    def sequential(self) -> float:
        """The estimated latency on the VM: every task and copy one after the other."""
        nodes = self.problem.nodes
        return self._compute_of(nodes) + sum(self._copies_of(n) for n in nodes)

    def local(self, nodes: set[str]) -> float:
        """The part of :meth:`sequential` that the devices of ``nodes`` decide."""
        p = self.problem
        producers = set(nodes)
        for n in nodes:
            producers.update(x for x in p.inputs.get(n, ()) if x in p.position)
        return self._compute_of(nodes) + sum(self._copies_of(x) for x in producers)

    def concurrent(self) -> float:
        """The estimated latency on the concurrent executor (list scheduling, see module)."""
        p = self.problem
        lanes = Lanes()
        done: dict[str, float] = {}  # node -> when its output is ready where it was made
        copied: dict[tuple[str, str], float] = {}  # (producer, dst device) -> when ready there
        next_instance: dict[str, int] = {}
        made_on: dict[str, str] = {}  # node -> the lane that computed it

        def ready(node: str, lane: str, device: str) -> float:
            src = self.device(node)
            if src == device:
                return done[node]
            key = (node, device)
            if key not in copied:
                kind = p.copy_kind.get(accelerator_end(src, device), "sync")
                seconds = p.copy_seconds(src, device, p.bytes.get(node, 0))
                copier = copy_lane(made_on[node], lane, kind)
                copied[key] = lanes.book([copier], done[node], seconds) + seconds
            return copied[key]

        for node in p.nodes:
            i = self.owner.get(node)
            if i is None:
                reads = [ready(x, HOST, HOST) for x in p.inputs.get(node, ()) if x in done]
                seconds = p.host.get(node, 0.0)
                done[node] = lanes.book([HOST], max([0.0, *reads]), seconds) + seconds
                made_on[node] = HOST
                continue
            cand = p.candidates[i]
            if node != cand.nodes[-1]:
                continue  # a group runs once its last operator (in model order) is reached
            k = next_instance.get(cand.accelerator, 0)
            next_instance[cand.accelerator] = k + 1
            lane = f"{cand.accelerator}:{k % max(1, p.instances.get(cand.accelerator, 1))}"
            inner = set(cand.nodes)
            outer = {x for n in cand.nodes for x in p.inputs.get(n, ()) if x not in inner}
            # its copies queue as their data gets ready, as the executor queues them
            first = sorted((x for x in outer if x in done), key=lambda x: (done[x], p.position[x]))
            reads = [ready(x, lane, cand.accelerator) for x in first]
            end = lanes.book([lane], max([0.0, *reads]), cand.seconds) + cand.seconds
            for n in cand.nodes:
                done[n] = end
                made_on[n] = lane
        finish = [lanes.end]
        for node in p.outputs:
            if node in done:
                finish.append(ready(node, HOST, HOST))
        return max(finish)

    def estimate(self) -> float:
        """The estimated latency under the problem's executor (see the module)."""
        if self.problem.executor == "vm":
            return self.sequential()
        if self.problem.executor == "concurrent":
            return self.concurrent()
        return min(self.sequential(), self.concurrent())


@dataclass(frozen=True)
class Solution:
    """What :func:`solve` chose, and what it compared it with.

    Attributes:
        assignment: the chosen candidates.
        estimate: its estimated latency (seconds).
        baselines: name -> estimated latency of each starting point
            (``"priority npu > dsp"``, ``"npu alone"``, ``"host alone"``).
        baseline_assignments: name -> that starting point's assignment.
        moves: candidates the local search took or dropped.
    """

    assignment: Assignment
    estimate: float
    baselines: dict[str, float]
    baseline_assignments: dict[str, Assignment]
    moves: int


def greedy(problem: Problem, order: Sequence[str]) -> Assignment:
    """The assignment a claiming order gives: each accelerator in turn takes its candidates
    in model order where nothing is taken yet (forced candidates first)."""
    a = Assignment(problem)
    for i, c in enumerate(problem.candidates):
        if c.forced:
            a.take(i)
    for accel in order:
        for i, c in enumerate(problem.candidates):
            if c.accelerator == accel and not c.forced and not a.overlapping(i):
                a.take(i)
    return a


def _improve(a: Assignment) -> int:
    """Local search on the sequential estimate; returns how many moves it made."""
    p = a.problem
    order = sorted(
        range(len(p.candidates)),
        key=lambda i: p.position.get(p.candidates[i].nodes[0], 0) if p.candidates[i].nodes else 0,
    )
    moves = 0
    for _ in range(MAX_SWEEPS):
        changed = False
        for i in order:
            if p.candidates[i].forced:
                continue
            if i not in a.chosen and any(p.candidates[j].forced for j in a.overlapping(i)):
                continue
            if a.gain(i) < -1e-12:
                a.flip(i)
                changed, moves = True, moves + 1
        if not changed:
            break
    return moves


def solve(problem: Problem, configured: Sequence[str] = ()) -> Solution:
    """Choose the assignment with the lowest estimate (see the module's documentation).

    ``configured`` is the claiming order the config gives (``priority``); among
    equal estimates its assignment wins, so that auto changes nothing it cannot
    improve.
    """
    accels = problem.accelerators
    starts: dict[str, Assignment] = {}
    if configured:
        starts[order_name(configured)] = greedy(problem, configured)
    orders = itertools.permutations(accels) if len(accels) <= MAX_PERMUTED else [accels]
    for order in orders:
        starts.setdefault(order_name(order), greedy(problem, order))
    for accel in accels:
        starts.setdefault(alone_name(accel), greedy(problem, [accel]))
    starts.setdefault(order_name(()), greedy(problem, []))
    baselines = {name: a.estimate() for name, a in starts.items()}
    ranked = sorted(starts, key=lambda n: baselines[n])  # stable: the configured order first
    finalists = [(baselines[n], 0, starts[n]) for n in ranked]
    moves = 0
    for rank, name in enumerate(ranked[:STARTS]):
        searched = starts[name].copy()
        made = _improve(searched)
        moves += made
        if made:
            finalists.append((searched.estimate(), rank + 1, searched))
    best = min(finalists, key=lambda f: (f[0], f[1]))
    return Solution(best[2], best[0], baselines, starts, moves)
