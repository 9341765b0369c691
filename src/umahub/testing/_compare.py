"""The tolerance of every conformance check, stated once, and the comparison that applies it.

numpy is imported inside the functions: importing this module (which pytest does
at start-up, through :mod:`umahub.testing`) costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["TOLERANCE", "Tolerance", "assert_matches_host", "compare"]


@dataclass(frozen=True)
class Tolerance:
    """How far an accelerator's outputs may be from the host's.

    An output element ``a`` matches the host's ``r`` when
    ``|a - r| <= atol + rtol * |r|`` (numpy's ``allclose`` rule), where
    ``atol = atol_scale * max(1, max |reference|)``: the absolute part grows
    with the magnitude of the output, so a model whose logits are in the
    hundreds is held to the same relative standard as one whose are near 1.

    Attributes:
        rtol: relative tolerance.
        atol_scale: absolute tolerance per unit of ``max(1, max |reference|)``.
    """

    rtol: float = 1e-4
    atol_scale: float = 1e-4

    def atol(self, reference: Any) -> float:
        """The absolute tolerance for comparing against ``reference``."""
        import numpy as np

        ref = np.asarray(reference)
        peak = float(np.max(np.abs(ref))) if ref.size else 0.0
        return self.atol_scale * max(1.0, peak)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, with the rule in words (for the report)."""
        return {
            "rtol": self.rtol,
            "atol": f"{self.atol_scale:g} * max(1, max|reference|)",
            "rule": "|actual - reference| <= atol + rtol * |reference|, elementwise",
        }


#: The one tolerance every check of the kit uses.
TOLERANCE = Tolerance()


def _outputs(value: Any) -> list[Any]:
    import numpy as np

    if isinstance(value, (list, tuple)):
        return [np.asarray(v) for v in value]
    return [np.asarray(value)]


def compare(actual: Any, reference: Any, what: str = "output") -> tuple[float, str]:
    """Compare ``actual`` with the host's ``reference`` under :data:`TOLERANCE`.

    Both may be an array or a list of arrays (a model with several outputs).

    Returns:
        ``(largest absolute error over all outputs, problem)``; ``problem`` is
        "" when every element is within tolerance, else a sentence that gives
        the largest error, where it is, and the tolerance. The error is ``inf``
        when the outputs cannot be compared (count, shape, non-finite values).
    """
    import numpy as np

    got, ref = _outputs(actual), _outputs(reference)
    if len(got) != len(ref):
        return float("inf"), f"{what}: {len(got)} output(s), the host gives {len(ref)}"
    largest, problems = 0.0, []
    for i, (a, r) in enumerate(zip(got, ref, strict=True)):
        name = what if len(ref) == 1 else f"{what} {i}"
        if a.shape != r.shape:
            return float("inf"), f"{name}: shape {a.shape}, the host gives {r.shape}"
        a64, r64 = a.astype(np.float64), r.astype(np.float64)
        if np.any(np.isfinite(a64) != np.isfinite(r64)):
            return float("inf"), (
                f"{name}: {int(np.sum(~np.isfinite(a64)))} non-finite "
                f"value(s) where the host has {int(np.sum(~np.isfinite(r64)))}"
            )
        finite = np.isfinite(r64)
        error = np.where(finite, np.abs(a64 - np.where(finite, r64, 0.0)), 0.0)
        worst = float(error.max()) if error.size else 0.0
        largest = max(largest, worst)
        atol = TOLERANCE.atol(r64[finite])
        bad = error > atol + TOLERANCE.rtol * np.abs(np.where(finite, r64, 0.0))
        if bad.any():
            where = np.unravel_index(int(np.argmax(np.where(bad, error, -1.0))), error.shape)
            problems.append(
                f"{name}: {int(bad.sum())} of {bad.size} element(s) differ from the host "
                f"beyond rtol={TOLERANCE.rtol:g}, atol={atol:.3g}; largest error {worst:.3g} "
                f"at {tuple(int(w) for w in where)} (got {a64[where]:.6g}, host "
                f"{r64[where]:.6g})"
            )
    return largest, "; ".join(problems)


def assert_matches_host(actual: Any, reference: Any, what: str = "output") -> float:
    """Assert that ``actual`` matches the host's ``reference`` (see :func:`compare`).

    Returns:
        The largest absolute error.

    Raises:
        AssertionError: with :func:`compare`'s sentence, when it does not match.
    """
    largest, problem = compare(actual, reference, what)
    if problem:
        raise AssertionError(problem)
    return largest
