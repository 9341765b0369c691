"""How ``executor = "auto"`` chooses between the VM and the concurrent executor, and
keeps checking its choice.

The choice is made from the model's own first calls, as the user runs them,
in blocks of :data:`AUTO_BLOCK` calls on one executor, alternating; the
first call of a block warms that executor's threads up (idle threads are
slow to wake, the more so on a busy machine, and alternating call by call
would time mostly that), the others are timed. Once each executor has run
:data:`AUTO_TRIALS` blocks, the concurrent executor is kept only if it was
clearly faster: its median at least :data:`AUTO_MARGIN` under the VM's, and
faster in most pairs of blocks run one after the other. Anything less keeps
the VM, which hands nothing between threads and so never loses by much.

A choice made while another process kept the machine busy, or a machine
that gets busy later (a neighbour on the core an accelerator's worker is
pinned to), can leave "auto" on the slower executor. So the choice is
checked while the model runs: now and then a block runs on the other
executor, and when that one beats the median of the chosen executor's recent
calls by the margin :data:`AUTO_SWITCH` checks in a row, "auto" switches, and
:attr:`ExecutorChoice.why` says when and why. The first check comes
:data:`AUTO_RECHECK` calls after the choice; each check the other executor
loses doubles the wait for the next (up to :data:`AUTO_RECHECK_MAX` calls),
so that checking an executor many times slower costs next to nothing, and a
check it wins brings the next one back to :data:`AUTO_RECHECK` calls.
"""

from __future__ import annotations

import statistics
import threading
from collections import deque
from collections.abc import Sequence

__all__ = [
    "AUTO_BLOCK",
    "AUTO_MARGIN",
    "AUTO_RECHECK",
    "AUTO_RECHECK_MAX",
    "AUTO_SWITCH",
    "AUTO_TRIALS",
    "AUTO_TRIAL_CALLS",
    "ExecutorChoice",
    "compare",
]

#: Calls in a row on one executor: the first warms its threads up, the others are timed.
AUTO_BLOCK = 3
#: Blocks each executor runs before "auto" chooses.
AUTO_TRIALS = 4
#: Calls of ``run`` "auto" takes to choose: every block of the trials.
AUTO_TRIAL_CALLS = 2 * AUTO_TRIALS * AUTO_BLOCK
#: How much faster than the VM (its median) the concurrent executor must be to be kept,
#: and how much faster the other executor must be, check after check, for a switch.
AUTO_MARGIN = 0.05
#: Calls after the choice (and after a check the other executor won) before the next check.
AUTO_RECHECK = 20
#: The longest wait, in calls, between two checks.
AUTO_RECHECK_MAX = 2000
#: Checks in a row the other executor must win for "auto" to switch to it.
AUTO_SWITCH = 3
#: Calls of the chosen executor whose median a check is compared with.
_RECENT = 9

_OTHER = {"vm": "concurrent", "concurrent": "vm"}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def compare(vm: Sequence[float], concurrent: Sequence[float]) -> tuple[str, str]:
    """``(executor, why)`` from seconds of calls (or blocks of calls) of each, the two
    lists in the order they alternated (``vm[i]`` and ``concurrent[i]`` ran one after
    the other): the concurrent executor when its median is at least
    :data:`AUTO_MARGIN` under the VM's and it was faster in most pairs, else the VM."""
    mv, mc = statistics.median(vm), statistics.median(concurrent)
    pairs = list(zip(vm, concurrent))
    wins = sum(c < v for v, c in pairs)
    measured = (
        f"concurrent {_ms(mc)} against the VM's {_ms(mv)} (medians of {len(vm)} and "
        f"{len(concurrent)}), faster in {wins} of {len(pairs)} pairs"
    )
    if mc < mv * (1 - AUTO_MARGIN) and 2 * wins > len(pairs):
        return "concurrent", measured
    return "vm", f"{measured}: not {AUTO_MARGIN:.0%} faster in most"


class ExecutorChoice:
    """What "auto" runs next, from the calls it has timed (thread-safe).

    :meth:`next` says which executor the next call runs on, :meth:`record` takes
    the seconds it took. :attr:`chosen` is ``""`` while the trials run.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._trials: dict[str, list[float]] = {"vm": [], "concurrent": []}
        self._recent: deque[float] = deque(maxlen=_RECENT)
        self._block = ""  # the executor of the block under way, "" between blocks
        self._block_left = 0  # calls of it still to start
        self._block_times: list[float] = []
        self._calls = 0
        self._wins = 0
        self._interval = AUTO_RECHECK
        self._next_check = 0
        self.chosen = ""
        self.why = ""

    def next(self) -> str:
        """``"vm"`` or ``"concurrent"``: a trial, the choice, or a check of it."""
        with self._lock:
            self._calls += 1
            if self._block_left:
                self._block_left -= 1
                return self._block
            if not self.chosen:
                turn = len(self._trials["vm"]) > len(self._trials["concurrent"])
                return self._start(("vm", "concurrent")[turn])
            if self._calls >= self._next_check and not self._block:
                self._next_check = self._calls + self._interval
                return self._start(_OTHER[self.chosen])
            return self.chosen

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
                    self._block = ""
                    self._block_done(which, timed)
            elif which == self.chosen:
                self._recent.append(seconds)

    def _block_done(self, which: str, seconds: float) -> None:
        if not self.chosen:
            self._trials[which].append(seconds)
            vm, concurrent = self._trials["vm"], self._trials["concurrent"]
            if min(len(vm), len(concurrent)) >= AUTO_TRIALS:
                self.chosen, measured = compare(vm, concurrent)
                self.why = f"timed on the first calls, in blocks of {AUTO_BLOCK}: {measured}"
                self._next_check = self._calls + AUTO_RECHECK
            return
        if which == self.chosen or not self._recent:
            return
        usual = statistics.median(self._recent)
        won = seconds < usual * (1 - AUTO_MARGIN)
        self._wins = self._wins + 1 if won else 0
        self._interval = AUTO_RECHECK if won else min(2 * self._interval, AUTO_RECHECK_MAX)
        self._next_check = self._calls + self._interval
        if self._wins >= AUTO_SWITCH:
            self.why = (
                f"switched at call {self._calls}: {_name(which)} took {_ms(seconds)} in "
                f"{AUTO_SWITCH} checks in a row against {_ms(usual)} for "
                f"{_name(self.chosen)} (the median of its last {len(self._recent)} calls)"
            )
            self.chosen, self._wins = which, 0
            self._recent.clear()
            self._interval = AUTO_RECHECK
            self._next_check = self._calls + AUTO_RECHECK

    def progress(self) -> str:
        """How far the trials are, for a "not chosen yet" message."""
        with self._lock:
            done = sum(len(t) for t in self._trials.values())
        return f"timing both executors: {done} of {2 * AUTO_TRIALS} blocks of calls timed"


def _name(executor: str) -> str:
    return "the VM" if executor == "vm" else "the concurrent executor"
