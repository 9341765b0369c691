"""The timeline estimate of one inference: a cost model and the schedule it gives. No drawing.

The estimate is made to compare placements, not to predict milliseconds:

* compute: an operator takes ``FLOPs / throughput`` of its device. FLOPs are
  ``Operator.flops`` when the report carries it (and it is not 0), otherwise a
  default per kind of operator, matched on the op name (:data:`DEFAULT_FLOPS`,
  :data:`OTHER_FLOPS`). Throughput: :data:`HOST_FLOPS` for the host,
  :data:`ACCELERATOR_FLOPS` for every accelerator, unless ``throughput`` names
  the device (``"npu:0"``), the accelerator (``"npu"``) or ``"host"``.
* a copy takes ``bytes / bandwidth`` (:data:`BANDWIDTH`).
* lanes, and the lane a copy takes, are those of the lane model,
  :mod:`umahub.lanes`, which placement by cost's search schedules on too.
* a sync copy is done by a processor, the one of its accelerator end: it
  occupies that device's lane, as the concurrent executor runs it, and (in a
  sequential program) it is a step of the program.
* an async copy runs on the DMA lane of its accelerator end as soon as its data
  is ready (a constant, i.e. weights, at time 0) and the engine is free;
  compute goes on meanwhile, and the receiving operator waits for it.
* order: without data edges the model is a sequential program: an operator
  starts after the one before it in model order (which is a topological
  order), once its device is free and its copies have arrived. When the
  operators carry their inputs (``Operator.inputs``, names of producer nodes),
  an operator waits only for its producers and for the copies it reads
  (``Copy.consumer``: the operator, or its partition), so devices may run
  side by side.

Weights copied once, when the model is loaded, are not part of an inference
and stay out of the schedule. :func:`timeline` is the public form (spans);
:func:`schedule` adds what drawing a span needs (:class:`Item`).

Next to the estimate, :func:`measured` gives the spans of a real run, when the
report has one (``report.measured``, from :meth:`umahub.Compiled.profile` or
``profile = true``): every step of one inference on the concurrent executor,
on the lane of the worker that ran it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from umahub.config import HOST, accelerator_of
from umahub.lanes import Lanes, copy_label, copy_lane, device_of, dma_lane, ordered
from umahub.report.picture.groups import groups, has_edges, split

if TYPE_CHECKING:
    from umahub.plugin.context import Copy, Operator
    from umahub.report.data import ReportData as Report

__all__ = [
    "ACCELERATOR_FLOPS",
    "BANDWIDTH",
    "DEFAULT_FLOPS",
    "HOST_FLOPS",
    "OTHER_FLOPS",
    "Item",
    "Span",
    "all_devices",
    "estimate_flops",
    "lanes",
    "measured",
    "measured_text",
    "schedule",
    "timeline",
]

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


class Span(NamedTuple):
    """One bar of the timeline: ``lane`` is a device or ``"<device> DMA"``; seconds."""

    lane: str
    start: float
    end: float
    label: str


@dataclass(frozen=True)
class Item:
    """A span with what drawing it needs: its kind, colour source, tooltip and bytes."""

    lane: str
    start: float
    end: float
    label: str
    kind: str  # "compute", "sync" or "async"
    device: str  # whose colour
    detail: str  # the tooltip
    bytes: int = 0  # of a copy (its bar is labelled with them); 0 for compute


def estimate_flops(op: Operator) -> float:
    """``op.flops`` when the report has it (not 0), else the default for its kind of op."""
    if op.flops > 0:
        return float(op.flops)
    kind = op.op.rsplit(".", 1)[-1].lower()
    for key, value in DEFAULT_FLOPS:
        if key in kind:
            return value
    return OTHER_FLOPS


def _throughput(device: str, throughput: Mapping[str, float] | None) -> float:
    given = throughput or {}
    for key in (device, accelerator_of(device)):
        if key in given:
            return float(given[key])
    if device == HOST:
        return HOST_FLOPS
    return float(given.get("accelerator", ACCELERATOR_FLOPS))


def schedule(
    report: Report, throughput: Mapping[str, float] | None = None, bandwidth: float = BANDWIDTH
) -> list[Item]:
    """Every span of one inference, with drawing information (see the module's cost model)."""
    gs = groups(report.placement)
    sequential = not has_edges(report.placement)
    incoming, outputs = split(gs, report.copies)
    booked = Lanes()
    end_of: dict[str, float] = {}
    group_end: dict[int, float] = {}
    items: list[Item] = []
    pc = 0.0  # the program point of a sequential program

    def do_copy(c: Copy, producer: int | None, not_before: float) -> float:
        ready = group_end.get(producer, 0.0) if producer is not None else 0.0
        duration = c.bytes / bandwidth
        detail = (
            f"{'constant ' if c.constant else ''}{c.tensor}: {c.src} -> {c.dst}, "
            f"{c.bytes} bytes, {c.kind}"
        )
        kind, lane = c.kind, copy_lane(c.src, c.dst, c.kind)
        if kind != "async":
            ready = max(ready, not_before)
        start = booked.book([lane], ready, duration)
        end, label = start + duration, copy_label(c.tensor, c.src, c.dst)
        items.append(Item(lane, start, end, label, kind, device_of(lane), detail, c.bytes))
        return end

    for g in gs:
        arrived = 0.0
        arrived_for: dict[str, float] = defaultdict(float)  # consumer -> its copies' end
        for c, producer in incoming[g.index]:
            end = do_copy(c, producer, pc if sequential else 0.0)
            if sequential and c.kind != "async":
                pc = max(pc, end)
            arrived = max(arrived, end)
            arrived_for[c.consumer] = max(arrived_for[c.consumer], end)
        rate = _throughput(g.device, throughput)
        for op in g.ops:
            if not sequential:  # with data edges an operator waits only for its own copies
                arrived = max(arrived_for[""], arrived_for[op.name], arrived_for[op.partition])
            seconds = estimate_flops(op) / rate
            ready = max([arrived, pc, *(end_of[i] for i in op.inputs if i in end_of)])
            start = booked.book([g.device], ready, seconds)
            end = end_of[op.name] = start + seconds
            if sequential:
                pc = end
            detail = f"{op.name}: {op.op} on {g.device}, {estimate_flops(op) / 1e6:.3g} MFLOP"
            items.append(Item(g.device, start, end, op.name, "compute", g.device, detail))
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
        device's lane; one per copy, on the lane it takes (an async copy on
        the DMA lane, ``"npu:0 DMA"``; a sync copy on its accelerator end's
        lane: :func:`umahub.lanes.copy_lane`). Copies are labelled
        ``"copy <tensor> <src>-><dst>"``.
    """
    return [Span(i.lane, i.start, i.end, i.label) for i in schedule(report, throughput, bandwidth)]


def all_devices(report: Report) -> list[str]:
    """The report's devices in its order, then any other device an operator runs on."""
    return list(dict.fromkeys([*report.devices, *(o.device for o in report.placement)]))


def lanes(report: Report, items: Sequence[Item]) -> list[str]:
    """Device lanes in the report's order, each followed by its DMA lane if it has one."""
    devices = all_devices(report)
    dma = {
        p.device
        for p in (report.memory.pools if report.memory else ())
        if p.copy == "async" and p.device in devices
    }
    every = [*devices, *(dma_lane(d) for d in dma), *(i.lane for i in items)]
    return ordered(every, devices)


def measured(report: Report) -> list[Item]:
    """The measured run of ``report.measured`` as items to draw ([] when there is none).

    A copy's bytes are those it measured, or (a run measured by an older umahub)
    those of the report's copy of the same tensor between the same devices.
    """
    spans = (getattr(report, "measured", None) or {}).get("spans", [])
    sizes = {copy_label(c.tensor, c.src, c.dst): c.bytes for c in report.copies}
    items = []
    for s in spans:
        lane, label, kind = s["lane"], s["label"], s["kind"]
        took = f"{(s['end'] - s['start']) * 1e3:.3g} ms"
        detail = f"{label} on {lane}, measured: {took}"
        device, size = device_of(lane), s.get("bytes") or sizes.get(label, 0)
        items.append(Item(lane, s["start"], s["end"], label, kind, device, detail, size))
    return items


def measured_text(report: Report) -> str:
    """What the measured chart is: both executors' times and the workers' cores."""
    m = getattr(report, "measured", None) or {}
    if not m.get("spans"):
        return ""
    cores = "; ".join(
        f"{lane} on core{'s' if len(c) > 1 else ''} {','.join(map(str, c))}"
        for lane, c in m["lanes"].items()
    )
    return (
        f"Measured on this machine (median of {m['runs']} runs): the VM "
        f"{m['vm_seconds'] * 1e3:.3g} ms, the concurrent executor "
        f"{m['concurrent_seconds'] * 1e3:.3g} ms per inference. Workers: {cores}."
    )
