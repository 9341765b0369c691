"""Finding and calling plugins: the :class:`Hub`, loading, hook dispatch, contract checks.

:mod:`~umahub.hub.loading` finds plugins (entry points, ``UMAHUB_PLUGINS``,
objects given in code), :mod:`~umahub.hub.dispatch` calls their hooks in the
user's order, :mod:`~umahub.hub.contract` checks what they return,
:mod:`~umahub.hub.tracing` and :mod:`~umahub.hub.timelimit` record and bound
each call. :mod:`~umahub.hub.hub` is the :class:`Hub` users hold: the door to
the compiler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from umahub.hub.hub import Hub

__all__ = ["Hub"]


def __getattr__(name: str) -> Any:
    if name == "Hub":  # resolved on first use: the hub imports the compiler
        from umahub.hub.hub import Hub

        return Hub
    raise AttributeError(f"module 'umahub.hub' has no attribute {name!r}")
