"""Destinations of copies kept for the next inferences (the concurrent executor's).

A copy that allocates a new destination at every inference pays for the memory
again: a fresh buffer is page-faulted in as the copy writes it, and two workers
faulting at once wait on each other in the kernel. :class:`Spares` keeps the
destination of a copy once its inference no longer needs it, for the same copy
of a later inference; :func:`only_reference` says when nothing else holds it.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

__all__ = ["SPARES_PER_COPY", "Spares", "only_reference"]

#: Destinations kept per copy step for the next inferences (one per inference in flight).
SPARES_PER_COPY = 4


def only_reference(tensor: Any) -> bool:
    """Whether the Python object ``tensor`` holds the only reference to its TVM tensor.

    Reads the strong count of the object's header (the first 32 bits of
    ``TVMFFIObject``, tvm-ffi's stable C ABI); anything it cannot read counts
    as shared.
    """
    try:
        handle = tensor.__chandle__()
        return bool(handle) and ctypes.c_uint64.from_address(handle).value & 0xFFFFFFFF == 1
    except (AttributeError, TypeError, ValueError):
        return False


class Spares:
    """Destinations of copies that their inferences no longer need, by copy step."""

    def __init__(self, limit: int = SPARES_PER_COPY):
        self.limit = limit
        self.kept: dict[int, list[Any]] = {}
        self.lock = threading.Lock()

    def give(self, step: int, tensor: Any) -> bool:
        """Keep ``tensor`` (the output of copy ``step``) for a later copy, when nothing
        else references it; returns whether it was kept."""
        if not only_reference(tensor):
            return False
        with self.lock:
            kept = self.kept.setdefault(step, [])
            if len(kept) >= self.limit:
                return False
            kept.append(tensor)
        return True

    def take(self, step: int) -> Any:
        """A kept destination of copy ``step``, or None."""
        with self.lock:
            kept = self.kept.get(step)
            return kept.pop() if kept else None
