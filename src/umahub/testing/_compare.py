"""The tolerances of every conformance check, stated once, and the comparison that applies them.

Float outputs are held to :data:`TOLERANCE`; quantized outputs (out of a
dequantize, or integer) to :data:`STEPS`, in units of their quantization step.

numpy is imported inside the functions: importing this module (which pytest does
at start-up, through :mod:`umahub.testing`) costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "STEPS",
    "TOLERANCE",
    "StepTolerance",
    "Tolerance",
    "assert_matches_host",
    "compare",
    "output_steps",
    "steps_apart",
]


@dataclass(frozen=True)
class Tolerance:
    """How far an accelerator's outputs may be from the host's.

    An output element ``a`` matches the host's ``r`` when
    ``|a - r| <= atol + rtol * |r|`` (numpy's ``allclose`` rule), where
    ``atol = atol_scale * max |reference|``: the absolute part follows the
    magnitude of the output, with no floor, so a model whose logits are in the
    hundreds and one whose outputs are near 1e-15 are held to the same
    relative standard (an all-zero result for small outputs fails).

    Attributes:
        rtol: relative tolerance.
        atol_scale: absolute tolerance per unit of ``max |reference|``.
    """

    rtol: float = 1e-4
    atol_scale: float = 1e-4

    def atol(self, reference: Any) -> float:
        """The absolute tolerance for comparing against ``reference``."""
        import numpy as np

        ref = np.asarray(reference)
        peak = float(np.max(np.abs(ref))) if ref.size else 0.0
        return self.atol_scale * peak

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, with the rule in words (for the report)."""
        return {
            "rtol": self.rtol,
            "atol": f"{self.atol_scale:g} * max|reference|",
            "rule": "|actual - reference| <= atol + rtol * |reference|, elementwise",
        }


#: The one tolerance every check of the kit uses for float outputs.
TOLERANCE = Tolerance()


@dataclass(frozen=True)
class StepTolerance:
    """How far a quantized output may be from the host's, in its quantization steps.

    An output is quantized when it comes out of ``R.dequantize`` with a
    constant scale (its step is that scale, per channel where the dequantize
    is) or has an integer dtype (step 1). An element ``a`` differs from the
    host's ``r`` by ``|a - r| / step`` units, a whole number for values on the
    quantization grid; a difference off the grid counts as the next whole unit
    up. The default allows 0 units: every umahub path must give the host's
    integers, bit for bit.

    Attributes:
        units: the largest difference allowed, in whole units.
    """

    units: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, with the rule in words (for the report)."""
        return {
            "units": self.units,
            "rule": "|actual - reference| / step in whole units <= units, elementwise, for an "
            "output of R.dequantize (step: its scale) or of an integer dtype (step: 1)",
        }


#: The one tolerance every check of the kit uses for quantized outputs.
STEPS = StepTolerance()
#: A difference within this fraction of a step of a whole number of steps is that number.
_ON_GRID = 1e-3


def _outputs(value: Any) -> list[Any]:
    import numpy as np

    if isinstance(value, (list, tuple)):
        return [np.asarray(v) for v in value]
    return [np.asarray(value)]


def compare(
    actual: Any, reference: Any, what: str = "output", steps: Any = None
) -> tuple[float, str]:
    """Compare ``actual`` with the host's ``reference`` under :data:`TOLERANCE` or :data:`STEPS`.

    Both may be an array or a list of arrays (a model with several outputs).
    ``steps`` (from :func:`output_steps`) has one entry per output: None for
    a float output (:data:`TOLERANCE`), or the output's quantization step,
    for which :data:`STEPS` applies and the sentence says how many elements
    differ by how many units (``3 elements differ by 1 unit, 1 element differs
    by 2 units``). Without ``steps``, every output is float.

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
    per_output = list(steps) if steps is not None else [None] * len(ref)
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
        if i < len(per_output) and per_output[i] is not None:
            problem = _steps_problem(name, a64, r64, _units(error, per_output[i]))
            if problem:
                problems.append(problem)
            continue
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


def _units(error: Any, step: Any) -> Any:
    """Whole units of ``step`` in ``error``: the nearest whole number on the grid, else up."""
    import numpy as np

    ratio = error / np.asarray(step, dtype=np.float64)
    nearest = np.rint(ratio)
    return np.where(np.abs(ratio - nearest) <= _ON_GRID, nearest, np.ceil(ratio)).astype(np.int64)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _steps_problem(name: str, a64: Any, r64: Any, units: Any) -> str:
    import numpy as np

    bad = units > STEPS.units
    if not bad.any():
        return ""
    counts = np.unique(units[bad], return_counts=True)
    parts = [
        f"{_plural(int(n), 'element')} {'differs' if n == 1 else 'differ'} by "
        f"{_plural(int(k), 'unit')}"
        for k, n in zip(*counts, strict=True)
    ]
    where = np.unravel_index(int(np.argmax(units)), units.shape)
    return (
        f"{name}: {', '.join(parts)} of its quantization step from the host "
        f"({_plural(STEPS.units, 'unit')} allowed); the largest at "
        f"{tuple(int(w) for w in where)}: got {a64[where]:.6g}, host {r64[where]:.6g}"
    )


def steps_apart(actual: Any, reference: Any, steps: Any) -> int | None:
    """The largest difference, in whole units of their steps, over the quantized outputs.

    None when no output is quantized (every entry of ``steps`` is None) or
    the outputs cannot be compared (count, shape, non-finite values).
    """
    import numpy as np

    got, ref = _outputs(actual), _outputs(reference)
    if steps is None or len(got) != len(ref) or len(steps) != len(ref):
        return None
    largest = None
    for a, r, step in zip(got, ref, steps, strict=True):
        if step is None:
            continue
        a64, r64 = a.astype(np.float64), r.astype(np.float64)
        if a.shape != r.shape or not (np.isfinite(a64).all() and np.isfinite(r64).all()):
            return None
        units = _units(np.abs(a64 - r64), step)
        worst = int(units.max()) if units.size else 0
        largest = worst if largest is None else max(largest, worst)
    return largest


def output_steps(mod: Any) -> list[Any]:
    """The quantization step of each output of ``mod``'s ``main``, None for a float output.

    An output that is ``R.dequantize(q, scale, zp, axis)`` of a constant
    ``scale`` (through any aliases) has the step ``scale``, shaped to
    broadcast along ``axis``; an integer output has step 1.
    """
    import numpy as np
    from tvm import relax

    from umahub._tvm import Constant, constant_value, type_of

    func = mod["main"]
    values = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    result = func.body.body
    while isinstance(result, relax.Var) and result in values:
        result = values[result]
    fields = list(result.fields) if isinstance(result, relax.Tuple) else [result]
    steps: list[Any] = []
    for field in fields:
        value = field
        while isinstance(value, relax.Var) and value in values:
            value = values[value]
        dtype = str(type_of(field).dtype)
        if dtype.startswith(("int", "uint")):
            steps.append(1.0)
            continue
        op = getattr(getattr(value, "op", None), "name", None)
        scale = value.args[1] if op == "relax.dequantize" else None
        if not isinstance(scale, Constant):
            steps.append(None)
            continue
        step = constant_value(scale).numpy().astype(np.float64)
        if step.ndim and step.size > 1:
            ndim = len(type_of(field).shape)
            shape = [1] * ndim
            shape[int(value.attrs.axis)] = -1
            step = step.reshape(shape)
        steps.append(step.reshape(()) if step.size == 1 else step)
    return steps


def assert_matches_host(
    actual: Any, reference: Any, what: str = "output", steps: Any = None
) -> float:
    """Assert that ``actual`` matches the host's ``reference`` (see :func:`compare`).

    Returns:
        The largest absolute error.

    Raises:
        AssertionError: with :func:`compare`'s sentence, when it does not match.
    """
    largest, problem = compare(actual, reference, what, steps)
    if problem:
        raise AssertionError(problem)
    return largest
