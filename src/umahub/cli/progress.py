"""Progress of long work on stderr: the elapsed time, the step, and ``i/n`` where counted."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator

__all__ = ["Progress"]


class Progress:
    """A ``progress(stage, detail)`` callback for :meth:`umahub.Hub.compile`, and steps of its own.

    Each line is ``[umahub  12.3s] lower 3/7 npu_2_conv2d on npu:0``: the time
    since the command started, the stage, and what it works on (the compile
    stages give ``i/n`` where they count). ``quiet`` prints nothing.
    """

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.start = time.perf_counter()
        self._live = sys.stderr.isatty()

    def elapsed(self) -> float:
        """Seconds since the command started."""
        return time.perf_counter() - self.start

    def _line(self, text: str, at: float) -> str:
        return f"[umahub {at:5.1f}s] {text}"

    def __call__(self, stage: str, detail: str = "") -> None:
        if not self.quiet:
            text = f"{stage} {detail}" if detail else stage
            print(self._line(text, self.elapsed()), file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def step(self, stage: str, detail: str = "") -> Iterator[None]:
        """A step the command does itself (import the model, export the library).

        Its line is printed when it is done, with its duration: a step that
        fails (a damaged model file) leaves the error as the only line. On a
        terminal the step shows while it runs, and is erased if it fails.
        """
        text = f"{stage} {detail}" if detail else stage
        begun = self.elapsed()
        if self._live and not self.quiet:
            print(self._line(text + " ...", begun), end="", file=sys.stderr, flush=True)
        try:
            yield
        finally:
            if self._live and not self.quiet:
                print("\r\033[K", end="", file=sys.stderr, flush=True)
        if not self.quiet:
            done = f"{text}: {self.elapsed() - begun:.1f}s"
            print(self._line(done, begun), file=sys.stderr, flush=True)
