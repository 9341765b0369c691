"""The names of the search's starting points: made by the search, read back to build one.

A starting point is the placement a claiming order gives (``"priority npu >
dsp"``), one accelerator alone (``"npu alone"``) or the host alone
(``"host alone"``). :mod:`umahub.auto.search` names them, the report shows
the names, and :mod:`umahub.auto.finalists` reads them back
(:func:`accelerators_of`) to build a contender as that claiming order would.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["accelerators_of", "alone_name", "order_name"]


def order_name(order: Sequence[str]) -> str:
    """The starting point of a claiming order: ``"priority npu > dsp"``, or ``"host alone"``."""
    return "priority " + " > ".join(order) if order else "host alone"


def alone_name(accelerator: str) -> str:
    """The starting point of one accelerator alone: ``"npu alone"``."""
    return f"{accelerator} alone"


def accelerators_of(name: str) -> tuple[str, ...]:
    """The claiming order of a starting point's name (:func:`order_name`, :func:`alone_name`)."""
    if name == order_name(()):
        return ()
    if name.endswith(" alone"):
        return (name.removesuffix(" alone"),)
    return tuple(name.removeprefix("priority ").split(" > "))
