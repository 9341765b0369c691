"""The few lines ``umahub compile`` prints by default: what went where, copies, time."""

from __future__ import annotations

from collections import Counter
from typing import Any

from umahub.sizes import counted, human_size

__all__ = ["accelerator_lines", "summary"]


def _copies(report: Any, when: str) -> str:
    copies = [c for c in report.copies if c.when == when]
    if not copies:
        return "none"
    size = human_size(sum(c.bytes for c in copies))
    kinds = Counter(c.kind for c in copies)
    split = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
    in_place = sum(c.in_place for c in copies)
    if in_place:
        split += f"; {in_place} read in place by the VM"
    return f"{len(copies)} ({size}; {split})"


def _verdict(text: str) -> str:
    if text.startswith("not verified"):
        return "not verified"
    return "wrong" if "beyond the limit" in text else "right"


def summary(report: Any, seconds: float) -> str:
    """What a compile did, in a few lines; the full report is ``--report -``."""
    per_device = Counter(op.device for op in report.placement)
    host = per_device.pop("host", 0)
    placed = sum(per_device.values())
    where = ", ".join(f"{d} {n}" for d, n in sorted(per_device.items()))
    lines = [
        f"placement: {placed} of {counted(len(report.placement), 'operator')} on accelerators"
        + (f" ({where})" if where else "")
        + f", {host} on the host"
    ]
    fallen = [p for p in report.partitions if p.fallback]
    lines.append(
        f"partitions: {len(report.partitions) - len(fallen)} placed"
        + (f", {len(fallen)} fell back to the host" if fallen else "")
    )
    lines += [f"  {p.symbol} fell back: {p.fallback}" for p in fallen]
    verified = [p for p in report.partitions if p.verified]
    if verified:
        counts = Counter(_verdict(p.verified) for p in verified)
        lines.append("verify: " + ", ".join(f"{n} {what}" for what, n in sorted(counts.items())))
    if report.auto:
        from umahub.report.text import summary_line

        lines.append(summary_line(report.auto))
    if report.options:
        from umahub.report.text import options_lines

        lines += options_lines(report.options)
    lines.append(f"copies per inference: {_copies(report, 'inference')}")
    lines.append(f"weights copied at load: {_copies(report, 'load')}")
    stages = ", ".join(f"{k} {v:.1f}s" for k, v in report.stages.items() if v >= 0.05)
    lines.append(f"time: {seconds:.1f}s" + (f" ({stages})" if stages else ""))
    lines += [f"note: {n}" for n in report.notes]
    lines.append("the full report: --report - (text) or --report FILE (JSON)")
    return "\n".join(lines)


def accelerator_lines(accelerator: Any) -> list[str]:
    """``umahub plugins``' lines on an accelerator's memory: its pools, its on-chip
    buffers (scope, size, what they hold) and its clock."""
    lines = [
        f"memory pool: {p.scope} {human_size(p.size_bytes)} ({p.copy} copies)"
        for p in accelerator.memory
    ]
    if accelerator.buffers:
        width = max(len(b.scope) for b in accelerator.buffers)
        lines.append("on-chip buffers:")
        for b in accelerator.buffers:
            said = f"  {b.description}" if b.description else ""
            lines.append(f"  {b.scope:<{width}}  {human_size(b.size_bytes):>8}{said}")
    if accelerator.clock_hz is not None:
        hz = accelerator.clock_hz
        lines.append(f"clock: {hz / 1e9:g} GHz" if hz >= 1e9 else f"clock: {hz / 1e6:g} MHz")
    return lines
