"""The device programs' lanes: each module of a device, busy over one run of its program.

For every device partition whose codegen gave its cycles
(:class:`umahub.plugin.ProgramTiming`, in ``PartitionReport.program``): one
lane per module of the device (load, compute, store for a VTA-like NPU), the
spans where it is busy, on the program's own axis of cycles (and microseconds
at the accelerator's clock). Next to it, what the host measured for the same
call when the report has a measured run: the vendor's model of the device
against the wall-clock time of whatever ran it here (a simulator's own speed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from umahub.report.data import measured_calls
from umahub.report.picture.layout import M
from umahub.report.picture.svg import HOST_COLOUR, esc, fmt_time, text

if TYPE_CHECKING:
    from umahub.report.data import ReportData as Report

__all__ = ["MOST", "draw_programs"]

#: The most programs drawn (the report's text has every one).
MOST = 12
_LANE = 14
_LABEL_W = 300


def draw_programs(
    report: Report, top: float, width: float, colours: Mapping[str, str]
) -> tuple[list[str], float]:
    """The chart from ``top`` down, and its bottom; nothing when no program has cycles."""
    programs = [p for p in report.partitions if p.program.get("lanes") and not p.fallback]
    if not programs:
        return [], top
    measured = measured_calls(getattr(report, "measured", None))
    out = [
        text(M, top + 16, "Device programs, by the vendor's cycle model", size=15, weight="bold"),
        text(
            M,
            top + 34,
            "One run of each program: its modules' busy spans on its own axis of cycles"
            + (f" (the first {MOST} of {len(programs)})" if len(programs) > MOST else "")
            + "; 'host' is the wall time this machine took for the call.",
            size=10,
            fill="#666",
        ),
    ]
    y = top + 48
    x0, x1 = M + _LABEL_W, width - M
    for p in programs[:MOST]:
        program = p.program
        cycles = max(1, int(program["cycles"]))
        scale = (x1 - x0) / cycles
        seconds = program.get("seconds")
        head = f"{p.symbol} on {p.device}: {cycles:,} cycles"
        if seconds is not None:
            head += f" = {fmt_time(seconds)} at {program['clock_hz'] / 1e9:g} GHz"
        serial = int(program.get("serial_cycles", 0))
        if serial:
            head += f"; {serial / cycles:.2f}x overlap"
        if p.symbol in measured:
            head += f"; host {fmt_time(measured[p.symbol])}"
        out.append(text(M, y + 11, head, size=10.5, weight="bold"))
        y += 16
        colour = colours.get(p.device, HOST_COLOUR)
        out.append(f'<g class="program" data-partition="{esc(p.symbol)}" data-cycles="{cycles}">')
        for k, (module, spans) in enumerate(program["lanes"].items()):
            ly = y + k * _LANE
            busy = program.get("busy", {}).get(module, 0)
            out.append(
                f'<rect x="{M}" y="{ly:.1f}" width="{width - 2 * M:.1f}" height="{_LANE - 2}" '
                f'fill="{"#f7f7f7" if k % 2 == 0 else "#ffffff"}"/>'
            )
            out.append(
                text(M + 10, ly + 10, f"{module}: {busy:,} busy ({busy / cycles:.0%})", size=9.5)
            )
            for start, end in spans:
                out.append(
                    f'<rect class="span module" data-module="{esc(module)}" '
                    f'x="{x0 + start * scale:.2f}" y="{ly + 1:.1f}" '
                    f'width="{max(0.6, (end - start) * scale):.2f}" height="{_LANE - 4}" '
                    f'fill="{colour}"><title>{esc(module)}: cycles {start:,} - {end:,}'
                    "</title></rect>"
                )
        out.append("</g>")
        y += len(program["lanes"]) * _LANE + 8
    return out, y
