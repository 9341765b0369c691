"""SVG primitives of the picture: escaping, text (fitted, wrapped), numbers, colours.

Nothing here knows of a report: these are the pieces every drawing module
writes with. :func:`text` makes one ``<text>`` element; :func:`fit` and
:func:`wrap` size a string to a width by an average character width
(:data:`CHAR`), so no font metrics are needed; :func:`fmt_bytes` and
:func:`fmt_time` are the number formats of every label; :func:`device_colours`
gives each device its colour and :func:`ink` the text colour that reads on it;
:data:`DEFS` holds the markers and hatch patterns the drawing refers to.
"""

from __future__ import annotations

import hashlib
import html
from collections.abc import Sequence

from umahub.config import HOST, accelerator_of
from umahub.sizes import human_size

__all__ = [
    "CHAR",
    "DEFS",
    "FONT",
    "HOST_COLOUR",
    "copy_dash",
    "device_colour",
    "device_colours",
    "esc",
    "fit",
    "fmt_bytes",
    "fmt_time",
    "ink",
    "text",
    "wrap",
]

#: The font family of the picture.
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
#: Average character width, in font sizes.
CHAR = 0.58

# ---------------------------------------------------------------------- text


def esc(value: object) -> str:
    """``value`` as text escaped for SVG/HTML (quotes included)."""
    return html.escape(str(value), quote=True)


def fit(line: str, width: float, size: float = 10) -> str:
    """``line`` cut with an ellipsis to fit ``width`` pixels at font ``size``."""
    room = max(1, int(width / (size * CHAR)))
    return line if len(line) <= room else line[: max(0, room - 1)] + "…"


def wrap(line: str, width: float, size: float = 10) -> list[str]:
    """``line`` broken at spaces into lines that fit ``width`` pixels at font ``size``."""
    room = max(10, int(width / (size * CHAR)))
    lines: list[str] = []
    for word in line.split(" "):
        if lines and len(lines[-1]) + 1 + len(word) <= room:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def text(
    x: float,
    y: float,
    content: str,
    *,
    size: float = 10,
    fill: str = "#1f1f1f",
    anchor: str = "start",
    weight: str = "normal",
    cls: str = "",
    width: float | None = None,
    halo: bool = False,
) -> str:
    """One ``<text>`` element at (``x``, ``y``), ``content`` escaped.

    With ``width``, ``content`` is cut to fit it (:func:`fit`), and a cut
    text carries the whole of it in a ``<title>``, shown on hover. With
    ``halo``, the text is drawn over a white outline of itself, so a line that
    passes beneath it never runs through its letters.
    """
    shown = fit(content, width, size) if width is not None else content
    extra = f' class="{cls}"' if cls else ""
    bold = f' font-weight="{weight}"' if weight != "normal" else ""
    outline = (
        ' stroke="#ffffff" stroke-width="3" stroke-linejoin="round" paint-order="stroke"'
        if halo
        else ""
    )
    whole = f"<title>{esc(content)}</title>" if shown != content else ""
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" fill="{fill}" '
        f'text-anchor="{anchor}"{bold}{extra}{outline}>{whole}{esc(shown)}</text>'
    )


# ---------------------------------------------------------------------- numbers


def fmt_bytes(n: float) -> str:
    """``n`` bytes in B, KiB, MiB or GiB: :func:`umahub.sizes.human_size`."""
    return human_size(n)


def fmt_time(t: float) -> str:
    """``t`` seconds in µs, ms or s, three significant digits; ``"0"`` for 0."""
    if t == 0:
        return "0"
    if t < 1e-3:
        return f"{t * 1e6:.3g} µs"
    if t < 1:
        return f"{t * 1e3:.3g} ms"
    return f"{t:.3g} s"


# ---------------------------------------------------------------------- colours

# Indexed by a stable hash of the accelerator's name (see _slot), not by order
# of appearance; ordered so that the bundled accelerators get distinct,
# well-separated hues (npu blue, vanilla_accel orange, dsp_cpu green).
_PALETTE = (
    "#76b7b2",
    "#b07aa1",
    "#4e79a7",
    "#edc948",
    "#9c755f",
    "#ff9da7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#17becf",
)
#: The host's colour, and the colour of a device :func:`device_colours` was not given.
HOST_COLOUR = "#9aa0a6"
_SHADES = (0.0, 0.45, -0.3, 0.7, -0.5)  # instance i: mixed toward white (+) or black (-)


def _mix(colour: str, amount: float) -> str:
    rgb = [int(colour[i : i + 2], 16) for i in (1, 3, 5)]
    target = 255 if amount > 0 else 0
    rgb = [round(v + (target - v) * abs(amount)) for v in rgb]
    return "#" + "".join(f"{v:02x}" for v in rgb)


def _slot(accelerator: str) -> int:
    """The accelerator's palette index: a hash of its name, the same in every process."""
    digest = hashlib.md5(accelerator.encode("utf-8"), usedforsecurity=False).digest()
    return int.from_bytes(digest[:4], "big") % len(_PALETTE)


def _shade(base: str, device: str) -> str:
    _, _, instance = device.partition(":")
    i = int(instance) if instance.isdigit() else 0
    return _mix(base, _SHADES[i % len(_SHADES)])


def device_colour(device: str) -> str:
    """The colour of ``device`` (``"npu:0"``, ``"host"``), the same in every picture.

    The accelerator's hue comes from a fixed palette indexed by a stable hash
    of its name; instance ``i`` is a shade of it; the host is grey.
    :func:`device_colours` gives the same colours, except that two
    accelerators of one picture whose names hash to one hue are told apart.
    """
    if device == HOST:
        return HOST_COLOUR
    return _shade(_PALETTE[_slot(accelerator_of(device))], device)


def device_colours(devices: Sequence[str]) -> dict[str, str]:
    """The colour of each device: :func:`device_colour`, with no hue shared in one picture.

    When two accelerators' names hash to one hue, the one later by name (never
    by order of appearance) takes the next free hue, so a picture never shows
    two accelerators alike and the choice depends on the names alone.
    """
    hues: dict[str, int] = {}
    for name in sorted({accelerator_of(d) for d in devices if d != HOST}):
        slot = _slot(name)
        used = set(hues.values())
        if len(used) < len(_PALETTE):
            while slot in used:
                slot = (slot + 1) % len(_PALETTE)
        hues[name] = slot
    return {
        d: HOST_COLOUR if d == HOST else _shade(_PALETTE[hues[accelerator_of(d)]], d)
        for d in devices
    }


def ink(colour: str) -> str:
    """Dark or white text, whichever reads on ``colour``."""
    r, g, b = (int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return "#1f1f1f" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "#ffffff"


def copy_dash(kind: str) -> str:
    """The dash of a copy's line, in the graph and the legend: async dashed, sync solid."""
    return ' stroke-dasharray="5 3"' if kind == "async" else ""


#: The ``<defs>`` the drawing refers to: arrow and dot markers, the sync and
#: async hatch patterns.
DEFS = """<defs>
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
