"""The report: where every operator runs and why, what each hook did, copies, memory, time.

``str(report)`` is the table a person reads; ``report.to_json()`` is the same
as data; ``report.save_picture(path)`` draws the graph and a timeline
(:mod:`umahub.picture`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from umahub.context import Copy, Operator
from umahub.memory import MemoryPlan
from umahub.sizes import human_size
from umahub.tracing import HookCall

__all__ = ["PartitionReport", "Report"]


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
    fallback: str = ""  # why it went back to the host
    virtual_device: str = ""  # (device type, runtime device index, target, memory scope)
    verified: str = ""  # what verification found ("" when it did not run)
    max_error: float | None = None  # the largest error against the host, when verified

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return dict(self.__dict__, patterns=list(self.patterns))


def hooks_that_acted(calls: list[HookCall]) -> dict[str, list[str]]:
    """hook -> plugins whose implementation returned something, in call order."""
    acted: dict[str, list[str]] = defaultdict(list)
    for call in calls:
        if call.returned and call.plugin not in acted[call.hook]:
            acted[call.hook].append(call.plugin)
    return dict(acted)


@dataclass
class Report:
    """Everything a compile decided, for people (``str``) and programs (``to_json``)."""

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
    auto: dict[str, Any] | None = None  # placement by cost: umahub.auto.AutoChoice.to_dict()

    # ------------------------------------------------------------------ summaries

    def devices_of(self) -> dict[str, int]:
        """Operator count per device (host included)."""
        counts: dict[str, int] = defaultdict(int)
        for op in self.placement:
            counts[op.device] += 1
        return dict(counts)

    def copy_edges(self, when: str = "inference") -> list[dict[str, Any]]:
        """Copies grouped by (src, dst): count, bytes, kind.

        ``when="inference"``: the copies of every inference; ``"load"``: the
        weights copied to their accelerators once, when the model is loaded.
        """
        edges: dict[tuple[str, str], dict[str, Any]] = {}
        for c in (c for c in self.copies if c.when == when):
            e = edges.setdefault(
                (c.src, c.dst), {"src": c.src, "dst": c.dst, "count": 0, "bytes": 0, "kind": c.kind}
            )
            e["count"] += 1
            e["bytes"] += c.bytes
        return list(edges.values())

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data."""
        return {
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
            "auto": self.auto,
        }

    def to_json(self, indent: int = 2) -> str:
        """The report as JSON text."""
        return json.dumps(self.to_dict(), indent=indent)

    def save_picture(self, path: str) -> str:
        """Draw the placement graph and the timeline to ``path`` (.svg or .html)."""
        from umahub.picture import save_picture

        return save_picture(self, path)

    # ------------------------------------------------------------------ text

    def __str__(self) -> str:
        lines = ["placement:"]
        width = max([len(o.name) for o in self.placement] + [4])
        opw = max([len(o.op) for o in self.placement] + [2])
        devw = max([len(o.device) for o in self.placement] + [6])
        lines.append(f"  {'node':<{width}}  {'op':<{opw}}  {'device':<{devw}}  pattern / pin")
        for o in self.placement:
            why = o.pattern or ("-" if not o.pinned else "")
            if o.pinned:
                why = f"{why} (pinned by '{o.pinned}')".strip()
            lines.append(f"  {o.name:<{width}}  {o.op:<{opw}}  {o.device:<{devw}}  {why}")
        counts = ", ".join(f"{d}: {n}" for d, n in sorted(self.devices_of().items()))
        lines.append(f"  operators per device: {counts}")
        if self.partitions:
            lines.append("partitions:")
            for p in self.partitions:
                state = (
                    f"FELL BACK to host: {p.fallback}"
                    if p.fallback
                    else f"{p.device} {p.virtual_device}".strip()
                )
                lines.append(
                    f"  {p.symbol}  [{state}]  {p.operators} op(s), "
                    f"patterns {', '.join(p.patterns)}"
                )
                for hook, plugins in p.hooks.items():
                    lines.append(f"      {hook}: {', '.join(plugins)}")
                for said in p.schedule:
                    lines.append(f"      schedule: {said}")
                for packed in p.packed:
                    lines.append(f"      packed at compile time: {packed}")
                if p.verified:
                    lines.append(f"      verify: {p.verified}")
        for when, title in (
            ("inference", "copies per inference:"),
            ("load", "weights copied once, at load:"),
        ):
            edges = self.copy_edges(when)
            if edges:
                lines.append(title)
            for e in edges:
                lines.append(
                    f"  {e['src']} -> {e['dst']}: {e['count']} copies, "
                    f"{human_size(e['bytes'])}, {e['kind']}"
                )
        if self.memory is not None:
            lines.append("memory:")
            lines.append(
                f"  host: {human_size(self.memory.host_bytes)} planned "
                f"(+{human_size(self.memory.host_constants)} of constants)"
            )
            for pool in self.memory.pools:
                lines.append(
                    f"  {pool.device} {pool.scope}: {human_size(pool.used)} of "
                    f"{human_size(pool.size_bytes)} used ({human_size(pool.resident)} "
                    f"resident), {human_size(pool.free)} free"
                )
        if self.host_schedules:
            parts = ", ".join(f"{how} {n}" for how, n in self.host_schedules.items())
            lines.append(f"host functions: {sum(self.host_schedules.values())} ({parts})")
        if self.stages:
            total = sum(self.stages.values())
            parts = ", ".join(f"{k} {v:.2f}s" for k, v in self.stages.items())
            lines.append(f"time: {total:.2f}s ({parts})")
        if self.hook_seconds:
            parts = ", ".join(f"{k} {v * 1e3:.1f}ms" for k, v in self.hook_seconds.items())
            lines.append(f"hook time: {parts}")
        if self.measured.get("spans"):
            m = self.measured
            lines.append(
                f"measured: vm {m['vm_seconds'] * 1e3:.2f}ms, concurrent "
                f"{m['concurrent_seconds'] * 1e3:.2f}ms per inference (median of {m['runs']})"
            )
        if self.auto:
            from umahub.auto.text import describe

            lines += describe(self.auto)
        for note in self.notes:
            lines.append(f"note: {note}")
        return "\n".join(lines)
