"""The conformance report: what each accelerator took of each model, the largest error, what failed.

The checks record into a :class:`Recorder` while they run; a hook records the
message of every check that fails; ``pytest_sessionfinish`` writes the JSON::

    {
      "umahub": "0.1.0", "tvm": "0.27.0", "hypothesis": "6.x", "python": "3.11.9",
      "tolerance": {"rtol": 0.0001, "atol": "0.0001 * max|reference|", ...},
      "options": {"conformance": ["alpha"], "models": ["mlp"], "examples": 8},
      "passed": true,
      "accelerators": {
        "alpha_accel": {
          "plugin": "alpha", "instances": 2, "codegen": "llvm", "passed": true,
          "models": {
            "mlp": {"operators_total": 5, "operators_taken": 3, "partitions": 2,
                    "largest_error": 4.7e-07, "passed": true, "failures": [],
                    "checks": {"partition": "passed", "compile": "passed", ...},
                    "notes": []}
          },
          "all_models": {"passed": true, "failures": [],
                         "checks": {"takes_operators": "passed"}, "notes": [], ...},
          "random_graphs": {"vocabulary": ["relax.add", "relax.nn.relu"], "examples": 8,
                            "graphs_taken": 7, "operators_total": 31, "operators_taken": 19,
                            "largest_error": 2.4e-07, "passed": true, "failures": []}
        }
      },
      "cross": {
        "alpha_accel+beta_accel": {
          "accelerators": ["alpha_accel", "beta_accel"], "vocabulary": [...],
          "examples": 8, "operators_total": 40, "operators_taken": 22, "pins": 19,
          "pins_unhonoured": 6, "pin_conflicts": 0, "largest_error": 4.8e-07,
          "passed": true, "failures": [], ...
        }
      }
    }

``all_models`` has the checks over all the models of an accelerator
(``takes_operators``: it took some operator of one of them).
``cross`` is there with ``--umahub-conformance-cross`` (or a
``CrossConformanceSuite``): the random graphs with random pins of the named
accelerators together.

``largest_error`` is the largest absolute difference from the host's output
over every run of that model (compiled, reloaded, pinned to each instance);
``null`` when nothing ran. A model with quantized outputs (an int8 model of
the zoo) also has ``largest_units``: the largest difference in units of the
output's quantization step, which :data:`~umahub.testing.STEPS` bounds (0 by
default); ``"steps"`` at the top gives that rule.
"""

from __future__ import annotations

import json
import math
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["WHOLE", "Recorder"]


@dataclass
class _Entry:
    """Results of one model (or of the random graphs) on one accelerator."""

    numbers: dict[str, Any] = field(default_factory=dict)
    largest_error: float | None = None
    checks: dict[str, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        error = self.largest_error
        return {
            **self.numbers,
            "largest_error": None if error is None or math.isinf(error) else error,
            "passed": not self.failures and "failed" not in self.checks.values(),
            "failures": list(self.failures),
            "checks": dict(self.checks),
            "notes": list(self.notes),
        }


_RANDOM = "<random graphs>"
#: The "model" of the checks over all the models of an accelerator (``takes_operators``).
WHOLE = "<all models>"


class Recorder:
    """Collects what the checks found, per accelerator and model; writes the report."""

    def __init__(self) -> None:
        self._accelerators: dict[str, dict[str, Any]] = {}
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._cross: dict[str, _Entry] = {}

    def cross(self, name: str, **values: Any) -> None:
        """Record counts of the cross check of ``name`` (accelerators joined by ``+``)."""
        self._cross.setdefault(name, _Entry()).numbers.update(values)

    def cross_error(self, name: str, value: float) -> None:
        """Record an absolute error of the cross check; the report keeps the largest."""
        entry = self._cross.setdefault(name, _Entry())
        entry.largest_error = (
            value if entry.largest_error is None else max(entry.largest_error, value)
        )

    def cross_outcome(self, name: str, outcome: str, message: str = "") -> None:
        """Record how the cross check of ``name`` ended, and why."""
        entry = self._cross.setdefault(name, _Entry())
        if entry.checks.get("random_placement") != "failed":
            entry.checks["random_placement"] = outcome
        if outcome == "failed":
            entry.failures.append(message or "random_placement")
        elif outcome == "skipped" and message:
            entry.notes.append(f"random_placement skipped: {message}")

    def accelerator(self, name: str, **info: Any) -> None:
        """Record facts about an accelerator (plugin, instances, codegen)."""
        self._accelerators.setdefault(name, {}).update(info)

    def _entry(self, accelerator: str, model: str | None) -> _Entry:
        self._accelerators.setdefault(accelerator, {})
        return self._entries.setdefault((accelerator, model or _RANDOM), _Entry())

    def numbers(self, accelerator: str, model: str | None, **values: Any) -> None:
        """Record counts (``operators_total=...``); ``model`` None = the random graphs."""
        self._entry(accelerator, model).numbers.update(values)

    def error(self, accelerator: str, model: str | None, value: float) -> None:
        """Record an absolute error; the report keeps the largest."""
        entry = self._entry(accelerator, model)
        entry.largest_error = (
            value if entry.largest_error is None else max(entry.largest_error, value)
        )

    def units(self, accelerator: str, model: str, value: int) -> None:
        """Record a difference in quantization steps; the report keeps the largest
        (``largest_units``, only for a model with quantized outputs)."""
        numbers = self._entry(accelerator, model).numbers
        numbers["largest_units"] = max(value, numbers.get("largest_units", value))

    def outcome(
        self, accelerator: str, model: str | None, check: str, outcome: str, message: str = ""
    ) -> None:
        """Record how a check ended (``"passed"``, ``"failed"``, ``"skipped"``) and why.

        The message of a failure goes to ``failures``, that of a skip to ``notes``.
        """
        entry = self._entry(accelerator, model)
        if entry.checks.get(check) != "failed":  # a teardown cannot undo a failed call
            entry.checks[check] = outcome
        if outcome == "failed":
            entry.failures.append(f"{check}: {message}" if message else check)
        elif outcome == "skipped" and message:
            entry.notes.append(f"{check} skipped: {message}")

    def __bool__(self) -> bool:
        return bool(self._accelerators) or bool(self._cross)

    def to_dict(self, tolerance: dict[str, Any], **extra: Any) -> dict[str, Any]:
        """The report as data (see the module docstring)."""
        accelerators: dict[str, Any] = {}
        for name, info in sorted(self._accelerators.items()):
            models = {
                m: e.to_dict()
                for (a, m), e in self._entries.items()
                if a == name and m not in (_RANDOM, WHOLE)
            }
            body = {**info, "models": models}
            random = self._entries.get((name, _RANDOM))
            if random is not None:
                body["random_graphs"] = random.to_dict()
            whole = self._entries.get((name, WHOLE))
            if whole is not None:
                body["all_models"] = whole.to_dict()
            parts = [*models.values(), *([body["random_graphs"]] if random else [])]
            parts += [body["all_models"]] if whole else []
            body["passed"] = all(p["passed"] for p in parts)
            accelerators[name] = body
        cross = {name: e.to_dict() for name, e in sorted(self._cross.items())}
        data = {
            **_versions(),
            "tolerance": tolerance,
            **extra,
            "passed": all(a["passed"] for a in [*accelerators.values(), *cross.values()]),
            "accelerators": accelerators,
        }
        if cross:
            data["cross"] = cross
        return data

    def write(self, path: Path, tolerance: dict[str, Any], **extra: Any) -> Path:
        """Write the report as JSON to ``path``; return the path."""
        path.parent.mkdir(parents=True, exist_ok=True)
        data = self.to_dict(tolerance, **extra)
        path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
        return path


def _versions() -> dict[str, Any]:
    from importlib import metadata

    versions: dict[str, Any] = {}
    for key, dist in (
        ("umahub", "umahub"),
        ("tvm", "apache-tvm"),
        ("hypothesis", "hypothesis"),
        ("pytest", "pytest"),
    ):
        try:
            versions[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[key] = None
    if versions["tvm"] is None:
        try:
            import tvm

            versions["tvm"] = tvm.__version__
        except ImportError:
            pass
    versions["python"] = platform.python_version()
    return versions
