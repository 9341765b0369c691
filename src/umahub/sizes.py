"""Byte counts as people read them: one format for every message, report and picture.

:func:`human_size` is the only place a byte count becomes text for a user
(``"16 KiB"``, ``"3.8 MiB"``); plugins use it too, in the reasons their
pattern checks give (``umahub.Refusal``). :func:`counted` puts a count of
things in words (``"1 copy"``, ``"2 copies"``).
"""

from __future__ import annotations

__all__ = ["counted", "human_size"]

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_size(n: float) -> str:
    """``n`` bytes in B, KiB, MiB, GiB (or TiB), with three significant digits at most.

    ``human_size(512) == "512 B"``, ``human_size(16384) == "16 KiB"``,
    ``human_size(8192) == "8 KiB"``, ``human_size(3_900_000) == "3.7 MiB"``.
    """
    value, k = float(n), 0
    # 1023.9 MiB would print as "1024 MiB": a value that rounds to 1024 goes up a unit
    while round(abs(value)) >= 1024 and k < len(_UNITS) - 1:
        value /= 1024
        k += 1
    if k == 0:
        return f"{int(value)} B"
    number = f"{value:.1f}" if abs(value) < 10 else f"{value:.0f}"
    return f"{number.removesuffix('.0')} {_UNITS[k]}"


def counted(n: int, one: str, many: str | None = None) -> str:
    """``n`` things in words, singular for one: ``counted(1, "copy", "copies") == "1 copy"``,
    ``counted(3, "op") == "3 ops"`` (``many`` is ``one + "s"`` unless given)."""
    return f"{n} {one if n == 1 else (many or one + 's')}"
