"""The report's data: where every operator runs and why, what each hook did, copies, memory, time.

:class:`ReportData` is what the stages fill in and what programs read
(``to_json``); the views (:mod:`umahub.report.text`,
:mod:`umahub.report.picture`) read it and are never imported here.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from umahub.hub.tracing import HookCall
from umahub.plugin.context import Copy, Operator
from umahub.plugin.memory import MemoryPlan

__all__ = [
    "LANE_SPANS",
    "PartitionReport",
    "ReportData",
    "hooks_that_acted",
    "measured_calls",
    "program_report",
]


#: The version of the report's JSON (``"format"``): raised when a key changes meaning or
#: goes away; a key added keeps it.
REPORT_FORMAT = 1


@dataclass
class PartitionReport:
    """One partition: where it ran, which plugin did what at each hook, how long."""

    symbol: str
    accelerator: str
    device: str
    patterns: tuple[str, ...]
    operators: int
    hooks: dict[str, list[str]] = field(default_factory=dict)  # hook -> plugins that acted
    seconds: dict[str, float] = field(default_factory=dict)  # stage -> seconds
    schedule: list[str] = field(default_factory=list)  # what schedule hooks said they did
    packed: list[str] = field(default_factory=list)  # weights packed at compile time (prepack)
    # the kernel's stages computed at compile time (constant_stages): their blocks, size
    precomputed: list[str] = field(default_factory=list)
    fallback: str = ""  # why it went back to the host
    virtual_device: str = ""  # (device type, runtime device index, target, memory scope)
    verified: str = ""  # what verification found ("" when it did not run)
    max_error: float | None = None  # the largest error against the host, when verified
    # a device partition's program: runtime, bytes, resident_bytes (weights at load),
    # metadata, and by the vendor's cycle model (when the codegen gave it): cycles,
    # serial_cycles, busy (per module), seconds (at the accelerator's clock), notes, lanes
    program: dict[str, Any] = field(default_factory=dict)
    # each on-chip buffer of the accelerator: scope -> [bytes used, capacity]
    buffers: dict[str, list[int]] = field(default_factory=dict)
    passes: list[str] = field(default_factory=list)  # TIR passes run: "phase N: name (plugin)"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return dict(self.__dict__, patterns=list(self.patterns))


#: The most spans per module a report keeps of a device program's timeline (the picture's
#: lanes); neighbouring spans are merged down to it.
LANE_SPANS = 400


def _merged(spans: list[tuple[int, int]], most: int) -> list[list[int]]:
    """``spans`` (sorted, not overlapping) merged across the smallest gaps down to ``most``."""
    merged = [list(s) for s in spans]
    while len(merged) > most:
        gaps = sorted(merged[i + 1][0] - merged[i][1] for i in range(len(merged) - 1))
        limit = gaps[len(merged) - most - 1]  # close every gap up to this size
        out = [merged[0]]
        for start, end in merged[1:]:
            if start - out[-1][1] <= limit:
                out[-1][1] = end
            else:
                out.append([start, end])
        merged = out
    return merged


def program_report(call: Any, accelerator: Any) -> dict[str, Any]:
    """The report's entry for a device partition's program (``PartitionReport.program``):
    what it is, and what one run takes by the vendor's cycle model when the codegen
    said (in seconds too at the accelerator's ``clock_hz``), with its lanes."""
    program = call.program
    entry: dict[str, Any] = {
        "runtime": call.runtime,
        "bytes": len(program.data),
        "resident_bytes": call.resident_bytes,
        "metadata": dict(program.metadata),
    }
    timing = program.timing
    if timing is None:
        return entry
    entry.update(timing.to_dict(), serial_cycles=timing.serial_cycles)
    clock = accelerator.clock_hz
    entry["clock_hz"] = clock
    entry["seconds"] = timing.cycles / clock if clock else None
    by_module: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for module, start, end in timing.spans:
        by_module[module].append((start, end))
    entry["lanes"] = {
        module: _merged(sorted(spans), LANE_SPANS) for module, spans in by_module.items()
    }
    return entry


def measured_calls(measured: dict[str, Any] | None) -> dict[str, float]:
    """Seconds of each step of a measured run (``report.measured``) by its label (a
    partition's symbol), one inference; {} without a measured run."""
    took: dict[str, float] = {}
    for span in (measured or {}).get("spans", []):
        if span.get("kind") == "compute":
            took[span["label"]] = took.get(span["label"], 0.0) + span["end"] - span["start"]
    return took


def hooks_that_acted(calls: list[HookCall]) -> dict[str, list[str]]:
    """hook -> plugins whose implementation returned something, in call order."""
    acted: dict[str, list[str]] = defaultdict(list)
    for call in calls:
        if call.returned and call.plugin not in acted[call.hook]:
            acted[call.hook].append(call.plugin)
    return dict(acted)


@dataclass
class ReportData:
    """Everything a compile decided, as data (``to_dict``, ``to_json``)."""

    placement: list[Operator]
    partitions: list[PartitionReport]
    devices: list[str]
    copies: list[Copy] = field(default_factory=list)
    memory: MemoryPlan | None = None
    stages: dict[str, float] = field(default_factory=dict)
    hook_seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    built: bool = True
    measured: dict[str, Any] = field(default_factory=dict)  # Compiled.profile's, when run
    model: str = ""  # the model's name, for the picture's title ("" when not given)
    host_schedules: dict[str, int] = field(default_factory=dict)  # how -> host functions
    #: the host functions built without a schedule (each a loop nest on one thread)
    host_unscheduled: list[str] = field(default_factory=list)
    #: each host kernel the tuning database knows: name, used ("tuned" or "hook"), why
    tuned_kernels: list[dict[str, str]] = field(default_factory=list)
    auto: dict[str, Any] | None = None  # placement by cost: umahub.auto.AutoChoice.to_dict()
    #: each quantized operator: node (its final quantize), kind, device, pattern,
    #: why no accelerator took it ("" where one did), and whether umahub computes it
    #: in integers (else the host computes it in float32, as written)
    quantized: list[dict[str, Any]] = field(default_factory=list)
    #: backend options set to other values than their defaults, per accelerator
    #: (``[tool.umahub.options]``, ``--option``); accelerators with none left out
    options: dict[str, dict[str, Any]] = field(default_factory=dict)

    # ------------------------------------------------------------------ summaries

    def devices_of(self) -> dict[str, int]:
        """Operator count per device (host included)."""
        counts: dict[str, int] = defaultdict(int)
        for op in self.placement:
            counts[op.device] += 1
        return dict(counts)

    def copy_edges(self, when: str = "inference") -> list[dict[str, Any]]:
        """Copies grouped by (src, dst): count, bytes, kind, and ``in_place``
        (every one of them :attr:`~umahub.plugin.Copy.in_place`).

        ``when="inference"``: the copies of every inference; ``"load"``: the
        weights copied to their accelerators once, when the model is loaded.
        """
        edges: dict[tuple[str, str], dict[str, Any]] = {}
        for c in (c for c in self.copies if c.when == when):
            first = {"src": c.src, "dst": c.dst, "count": 0, "bytes": 0, "kind": c.kind}
            e = edges.setdefault((c.src, c.dst), {**first, "in_place": True})
            e["count"] += 1
            e["bytes"] += c.bytes
            e["in_place"] = e["in_place"] and c.in_place
        return list(edges.values())

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data; ``format`` is :data:`REPORT_FORMAT`."""
        return {
            "format": REPORT_FORMAT,
            "devices": self.devices,
            "placement": [dict(o.__dict__) for o in self.placement],
            "partitions": [p.to_dict() for p in self.partitions],
            "copies": [c.to_dict() for c in self.copies],
            "copy_edges": self.copy_edges(),
            "load_copy_edges": self.copy_edges("load"),
            "memory": self.memory.to_dict() if self.memory else None,
            "stages": self.stages,
            "hook_seconds": self.hook_seconds,
            "notes": self.notes,
            "built": self.built,
            "measured": self.measured,
            "model": self.model,
            "host_schedules": self.host_schedules,
            "host_unscheduled": self.host_unscheduled,
            "tuned_kernels": self.tuned_kernels,
            "auto": self.auto,
            "quantized": self.quantized,
            "options": self.options,
        }

    def to_json(self, indent: int = 2) -> str:
        """The report as JSON text."""
        return json.dumps(self.to_dict(), indent=indent)
