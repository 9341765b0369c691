"""Drawing the placement graph: group boxes, operator rows, copy markers, data edges.

The model's operators in model order, grouped into partition boxes (placed by
:mod:`umahub.report.picture.layout`) and coloured by the device they run on, with
every copy drawn as a labelled marker (bytes, sync or async) in front of the
group that receives it, the model's outputs after the last box, and data
edges that skip boxes as curves. Edges are drawn first, beneath everything:
boxes are filled white and labels in the gaps have a white halo, so no edge
runs over text. A name cut to fit carries the whole of it in a ``<title>``.
:func:`draw_graph` draws it all.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from umahub.report.picture.groups import Group, has_edges, loaded_into
from umahub.report.picture.layout import (
    CGAP,
    CROW,
    FIRST,
    GW,
    HEAD,
    LAST,
    MAX_COPIES,
    MAX_NOTES,
    MAX_ROWS,
    ROW,
    TICK,
    M,
    Placed,
    copies_height,
    place,
    ticks_per_row,
)
from umahub.report.picture.svg import (
    CHAR,
    HOST_COLOUR,
    copy_dash,
    esc,
    fit,
    fmt_bytes,
    ink,
    text,
)
from umahub.sizes import counted

if TYPE_CHECKING:
    from umahub.plugin.context import Copy, Operator
    from umahub.report.data import ReportData as Report

__all__ = ["draw_graph"]


def _short_op(op: str) -> str:
    return op.removeprefix("relax.").removeprefix("nn.")


def _copy_markers(
    copies: list[tuple[Copy, int | None]],
    x: float,
    y: float,
    width: float,
    colours: Mapping[str, str],
) -> list[str]:
    """Labelled arrows for the copies received by the group at ``x + width``."""
    out: list[str] = []
    shown = copies if len(copies) <= MAX_COPIES else copies[: MAX_COPIES - 1]
    for k, (c, _) in enumerate(shown):
        cy = y + 8 + k * CROW
        colour = colours.get(c.src, HOST_COLOUR)
        label = f"{fmt_bytes(c.bytes)} {c.kind}"
        dot = (
            f'stroke="{colour}" stroke-width="1.5" fill="#ffffff"'
            if c.constant
            else f'fill="{colour}"'
        )
        dash = copy_dash(c.kind)
        out.append(
            f'<g class="copy" data-tensor="{esc(c.tensor)}" data-src="{esc(c.src)}" '
            f'data-dst="{esc(c.dst)}" data-bytes="{c.bytes}" data-kind="{esc(c.kind)}">'
            f"<title>{esc(c.tensor)}: {esc(c.src)} -&gt; {esc(c.dst)}, {fmt_bytes(c.bytes)}, "
            f"{esc(c.kind)}{' (constant)' if c.constant else ''}</title>"
            f'<circle cx="{x + 8:.1f}" cy="{cy + 6:.1f}" r="3.5" {dot}/>'
            + text(
                x + 16,
                cy + 10,
                label,
                width=width - 22,
                size=9,
                fill="#666" if c.constant else "#1f1f1f",
                cls="copy-label",
                halo=True,
            )
            + f'<line x1="{x + 4:.1f}" y1="{cy + 14:.1f}" x2="{x + width - 8:.1f}" '
            f'y2="{cy + 14:.1f}" stroke="{colour}" stroke-width="2"{dash} '
            'marker-end="url(#arrow)"/></g>'
        )
    if len(copies) > len(shown):
        rest = copies[len(shown) :]
        total = sum(c.bytes for c, _ in rest)
        kinds = "/".join(sorted({c.kind for c, _ in rest}))
        cy = y + 8 + len(shown) * CROW
        out.append(
            '<g class="copy-more"><title>'
            + esc(
                "; ".join(
                    f"{c.tensor} {c.src}->{c.dst} {fmt_bytes(c.bytes)} {c.kind}" for c, _ in rest
                )
            )
            + "</title>"
            + text(
                x + 4,
                cy + 10,
                f"+{len(rest)}: {fmt_bytes(total)} {kinds}",
                width=width - 8,
                fill="#555",
                halo=True,
            )
            + "</g>"
        )
    return out


#: The outline of an operator that placement by cost put elsewhere than priority would.
AUTO_STROKE = ' stroke="#d62728" stroke-width="1.5" stroke-dasharray="3 2"'


def _op_title(op: Operator, moved: tuple[str, ...] | None = None) -> str:
    parts = [f"{op.name}: {op.op} on {op.device}"]
    if moved is not None:
        parts.append(f"placed by cost (by priority: {moved[0]})")
    if op.pattern:
        parts.append(f"pattern {op.pattern}")
    if op.pinned:
        parts.append(f"pinned by '{op.pinned}'")
    if op.inputs:
        parts.append("inputs " + ", ".join(op.inputs))
    return "; ".join(parts)


def _load_title(weights: Sequence[Copy]) -> str:
    each = ", ".join(f"{c.src} -> {c.dst} {fmt_bytes(c.bytes)} {c.kind}" for c in weights)
    return f"{counted(len(weights), 'weight tensor')} copied once, at load: {each}"


def _draw_group(
    p: Placed,
    colours: Mapping[str, str],
    patterns: Mapping[str, str],
    weights: Sequence[Copy] = (),
    moved: Mapping[str, Sequence[str]] | None = None,
) -> list[str]:
    """A group's box: header (device, count, patterns, weights loaded) and its operators.

    ``moved``: node -> (device by priority, device by cost) of the operators
    placement by cost put elsewhere; they get a red dashed outline.
    """
    moved = moved or {}
    g, x, y = p.group, p.x, p.y
    badge = f"weights {fmt_bytes(sum(c.bytes for c in weights))}" if weights else ""
    colour = colours.get(g.device, HOST_COLOUR)
    dashed = "" if g.partition else ' stroke-dasharray="4 3"'
    out = [
        f'<g class="group" data-device="{esc(g.device)}" data-partition="{esc(g.partition)}">',
        f"<title>{esc(g.partition or 'host operators')} on {esc(g.device)}, "
        f"{counted(len(g.ops), 'operator')}"
        f"{esc(', patterns ' + patterns[g.partition]) if patterns.get(g.partition) else ''}"
        "</title>",
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{GW}" height="{p.height:.1f}" rx="6" '
        f'fill="#ffffff" stroke="{colour}" stroke-width="2"{dashed}/>',
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{GW}" height="5" rx="2" fill="{colour}"/>',
        text(x + 8, y + 17, g.device, width=GW - 60, weight="bold", size=11),
        text(
            x + GW - 8,
            y + 17,
            f"{len(g.ops)} op{'s' if len(g.ops) != 1 else ''}",
            size=9,
            fill="#666",
            anchor="end",
        ),
        text(
            x + 8,
            y + 27,
            patterns.get(g.partition, "") if g.partition else "host operators",
            width=GW - 20 - len(badge) * 8.5 * CHAR,
            size=8.5,
            fill="#666",
        ),
    ]
    if weights:
        out.append(
            f'<g class="load-copy" data-bytes="{sum(c.bytes for c in weights)}">'
            f"<title>{esc(_load_title(weights))}</title>"
            + text(x + GW - 8, y + 27, badge, size=8.5, fill="#444", anchor="end")
            + "</g>"
        )
    on_colour = ink(colour)
    ops = g.ops
    shown, hidden = ops, []
    if len(ops) > MAX_ROWS:
        shown, hidden = [*ops[:FIRST], *ops[-LAST:]], ops[FIRST:-LAST]
    row_y = y + HEAD
    for k, op in enumerate(shown):
        if hidden and k == FIRST:
            row_y = _draw_hidden(out, hidden, x, row_y, colours, p)
        kind = fit(_short_op(op.op), 60, 8)
        room = GW - 22 - len(kind) * 8 * CHAR
        pin = ' stroke="#1f1f1f" stroke-width="1.5"' if op.pinned else ""
        was = moved.get(op.name)
        if was is not None:
            pin = f'{AUTO_STROKE} data-priority-device="{esc(was[0])}"'
        out.append(
            f'<g class="op-row"><title>'
            f"{esc(_op_title(op, tuple(was) if was is not None else None))}</title>"
            f'<rect class="op" data-node="{esc(op.name)}" data-device="{esc(op.device)}" '
            f'x="{x + 4:.1f}" y="{row_y:.1f}" width="{GW - 8}" height="{ROW - 2}" '
            f'rx="3" fill="{colours.get(op.device, HOST_COLOUR)}"{pin}/>'
            + text(x + 9, row_y + 10.5, op.name, width=room, size=9.5, fill=on_colour)
            + text(
                x + GW - 9,
                row_y + 10.5,
                _short_op(op.op),
                width=60,
                size=8,
                fill=on_colour,
                anchor="end",
                cls="op-kind",
            )
            + "</g>"
        )
        p.anchors[op.name] = (x + 4, row_y + (ROW - 2) / 2, x + GW - 4)
        row_y += ROW
    out.append("</g>")
    return out


def _draw_hidden(
    out: list[str],
    hidden: list[Operator],
    x: float,
    y: float,
    colours: Mapping[str, str],
    p: Placed,
) -> float:
    """The middle of a long group: a caption and one small mark per operator."""
    counts: dict[str, int] = defaultdict(int)
    for op in hidden:
        counts[_short_op(op.op)] += 1
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
    out.append(
        text(x + 8, y + 10, f"+{len(hidden)} more: {summary}", width=GW - 16, size=9, fill="#444")
    )
    y += 16
    per_row = ticks_per_row()
    for k, op in enumerate(hidden):
        tx = x + 6 + (k % per_row) * TICK
        ty = y + (k // per_row) * 7
        out.append(
            f'<rect class="op" data-node="{esc(op.name)}" data-device="{esc(op.device)}" '
            f'x="{tx:.1f}" y="{ty:.1f}" width="{TICK - 1}" height="5" '
            f'fill="{colours.get(op.device, HOST_COLOUR)}">'
            f"<title>{esc(_op_title(op))}</title></rect>"
        )
        p.anchors[op.name] = (tx, ty + 2.5, tx + TICK - 1)
    return y + math.ceil(len(hidden) / per_row) * 7 + 4


def _draw_edges(placed: list[Placed]) -> list[str]:
    """Data edges that skip over groups (when the operators carry their inputs).

    An edge runs from the right border of its source's box, at the source's
    row, to the left border of its consumer's box, where its dot sits: the
    boxes, drawn over the edges, hide nothing of it but what lies beneath them.
    """
    where = {name: (p.group.index, a[1], p.x + GW) for p in placed for name, a in p.anchors.items()}
    out: list[str] = []
    for p in placed:
        for op in p.group.ops:
            if op.name not in p.anchors:
                continue
            for src in op.inputs:
                if src not in where:
                    continue
                gi, sy, sx2 = where[src]
                if gi >= p.group.index - 1:
                    continue  # within the group or from the one before: the flow shows it
                tx, ty = p.x, p.anchors[op.name][1]
                bend = max(40.0, abs(tx - sx2) / 3)
                out.append(
                    f'<path class="edge" d="M{sx2:.1f},{sy:.1f} C{sx2 + bend:.1f},'
                    f'{sy:.1f} {tx - bend:.1f},{ty:.1f} {tx:.1f},{ty:.1f}" fill="none" '
                    'stroke="#555" stroke-opacity="0.45" stroke-width="1.2" '
                    f'marker-end="url(#dot)"><title>{esc(src)} -&gt; {esc(op.name)}'
                    "</title></path>"
                )
    return out


def _draw_fallbacks(report: Report, bottom: float, width: float) -> tuple[list[str], float]:
    """The partitions that fell back to the host, with their reasons (the first few)."""
    fallen = [p for p in report.partitions if p.fallback]
    out: list[str] = []
    if fallen:
        bottom += 18
        out.append(
            text(
                M,
                bottom,
                f"{counted(len(fallen), 'partition')} fell back to the host "
                "(their operators are drawn on the host):",
                size=10.5,
                fill="#c0392b",
                weight="bold",
            )
        )
    for p in fallen[:MAX_NOTES]:
        bottom += 15
        out.append(
            f'<g class="fallback"><title>{esc(p.fallback)}</title>'
            + text(M + 10, bottom, p.fallback, width=width - 2 * M - 10, size=9.5, fill="#c0392b")
            + "</g>"
        )
    if len(fallen) > MAX_NOTES:
        bottom += 15
        out.append(
            text(
                M + 10,
                bottom,
                f"+{len(fallen) - MAX_NOTES} more: see the report",
                size=9.5,
                fill="#c0392b",
            )
        )
    return out, bottom


def draw_graph(
    report: Report,
    gs: list[Group],
    incoming: Mapping[int, list[tuple[Copy, int | None]]],
    outputs: list[tuple[Copy, int | None]],
    colours: Mapping[str, str],
    width: float,
    top: float,
) -> tuple[list[str], float]:
    """The placement graph from ``top`` down, and its bottom: heading, boxes, copies, notes."""
    loaded = loaded_into(gs, report.copies)
    patterns = {p.symbol: ", ".join(p.patterns) for p in report.partitions}
    moved = (report.auto or {}).get("changed", {})
    body = [
        text(M, top + 14, "Placement graph", size=15, weight="bold"),
        text(
            M + 150,
            top + 14,
            "model order, left to right then row by row; "
            "boxes: partitions (dashed: host operators); arrows: copies into "
            "the next box"
            + ("; 'weights': copied once, at load" if loaded else "")
            + ("; curves: data edges that skip boxes" if has_edges(report.placement) else "")
            + ("; red dashed: placed by cost, not where priority puts it" if moved else ""),
            size=9.5,
            fill="#666",
        ),
    ]
    placed, bottom = place(gs, incoming, width, top + 28)
    flow: list[str] = []
    boxes: list[str] = []
    for k, p in enumerate(placed):
        if p.copies:
            boxes += _copy_markers(p.copies, p.x - p.gap, p.y + HEAD, p.gap, colours)
        elif k > 0 and p.x - p.gap > M:
            flow.append(
                f'<line x1="{p.x - p.gap + 3:.1f}" y1="{p.y + 17:.1f}" '
                f'x2="{p.x - 3:.1f}" y2="{p.y + 17:.1f}" stroke="#999" '
                'stroke-width="1.5" marker-end="url(#arrow)"/>'
            )
        boxes += _draw_group(p, colours, patterns, loaded.get(p.group.index, ()), moved)
    # Edges first: the boxes (white) and the labels (haloed) drawn after them
    # cover them, so no edge runs over text.
    body += _draw_edges(placed) + boxes + flow
    if outputs:
        last = placed[-1] if placed else None
        ox = (last.x + GW) if last else M
        oy = last.y if last else top + 28
        if ox + CGAP + 60 > width - M:
            ox, oy = M, bottom + 26
        body += _copy_markers(outputs, ox, oy + HEAD, CGAP, colours)
        body.append(
            f'<rect x="{ox + CGAP:.1f}" y="{oy + HEAD:.1f}" width="52" height="20" '
            'rx="10" fill="#ffffff" stroke="#999"/>'
            + text(ox + CGAP + 26, oy + HEAD + 14, "output", size=10, anchor="middle", fill="#444")
        )
        bottom = max(bottom, oy + HEAD + copies_height(len(outputs)))
    notes, bottom = _draw_fallbacks(report, bottom, width)
    return body + notes, bottom
