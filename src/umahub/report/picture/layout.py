"""Where the placement graph's boxes go: sizes, gaps, heights, and rows that wrap like text.

The graph flows left to right and wraps into rows, so that a model of a few
hundred operators stays a page of boxes rather than a ribbon. A group of more
than :data:`MAX_ROWS` operators shows its first :data:`FIRST` and last
:data:`LAST` operators by name and the ones between as a strip of small marks
(:data:`TICK` wide each). The other constants are the picture's measures in
pixels, shared by the drawing modules. No SVG is written here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from umahub.report.picture.groups import Group

if TYPE_CHECKING:
    from umahub.plugin.context import Copy

__all__ = [
    "CGAP",
    "CROW",
    "FIRST",
    "GAP",
    "GW",
    "HEAD",
    "LABEL_W",
    "LANE",
    "LAST",
    "MAX_COPIES",
    "MAX_NOTES",
    "MAX_ROWS",
    "ROW",
    "TICK",
    "M",
    "Placed",
    "copies_height",
    "group_height",
    "place",
    "ticks_per_row",
]

#: A group with more operators than this shows the ones in the middle as marks.
MAX_ROWS = 10
#: Operators of a long group shown by name before its marks ...
FIRST = 6
#: ... and after them.
LAST = 2
M = 20  #: margin
GW = 160  #: group width
HEAD = 30  #: group header height
ROW = 16  #: operator row height (with its gap)
TICK = 5  #: width of a collapsed operator's mark (with its gap)
GAP = 22  #: between groups without copies
CGAP = 104  #: between groups with copies
CROW = 20  #: one copy marker
MAX_COPIES = 6  #: markers per gap before they are summed up
MAX_NOTES = 3  #: fallback reasons written out
LANE = 20  #: timeline lane height (with its gap)
LABEL_W = 200  #: timeline lane label column


@dataclass
class Placed:
    """A group with its place in the graph and where its operators were drawn."""

    group: Group
    x: float
    y: float
    gap: float
    height: float
    copies: list[tuple[Copy, int | None]]
    anchors: dict[str, tuple[float, float, float]] = field(default_factory=dict)  # name->x,y,x2


def ticks_per_row() -> int:
    """How many marks of collapsed operators fit across a group."""
    return int((GW - 12) // TICK)


def group_height(g: Group) -> float:
    """The height of ``g``'s box: a header and a row per operator (or marks for the middle)."""
    n = len(g.ops)
    if n <= MAX_ROWS:
        return HEAD + n * ROW + 6
    hidden = n - FIRST - LAST
    return HEAD + (FIRST + LAST) * ROW + 16 + math.ceil(hidden / ticks_per_row()) * 7 + 10


def copies_height(n: int) -> float:
    """The height of the markers of ``n`` copies in a gap."""
    return 8 + min(n, MAX_COPIES) * CROW


def place(
    gs: list[Group], incoming: Mapping[int, list], width: float, top: float
) -> tuple[list[Placed], float]:
    """Each group's box, left to right, wrapping into rows; and the bottom of the last row."""
    placed: list[Placed] = []
    x, y, row_h = M, top, 0.0
    for g in gs:
        copies = incoming.get(g.index, [])
        gap = CGAP if copies else (GAP if g.index else 0)
        if x > M and x + gap + GW > width - M:
            x, y, row_h = M, y + row_h + 14, 0.0
        h = max(group_height(g), HEAD + copies_height(len(copies)) if copies else 0)
        placed.append(Placed(g, x + gap, y, gap, group_height(g), copies))
        x += gap + GW
        row_h = max(row_h, h)
    return placed, y + row_h
