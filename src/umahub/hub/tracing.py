"""Tracing hook calls: which plugin's implementation ran, for how long, what it gave.

The traced manager of :mod:`umahub.hub.dispatch` wraps every implementation with
:func:`traced`: while a compile records (:func:`recording`), each call is
logged as a :class:`HookCall` (the report's hooks per partition, the hook
times); an exception leaving an implementation leaves it as a
:class:`~umahub.errors.PluginFailure` naming the plugin and the hook, caused
by the original; and the implementation running on each thread is known
(:func:`running_on`), so that an expired time limit can name it.

A plugin's hook wrapper (``wrapper=True``) around traced implementations
therefore sees their exceptions as a ``PluginFailure`` (the original is its
``cause``); with ``hub.hook``, which is not traced, it sees the original.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from umahub.errors import PluginFailure

__all__ = [
    "HookCall",
    "last_returned",
    "recording",
    "returned_by",
    "running_on",
    "traced",
]


@dataclass(frozen=True)
class HookCall:
    """One call of one plugin's implementation, as the report shows it."""

    plugin: str
    hook: str
    seconds: float
    returned: bool


_LOG: contextvars.ContextVar[list[HookCall] | None] = contextvars.ContextVar(
    "umahub_hook_log", default=None
)


@contextlib.contextmanager
def recording() -> Iterator[list[HookCall]]:
    """Collect the :class:`HookCall` of every implementation called in the block."""
    log: list[HookCall] = []
    token = _LOG.set(log)
    try:
        yield log
    finally:
        _LOG.reset(token)


def last_returned(hook: str) -> str | None:
    """The plugin whose implementation of ``hook`` last returned a value in this recording."""
    givers = returned_by(hook, 1)
    return givers[0] if givers else None


def returned_by(hook: str, count: int) -> list[str]:
    """The plugins of the last ``count`` calls of ``hook`` that returned a value, in call order.

    pluggy leaves None results out of a hook's result list; this lines the
    results up with the plugins that gave them.
    """
    givers = [c.plugin for c in (_LOG.get() or []) if c.hook == hook and c.returned]
    return givers[len(givers) - count :] if count else []


# thread id -> (plugin, hook) of the traced implementation running on it, for the
# message of a time limit that expired (see umahub.hub.timelimit).
_RUNNING: dict[int, tuple[str, str]] = {}


def running_on(thread_id: int | None) -> tuple[str, str] | None:
    """(plugin, hook) of the traced implementation running on that thread, if any."""
    return _RUNNING.get(thread_id) if thread_id is not None else None


def traced(plugin: str, hook: str, func: Any) -> Any:
    """``func`` (``plugin``'s implementation of ``hook``) logged, timed and blamed.

    Raises:
        PluginFailure: ``func`` raised; the failure names ``plugin`` and
            ``hook`` (or, raised by a traced call inside ``func``, that one's).
    """

    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        log = _LOG.get()
        me = threading.get_ident()
        outer = _RUNNING.get(me)
        _RUNNING[me] = (plugin, hook)
        try:
            if log is None:
                return func(*args, **kwargs)
            start = time.perf_counter()
            result = func(*args, **kwargs)
        except PluginFailure:
            raise  # blamed by the traced call it left first, the innermost
        except Exception as exc:
            raise PluginFailure(plugin, hook, exc) from exc
        finally:
            if outer is None:
                _RUNNING.pop(me, None)
            else:
                _RUNNING[me] = outer
        log.append(HookCall(plugin, hook, time.perf_counter() - start, result is not None))
        return result

    return call
