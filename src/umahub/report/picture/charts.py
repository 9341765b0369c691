"""Drawing the picture's charts: the timeline of one inference, memory bars, the legend.

The timeline draws the spans of :func:`umahub.report.picture.timeline.schedule`, one
lane per device and one DMA lane per accelerator whose pools are filled
asynchronously, on a time axis with round ticks, under a line that states the
cost model (:func:`cost_text`). The memory chart is a bar per pool of a device
in use; the legend gives each device's colour and the copy styles.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING

from umahub.lanes import device_of, is_dma
from umahub.report.picture.layout import LABEL_W, LANE, M
from umahub.report.picture.svg import (
    CHAR,
    HOST_COLOUR,
    copy_dash,
    esc,
    fmt_bytes,
    fmt_time,
    ink,
    text,
    wrap,
)
from umahub.report.picture.timeline import ACCELERATOR_FLOPS, HOST_FLOPS, Item

if TYPE_CHECKING:
    from umahub.report.data import ReportData as Report

__all__ = ["cost_text", "draw_legend", "draw_memory", "draw_timeline"]


def _nice_step(span: float, ticks: int = 8) -> float:
    raw = span / ticks
    power = 10 ** math.floor(math.log10(raw))
    return next((m * power for m in (1, 2, 2.5, 5) if m * power >= raw), 10 * power)


def cost_text(throughput: Mapping[str, float] | None, bandwidth: float, edges: bool) -> str:
    """The cost model in one sentence, with the throughputs and bandwidth in use."""
    given = "".join(f", {k} {v / 1e9:g}" for k, v in (throughput or {}).items())
    order = "operators wait for their inputs" if edges else "a sequential program in model order"
    return (
        f"cost model: compute = FLOPs / throughput (GFLOP/s: host {HOST_FLOPS / 1e9:g}, "
        f"accelerators {ACCELERATOR_FLOPS / 1e9:g}{given}; FLOPs per op from the report, "
        f"else a default by op kind); copy = bytes / {bandwidth / 1e9:g} GB/s; sync copies "
        f"take their accelerator's lane, async copies its DMA lane; {order}"
    )


def draw_timeline(
    items: list[Item],
    lanes: list[str],
    width: float,
    top: float,
    colours: Mapping[str, str],
    cost: str,
    heading: str = "Timeline estimate of one inference",
) -> tuple[list[str], float]:
    """The timeline chart from ``top`` down, and its bottom: summary, cost model, lanes, spans.

    ``heading`` and ``cost`` (the lines under the summary) name what is drawn:
    the estimate, or a measured run (:func:`umahub.report.picture.timeline.measured`).
    """
    total = max((i.end for i in items), default=0.0)
    busy: dict[str, float] = defaultdict(float)
    for i in items:
        busy[i.lane] += i.end - i.start
    cost_lines = wrap(cost, width - 2 * M, 9.5)
    out = [
        text(M, top + 16, heading, size=15, weight="bold"),
        text(
            M,
            top + 34,
            f"total {fmt_time(total)}  ·  busy: "
            + ", ".join(f"{lane} {fmt_time(busy[lane])}" for lane in lanes if busy[lane] > 0),
            size=11,
            cls="summary",
        ),
        *(
            text(M, top + 50 + 13 * k, line, size=9.5, fill="#666")
            for k, line in enumerate(cost_lines)
        ),
    ]
    x0, x1 = M + LABEL_W, width - M
    y0 = top + 50 + 13 * len(cost_lines) + 18
    scale = (x1 - x0) / total if total > 0 else 0.0
    out.append(f'<g class="timeline" data-total="{total!r}">')
    if total > 0:
        step = _nice_step(total)
        t = 0.0
        while t <= total * 1.0001:
            tx = x0 + t * scale
            out.append(
                f'<line x1="{tx:.1f}" y1="{y0 - 6:.1f}" x2="{tx:.1f}" '
                f'y2="{y0 + len(lanes) * LANE:.1f}" stroke="#e3e3e3"/>'
            )
            out.append(text(tx, y0 - 9, fmt_time(t), size=9, fill="#666", anchor="middle"))
            t += step
    for k, lane in enumerate(lanes):
        ly = y0 + k * LANE
        device = device_of(lane)
        share = f"{busy[lane] / total:.0%}" if total > 0 else "0%"
        dma = is_dma(lane)
        out += [
            f'<g class="lane" data-lane="{esc(lane)}" data-busy="{busy[lane]!r}">',
            f'<rect x="{M}" y="{ly:.1f}" width="{width - 2 * M:.1f}" '
            f'height="{LANE - 3}" fill="{"#f7f7f7" if k % 2 == 0 else "#ffffff"}"/>',
            f'<rect x="{M}" y="{ly:.1f}" width="5" height="{LANE - 3}" '
            f'fill="{colours.get(device, HOST_COLOUR)}"/>',
            text(M + 10, ly + 12, lane, width=110, size=10.5, weight="normal" if dma else "bold"),
            text(
                x0 - 8,
                ly + 12,
                f"{fmt_time(busy[lane])} ({share})",
                size=9,
                fill="#666",
                anchor="end",
            ),
            "</g>",
        ]
    index = {lane: k for k, lane in enumerate(lanes)}
    for i in items:
        ly = y0 + index[i.lane] * LANE
        sx = x0 + i.start * scale
        w = max(0.8, (i.end - i.start) * scale)
        if i.kind == "compute":
            fill = colours.get(i.device, HOST_COLOUR)
            stroke = ' stroke="#ffffff" stroke-width="0.5"' if w > 4 else ""
        else:
            fill = f"url(#{i.kind})"
            stroke = f' stroke="{colours.get(i.device, HOST_COLOUR)}" stroke-width="0.8"'
        out.append(
            f'<rect class="span {i.kind}" data-lane="{esc(i.lane)}" '
            f'data-start="{i.start!r}" data-end="{i.end!r}" x="{sx:.2f}" '
            f'y="{ly + 1:.1f}" width="{w:.2f}" height="{LANE - 5}" fill="{fill}"{stroke}>'
            f"<title>{esc(i.detail)}: {fmt_time(i.start)} - "
            f"{fmt_time(i.end)}</title></rect>"
        )
        label = i.label if i.kind == "compute" else fmt_bytes(i.bytes)
        if w > len(label) * 8.5 * CHAR + 6:
            colour = ink(fill) if i.kind == "compute" else "#1f1f1f"
            out.append(text(sx + w / 2, ly + 11.5, label, size=8.5, fill=colour, anchor="middle"))
    out.append("</g>")
    return out, y0 + len(lanes) * LANE + 6


def draw_memory(
    report: Report, top: float, width: float, colours: Mapping[str, str]
) -> tuple[list[str], float]:
    """A bar per pool of a device in use: used of size; nothing without a memory plan."""
    if report.memory is None:
        return [], top
    pools = [p for p in report.memory.pools if p.device in report.devices]
    out = [
        text(M, top + 16, "Memory", size=15, weight="bold"),
        text(
            M,
            top + 34,
            f"host: {fmt_bytes(report.memory.host_bytes)} planned "
            f"(+{fmt_bytes(report.memory.host_constants)} of constants)",
            size=10.5,
        ),
    ]
    y = top + 44
    col_w = (width - 2 * M) / 2
    for k, p in enumerate(pools):
        px = M + (k % 2) * col_w
        py = y + (k // 2) * 20
        share = p.used / p.size_bytes if p.size_bytes else 0.0
        bar = 160
        out.append(
            f'<g class="pool" data-device="{esc(p.device)}" data-scope="{esc(p.scope)}">'
            f'<rect x="{px:.1f}" y="{py + 3:.1f}" width="{bar}" height="10" '
            'fill="#eeeeee" stroke="#cccccc"/>'
            f'<rect x="{px:.1f}" y="{py + 3:.1f}" width="{bar * min(1.0, share):.1f}" '
            f'height="10" fill="{colours.get(p.device, HOST_COLOUR)}"/>'
            + text(
                px + bar + 8,
                py + 12,
                f"{p.device} {p.scope}: {fmt_bytes(p.used)} of "
                f"{fmt_bytes(p.size_bytes)} ({share:.1%}), {p.copy}",
                width=col_w - bar - 16,
                size=10,
            )
            + "</g>"
        )
    return out, y + math.ceil(len(pools) / 2) * 20 + 4


def draw_legend(
    devices: list[str],
    counts: Mapping[str, int],
    colours: Mapping[str, str],
    top: float,
    width: float,
    weights: Mapping[str, int],
) -> tuple[list[str], float]:
    """Device swatches (operators, weights loaded), the copy styles and the dot, wrapped."""
    out: list[str] = ['<g class="legend">']
    x: float = M
    y: float = top
    entries = [
        (
            d,
            f"{d} ({counts.get(d, 0)} op{'s' if counts.get(d, 0) != 1 else ''}"
            + (f", weights {fmt_bytes(weights[d])}" if weights.get(d) else "")
            + ")",
        )
        for d in devices
    ]
    for d, label in entries:
        w = 24 + len(label) * 10.5 * CHAR
        if x + w > width - M:
            x, y = M, y + 18
        out.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="12" height="12" rx="2" '
            f'fill="{colours[d]}" data-device="{esc(d)}"/>'
        )
        out.append(text(x + 17, y + 10, label, size=10.5))
        x += w
    for kind, label in (
        ("sync", "sync copy (by the accelerator's processor)"),
        ("async", "async copy (DMA, overlaps compute)"),
    ):
        w = 38 + len(label) * 10.5 * CHAR
        if x + w > width - M:
            x, y = M, y + 18
        dash = copy_dash(kind)
        out.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="12" height="12" fill="url(#{kind})" '
            'stroke="#666" stroke-width="0.8"/>'
            f'<line x1="{x + 15:.1f}" y1="{y + 6:.1f}" x2="{x + 29:.1f}" y2="{y + 6:.1f}" '
            f'stroke="#666" stroke-width="2"{dash}/>'
        )
        out.append(text(x + 33, y + 10, label, size=10.5))
        x += w
    label = "dot: where a copy comes from (hollow: a constant)"
    if x + 24 + len(label) * 10.5 * CHAR > width - M:
        x, y = M, y + 18
    out.append(
        f'<circle cx="{x + 6:.1f}" cy="{y + 6:.1f}" r="3.5" fill="#ffffff" '
        'stroke="#666" stroke-width="1.5"/>' + text(x + 15, y + 10, label, size=10.5)
    )
    out.append("</g>")
    return out, y + 22
