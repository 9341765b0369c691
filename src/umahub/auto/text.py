"""The report's words for placement by cost: its section of the text, its summary line."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["describe", "summary_line"]


#: Groups the report's text lists by name; the rest are counted (all are in the JSON).
SHOWN_GROUPS = 12


def summary_line(auto: Mapping[str, Any]) -> str:
    """One line on what placement by cost did, for ``umahub compile``'s summary."""
    configured = auto["baselines_ms"].get(auto["configured"])
    versus = f" (by priority: {configured:.2f} ms)" if configured is not None else ""
    counts = ", ".join(f"{n} {k}" for k, n in auto["costs"].items() if n)
    return (
        f"placement by cost: estimated {auto['estimate_ms']:.2f} ms{versus}, "
        f"{len(auto['changed'])} operator(s) placed otherwise than by priority; "
        f"costs: {counts or 'none'}; {sum(auto['seconds'].values()):.1f}s"
    )


def _finalists(auto: Mapping[str, Any]) -> list[str]:
    measured = auto.get("finalists") or {}
    if "skipped" in measured:
        return [f"  not measured against the other starting points: {measured['skipped']}"]
    if "kept" not in measured:
        return []
    kept = "the choice" if measured["kept"] == "auto" else measured["kept"]
    cached = " (the verdict of an earlier compile)" if measured.get("cached") else ""
    times = ", ".join(
        f"{'the choice' if name == 'auto' else name} {ms:.3f} ms"
        for name, ms in sorted(measured["measured_ms"].items(), key=lambda kv: kv[1])
    )
    tie = (
        " (a tie with the choice, which the rounds did not show faster)"
        if measured.get("tie")
        else ""
    )
    lines = [f"  measured: {times}: {kept} is kept{tie}{cached}"]
    for name, why in measured.get("left_out", {}).items():
        lines.append(f"    {name} left out: {why}")
    return lines


def describe(auto: Mapping[str, Any]) -> list[str]:
    """The report's text section on placement by cost."""
    lines = ["placement by cost:"]
    lines.append(
        f"  estimate: {auto['estimate_ms']:.3f} ms ({auto['executor']} executor); "
        f"starting points, estimated:"
    )
    for name, ms in sorted(auto["baselines_ms"].items(), key=lambda kv: kv[1]):
        mark = "  (configured)" if name == auto["configured"] else ""
        lines.append(f"    {ms:10.3f} ms  {name}{mark}")
    lines.extend(_finalists(auto))
    changed = auto["changed"]
    if changed:
        lines.append(f"  placed otherwise than by priority: {len(changed)} operator(s)")
        for node, (before, after) in list(changed.items())[:SHOWN_GROUPS]:
            lines.append(f"    {node}: {before} -> {after}")
        if len(changed) > SHOWN_GROUPS:
            lines.append(f"    ... {len(changed) - SHOWN_GROUPS} more (report JSON: auto.changed)")
    groups = auto["groups"]
    interesting = [g for g in groups if g["chosen"] != g["by_priority"]] + [
        g for g in groups if g["chosen"] == g["by_priority"]
    ]
    lines.append(f"  candidate groups: {len(groups)} ({sum(g['chosen'] for g in groups)} taken)")
    for g in interesting[:SHOWN_GROUPS]:
        nodes = ", ".join(g["nodes"][:3]) + (" ..." if len(g["nodes"]) > 3 else "")
        state = "taken" if g["chosen"] else "not taken"
        lines.append(f"    {g['accelerator']} [{nodes}] {state}: {g['why']}")
    if len(groups) > SHOWN_GROUPS:
        lines.append(f"    ... {len(groups) - SHOWN_GROUPS} more (report JSON: auto.groups)")
    copies = "; ".join(
        f"{a} {c['gb_per_s']} GB/s + {c['latency_us']} us ({c['source']})"
        for a, c in auto["copies"].items()
    )
    if copies:
        lines.append(f"  copies: {copies}")
    counts = ", ".join(f"{k} {n}" for k, n in auto["costs"].items())
    cache = auto["cache"]
    lines.append(
        f"  costs: {counts}; cache {cache['path']} ({cache['hits']} hits, {cache['misses']} misses)"
    )
    spent = ", ".join(f"{k} {v:.2f}s" for k, v in auto["seconds"].items())
    lines.append(f"  time: {spent}")
    return lines
