"""The tuning database: a directory with one JSON file, a verdict per kernel.

Kernels are grouped by *key*: the target they were built for, TVM's version,
the loaded plugins' versions and the backend options set. A compile looks a kernel up only under its
own key, so a database tuned for another CPU, another TVM or other plugins is
never used by mistake (the compile says so in a warning). One database may
hold several keys (a farm of two kinds of board).

A kernel is found by the structural hash of its PrimFunc, as the compile
hands it to the host's schedule; its entry holds both measurements (the
hook's schedule and the best tuned one), which was chosen and why, and the
tuned schedule as MetaSchedule's trace (JSON), which the compile replays; a
partition's tuned schedule is kept as TVMScript instead (a plugin's schedule
may use primitives, ``transform_layout`` among them, whose trace cannot be
written with apache-tvm-ffi 0.1.15: see :mod:`umahub.tuning.search`), which
the compile parses.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from umahub.errors import UmahubError

__all__ = ["FILE", "TIE", "TuningDatabase", "TuningError", "Verdict", "database_key", "key_text"]

#: The database's file inside its directory.
FILE = "umahub-tuning.json"
_FORMAT = 1

#: Times within this fraction of each other are a tie, which keeps the hook's schedule.
TIE = 0.02


class TuningError(UmahubError):
    """Tuning cannot start or its database cannot be used: names what and what to do."""


@dataclass
class Verdict:
    """What tuning decided for one kernel."""

    name: str  # the host function's name in the compiled model
    hook: str  # how the compile schedules it otherwise ("matmul", "plugin: ...")
    hook_seconds: float | None  # its measured time (None: it failed to build or run)
    tuned_seconds: float | None  # the best tuned candidate's (None: none built and ran)
    trials: int  # candidates measured
    used: str  # "tuned" or "hook"
    why: str  # one line for the report
    #: MetaSchedule's trace of the best tuned schedule, as JSON data (kept when the
    #: hook's is used too: the measurements may be judged again)
    trace: Any = None
    #: the best tuned schedule as TVMScript: a partition's, in place of the trace
    script: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The verdict as plain data (the database's and the report's form)."""
        # not dataclasses.asdict: it deep-copies, and a TVM object's copy goes through
        # tvm.ir.save_json, which crashes with apache-tvm-ffi 0.1.15 (see umahub.tuning.search)
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["trace"] = plain(self.trace)
        return data


def decide(
    name: str, hook: str, hook_seconds: float | None, tuned_seconds: float | None, trials: int
) -> tuple[str, str]:
    """("tuned" or "hook", why): the tuned kernel only where it measured faster; a tie keeps
    the hook's."""
    if tuned_seconds is None:
        return "hook", f"no tuned candidate built and ran in {trials} trials"
    tuned_ms = f"{tuned_seconds * 1e3:.4g} ms"
    if hook_seconds is None:
        return "tuned", f"tuned {tuned_ms}; the {hook} schedule failed to build or run"
    hook_ms = f"{hook_seconds * 1e3:.4g} ms"
    if tuned_seconds < hook_seconds * (1 - TIE):
        gain = hook_seconds / tuned_seconds
        return "tuned", f"tuned {tuned_ms} against {hook} {hook_ms} ({gain:.2f}x faster)"
    if tuned_seconds <= hook_seconds * (1 + TIE):
        return "hook", (
            f"tuned {tuned_ms} against {hook} {hook_ms}: a tie (within {TIE:.0%}) keeps {hook}"
        )
    return "hook", f"tuned {tuned_ms} against {hook} {hook_ms}: {hook} is faster"


def database_key(
    target: Any, plugins: dict[str, str], options: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The key kernels are kept under: the target, TVM's version, the plugins' versions,
    and the backend options set to other values than their defaults (a hook's schedule,
    which a verdict measured, depends on them; none set: no ``options`` in the key)."""
    import tvm

    key = {"target": str(target), "tvm": tvm.__version__, "plugins": dict(sorted(plugins.items()))}
    if options:
        key["options"] = {n: dict(sorted(v.items())) for n, v in sorted(options.items())}
    return key


def key_text(key: dict[str, Any]) -> str:
    """A key for messages: ``target {...}, TVM 0.27.0, plugins dsp 0.1, npu 0.1`` (and
    ``, options npu.tile-rows=16`` where options were set)."""
    plugins = ", ".join(f"{n} {v}" for n, v in key["plugins"].items()) or "none"
    text = f"target {key['target']}, TVM {key['tvm']}, plugins {plugins}"
    options = [
        f"{a}.{o}={v}" for a, values in key.get("options", {}).items() for o, v in values.items()
    ]
    return text + (f", options {' '.join(options)}" if options else "")


def plain(value: Any) -> Any:
    """A trace's JSON data as Python lists, strings and numbers (TVM's floats included)."""
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        return [plain(v) for v in value]
    if hasattr(value, "value"):  # an IntImm or FloatImm
        return value.value
    return str(value)


class TuningDatabase:
    """A tuning database directory: its verdicts by key (see the module's docs)."""

    def __init__(self, path: str | os.PathLike, *, create: bool = False):
        self.path = Path(path)
        self.file = self.path / FILE
        if self.path.exists() and not self.path.is_dir():
            raise TuningError(
                f"tuning database '{self.path}' is a file; give a directory (umahub tune makes it)"
            )
        if not self.file.exists() and not create:
            raise TuningError(
                f"tuning database '{self.path}' does not exist (no {FILE} in it); run "
                "`umahub tune MODEL --database PATH` to make it, or fix the path"
            )
        self.entries: list[dict[str, Any]] = []
        if self.file.exists():
            try:
                data = json.loads(self.file.read_text())
                if data.get("format") != _FORMAT:
                    raise ValueError(f"format {data.get('format')!r}, expected {_FORMAT}")
                self.entries = list(data["entries"])
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise TuningError(
                    f"tuning database '{self.file}' cannot be read ({exc}); delete it and "
                    "run `umahub tune` again"
                ) from None

    def kernels(self, key: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
        """The verdicts kept under ``key`` (by kernel hash), or None: none for that key."""
        for entry in self.entries:
            if entry["key"] == key:
                return dict(entry["kernels"])
        return None

    def keys(self) -> list[dict[str, Any]]:
        """The keys the database holds kernels for."""
        return [entry["key"] for entry in self.entries]

    def put(self, key: dict[str, Any], kernel: str, verdict: Verdict) -> None:
        """Keep ``verdict`` for the kernel of hash ``kernel`` under ``key`` (replaces an older)."""
        data = verdict.to_dict()
        for entry in self.entries:
            if entry["key"] == key:
                entry["kernels"][kernel] = data
                return
        self.entries.append({"key": key, "kernels": {kernel: data}})

    def save(self) -> None:
        """Write the database (its directory made if needed)."""
        self.path.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"format": _FORMAT, "entries": self.entries}, indent=1)
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(self.file)
