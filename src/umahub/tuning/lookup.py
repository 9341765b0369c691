"""The compile's side of tuning: a host kernel's tuned schedule, where it measured faster.

:func:`tuned_schedule` is asked by :func:`umahub.host.lowering.lower_host`
before the hook's (or umahub's) schedule, for every host PrimFunc. It answers
from ``[tool.umahub] tuning-database`` under the compile's key (target, TVM,
plugins): the tuned schedule replayed where the verdict is ``"tuned"``,
None otherwise. Each kernel the database knows is recorded for the report
(:func:`recording`) with which schedule was used and why.

A database that cannot be used (a wrong path, nothing for this key, a trace
that no longer replays) is a warning naming it and what to do; the compile
goes on with the hook's schedules.

While :mod:`umahub.tuning.tasks` collects a model's kernels, it answers None
and keeps each function it is asked about.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from umahub.errors import warn
from umahub.tuning.database import FILE, TuningDatabase, TuningError, database_key, key_text

__all__ = ["collecting", "kernel_hash", "plugin_versions", "recording", "tuned_schedule"]

_collected: ContextVar[list[tuple[str, Any, Any]] | None] = ContextVar("collected", default=None)
_recorded: ContextVar[list[dict[str, str]] | None] = ContextVar("recorded", default=None)
_warned: set[tuple[str, str]] = set()


def kernel_hash(func: tirx.PrimFunc) -> str:
    """The key of a kernel in the database: its PrimFunc's structural hash."""
    return f"{tvm_ffi.structural_hash(func) & (2**64 - 1):016x}"


def plugin_versions(hub: Any) -> dict[str, str]:
    """The loaded plugins' versions, part of the database's key."""
    return {p.name: str(p.version or "") for p in hub.plugins if p.loaded}


@contextlib.contextmanager
def collecting() -> Iterator[list[tuple[str, Any, Any]]]:
    """While open, the host functions asked about, as (name, PrimFunc, target)."""
    found: list[tuple[str, Any, Any]] = []
    token = _collected.set(found)
    try:
        yield found
    finally:
        _collected.reset(token)


@contextlib.contextmanager
def recording() -> Iterator[list[dict[str, str]]]:
    """While open, each kernel the database decided: name, used ("tuned"/"hook"), why.

    Opened once per build of the host's part: its warnings are said once per compile.
    """
    _warned.clear()
    found: list[dict[str, str]] = []
    token = _recorded.set(found)
    try:
        yield found
    finally:
        _recorded.reset(token)


def _warn_once(path: str, key: str, message: str) -> None:
    if (path, key) not in _warned:
        _warned.add((path, key))
        warn(message)


_read_cache: dict[tuple[Path, float], TuningDatabase] = {}


def _read(path: Path) -> TuningDatabase:
    """The database at ``path``, read again only when its file changed."""
    try:
        stamp = (path / FILE).stat().st_mtime
    except OSError:
        return TuningDatabase(path)  # the error that says what is wrong with the path
    database = _read_cache.get((path, stamp))
    if database is None:
        _read_cache.clear()
        database = _read_cache[(path, stamp)] = TuningDatabase(path)
    return database


def _kernels(hub: Any, path: str, target: Any) -> dict[str, dict[str, Any]] | None:
    key = database_key(target, plugin_versions(hub))
    where = f"[tool.umahub] tuning-database '{path}'"
    try:
        database = _read(Path(path))
    except TuningError as exc:
        _warn_once(path, "", f"{where}: {exc}; the compile uses the hooks' schedules")
        return None
    kernels = database.kernels(key)
    if kernels is None:
        held = "; ".join(key_text(k) for k in database.keys()) or "nothing"
        _warn_once(
            path,
            str(key),
            f"{where} has no kernels tuned for {key_text(key)} (it holds: {held}); run "
            "`umahub tune MODEL` for this machine, TVM and plugins; the compile uses the "
            "hooks' schedules",
        )
    return kernels


def _replayed(func: tirx.PrimFunc, trace: Any) -> tirx.PrimFunc:
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    s_tir.Trace.apply_json_to_schedule(trace, sch)
    return sch.mod["main"]


def tuned_schedule(
    hub: Any, func: tirx.PrimFunc, target: Any, name: str
) -> tuple[tirx.PrimFunc, str] | None:
    """``func`` with its tuned schedule and ``"tuned"``, or None: the hook's schedule is used."""
    collected = _collected.get()
    if collected is not None:
        collected.append((name, func, target))
        return None
    path = getattr(hub.config, "tuning_database", None)
    if not path:
        return None
    kernels = _kernels(hub, str(path), target)
    entry = kernels.get(kernel_hash(func)) if kernels else None
    if entry is None:
        return None
    used, why, result = entry["used"], entry["why"], None
    if used == "tuned":
        try:
            result = _replayed(func, entry["trace"]), "tuned"
        except Exception as exc:
            used, why = "hook", f"the tuned schedule does not replay ({type(exc).__name__})"
            _warn_once(
                str(path),
                name,
                f"[tool.umahub] tuning-database '{path}': the tuned schedule of '{name}' does "
                "not replay; run `umahub tune MODEL` again",
            )
    recorded = _recorded.get()
    if recorded is not None:
        recorded.append({"name": name, "used": used, "why": why})
    return result
