"""The report as a picture: the placement graph and a timeline estimate of one inference.

``save_picture(report, "model.svg")`` writes one SVG: on top the model's
operators in model order, grouped into partition boxes and coloured by the
device they run on, with every copy drawn as a labelled marker (bytes, sync or
async) in front of the group that receives it; below, one inference as a
timeline, one lane per device and one DMA lane per accelerator whose pools are
filled asynchronously. ``save_picture(report, "model.html")`` writes the same
SVG inside a page, with a legend and the report's text table.

The graph flows left to right and wraps into rows like text, so that a model of
a few hundred operators stays a page of boxes rather than a ribbon; a group of
more than :data:`MAX_ROWS` operators shows its first and last operators by name
and the ones between as a strip of small marks (one per operator, each with its
name as a tooltip).

The timeline is an estimate with a stated cost model, made to compare
placements, not to predict milliseconds:

* compute: an operator takes ``FLOPs / throughput`` of its device. FLOPs are
  ``Operator.flops`` when the report carries it (and it is not 0), otherwise a
  default per kind of operator, matched on the op name (:data:`DEFAULT_FLOPS`,
  :data:`OTHER_FLOPS`). Throughput: :data:`HOST_FLOPS` for the host,
  :data:`ACCELERATOR_FLOPS` for every accelerator, unless ``throughput`` names
  the device (``"npu:0"``), the accelerator (``"npu"``) or ``"host"``.
* a copy takes ``bytes / bandwidth`` (:data:`BANDWIDTH`).
* a sync copy is done by a processor: it occupies both its source and its
  destination lane, and (in a sequential program) it is a step of the program.
* an async copy runs on the DMA lane of its accelerator end as soon as its data
  is ready (a constant, i.e. weights, at time 0) and the engine is free;
  compute goes on meanwhile, and the receiving operator waits for it.
* order: without data edges the model is a sequential program: an operator
  starts after the one before it in model order (which is a topological
  order), once its device is free and its copies have arrived. When the
  operators carry their inputs (``Operator.inputs``, names of producer nodes),
  an operator waits only for its producers, so devices may run side by side.

Weights copied once, when the model is loaded (``Copy.when == "load"``), are
not part of an inference: they are left out of the timeline, counted in the
heading and in the legend per device, and shown on their partition's box when
the copy names its ``consumer``.

Which copy feeds which group: when a copy names its ``consumer`` (and
``producer``), an operator or partition symbol, that is used; otherwise copies,
which the report lists in the order they happen, are matched in order to the
next group on their destination device, and the producer is the operator the
tensor is named after, or else the latest group on the source device before
the consumer.
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from umahub.config import HOST

if TYPE_CHECKING:
    from umahub.build import Copy
    from umahub.context import Operator
    from umahub.report import Report

__all__ = [
    "ACCELERATOR_FLOPS",
    "BANDWIDTH",
    "DEFAULT_FLOPS",
    "HOST_FLOPS",
    "OTHER_FLOPS",
    "SUFFIXES",
    "Span",
    "estimate_flops",
    "render_html",
    "render_svg",
    "save_picture",
    "timeline",
]

#: The suffixes :func:`save_picture` writes.
SUFFIXES = (".svg", ".html")

#: Host compute throughput of the cost model, FLOP/s.
HOST_FLOPS = 10e9
#: Accelerator compute throughput of the cost model, FLOP/s.
ACCELERATOR_FLOPS = 100e9
#: Copy bandwidth of the cost model, bytes/s (10 GB/s), sync and async alike.
BANDWIDTH = 10e9
#: FLOPs of an operator whose report carries none: the first entry whose key
#: is in the op's last name segment (``"relax.nn.conv2d"`` -> ``"conv2d"``).
DEFAULT_FLOPS: tuple[tuple[str, float], ...] = (
    ("conv", 100e6),
    ("matmul", 20e6),
    ("dense", 20e6),
    ("linear", 20e6),
    ("einsum", 20e6),
    ("attention", 20e6),
    ("softmax", 1e6),
    ("norm", 1e6),
    ("pool", 1e6),
    ("mean", 1e6),
    ("variance", 1e6),
    ("sum", 1e6),
)
#: FLOPs of any other operator (elementwise, reshape, ...) without a count.
OTHER_FLOPS = 1e5
#: A group with more operators than this shows the ones in the middle as marks.
MAX_ROWS = 10


# ---------------------------------------------------------------------- the schedule


class Span(NamedTuple):
    """One bar of the timeline: ``lane`` is a device or ``"<device> DMA"``; seconds."""

    lane: str
    start: float
    end: float
    label: str


@dataclass(frozen=True)
class _Item:
    """A span with what drawing it needs: its kind, colour source and tooltip."""

    lane: str
    start: float
    end: float
    label: str
    kind: str  # "compute", "sync" or "async"
    device: str  # whose colour
    detail: str = ""  # the tooltip
    short: str = ""  # the text drawn on the bar, if it fits (default: label)


@dataclass
class _Group:
    """Consecutive operators of one partition (or of the host), in model order."""

    index: int
    device: str
    partition: str
    ops: list[Operator] = field(default_factory=list)


def estimate_flops(op: Operator) -> float:
    """``op.flops`` when the report has it (not 0), else the default for its kind of op."""
    flops = getattr(op, "flops", 0) or 0
    if flops > 0:
        return float(flops)
    kind = op.op.rsplit(".", 1)[-1].lower()
    for key, value in DEFAULT_FLOPS:
        if key in kind:
            return value
    return OTHER_FLOPS


def _throughput(device: str, throughput: Mapping[str, float] | None) -> float:
    given = throughput or {}
    for key in (device, device.split(":")[0]):
        if key in given:
            return float(given[key])
    return float(
        given.get(
            HOST if device == HOST else "accelerator",
            HOST_FLOPS if device == HOST else ACCELERATOR_FLOPS,
        )
    )


def _groups(placement: Sequence[Operator]) -> list[_Group]:
    groups: list[_Group] = []
    for op in placement:
        if not groups or (groups[-1].partition, groups[-1].device) != (op.partition, op.device):
            groups.append(_Group(len(groups), op.device, op.partition))
        groups[-1].ops.append(op)
    return groups


def _inputs(op: Operator) -> tuple[str, ...]:
    return tuple(getattr(op, "inputs", ()) or ())


def _attribute(
    groups: list[_Group], copies: Sequence[Copy]
) -> list[tuple[Copy, int | None, int | None]]:
    """(copy, producer group, consumer group) per copy; None: model input/constant, output."""
    by_name: dict[str, int] = {}
    for g in groups:
        if g.partition:
            by_name.setdefault(g.partition, g.index)
        for op in g.ops:
            by_name.setdefault(op.name, g.index)
    edges = any(_inputs(op) for g in groups for op in g.ops)
    links: list[tuple[Copy, int | None, int | None]] = []
    pointer = 0
    for c in copies:
        named_consumer = getattr(c, "consumer", "") or ""
        named_producer = getattr(c, "producer", "") or ""
        producer = by_name.get(named_producer) if named_producer else None
        if producer is None and not named_producer and not c.constant:
            named = by_name.get(c.tensor)
            if named is not None and groups[named].device == c.src:
                producer = named
        if named_consumer:
            consumer = by_name.get(named_consumer)
        else:
            start = pointer if producer is None else max(pointer, producer + 1)
            if producer is None and not c.constant and c.src != HOST:
                # the tensor is made on c.src: its consumer comes after a group there
                first = next((g.index for g in groups if g.device == c.src), None)
                start = max(start, first + 1) if first is not None else start
            candidates = [g for g in groups[start:] if g.device == c.dst]
            if edges:  # prefer the first that reads something made where the copy comes from
                reading = [
                    g
                    for g in candidates
                    if any(
                        (k := by_name.get(i)) is not None
                        and k != g.index
                        and (k == producer if producer is not None else groups[k].device == c.src)
                        for op in g.ops
                        for i in _inputs(op)
                    )
                ]
                candidates = reading or candidates
            consumer = candidates[0].index if candidates else None
        if consumer is not None:
            pointer = consumer
        if producer is None and not named_producer and not c.constant:
            before = consumer if consumer is not None else pointer + 1
            producer = next((g.index for g in reversed(groups[:before]) if g.device == c.src), None)
        links.append((c, producer, consumer))
    return links


def _at_load(c: Copy) -> bool:
    """True for a copy made once when the model is loaded (weights), not per inference."""
    return getattr(c, "when", "inference") == "load"


def _per_inference(copies: Sequence[Copy]) -> list[Copy]:
    return [c for c in copies if not _at_load(c)]


def _loaded_into(groups: list[_Group], copies: Sequence[Copy]) -> dict[int, list[Copy]]:
    """Group -> the weights loaded for it, for the load copies that name their consumer.

    A load copy without a consumer cannot be placed (a partition may read
    several weights, and a weight read by several partitions is loaded once);
    those are counted per device in the legend only.
    """
    index: dict[str, int] = {}
    for g in groups:
        index.setdefault(g.partition, g.index)
        for op in g.ops:
            index.setdefault(op.name, g.index)
    into: dict[int, list[Copy]] = defaultdict(list)
    for c in copies:
        named = getattr(c, "consumer", "") or ""
        if _at_load(c) and named and named in index:
            into[index[named]].append(c)
    return into


def _dma_lane(copy: Copy) -> str:
    return f"{copy.dst if copy.dst != HOST else copy.src} DMA"


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            if unit == "B":
                return f"{int(n)} B"
            return f"{n:.1f} {unit}" if n < 10 else f"{n:.0f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover - the loop returns


def _fmt_time(t: float) -> str:
    if t == 0:
        return "0"
    if t < 1e-3:
        return f"{t * 1e6:.3g} µs"
    if t < 1:
        return f"{t * 1e3:.3g} ms"
    return f"{t:.3g} s"


def _copy_label(c: Copy) -> str:
    return f"copy {c.tensor} {c.src}->{c.dst}"


def _schedule(
    report: Report, throughput: Mapping[str, float] | None = None, bandwidth: float = BANDWIDTH
) -> list[_Item]:
    """Every span of one inference, with drawing information (see the module's cost model)."""
    groups = _groups(report.placement)
    edges = any(_inputs(o) for o in report.placement)
    sequential = not edges
    incoming: dict[int, list[tuple[Copy, int | None]]] = defaultdict(list)
    outputs: list[tuple[Copy, int | None]] = []
    for c, producer, consumer in _attribute(groups, _per_inference(report.copies)):
        (incoming[consumer] if consumer is not None else outputs).append((c, producer))
    free: dict[str, float] = defaultdict(float)
    end_of: dict[str, float] = {}
    group_end: dict[int, float] = {}
    items: list[_Item] = []
    pc = 0.0  # the program point of a sequential program

    def do_copy(c: Copy, producer: int | None, not_before: float) -> float:
        ready = group_end.get(producer, 0.0) if producer is not None else 0.0
        duration = c.bytes / bandwidth
        detail = (
            f"{'constant ' if c.constant else ''}{c.tensor}: {c.src} -> {c.dst}, "
            f"{c.bytes} bytes, {c.kind}"
        )
        if c.kind == "async":
            lane = _dma_lane(c)
            start = max(ready, free[lane])
            free[lane] = start + duration
            items.append(
                _Item(
                    lane,
                    start,
                    start + duration,
                    _copy_label(c),
                    "async",
                    lane.removesuffix(" DMA"),
                    detail,
                    _fmt_bytes(c.bytes),
                )
            )
        else:
            start = max(ready, free[c.src], free[c.dst], not_before)
            free[c.src] = free[c.dst] = start + duration
            for lane in dict.fromkeys((c.src, c.dst)):
                items.append(
                    _Item(
                        lane,
                        start,
                        start + duration,
                        _copy_label(c),
                        "sync",
                        lane,
                        detail,
                        _fmt_bytes(c.bytes),
                    )
                )
        return start + duration

    for g in groups:
        arrived = 0.0
        for c, producer in incoming[g.index]:
            end = do_copy(c, producer, pc if sequential else 0.0)
            if sequential and c.kind != "async":
                pc = max(pc, end)
            arrived = max(arrived, end)
        rate = _throughput(g.device, throughput)
        for op in g.ops:
            start = max(
                free[g.device], arrived, pc, *(end_of[i] for i in _inputs(op) if i in end_of)
            )
            end = start + estimate_flops(op) / rate
            free[g.device] = end
            end_of[op.name] = end
            if sequential:
                pc = end
            items.append(
                _Item(
                    g.device,
                    start,
                    end,
                    op.name,
                    "compute",
                    g.device,
                    f"{op.name}: {op.op} on {g.device}, {estimate_flops(op) / 1e6:.3g} MFLOP",
                )
            )
        group_end[g.index] = max(end_of[o.name] for o in g.ops)
    for c, producer in outputs:
        end = do_copy(c, producer, pc if sequential else 0.0)
        if sequential and c.kind != "async":
            pc = max(pc, end)
    return items


def timeline(
    report: Report, *, throughput: Mapping[str, float] | None = None, bandwidth: float = BANDWIDTH
) -> list[Span]:
    """The estimated schedule of one inference, as ``(lane, start, end, label)`` spans.

    Args:
        report: the report of a compile or of ``explain``.
        throughput: FLOP/s by device (``"npu:0"``), accelerator (``"npu"``),
            ``"host"`` or ``"accelerator"`` (every accelerator); the rest are
            :data:`HOST_FLOPS` and :data:`ACCELERATOR_FLOPS`.
        bandwidth: bytes/s of every copy.

    Returns:
        Spans in the order they were scheduled (seconds from the start of the
        inference): one per operator, labelled with its node name, on its
        device's lane; one per async copy on the DMA lane (``"npu:0 DMA"``);
        and one per sync copy on each of its two ends. Copies are labelled
        ``"copy <tensor> <src>-><dst>"``.
    """
    return [Span(i.lane, i.start, i.end, i.label) for i in _schedule(report, throughput, bandwidth)]


def _lanes(report: Report, items: Sequence[_Item]) -> list[str]:
    """Device lanes in the report's order, each followed by its DMA lane if it has one."""
    devices = list(dict.fromkeys([*report.devices, *(o.device for o in report.placement)]))
    dma = {
        p.device
        for p in (report.memory.pools if report.memory else ())
        if p.copy == "async" and p.device in devices
    }
    dma |= {i.lane.removesuffix(" DMA") for i in items if i.lane.endswith(" DMA")}
    lanes: list[str] = []
    for d in devices:
        lanes.append(d)
        if d in dma:
            lanes.append(f"{d} DMA")
    lanes += [i.lane for i in items if i.lane not in lanes]
    return list(dict.fromkeys(lanes))


# ---------------------------------------------------------------------- colours

_PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#b07aa1",
    "#76b7b2",
    "#edc948",
    "#9c755f",
    "#ff9da7",
    "#17becf",
)
_HOST_COLOUR = "#9aa0a6"
_SHADES = (0.0, 0.45, -0.3, 0.7, -0.5)  # instance i: mixed toward white (+) or black (-)


def _mix(colour: str, amount: float) -> str:
    rgb = [int(colour[i : i + 2], 16) for i in (1, 3, 5)]
    target = 255 if amount > 0 else 0
    rgb = [round(v + (target - v) * abs(amount)) for v in rgb]
    return "#" + "".join(f"{v:02x}" for v in rgb)


def device_colours(devices: Sequence[str]) -> dict[str, str]:
    """A colour per device: grey for the host, a hue per accelerator, a shade per instance."""
    accelerators = list(dict.fromkeys(d.split(":")[0] for d in devices if d != HOST))
    colours: dict[str, str] = {}
    for d in devices:
        if d == HOST:
            colours[d] = _HOST_COLOUR
            continue
        name, _, instance = d.partition(":")
        base = _PALETTE[accelerators.index(name) % len(_PALETTE)]
        i = int(instance) if instance.isdigit() else 0
        colours[d] = _mix(base, _SHADES[i % len(_SHADES)])
    return colours


def _ink(colour: str) -> str:
    """Dark or white text, whichever reads on ``colour``."""
    r, g, b = (int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return "#1f1f1f" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "#ffffff"


# ---------------------------------------------------------------------- drawing

_FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
_CHAR = 0.58  # average character width, in font sizes
_M = 20  # margin
_GW = 160  # group width
_HEAD = 30  # group header height
_ROW = 16  # operator row height (with its gap)
_TICK = 5  # width of a collapsed operator's mark (with its gap)
_GAP = 22  # between groups without copies
_CGAP = 104  # between groups with copies
_CROW = 20  # one copy marker
_MAX_COPIES = 6  # markers per gap before they are summed up
_MAX_NOTES = 3  # fallback reasons written out
_LANE = 20  # timeline lane height (with its gap)
_LABEL_W = 200  # timeline lane label column


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _fit(text: str, width: float, size: float = 10) -> str:
    """``text`` cut with an ellipsis to fit ``width`` pixels at font ``size``."""
    room = max(1, int(width / (size * _CHAR)))
    return text if len(text) <= room else text[: max(0, room - 1)] + "…"


def _wrap(text: str, width: float, size: float = 10) -> list[str]:
    """``text`` broken at spaces into lines that fit ``width`` pixels at font ``size``."""
    room = max(10, int(width / (size * _CHAR)))
    lines: list[str] = []
    for word in text.split(" "):
        if lines and len(lines[-1]) + 1 + len(word) <= room:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def _text(
    x: float,
    y: float,
    text: str,
    *,
    size: float = 10,
    fill: str = "#1f1f1f",
    anchor: str = "start",
    weight: str = "normal",
    cls: str = "",
) -> str:
    extra = f' class="{cls}"' if cls else ""
    bold = f' font-weight="{weight}"' if weight != "normal" else ""
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" fill="{fill}" '
        f'text-anchor="{anchor}"{bold}{extra}>{_e(text)}</text>'
    )


def _short_op(op: str) -> str:
    return op.removeprefix("relax.").removeprefix("nn.")


@dataclass
class _Placed:
    """A group with its place in the graph and where its operators were drawn."""

    group: _Group
    x: float
    y: float
    gap: float
    height: float
    copies: list[tuple[Copy, int | None]]
    anchors: dict[str, tuple[float, float, float]] = field(default_factory=dict)  # name->x,y,x2


def _group_height(g: _Group) -> float:
    n = len(g.ops)
    if n <= MAX_ROWS:
        return _HEAD + n * _ROW + 6
    hidden = n - 8
    per_row = int((_GW - 12) // _TICK)
    return _HEAD + 8 * _ROW + 16 + math.ceil(hidden / per_row) * 7 + 10


def _copies_height(n: int) -> float:
    return 8 + min(n, _MAX_COPIES) * _CROW


def _layout(
    groups: list[_Group], incoming: Mapping[int, list], width: float, top: float
) -> tuple[list[_Placed], float]:
    placed: list[_Placed] = []
    x, y, row_h = _M, top, 0.0
    for g in groups:
        copies = incoming.get(g.index, [])
        gap = _CGAP if copies else (_GAP if g.index else 0)
        if x > _M and x + gap + _GW > width - _M:
            x, y, row_h = _M, y + row_h + 14, 0.0
        h = max(_group_height(g), _HEAD + _copies_height(len(copies)) if copies else 0)
        placed.append(_Placed(g, x + gap, y, gap, _group_height(g), copies))
        x += gap + _GW
        row_h = max(row_h, h)
    return placed, y + row_h


def _copy_markers(
    copies: list[tuple[Copy, int | None]],
    x: float,
    y: float,
    width: float,
    colours: Mapping[str, str],
) -> list[str]:
    """Labelled arrows for the copies received by the group at ``x + width``."""
    out: list[str] = []
    shown = copies if len(copies) <= _MAX_COPIES else copies[: _MAX_COPIES - 1]
    for k, (c, _) in enumerate(shown):
        cy = y + 8 + k * _CROW
        colour = colours.get(c.src, _HOST_COLOUR)
        label = f"{_fmt_bytes(c.bytes)} {c.kind}"
        dot = (
            f'stroke="{colour}" stroke-width="1.5" fill="#ffffff"'
            if c.constant
            else (f'fill="{colour}"')
        )
        dash = ' stroke-dasharray="5 3"' if c.kind == "async" else ""
        out.append(
            f'<g class="copy" data-tensor="{_e(c.tensor)}" data-src="{_e(c.src)}" '
            f'data-dst="{_e(c.dst)}" data-bytes="{c.bytes}" data-kind="{_e(c.kind)}">'
            f"<title>{_e(c.tensor)}: {_e(c.src)} -&gt; {_e(c.dst)}, {c.bytes} bytes, "
            f"{_e(c.kind)}{' (constant)' if c.constant else ''}</title>"
            f'<circle cx="{x + 8:.1f}" cy="{cy + 6:.1f}" r="3.5" {dot}/>'
            + _text(
                x + 16,
                cy + 10,
                _fit(label, width - 22, 9),
                size=9,
                fill="#666" if c.constant else "#1f1f1f",
                cls="copy-label",
            )
            + f'<line x1="{x + 4:.1f}" y1="{cy + 14:.1f}" x2="{x + width - 8:.1f}" '
            f'y2="{cy + 14:.1f}" stroke="{colour}" stroke-width="2"{dash} '
            'marker-end="url(#arrow)"/></g>'
        )
    if len(copies) > len(shown):
        rest = copies[len(shown) :]
        total = sum(c.bytes for c, _ in rest)
        kinds = "/".join(sorted({c.kind for c, _ in rest}))
        cy = y + 8 + len(shown) * _CROW
        out.append(
            '<g class="copy-more"><title>'
            + _e("; ".join(f"{c.tensor} {c.src}->{c.dst} {c.bytes} B {c.kind}" for c, _ in rest))
            + "</title>"
            + _text(
                x + 4,
                cy + 10,
                _fit(f"+{len(rest)}: {_fmt_bytes(total)} {kinds}", width - 8),
                fill="#555",
            )
            + "</g>"
        )
    return out


def _op_title(op: Operator) -> str:
    parts = [f"{op.name}: {op.op} on {op.device}"]
    if op.pattern:
        parts.append(f"pattern {op.pattern}")
    if op.pinned:
        parts.append(f"pinned by '{op.pinned}'")
    if _inputs(op):
        parts.append("inputs " + ", ".join(_inputs(op)))
    return "; ".join(parts)


def _draw_group(
    p: _Placed,
    colours: Mapping[str, str],
    patterns: Mapping[str, str],
    weights: Sequence[Copy] = (),
) -> list[str]:
    g, x, y = p.group, p.x, p.y
    badge = f"weights {_fmt_bytes(sum(c.bytes for c in weights))}" if weights else ""
    colour = colours.get(g.device, _HOST_COLOUR)
    dashed = "" if g.partition else ' stroke-dasharray="4 3"'
    out = [
        f'<g class="group" data-device="{_e(g.device)}" data-partition="{_e(g.partition)}">',
        f"<title>{_e(g.partition or 'host operators')} on {_e(g.device)}, "
        f"{len(g.ops)} operator(s)</title>",
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{_GW}" height="{p.height:.1f}" rx="6" '
        f'fill="#ffffff" stroke="{colour}" stroke-width="2"{dashed}/>',
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{_GW}" height="5" rx="2" fill="{colour}"/>',
        _text(x + 8, y + 17, _fit(g.device, _GW - 60), weight="bold", size=11),
        _text(
            x + _GW - 8,
            y + 17,
            f"{len(g.ops)} op{'s' if len(g.ops) != 1 else ''}",
            size=9,
            fill="#666",
            anchor="end",
        ),
        _text(
            x + 8,
            y + 27,
            _fit(
                patterns.get(g.partition, "") if g.partition else "host operators",
                _GW - 20 - len(badge) * 8.5 * _CHAR,
                8.5,
            ),
            size=8.5,
            fill="#666",
        ),
    ]
    if weights:
        out.append(
            f'<g class="load-copy" data-bytes="{sum(c.bytes for c in weights)}">'
            f"<title>{_e(_load_title(weights))}</title>"
            + _text(x + _GW - 8, y + 27, badge, size=8.5, fill="#444", anchor="end")
            + "</g>"
        )
    ink = _ink(colour)
    ops = g.ops
    shown: list[tuple[int, Operator]] = list(enumerate(ops))
    hidden: list[Operator] = []
    if len(ops) > MAX_ROWS:
        shown = [*enumerate(ops[:6]), *((len(ops) - 2 + k, o) for k, o in enumerate(ops[-2:]))]
        hidden = ops[6:-2]
    row_y = y + _HEAD
    for k, (i, op) in enumerate(shown):
        if hidden and i == len(ops) - 2 and k == 6:
            row_y = _draw_hidden(out, hidden, x, row_y, colours, p)
        kind = _fit(_short_op(op.op), 60, 8)
        room = _GW - 22 - len(kind) * 8 * _CHAR
        pin = ' stroke="#1f1f1f" stroke-width="1.5"' if op.pinned else ""
        out.append(
            f'<g class="op-row"><title>{_e(_op_title(op))}</title>'
            f'<rect class="op" data-node="{_e(op.name)}" data-device="{_e(op.device)}" '
            f'x="{x + 4:.1f}" y="{row_y:.1f}" width="{_GW - 8}" height="{_ROW - 2}" '
            f'rx="3" fill="{colours.get(op.device, _HOST_COLOUR)}"{pin}/>'
            + _text(x + 9, row_y + 10.5, _fit(op.name, room, 9.5), size=9.5, fill=ink)
            + _text(x + _GW - 9, row_y + 10.5, kind, size=8, fill=ink, anchor="end", cls="op-kind")
            + "</g>"
        )
        p.anchors[op.name] = (x + 4, row_y + (_ROW - 2) / 2, x + _GW - 4)
        row_y += _ROW
    out.append("</g>")
    return out


def _load_title(weights: Sequence[Copy]) -> str:
    return f"{len(weights)} weight tensor(s) copied once, when the model is loaded: " + ", ".join(
        f"{c.src} -> {c.dst} {c.bytes} bytes {c.kind}" for c in weights
    )


def _draw_hidden(
    out: list[str],
    hidden: list[Operator],
    x: float,
    y: float,
    colours: Mapping[str, str],
    p: _Placed,
) -> float:
    """The middle of a long group: a caption and one small mark per operator."""
    counts: dict[str, int] = defaultdict(int)
    for op in hidden:
        counts[_short_op(op.op)] += 1
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
    out.append(
        _text(
            x + 8, y + 10, _fit(f"+{len(hidden)} more: {summary}", _GW - 16, 9), size=9, fill="#444"
        )
    )
    y += 16
    per_row = int((_GW - 12) // _TICK)
    for k, op in enumerate(hidden):
        tx = x + 6 + (k % per_row) * _TICK
        ty = y + (k // per_row) * 7
        out.append(
            f'<rect class="op" data-node="{_e(op.name)}" data-device="{_e(op.device)}" '
            f'x="{tx:.1f}" y="{ty:.1f}" width="{_TICK - 1}" height="5" '
            f'fill="{colours.get(op.device, _HOST_COLOUR)}">'
            f"<title>{_e(_op_title(op))}</title></rect>"
        )
        p.anchors[op.name] = (tx, ty + 2.5, tx + _TICK - 1)
    return y + math.ceil(len(hidden) / per_row) * 7 + 4


def _draw_edges(placed: list[_Placed]) -> list[str]:
    """Data edges that skip over groups (when the operators carry their inputs)."""
    where = {name: (p.group.index, a) for p in placed for name, a in p.anchors.items()}
    out: list[str] = []
    for p in placed:
        for op in p.group.ops:
            if op.name not in p.anchors:
                continue
            for src in _inputs(op):
                if src not in where:
                    continue
                gi, (_, sy, sx2) = where[src]
                if gi >= p.group.index - 1:
                    continue  # within the group or from the one before: the flow shows it
                tx, ty, _ = p.anchors[op.name]
                bend = max(40.0, abs(tx - sx2) / 3)
                out.append(
                    f'<path class="edge" d="M{sx2:.1f},{sy:.1f} C{sx2 + bend:.1f},'
                    f'{sy:.1f} {tx - bend:.1f},{ty:.1f} {tx:.1f},{ty:.1f}" fill="none" '
                    'stroke="#555" stroke-opacity="0.45" stroke-width="1.2" '
                    f'marker-end="url(#dot)"><title>{_e(src)} -&gt; {_e(op.name)}'
                    "</title></path>"
                )
    return out


def _nice_step(span: float, ticks: int = 8) -> float:
    raw = span / ticks
    power = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * power >= raw:
            return m * power
    return 10 * power  # pragma: no cover


def _draw_timeline(
    report: Report,
    items: list[_Item],
    lanes: list[str],
    width: float,
    top: float,
    colours: Mapping[str, str],
    cost: str,
) -> tuple[list[str], float]:
    total = max((i.end for i in items), default=0.0)
    busy: dict[str, float] = defaultdict(float)
    for i in items:
        busy[i.lane] += i.end - i.start
    out = [
        _text(_M, top + 16, "Timeline estimate of one inference", size=15, weight="bold"),
        _text(
            _M,
            top + 34,
            f"total {_fmt_time(total)}  ·  busy: "
            + ", ".join(f"{lane} {_fmt_time(busy[lane])}" for lane in lanes if busy[lane] > 0),
            size=11,
            cls="summary",
        ),
        *(
            _text(_M, top + 50 + 13 * k, line, size=9.5, fill="#666")
            for k, line in enumerate(_wrap(cost, width - 2 * _M, 9.5))
        ),
    ]
    x0, x1 = _M + _LABEL_W, width - _M
    y0 = top + 50 + 13 * len(_wrap(cost, width - 2 * _M, 9.5)) + 18
    scale = (x1 - x0) / total if total > 0 else 0.0
    out.append(f'<g class="timeline" data-total="{total!r}">')
    if total > 0:
        step = _nice_step(total)
        t = 0.0
        while t <= total * 1.0001:
            tx = x0 + t * scale
            out.append(
                f'<line x1="{tx:.1f}" y1="{y0 - 6:.1f}" x2="{tx:.1f}" '
                f'y2="{y0 + len(lanes) * _LANE:.1f}" stroke="#e3e3e3"/>'
            )
            out.append(_text(tx, y0 - 9, _fmt_time(t), size=9, fill="#666", anchor="middle"))
            t += step
    for k, lane in enumerate(lanes):
        ly = y0 + k * _LANE
        device = lane.removesuffix(" DMA")
        share = f"{busy[lane] / total:.0%}" if total > 0 else "0%"
        out.append(f'<g class="lane" data-lane="{_e(lane)}" data-busy="{busy[lane]!r}">')
        out.append(
            f'<rect x="{_M}" y="{ly:.1f}" width="{width - 2 * _M:.1f}" '
            f'height="{_LANE - 3}" fill="{"#f7f7f7" if k % 2 == 0 else "#ffffff"}"/>'
        )
        out.append(
            f'<rect x="{_M}" y="{ly:.1f}" width="5" height="{_LANE - 3}" '
            f'fill="{colours.get(device, _HOST_COLOUR)}"/>'
        )
        out.append(
            _text(
                _M + 10,
                ly + 12,
                _fit(lane, 110, 10.5),
                size=10.5,
                weight="bold" if not lane.endswith(" DMA") else "normal",
            )
        )
        out.append(
            _text(
                x0 - 8,
                ly + 12,
                f"{_fmt_time(busy[lane])} ({share})",
                size=9,
                fill="#666",
                anchor="end",
            )
        )
        out.append("</g>")
    index = {lane: k for k, lane in enumerate(lanes)}
    for i in items:
        ly = y0 + index[i.lane] * _LANE
        sx = x0 + i.start * scale
        w = max(0.8, (i.end - i.start) * scale)
        if i.kind == "compute":
            fill = colours.get(i.device, _HOST_COLOUR)
            stroke = ' stroke="#ffffff" stroke-width="0.5"' if w > 4 else ""
        else:
            fill = f"url(#{i.kind})"
            stroke = f' stroke="{colours.get(i.device, _HOST_COLOUR)}" stroke-width="0.8"'
        out.append(
            f'<rect class="span {i.kind}" data-lane="{_e(i.lane)}" '
            f'data-start="{i.start!r}" data-end="{i.end!r}" x="{sx:.2f}" '
            f'y="{ly + 1:.1f}" width="{w:.2f}" height="{_LANE - 5}" fill="{fill}"{stroke}>'
            f"<title>{_e(i.detail or i.label)}: {_fmt_time(i.start)} - "
            f"{_fmt_time(i.end)}</title></rect>"
        )
        label = i.short or i.label
        if w > len(label) * 8.5 * _CHAR + 6:
            ink = _ink(fill) if i.kind == "compute" else "#1f1f1f"
            out.append(_text(sx + w / 2, ly + 11.5, label, size=8.5, fill=ink, anchor="middle"))
    out.append("</g>")
    return out, y0 + len(lanes) * _LANE + 6


def _draw_memory(
    report: Report, top: float, width: float, colours: Mapping[str, str]
) -> tuple[list[str], float]:
    """A bar per pool of a device in use: used of size."""
    if report.memory is None:
        return [], top
    pools = [p for p in report.memory.pools if p.device in report.devices]
    out = [
        _text(_M, top + 16, "Memory", size=15, weight="bold"),
        _text(
            _M,
            top + 34,
            f"host: {_fmt_bytes(report.memory.host_bytes)} planned "
            f"(+{_fmt_bytes(report.memory.host_constants)} of constants)",
            size=10.5,
        ),
    ]
    y = top + 44
    col_w = (width - 2 * _M) / 2
    for k, p in enumerate(pools):
        px = _M + (k % 2) * col_w
        py = y + (k // 2) * 20
        share = p.used / p.size_bytes if p.size_bytes else 0.0
        bar = 160
        out.append(
            f'<g class="pool" data-device="{_e(p.device)}" data-scope="{_e(p.scope)}">'
            f'<rect x="{px:.1f}" y="{py + 3:.1f}" width="{bar}" height="10" '
            'fill="#eeeeee" stroke="#cccccc"/>'
            f'<rect x="{px:.1f}" y="{py + 3:.1f}" width="{bar * min(1.0, share):.1f}" '
            f'height="10" fill="{colours.get(p.device, _HOST_COLOUR)}"/>'
            + _text(
                px + bar + 8,
                py + 12,
                _fit(
                    f"{p.device} {p.scope}: {_fmt_bytes(p.used)} of "
                    f"{_fmt_bytes(p.size_bytes)} ({share:.1%}), {p.copy}",
                    col_w - bar - 16,
                ),
                size=10,
            )
            + "</g>"
        )
    return out, y + math.ceil(len(pools) / 2) * 20 + 4


def _legend(
    devices: list[str],
    counts: Mapping[str, int],
    colours: Mapping[str, str],
    top: float,
    width: float,
    weights: Mapping[str, int] | None = None,
) -> tuple[list[str], float]:
    out: list[str] = ['<g class="legend">']
    x, y = _M, top
    weights = weights or {}
    entries = [
        (
            d,
            f"{d} ({counts.get(d, 0)} op{'s' if counts.get(d, 0) != 1 else ''}"
            + (f", weights {_fmt_bytes(weights[d])}" if weights.get(d) else "")
            + ")",
        )
        for d in devices
    ]
    for d, text in entries:
        w = 24 + len(text) * 10.5 * _CHAR
        if x + w > width - _M:
            x, y = _M, y + 18
        out.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="12" height="12" rx="2" '
            f'fill="{colours[d]}" data-device="{_e(d)}"/>'
        )
        out.append(_text(x + 17, y + 10, text, size=10.5))
        x += w
    for kind, text in (
        ("sync", "sync copy (blocks both ends)"),
        ("async", "async copy (DMA, overlaps compute)"),
    ):
        w = 38 + len(text) * 10.5 * _CHAR
        if x + w > width - _M:
            x, y = _M, y + 18
        dash = ' stroke-dasharray="5 3"' if kind == "async" else ""
        out.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="12" height="12" fill="url(#{kind})" '
            'stroke="#666" stroke-width="0.8"/>'
            f'<line x1="{x + 15:.1f}" y1="{y + 6:.1f}" x2="{x + 29:.1f}" y2="{y + 6:.1f}" '
            f'stroke="#666" stroke-width="2"{dash}/>'
        )
        out.append(_text(x + 33, y + 10, text, size=10.5))
        x += w
    text = "dot: where a copy comes from (hollow: a constant)"
    if x + 24 + len(text) * 10.5 * _CHAR > width - _M:
        x, y = _M, y + 18
    out.append(
        f'<circle cx="{x + 6:.1f}" cy="{y + 6:.1f}" r="3.5" fill="#ffffff" '
        'stroke="#666" stroke-width="1.5"/>' + _text(x + 15, y + 10, text, size=10.5)
    )
    out.append("</g>")
    return out, y + 22


_DEFS = """<defs>
<marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" \
orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker>
<marker id="dot" viewBox="0 0 10 10" refX="5" refY="5" markerWidth="4" markerHeight="4">\
<circle cx="5" cy="5" r="4" fill="#555"/></marker>
<pattern id="sync" width="6" height="6" patternUnits="userSpaceOnUse" \
patternTransform="rotate(45)"><rect width="6" height="6" fill="#fde3e1"/>\
<line x1="0" y1="0" x2="0" y2="6" stroke="#c0392b" stroke-width="2.5"/></pattern>
<pattern id="async" width="6" height="6" patternUnits="userSpaceOnUse" \
patternTransform="rotate(-45)"><rect width="6" height="6" fill="#e1eefc"/>\
<line x1="0" y1="0" x2="0" y2="6" stroke="#2e6fb7" stroke-width="2.5"/></pattern>
</defs>"""


def _cost_text(throughput: Mapping[str, float] | None, bandwidth: float, edges: bool) -> str:
    given = "".join(f", {k} {v / 1e9:g}" for k, v in (throughput or {}).items())
    order = "operators wait for their inputs" if edges else "a sequential program in model order"
    return (
        f"cost model: compute = FLOPs / throughput (GFLOP/s: host {HOST_FLOPS / 1e9:g}, "
        f"accelerators {ACCELERATOR_FLOPS / 1e9:g}{given}; FLOPs per op from the report, "
        f"else a default by op kind); copy = bytes / {bandwidth / 1e9:g} GB/s; sync copies "
        f"block both ends, async copies run on the DMA lane; {order}"
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
        title: a name for the model, shown in the heading.
        width: the picture's width in pixels; the graph wraps into rows to fit.
        throughput: FLOP/s overrides of the cost model (see :func:`timeline`).
        bandwidth: bytes/s of a copy.
    """
    width = max(width, 2 * _M + _GW + _CGAP)
    devices = list(dict.fromkeys([*report.devices, *(o.device for o in report.placement)]))
    colours = device_colours(devices)
    groups = _groups(report.placement)
    incoming: dict[int, list[tuple[Copy, int | None]]] = defaultdict(list)
    outputs: list[tuple[Copy, int | None]] = []
    for c, producer, consumer in _attribute(groups, _per_inference(report.copies)):
        (incoming[consumer] if consumer is not None else outputs).append((c, producer))
    loaded = _loaded_into(groups, report.copies)
    patterns = {p.symbol: ", ".join(p.patterns) for p in report.partitions}
    items = _schedule(report, throughput, bandwidth)
    lanes = _lanes(report, items)
    edges = any(_inputs(o) for o in report.placement)

    body: list[str] = []
    n_parts = len({g.partition for g in groups if g.partition})
    n_fallen = sum(1 for p in report.partitions if p.fallback)
    per_inference = _per_inference(report.copies)
    moved = sum(c.bytes for c in per_inference)
    weights = [c for c in report.copies if _at_load(c)]
    at_load = (
        (
            f" (+{len(weights)} weights, {_fmt_bytes(sum(c.bytes for c in weights))}, "
            "copied once at load)"
        )
        if weights
        else ""
    )
    heading = f"{title}: " if title else ""
    fell = f" (+{n_fallen} fell back)" if n_fallen else ""
    body.append(
        _text(
            _M,
            28,
            f"{heading}{len(report.placement)} operators, {n_parts} "
            f"partitions{fell}, {len(per_inference)} copies ({_fmt_bytes(moved)}) "
            f"per inference{at_load}",
            size=17,
            weight="bold",
        )
    )
    loaded_on: dict[str, int] = defaultdict(int)
    for c in weights:
        loaded_on[c.dst] += c.bytes
    legend, y = _legend(devices, report.devices_of(), colours, 44, width, loaded_on)
    body += legend
    body.append(_text(_M, y + 14, "Placement graph", size=15, weight="bold"))
    body.append(
        _text(
            _M + 150,
            y + 14,
            "model order, left to right then row by row; "
            "boxes: partitions (dashed: host operators); arrows: copies into "
            "the next box"
            + ("; 'weights': copied once, at load" if loaded else "")
            + ("; curves: data edges that skip boxes" if edges else ""),
            size=9.5,
            fill="#666",
        )
    )
    placed, bottom = _layout(groups, incoming, width, y + 28)
    flow: list[str] = []
    for k, p in enumerate(placed):
        if p.copies:
            body += _copy_markers(p.copies, p.x - p.gap, p.y + _HEAD, p.gap, colours)
        elif k > 0 and p.x - p.gap > _M:
            flow.append(
                f'<line x1="{p.x - p.gap + 3:.1f}" y1="{p.y + 17:.1f}" '
                f'x2="{p.x - 3:.1f}" y2="{p.y + 17:.1f}" stroke="#999" '
                'stroke-width="1.5" marker-end="url(#arrow)"/>'
            )
        body += _draw_group(p, colours, patterns, loaded.get(p.group.index, ()))
    body += flow
    if outputs:
        last = placed[-1] if placed else None
        ox = (last.x + _GW) if last else _M
        oy = last.y if last else y + 28
        if ox + _CGAP + 60 > width - _M:
            ox, oy = _M, bottom + 26
        body += _copy_markers(outputs, ox, oy + _HEAD, _CGAP, colours)
        body.append(
            f'<rect x="{ox + _CGAP:.1f}" y="{oy + _HEAD:.1f}" width="52" height="20" '
            'rx="10" fill="#ffffff" stroke="#999"/>'
            + _text(
                ox + _CGAP + 26, oy + _HEAD + 14, "output", size=10, anchor="middle", fill="#444"
            )
        )
        bottom = max(bottom, oy + _HEAD + _copies_height(len(outputs)))
    body += _draw_edges(placed)
    fallen = [p for p in report.partitions if p.fallback]
    if fallen:
        bottom += 18
        body.append(
            _text(
                _M,
                bottom,
                f"{len(fallen)} partition(s) fell back to the host "
                "(their operators are drawn on the host):",
                size=10.5,
                fill="#c0392b",
                weight="bold",
            )
        )
    for p in fallen[:_MAX_NOTES]:
        bottom += 15
        body.append(
            f'<g class="fallback"><title>{_e(p.fallback)}</title>'
            + _text(
                _M + 10,
                bottom,
                _fit(p.fallback, width - 2 * _M - 10, 9.5),
                size=9.5,
                fill="#c0392b",
            )
            + "</g>"
        )
    if len(fallen) > _MAX_NOTES:
        bottom += 15
        body.append(
            _text(
                _M + 10,
                bottom,
                f"+{len(fallen) - _MAX_NOTES} more: see the report",
                size=9.5,
                fill="#c0392b",
            )
        )
    cost = _cost_text(throughput, bandwidth, edges)
    tl, bottom = _draw_timeline(report, items, lanes, width, bottom + 24, colours, cost)
    body += tl
    mem, bottom = _draw_memory(report, bottom + 10, width, colours)
    body += mem
    height = bottom + _M
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="{_FONT}">\n'
        f"<title>{_e(heading)}umahub placement and timeline</title>\n{_DEFS}\n"
        f'<rect width="100%" height="100%" fill="#ffffff"/>\n' + "\n".join(body) + "\n</svg>\n"
    )


def render_html(report: Report, *, title: str = "", **options: Any) -> str:
    """A page with the SVG of :func:`render_svg`, a legend and ``str(report)`` in a <pre>."""
    svg = render_svg(report, title=title, **options)
    devices = list(dict.fromkeys([*report.devices, *(o.device for o in report.placement)]))
    colours = device_colours(devices)
    counts = report.devices_of()
    loaded: dict[str, int] = defaultdict(int)
    for c in report.copies:
        if _at_load(c):
            loaded[c.dst] += c.bytes
    legend = "".join(
        f'<li><span class="swatch" style="background:{colours[d]}"></span>{_e(d)} '
        f"({counts.get(d, 0)} operators"
        f"{f', weights {_fmt_bytes(loaded[d])} loaded once' if loaded.get(d) else ''})</li>"
        for d in devices
    )
    legend += (
        '<li><span class="swatch sync"></span>sync copy: done by a processor, '
        "blocks both ends</li>"
        '<li><span class="swatch async"></span>async copy: done by DMA, overlaps '
        "compute</li>"
    )
    name = _e(title or "model")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>umahub: {name}</title>
<style>
body {{ font-family: {_FONT}; margin: 16px; color: #1f1f1f; }}
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
<pre class="report">{_e(str(report))}</pre>
</body>
</html>
"""


def save_picture(report: Report, path: str | Path, **options: Any) -> str:
    """Draw ``report`` to ``path``: ``.svg`` (the picture) or ``.html`` (picture and table).

    Args:
        report: the report of a compile or of ``explain``.
        path: where to write; its suffix chooses the format.
        options: ``title`` (default: the file's stem), ``width``, ``throughput``
            and ``bandwidth`` (see :func:`render_svg`).

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
    options.setdefault("title", path.stem)
    if suffix == ".svg":
        text = '<?xml version="1.0" encoding="UTF-8"?>\n' + render_svg(report, **options)
    else:
        text = render_html(report, **options)
    path.write_text(text, encoding="utf-8")
    return str(path)
