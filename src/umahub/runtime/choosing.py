"""How ``executor = "auto"`` chooses how to run a model, and keeps checking its choice.

The ways to run it (:class:`ExecutorChoice`'s ``ways``): the VM on all its threads,
the VM on one thread, the concurrent executor (fewer where they are the same:
one core, a model on one device, ``TVM_NUM_THREADS`` set by the user; see
:func:`umahub.runtime.threadpool.vm_threads`). The thread count is a way of
its own because beside a busy process TVM's parallel loops wait, kernel
after kernel, for the thread whose core the neighbour holds, and the VM on
two threads can take ten times as long as on one.

The choice is made from the model's own first calls, as the user runs them,
in blocks of :data:`AUTO_BLOCK` calls on one way, taking turns; the first
call of a block warms that way's threads up (idle threads are slow to wake,
the more so on a busy machine, and alternating call by call would time
mostly that), the others are timed. Once each way has run :data:`AUTO_TRIALS`
blocks, a way other than the first (the VM on all its threads) is kept only if it
was clearly faster than the first: its median at least :data:`AUTO_MARGIN`
under the first's, and faster in most rounds of blocks; of those, the one of
the lowest median. Anything less keeps the first.

The machine can change after the choice (a neighbour starts or stops), so
the choice is checked while the model runs, in two ways:

* the chosen way against its own times, after each run of :data:`AUTO_WATCH`
  of its calls: when the run's median is :data:`AUTO_CHANGE` times its usual
  time, or that much under it, and the run before was so too, every other
  way is checked at once (one block each, back to back), and the new time is
  its usual one from then on. A change must last (:data:`AUTO_PERSIST` runs
  of calls): beside a neighbour whose load comes and goes, a few slow calls
  at a time would have the checks run again and again. The checks, not the
  trials again: timing every way again in :data:`AUTO_TRIALS` blocks each put
  a dozen calls on every slower way, where a way that lost the trials by 2x
  (the concurrent executor of a model on one device) could only cost; a
  check costs one block, and a way now faster wins its checks and is
  switched to (below). Its usual time is the lower of its median in the
  trials and the median of its first calls once chosen: the trials are a
  process's first calls, in short blocks between other ways, and the VM on
  several threads can run slower there than it does once it runs alone (the
  torchvision MobileNetV3-Small on a 2-core AMD EPYC: 2.5-3.3 ms in its
  first calls, 1.7-2.0 ms after), which would read as the machine getting
  quieter;
* now and then a block runs on another way, and when one beats the median of
  the chosen way's recent calls by the margin :data:`AUTO_SWITCH` checks in a
  row, "auto" switches to it. Each way has its own wait: the first check of
  the first other way comes :data:`AUTO_RECHECK` calls after the choice, of
  the next :data:`AUTO_RECHECK` calls after that (one slower block at a
  time, not two or three back to back: a run of slow calls is what a user
  timing the model sees, and what moves a median); each check it lost by more
  than the margin (it ran that much slower than the chosen way) doubles its
  wait, up to :data:`AUTO_RECHECK_MAX` calls, so that checking a way many
  times slower costs next to nothing; any other check brings its wait back to
  :data:`AUTO_RECHECK` calls, and a check it won brings its next one
  :data:`AUTO_CONFIRM` calls later: neither cost anything. Of two ways due,
  the one due first (the earlier in ``ways`` on a tie). A wait of their own
  keeps a way that keeps losing from holding back one that wins: with one
  wait for all, the VM on two threads, 30% faster than the one thread "auto"
  had chosen from its first calls, took 170 calls to win its three checks,
  each of its wins undone by the concurrent executor's loss next to it. And
  the VM on several threads can keep getting faster for a hundred calls
  after a process's first (the same model: 2.1 ms over calls 1-20, 1.65 over
  calls 60-120, a one-thread VM flat at 2.3): a check it lost by a little,
  early on, must not put it off for long.

:attr:`ExecutorChoice.why` says what was timed, and when and why it changed.
"""

from __future__ import annotations

import statistics
import threading
from collections import deque
from collections.abc import Mapping, Sequence

__all__ = [
    "AUTO_BLOCK",
    "AUTO_CHANGE",
    "AUTO_CONFIRM",
    "AUTO_MARGIN",
    "AUTO_PERSIST",
    "AUTO_RECHECK",
    "AUTO_RECHECK_MAX",
    "AUTO_SWITCH",
    "AUTO_TRIALS",
    "AUTO_TRIAL_CALLS",
    "AUTO_WATCH",
    "TWO_EXECUTORS",
    "ExecutorChoice",
    "choose",
    "compare",
]

#: Calls in a row on one way: the first warms its threads up, the others are timed.
AUTO_BLOCK = 3
#: Blocks each way runs before "auto" chooses.
AUTO_TRIALS = 4
#: The most calls of ``run`` "auto" takes to choose: every block of the trials of three ways.
AUTO_TRIAL_CALLS = 3 * AUTO_TRIALS * AUTO_BLOCK
#: How much faster than the first way (its median) another must be to be kept,
#: and how much faster another way must be, check after check, for a switch.
AUTO_MARGIN = 0.05
#: Calls after the choice before each other way's first check; its wait after a check
#: it did not lose by more than the margin.
AUTO_RECHECK = 20
#: Calls after a check another way won before that way's next check: a check won
#: cost nothing (that way ran faster), so the next one comes soon.
AUTO_CONFIRM = 5
#: The longest wait, in calls, between two checks.
AUTO_RECHECK_MAX = 2000
#: Checks in a row another way must win for "auto" to switch to it.
AUTO_SWITCH = 3
#: Calls of the chosen way whose median is compared with its usual time.
AUTO_WATCH = 5
#: Runs of :data:`AUTO_WATCH` calls in a row whose medians must all be off by
#: :data:`AUTO_CHANGE` (the same way) for "auto" to check every other way at once.
AUTO_PERSIST = 2
#: How many times slower (or faster) than its usual time the chosen way must run
#: for "auto" to check every other way at once.
AUTO_CHANGE = 1.5
#: Calls of the chosen way kept: a check is compared with their median, and
#: :meth:`ExecutorChoice._watch` looks at them in runs of :data:`AUTO_WATCH`.
_RECENT = AUTO_WATCH * AUTO_PERSIST

#: The ways of :func:`compare`: the VM on its thread pool as it is, and the concurrent executor.
TWO_EXECUTORS = {"vm": "the VM", "concurrent": "the concurrent executor"}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def choose(trials: Mapping[str, Sequence[float]], names: Mapping[str, str]) -> tuple[str, str]:
    """``(way, why)`` from seconds of calls (or blocks of calls) of each way, the
    lists in the order the ways took turns (``trials[a][i]`` and ``trials[b][i]``
    ran in one round): a way other than the first when its median is at least
    :data:`AUTO_MARGIN` under the first's and it was faster in most rounds (of
    such ways, the lowest median), else the first."""
    first, *others = trials
    base = statistics.median(trials[first])
    clear, said = [], []
    for way in others:
        times = trials[way]
        median = statistics.median(times)
        rounds = list(zip(trials[first], times))
        wins = sum(t < f for f, t in rounds)
        text = (
            f"{names[way]} {_ms(median)} against {_ms(base)} for {names[first]} (medians of "
            f"{len(times)} and {len(trials[first])}), faster in {wins} of {len(rounds)} rounds"
        )
        if median < base * (1 - AUTO_MARGIN) and 2 * wins > len(rounds):
            clear.append((median, way))
        else:
            text += f": not {AUTO_MARGIN:.0%} faster in most"
        said.append(text)
    return (min(clear)[1] if clear else first), "; ".join(said)


def compare(vm: Sequence[float], concurrent: Sequence[float]) -> tuple[str, str]:
    """:func:`choose` between the VM (first) and the concurrent executor."""
    return choose({"vm": vm, "concurrent": concurrent}, TWO_EXECUTORS)


class ExecutorChoice:
    """What "auto" runs next, from the calls it has timed (thread-safe).

    ``ways`` maps each way to its name in :attr:`why`, the first the one kept
    unless another is clearly faster; ``reason`` says why there are no others
    (the whole :attr:`why` where there is one way). :meth:`next` says which way
    the next call runs on, :meth:`record` takes the seconds it took.
    :attr:`chosen` is ``""`` while the trials run.
    """

    def __init__(self, ways: Mapping[str, str] = TWO_EXECUTORS, reason: str = "") -> None:
        self.ways = dict(ways)
        self._lock = threading.Lock()
        self._trials: dict[str, list[float]] = {way: [] for way in self.ways}
        self._recent: deque[float] = deque(maxlen=_RECENT)
        self._block = ""  # the way of the block under way, "" between blocks
        self._block_left = 0  # calls of it still to start
        self._block_times: list[float] = []
        self._calls = 0
        self._wins: dict[str, int] = {}
        self._wait: dict[str, int] = {}  # each other way's wait between its checks, in calls
        self._due: dict[str, int] = {}  # the call from which each other way's next check may start
        self._first_due = 0  # the earliest of them (what every call compares with)
        self._own = 0  # calls of the chosen way recorded since it was chosen
        self._usual = 0.0  # the chosen way's usual time (the module's docstring)
        self._chose_why = ""  # why the chosen way is chosen, without a change since
        self._reason = reason
        self.chosen = ""
        self.why = ""
        if len(self.ways) == 1:
            (self.chosen,) = self.ways
            self.why = reason

    @property
    def trial_calls(self) -> int:
        """Calls of ``run`` the trials take."""
        return len(self.ways) * AUTO_TRIALS * AUTO_BLOCK if len(self.ways) > 1 else 0

    def next(self) -> str:
        """The way the next call runs on: a trial, the choice, or a check of it."""
        with self._lock:
            self._calls += 1
            if self._block_left and self._block:
                self._block_left -= 1
                return self._block
            if not self.chosen:
                done = [len(t) for t in self._trials.values()]
                return self._start(list(self._trials)[done.index(min(done))])
            if self._due and self._calls >= self._first_due and not self._block:
                way = min(self._due, key=self._due.__getitem__)  # the earlier in ways on a tie
                self._set_due(way, self._calls + self._wait[way])  # if its block never ends
                return self._start(way)
            return self.chosen

    def _set_due(self, way: str, call: int) -> None:
        self._due[way] = call
        self._first_due = min(self._due.values())

    def _start(self, which: str) -> str:
        self._block, self._block_left, self._block_times = which, AUTO_BLOCK - 1, []
        return which

    def record(self, which: str, seconds: float) -> None:
        """The seconds a call on ``which`` took (after :meth:`next` said ``which``)."""
        with self._lock:
            if which == self._block:
                self._block_times.append(seconds)
                if len(self._block_times) == AUTO_BLOCK:
                    timed = statistics.median(self._block_times[1:])  # the first warms up
                    # calls from several threads: a block can fill up with calls of the
                    # same way from before it started; then it ends with calls still to give
                    self._block, self._block_left = "", 0
                    self._block_done(which, timed)
            elif which == self.chosen and len(self.ways) > 1:
                self._recent.append(seconds)
                self._own += 1
                if self._own % AUTO_WATCH:
                    return  # once per run: at every call, the medians cost a 2.5 ms model 1%
                if self._own == _RECENT:  # its first calls once chosen: its usual time
                    self._usual = min(self._usual, statistics.median(self._recent))
                self._watch()

    def _watch(self) -> None:
        """Check every other way at once when the chosen way's own calls moved far from
        its usual time, and stayed there (the machine got busy, or quiet)."""
        kept = list(self._recent)
        if len(kept) < AUTO_WATCH * AUTO_PERSIST:
            return
        runs = [kept[len(kept) - (i + 1) * AUTO_WATCH :][:AUTO_WATCH] for i in range(AUTO_PERSIST)]
        medians = [statistics.median(run) for run in runs]
        slower = all(m > self._usual * AUTO_CHANGE for m in medians)
        faster = all(m < self._usual / AUTO_CHANGE for m in medians)
        if not (slower or faster):
            return
        watched = AUTO_WATCH * AUTO_PERSIST
        now = statistics.median(kept[-watched:])
        self.why = (
            f"{self._chose_why}; at call {self._calls}, {self.ways[self.chosen]} took "
            f"{_ms(now)} (the median of its last {watched} calls) against its usual "
            f"{_ms(self._usual)}, {'slower' if slower else 'faster'} by over {AUTO_CHANGE:g}x "
            f"in each run of {AUTO_WATCH} of them: every other way checked at once"
        )
        self._usual, self._wins = now, {}
        for way in self._due:
            self._wait[way] = AUTO_RECHECK
            self._set_due(way, self._calls + 1)

    def _block_done(self, which: str, seconds: float) -> None:
        if not self.chosen:
            self._trials[which].append(seconds)
            if min(len(t) for t in self._trials.values()) >= AUTO_TRIALS:
                self._chose()
            return
        if which == self.chosen or not self._recent:
            return
        usual = statistics.median(self._recent)
        won = seconds < usual * (1 - AUTO_MARGIN)
        self._wins[which] = self._wins.get(which, 0) + 1 if won else 0
        # only a check lost by more than the margin cost calls: only that one backs off
        slower = seconds > usual * (1 + AUTO_MARGIN)
        self._wait[which] = min(2 * self._wait[which], AUTO_RECHECK_MAX) if slower else AUTO_RECHECK
        self._set_due(which, self._calls + (AUTO_CONFIRM if won else self._wait[which]))
        if self._wins[which] >= AUTO_SWITCH:
            self._chose_why = self.why = (
                f"switched at call {self._calls}: {self.ways[which]} took {_ms(seconds)} in "
                f"{AUTO_SWITCH} checks in a row against {_ms(usual)} for "
                f"{self.ways[self.chosen]} (the median of its last {len(self._recent)} calls)"
            )
            self._usual = seconds
            self._chosen(which)

    def _chose(self) -> None:
        way, measured = choose(self._trials, self.ways)
        reason = f" ({self._reason})" if self._reason else ""
        self._chose_why = self.why = (
            f"timed on the first calls, in blocks of {AUTO_BLOCK}: {measured}{reason}"
        )
        self._usual = statistics.median(self._trials[way])
        self._chosen(way)

    def _chosen(self, way: str) -> None:
        self.chosen, self._wins = way, {}
        self._recent.clear()
        self._own = 0
        others = [w for w in self.ways if w != way]
        self._wait = dict.fromkeys(others, AUTO_RECHECK)
        self._due = {w: self._calls + (i + 1) * AUTO_RECHECK for i, w in enumerate(others)}
        self._first_due = min(self._due.values())

    def progress(self) -> str:
        """How far the trials are, for a "not chosen yet" message."""
        with self._lock:
            done = sum(len(t) for t in self._trials.values())
        total = len(self.ways) * AUTO_TRIALS
        return f"timing {len(self.ways)} ways: {done} of {total} blocks of calls timed"
