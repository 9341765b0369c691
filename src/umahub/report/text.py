"""The report as text: ``str(report)``, its section on placement by cost, the summary line."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from umahub.plugin.options import format_value
from umahub.sizes import counted, human_size

if TYPE_CHECKING:
    from umahub.report.data import ReportData

__all__ = [
    "cycles_text",
    "describe",
    "options_lines",
    "refused_lines",
    "render",
    "summary_line",
]


#: Groups the report's text lists by name; the rest are counted (all are in the JSON).
SHOWN_GROUPS = 12


def summary_line(auto: Mapping[str, Any]) -> str:
    """One line on what placement by cost did, for ``umahub compile``'s summary."""
    configured = auto["baselines_ms"].get(auto["configured"])
    versus = f" (by priority: {configured:.2f} ms)" if configured is not None else ""
    counts = ", ".join(f"{n} {k}" for k, n in auto["costs"].items() if n)
    return (
        f"placement by cost: estimated {auto['estimate_ms']:.2f} ms{versus}, "
        f"{counted(len(auto['changed']), 'operator')} placed otherwise than by priority; "
        f"costs: {counts or 'none'}; {sum(auto['seconds'].values()):.1f}s"
    )


def options_lines(options: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per accelerator on the backend options set to other values than their
    defaults (the report's ``options``): ``options of npu: tile-rows = 8``."""
    return [
        f"options of {accelerator}: "
        + ", ".join(f"{k} = {format_value(v)}" for k, v in values.items())
        for accelerator, values in options.items()
    ]


def refused_lines(placement: list[Any]) -> list[str]:
    """The report's section on what accelerators' pattern checks refused, one line per
    operator and accelerator (``Operator.refused``): ``  lv3: npu: 3 input channels, ...``."""
    rows = [
        f"  {o.name}: {accelerator}: {reason or 'its check gives no reason'}"
        for o in placement
        for accelerator, reason in o.refused.items()
    ]
    return ["refused by accelerators' checks (node: accelerator: reason):", *rows] if rows else []


def _finalist(name: str) -> str:
    """A finalist as the text names it: placement by cost's own choice is "auto" in the data."""
    return "the choice" if name == "auto" else name


def _finalists(auto: Mapping[str, Any]) -> list[str]:
    measured = auto.get("finalists") or {}
    if "skipped" in measured:
        return [f"  not measured against the other starting points: {measured['skipped']}"]
    if "kept" not in measured:
        return []
    kept = _finalist(measured["kept"])
    cached = " (the verdict of an earlier compile)" if measured.get("cached") else ""
    times = ", ".join(
        f"{_finalist(name)} {ms:.3f} ms"
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
        lines.append(f"  placed otherwise than by priority: {counted(len(changed), 'operator')}")
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


def _quantized(rows: list[dict[str, Any]]) -> list[str]:
    """Where the quantized operators run; why those on the host are there."""
    if not rows:
        return []
    counts: dict[str, int] = {}
    for row in rows:
        if row.get("integers", True):
            counts[row["device"]] = counts.get(row["device"], 0) + 1
    where = ", ".join(f"{d} {n}" for d, n in sorted(counts.items()))
    floats = len(rows) - sum(counts.values())
    lines = [
        f"quantized operators: {len(rows)}, in integers ({where or 'none'})"
        + (f", in float32 on the host {floats}" if floats else "")
    ]
    for row in rows:
        if row["device"] == "host":
            lines.append(f"  {row['node']} (q{row['kind']}) on host: {row['why']}")
    return lines


def _in_place(count: int) -> str:
    return f"; in the host's memory: the VM reads {'it' if count == 1 else 'them'} in place"


def render(report: ReportData) -> str:
    """The report as the text a person reads: ``str(report)``."""
    from umahub.report.data import measured_calls

    calls = measured_calls(getattr(report, "measured", None))
    lines = ["placement:"]
    width = max([len(o.name) for o in report.placement] + [4])
    opw = max([len(o.op) for o in report.placement] + [2])
    devw = max([len(o.device) for o in report.placement] + [6])
    lines.append(f"  {'node':<{width}}  {'op':<{opw}}  {'device':<{devw}}  pattern / pin")
    for o in report.placement:
        why = o.pattern or ("-" if not o.pinned else "")
        if o.pinned:
            why = f"{why} (pinned by '{o.pinned}')".strip()
        lines.append(f"  {o.name:<{width}}  {o.op:<{opw}}  {o.device:<{devw}}  {why}")
    counts = ", ".join(f"{d}: {n}" for d, n in sorted(report.devices_of().items()))
    lines.append(f"  operators per device: {counts}")
    lines += refused_lines(report.placement)
    lines += options_lines(report.options)
    if report.partitions:
        lines.append("partitions:")
        for p in report.partitions:
            state = (
                f"FELL BACK to host: {p.fallback}"
                if p.fallback
                else f"{p.device} {p.virtual_device}".strip()
            )
            lines.append(
                f"  {p.symbol}  [{state}]  {counted(p.operators, 'op')}, "
                f"patterns {', '.join(p.patterns)}"
            )
            for hook, plugins in p.hooks.items():
                lines.append(f"      {hook}: {', '.join(plugins)}")
            for said in p.schedule:
                lines.append(f"      schedule: {said}")
            for packed in p.packed:
                lines.append(f"      packed at compile time: {packed}")
            for stages in p.precomputed:
                lines.append(f"      computed at compile time: {stages}")
            if p.passes and not p.fallback:
                lines.append(f"      tir passes: {'; '.join(p.passes)}")
            if p.buffers and not p.fallback:
                lines.append(
                    "      on-chip: "
                    + ", ".join(
                        f"{scope} {human_size(used)} of {human_size(size)}"
                        for scope, (used, size) in p.buffers.items()
                    )
                )
            if p.program and not p.fallback:
                lines.append(
                    f"      device program: {human_size(p.program['bytes'])} for runtime "
                    f"'{p.program['runtime']}', {human_size(p.program['resident_bytes'])} "
                    "of weights resident on the device"
                )
                if "cycles" in p.program:
                    line = f"      cycles: {cycles_text(p.program)}"
                    if p.symbol in calls:
                        line += f"; measured here: {calls[p.symbol] * 1e3:.3f} ms for the call"
                    lines.append(line)
                for note in p.program.get("notes", ()):
                    lines.append(f"      program: {note}")
            if p.verified:
                lines.append(f"      verify: {p.verified}")
    for when, title in (
        ("inference", "copies per inference:"),
        ("load", "weights copied once, at load:"),
    ):
        edges = report.copy_edges(when)
        if edges:
            lines.append(title)
        for e in edges:
            lines.append(
                f"  {e['src']} -> {e['dst']}: {counted(e['count'], 'copy', 'copies')}, "
                f"{human_size(e['bytes'])}, {e['kind']}"
                + (_in_place(e["count"]) if e["in_place"] else "")
            )
    if report.memory is not None:
        lines.append("memory:")
        lines.append(
            f"  host: {human_size(report.memory.host_bytes)} planned "
            f"(+{human_size(report.memory.host_constants)} of constants)"
        )
        for pool in report.memory.pools:
            lines.append(
                f"  {pool.device} {pool.scope}: {human_size(pool.used)} of "
                f"{human_size(pool.size_bytes)} used ({human_size(pool.resident)} "
                f"resident), {human_size(pool.free)} free"
            )
    lines += _quantized(report.quantized)
    if report.host_schedules:
        parts = ", ".join(f"{how} {n}" for how, n in report.host_schedules.items())
        lines.append(f"host functions: {sum(report.host_schedules.values())} ({parts})")
    if report.host_unscheduled:
        lines.append(
            "  unscheduled (a loop nest on one thread, no vectors): "
            + ", ".join(report.host_unscheduled)
        )
    if report.tuned_kernels:
        lines.append("tuned kernels (tuning-database):")
        lines += [f"  {k['name']}: {k['used']} ({k['why']})" for k in report.tuned_kernels]
    if report.stages:
        total = sum(report.stages.values())
        parts = ", ".join(f"{k} {v:.2f}s" for k, v in report.stages.items())
        lines.append(f"time: {total:.2f}s ({parts})")
    if report.hook_seconds:
        parts = ", ".join(f"{k} {v * 1e3:.1f}ms" for k, v in report.hook_seconds.items())
        lines.append(f"hook time: {parts}")
    if report.measured.get("spans"):
        m = report.measured
        lines.append(
            f"measured: vm {m['vm_seconds'] * 1e3:.2f}ms, concurrent "
            f"{m['concurrent_seconds'] * 1e3:.2f}ms per inference (median of {m['runs']})"
        )
        if m.get("auto"):
            lines.append(f'executor "auto" keeps: {m["auto"]["executor"]}: {m["auto"]["why"]}')
    if report.auto:
        lines += describe(report.auto)
    for note in report.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def cycles_text(program: dict[str, Any]) -> str:
    """One run of a device program by the vendor's cycle model, as the report says it:
    ``"41,230 (busy: load 20,118, compute 30,400, store 1,250; 51,768 without overlap,
    1.26x), 41.2 us at 1 GHz"``."""
    cycles, serial = program["cycles"], program["serial_cycles"]
    busy = ", ".join(f"{m} {c:,}" for m, c in program["busy"].items())
    text = f"{cycles:,} (busy: {busy}; {serial:,} without overlap"
    text += f", {serial / cycles:.2f}x)" if cycles else ")"
    if program.get("seconds") is not None:
        text += f", {program['seconds'] * 1e6:,.1f} us at {program['clock_hz'] / 1e9:g} GHz"
    return text
