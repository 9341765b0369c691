"""What every conformance check does with a compile and a comparison: skip when the model
did not compile, compare with the host and record, fail with a sentence."""

from __future__ import annotations

from typing import Any

import pytest

from umahub.errors import last_line
from umahub.testing._compare import compare, steps_apart
from umahub.testing._session import ConformanceSession

__all__ = ["compare_and_record", "compiled_or_skip", "fail_if"]


def compiled_or_skip(session: ConformanceSession, accelerator: str, model: str) -> Any:
    try:
        return session.compiled(accelerator, model)
    except Exception as exc:
        pytest.skip(
            f"{model} did not compile for {accelerator} (the compile check fails): "
            f"{type(exc).__name__}: {last_line(exc)}"
        )


def compare_and_record(
    session: ConformanceSession, accelerator: str, model: str, outputs: Any, what: str = "output"
) -> str:
    """Compare a zoo model's outputs with the host's (quantized outputs in steps), record the
    largest error (and difference in steps); the problem, "" if none."""
    reference, steps = session.reference(model), session.steps(model)
    largest, problem = compare(outputs, reference, what, steps)
    session.recorder.error(accelerator, model, largest)
    units = steps_apart(outputs, reference, steps)
    if units is not None:
        session.recorder.units(accelerator, model, units)
    return problem


def fail_if(problem: Any) -> None:
    """Fail the check with ``problem`` (a sentence) unless it is empty."""
    if problem:
        raise AssertionError(problem)
