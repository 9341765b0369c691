"""The whole picture: :func:`render_svg`, :func:`render_html` and :func:`save_picture`.

One SVG, top to bottom: a heading (operators, partitions, copies per inference,
weights copied at load), the legend, the placement graph
(:mod:`umahub.report.picture.graph`), the timeline estimate of one inference (and
the measured one), the device programs' module lanes in cycles
(:mod:`umahub.report.picture.programs`) and the memory bars
(:mod:`umahub.report.picture.charts`). The HTML page holds the same SVG
with a legend and the report's text table.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from umahub.report.picture.charts import cost_text, draw_legend, draw_memory, draw_timeline
from umahub.report.picture.graph import draw_graph
from umahub.report.picture.groups import (
    at_load,
    groups,
    has_edges,
    load_bytes,
    per_inference,
    split,
)
from umahub.report.picture.layout import CGAP, GW, M
from umahub.report.picture.programs import draw_programs
from umahub.report.picture.svg import DEFS, FONT, device_colours, esc, fmt_bytes, text
from umahub.report.picture.timeline import (
    BANDWIDTH,
    all_devices,
    lanes,
    measured,
    measured_text,
    schedule,
)
from umahub.sizes import counted

if TYPE_CHECKING:
    from umahub.report.data import ReportData as Report

__all__ = ["SUFFIXES", "render_html", "render_svg", "save_picture"]

#: The suffixes :func:`save_picture` writes.
SUFFIXES = (".svg", ".html")


def _heading(report: Report, title: str) -> str:
    """One line: operators, partitions (and fallbacks), copies per inference, weights."""
    n_parts = len({o.partition for o in report.placement if o.partition})
    n_fallen = sum(1 for p in report.partitions if p.fallback)
    inference = per_inference(report.copies)
    moved = sum(c.bytes for c in inference)
    weights = [c for c in report.copies if at_load(c)]
    at_load_text = (
        (
            f" (+{counted(len(weights), 'weight')}, {fmt_bytes(sum(c.bytes for c in weights))}, "
            "copied once at load)"
        )
        if weights
        else ""
    )
    heading = f"{title}: " if title else ""
    fell = f" (+{n_fallen} fell back)" if n_fallen else ""
    return (
        f"{heading}{counted(len(report.placement), 'operator')}, "
        f"{counted(n_parts, 'partition')}{fell}, "
        f"{counted(len(inference), 'copy', 'copies')} ({fmt_bytes(moved)}) "
        f"per inference{at_load_text}"
    )


def render_svg(
    report: Report,
    *,
    title: str = "",
    width: float = 1400,
    throughput: Mapping[str, float] | None = None,
    bandwidth: float = BANDWIDTH,
) -> str:
    """The picture as SVG text (no XML declaration): legend, graph, timeline, memory.

    Args:
        report: what to draw.
        title: a name for the model, shown in the heading (default: the
            report's ``model``).
        width: the picture's width in pixels; the graph wraps into rows to fit.
        throughput: FLOP/s overrides of the cost model (see
            :func:`umahub.report.picture.timeline.timeline`).
        bandwidth: bytes/s of a copy.
    """
    title = title or getattr(report, "model", "")
    width = max(width, 2 * M + GW + CGAP)
    devices = all_devices(report)
    colours = device_colours(devices)
    gs = groups(report.placement)
    incoming, outputs = split(gs, report.copies)
    items = schedule(report, throughput, bandwidth)

    body = [text(M, 28, _heading(report, title), size=17, weight="bold")]
    legend, y = draw_legend(
        devices, report.devices_of(), colours, 44, width, load_bytes(report.copies)
    )
    body += legend
    graph, bottom = draw_graph(report, gs, incoming, outputs, colours, width, y)
    body += graph
    cost = cost_text(throughput, bandwidth, has_edges(report.placement))
    chart, bottom = draw_timeline(items, lanes(report, items), width, bottom + 24, colours, cost)
    body += chart
    real = measured(report)
    if real:  # the run of Compiled.profile, next to the estimate
        chart, bottom = draw_timeline(
            real, lanes(report, real), width, bottom + 24, colours, measured_text(report),
            heading="Measured: one inference on the concurrent executor",
        )  # fmt: skip
        body += chart
    programs, bottom = draw_programs(report, bottom + 10, width, colours)
    body += programs
    memory, bottom = draw_memory(report, bottom + 10, width, colours)
    body += memory
    height = bottom + M
    heading = f"{title}: " if title else ""
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="{FONT}">\n'
        f"<title>{esc(heading)}umahub placement and timeline</title>\n{DEFS}\n"
        f'<rect width="100%" height="100%" fill="#ffffff"/>\n' + "\n".join(body) + "\n</svg>\n"
    )


def render_html(report: Report, *, title: str = "", **options: Any) -> str:
    """A page with the SVG of :func:`render_svg`, a legend and ``str(report)`` in a <pre>."""
    title = title or getattr(report, "model", "")
    svg = render_svg(report, title=title, **options)
    devices = all_devices(report)
    colours = device_colours(devices)
    counts = report.devices_of()
    loaded = load_bytes(report.copies)
    legend = "".join(
        f'<li><span class="swatch" style="background:{colours[d]}"></span>{esc(d)} '
        f"({counts.get(d, 0)} operators"
        f"{f', weights {fmt_bytes(loaded[d])} loaded once' if loaded.get(d) else ''})</li>"
        for d in devices
    )
    legend += (
        '<li><span class="swatch sync"></span>sync copy: done by the processor of '
        "its accelerator end, on that device's lane</li>"
        '<li><span class="swatch async"></span>async copy: done by DMA, overlaps '
        "compute</li>"
    )
    name = esc(title or "model")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>umahub: {name}</title>
<style>
body {{ font-family: {FONT}; margin: 16px; color: #1f1f1f; }}
ul.legend {{ list-style: none; padding: 0; display: flex; flex-wrap: wrap; gap: 6px 18px; }}
.swatch {{ display: inline-block; width: 12px; height: 12px; margin-right: 6px;
          vertical-align: -1px; border-radius: 2px; }}
.swatch.sync {{ background: repeating-linear-gradient(45deg, #c0392b 0 2px, #fde3e1 2px 5px); }}
.swatch.async {{ background: repeating-linear-gradient(-45deg, #2e6fb7 0 2px, #e1eefc 2px 5px); }}
svg {{ max-width: 100%; height: auto; }}
pre {{ background: #f7f7f7; padding: 12px; overflow-x: auto; font-size: 12px; }}
</style>
</head>
<body>
<h1>umahub: {name}</h1>
<ul class="legend">{legend}</ul>
{svg}
<h2>Report</h2>
<pre class="report">{esc(str(report))}</pre>
</body>
</html>
"""


def save_picture(report: Report, path: str | Path, **options: Any) -> str:
    """Draw ``report`` to ``path``: ``.svg`` (the picture) or ``.html`` (picture and table).

    Args:
        report: the report of a compile or of ``explain``.
        path: where to write; its suffix chooses the format.
        options: ``title`` (default: the report's ``model``, else the file's
            stem), ``width``, ``throughput`` and ``bandwidth`` (see :func:`render_svg`).

    Returns:
        The path written, as a string.

    Raises:
        ValueError: the suffix is neither ``.svg`` nor ``.html``.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(
            f"cannot save a picture as '{path.name}': the suffix must be one of "
            f"{', '.join(SUFFIXES)} (got '{path.suffix or 'none'}')"
        )
    options.setdefault("title", getattr(report, "model", "") or path.stem)
    if suffix == ".svg":
        svg = '<?xml version="1.0" encoding="UTF-8"?>\n' + render_svg(report, **options)
    else:
        svg = render_html(report, **options)
    path.write_text(svg, encoding="utf-8")
    return str(path)
