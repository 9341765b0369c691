"""How ``executor = "auto"`` chooses between the VM and the concurrent executor, and
keeps checking its choice.

The choice is made from the model's own first calls, as the user runs them:
they alternate between the two executors, and once each has run
:data:`AUTO_TRIALS` timed calls (after one to warm up), the concurrent
executor is kept only if it was clearly faster: its median at least
:data:`AUTO_MARGIN` under the VM's, and faster in most pairs of calls made
one after the other. Anything less keeps the VM, which hands nothing between
threads and so never loses by much.

A choice made while another process kept the machine busy, or a machine
that gets busy later (a neighbour on the core an accelerator's worker is
pinned to), can leave "auto" on the slower executor. So the choice is
checked while the model runs: every :data:`AUTO_RECHECK` calls, one runs on
the other executor, and when that one beats the median of the chosen
executor's recent calls by the margin :data:`AUTO_SWITCH` checks in a row,
"auto" switches, and :attr:`ExecutorChoice.why` says when and why.
"""

from __future__ import annotations

import statistics
import threading
from collections import deque
from collections.abc import Sequence

__all__ = [
    "AUTO_MARGIN",
    "AUTO_RECHECK",
    "AUTO_SWITCH",
    "AUTO_TRIALS",
    "ExecutorChoice",
    "compare",
]

#: Timed calls of ``run`` on each executor (after one to warm up) before "auto" chooses.
AUTO_TRIALS = 5
#: How much faster than the VM (its median) the concurrent executor must be to be kept,
#: and how much faster the other executor must be, check after check, for a switch.
AUTO_MARGIN = 0.05
#: Once chosen, one call in this many runs on the other executor, to check the choice.
AUTO_RECHECK = 50
#: Checks in a row the other executor must win for "auto" to switch to it.
AUTO_SWITCH = 3
#: Calls of the chosen executor whose median a check is compared with.
_RECENT = 9

_OTHER = {"vm": "concurrent", "concurrent": "vm"}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def compare(vm: Sequence[float], concurrent: Sequence[float]) -> tuple[str, str]:
    """``(executor, why)`` from seconds of calls of each, the two lists in the order the
    calls alternated (``vm[i]`` and ``concurrent[i]`` ran one after the other): the
    concurrent executor when its median is at least :data:`AUTO_MARGIN` under the VM's
    and it was faster in most pairs, else the VM."""
    mv, mc = statistics.median(vm), statistics.median(concurrent)
    pairs = list(zip(vm, concurrent))
    wins = sum(c < v for v, c in pairs)
    measured = (
        f"concurrent {_ms(mc)} against the VM's {_ms(mv)} (medians of {len(vm)} and "
        f"{len(concurrent)} calls), faster in {wins} of {len(pairs)} pairs of calls"
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
        self._calls = 0
        self._wins = 0
        self.chosen = ""
        self.why = ""

    def next(self) -> str:
        """``"vm"`` or ``"concurrent"``: a trial, the choice, or a check of it."""
        with self._lock:
            self._calls += 1
            if not self.chosen:
                return ("vm", "concurrent")[(self._calls - 1) % 2]
            if self._calls % AUTO_RECHECK == 0:
                return _OTHER[self.chosen]
            return self.chosen

    def record(self, which: str, seconds: float) -> None:
        """The seconds a call on ``which`` took (after :meth:`next` said ``which``)."""
        with self._lock:
            if not self.chosen:
                self._trials[which].append(seconds)
                timed = [t[1:] for t in self._trials.values()]  # the first of each warms up
                if all(len(t) >= AUTO_TRIALS for t in timed):
                    n = min(len(t) for t in timed)
                    self.chosen, measured = compare(timed[0][:n], timed[1][:n])
                    self.why = f"timed on the first calls: {measured}"
                return
            if which == self.chosen:
                self._recent.append(seconds)
                return
            usual = statistics.median(self._recent) if self._recent else float("inf")
            self._wins = self._wins + 1 if seconds < usual * (1 - AUTO_MARGIN) else 0
            if self._wins >= AUTO_SWITCH:
                self.why = (
                    f"switched at call {self._calls}: {_name(which)} took {_ms(seconds)} in "
                    f"{AUTO_SWITCH} checks in a row against {_ms(usual)} for "
                    f"{_name(self.chosen)} (the median of its last {len(self._recent)} calls)"
                )
                self.chosen, self._wins = which, 0
                self._recent.clear()

    def progress(self) -> str:
        """How far the trials are, for a "not chosen yet" message."""
        with self._lock:
            done = sum(max(0, len(t) - 1) for t in self._trials.values())
        return f"timing both executors: {done} of {2 * AUTO_TRIALS} calls timed"


def _name(executor: str) -> str:
    return "the VM" if executor == "vm" else "the concurrent executor"
