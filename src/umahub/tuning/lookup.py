"""The compile's side of tuning: a kernel's tuned schedule, where it measured faster.

:func:`tuned_schedule` is asked by :func:`umahub.host.lowering.lower_host`
before the hook's (or umahub's) schedule, for every host PrimFunc;
:func:`tuned_partition` by the lower stage before the ``umahub_schedule``
hooks, for every partition on an accelerator. Each answers from
``[tool.umahub] tuning-database`` under the compile's key (target, TVM,
plugins): the tuned schedule replayed where the verdict is ``"tuned"``,
None otherwise. Each kernel the database knows is recorded for the report
(:func:`recording`) with which schedule was used and why.

A database that cannot be used (a wrong path, nothing for this key, a trace
that no longer replays) is a warning naming it and what to do; the compile
goes on with the hook's schedules.

While :mod:`umahub.tuning.tasks` collects a model's kernels, both answer None
and keep each kernel they are asked about.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from umahub.errors import warn
from umahub.plugin.compat import param_buffers
from umahub.targets import or_host
from umahub.tuning.database import FILE, TuningDatabase, TuningError, database_key, key_text

__all__ = [
    "Collected",
    "PartitionKernel",
    "collecting",
    "kernel_hash",
    "key_of",
    "plugin_versions",
    "recording",
    "tuned_partition",
    "tuned_schedule",
]


@dataclass
class PartitionKernel:
    """A partition on an accelerator, between its lowering to TIR and its schedule.

    Attributes:
        hub: the compile's hub.
        context: the partition's compile context.
        tir: its TIR module (``umahub_relax_to_tir``'s, or the default lowering's).
        schedule_by_hooks: the module as the ``umahub_schedule`` hooks schedule it,
            and what they said.
        build: a scheduled module (and what its schedule said) through the rest
            of the partition's lowering: weights packed, TIR passes, codegen.
    """

    hub: Any
    context: Any
    tir: tvm.IRModule
    schedule_by_hooks: Callable[[], tuple[tvm.IRModule, list[str]]]
    build: Callable[[tvm.IRModule, list[str]], Any]

    def main(self) -> tirx.PrimFunc | None:
        """Its PrimFunc named ``"main"`` (as tuning schedules it), or None: its TIR holds
        more than the partition's one function, which tuning leaves alone."""
        symbol = self.context.symbol
        if len(self.tir.functions) != 1 or not any(
            gv.name_hint == symbol for gv in self.tir.functions
        ):
            return None
        return self.tir[symbol].with_attr("global_symbol", "main")

    def key(self) -> str | None:
        """Its key in the database: the accelerator's name and the kernel's hash."""
        func = self.main()
        return None if func is None else f"{self.context.accelerator.name}:{kernel_hash(func)}"

    def named(self, func: tirx.PrimFunc) -> tvm.IRModule:
        """``func`` (scheduled as ``"main"``) as the partition's module, under its symbol."""
        symbol = self.context.symbol
        return tvm.IRModule({symbol: func.with_attr("global_symbol", symbol)}, attrs=self.tir.attrs)


@dataclass
class Collected:
    """The kernels a compile asked about while :func:`collecting` was open.

    Attributes:
        host: the host's functions, as (name, PrimFunc, target).
        partitions: the partitions on accelerators.
    """

    host: list[tuple[str, Any, Any]] = field(default_factory=list)
    partitions: list[PartitionKernel] = field(default_factory=list)


_collected: ContextVar[Collected | None] = ContextVar("collected", default=None)
_recorded: ContextVar[list[dict[str, str]] | None] = ContextVar("recorded", default=None)
_warned: set[tuple[str, str]] = set()


def kernel_hash(func: tirx.PrimFunc) -> str:
    """The key of a kernel in the database: its PrimFunc's structural hash."""
    return f"{tvm_ffi.structural_hash(func) & (2**64 - 1):016x}"


def plugin_versions(hub: Any) -> dict[str, str]:
    """The loaded plugins' versions, part of the database's key."""
    return {p.name: str(p.version or "") for p in hub.plugins if p.loaded}


def key_of(hub: Any, target: Any) -> dict[str, Any]:
    """The database key of ``hub``'s kernels built for ``target`` (its plugins and the
    backend options set are part of it)."""
    return database_key(target, plugin_versions(hub), hub.changed_options())


@contextlib.contextmanager
def collecting() -> Iterator[Collected]:
    """While open, the kernels asked about: the host's functions and the partitions."""
    found = Collected()
    token = _collected.set(found)
    try:
        yield found
    finally:
        _collected.reset(token)


@contextlib.contextmanager
def recording(fresh: bool = True) -> Iterator[list[dict[str, str]]]:
    """While open, each kernel the database decided: name, used ("tuned"/"hook"), why.

    Opened by the lower stage (``fresh``: the compile's warnings start again) and
    again by the build of the host's part (not fresh): its warnings are said once
    per compile.
    """
    if fresh:
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
    key = key_of(hub, target)
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


def _signature(func: tirx.PrimFunc) -> list[str]:
    """Each parameter's dtype and shape (``"float32[1, 16]"``; a scalar's ``"scalar"``)."""
    return [
        "scalar" if b is None else f"{b.dtype}[{', '.join(str(d) for d in b.shape)}]"
        for b in param_buffers(func)
    ]


def _replayed(func: tirx.PrimFunc, entry: dict[str, Any]) -> tirx.PrimFunc:
    """``func`` scheduled as ``entry`` keeps it: its TVMScript parsed, else its trace replayed."""
    script = entry.get("script")
    if script:
        parsed = tvm.script.from_source(script)
        tuned = parsed["main"] if isinstance(parsed, tvm.IRModule) else parsed
        if not isinstance(tuned, tirx.PrimFunc):
            raise ValueError(f"its script holds a {type(tuned).__name__}, not a PrimFunc")
        mine, theirs = _signature(func), _signature(tuned)
        if mine != theirs:
            raise ValueError(f"its parameters are {theirs}, the kernel's {mine}")
        return tuned
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    s_tir.Trace.apply_json_to_schedule(entry["trace"], sch)
    return sch.mod["main"]


def tuned_schedule(
    hub: Any, func: tirx.PrimFunc, target: Any, name: str
) -> tuple[tirx.PrimFunc, str] | None:
    """``func`` with its tuned schedule and ``"tuned"``, or None: the hook's schedule is used."""
    collected = _collected.get()
    if collected is not None:
        collected.host.append((name, func, target))
        return None
    found = _verdict(hub, target, kernel_hash(func), func, name)
    return None if found is None else (found[0], "tuned")


def tuned_partition(kernel: PartitionKernel) -> tuple[tvm.IRModule, list[str]] | None:
    """The partition's TIR with its tuned schedule, and what to say of it; or None: the
    ``umahub_schedule`` hooks schedule it."""
    collected = _collected.get()
    if collected is not None:
        collected.partitions.append(kernel)
        return None
    if not getattr(kernel.hub.config, "tuning_database", None):
        return None
    func, key = kernel.main(), kernel.key()
    if func is None or key is None:
        return None
    ctx = kernel.context
    target = or_host(ctx.target)
    name = f"{ctx.symbol} on {ctx.device}"
    found = _verdict(kernel.hub, target, key, func, name)
    if found is None:
        return None
    scheduled, why = found
    return kernel.named(scheduled), [f"tuning-database: {why}"]


def _verdict(
    hub: Any, target: Any, key: str, func: tirx.PrimFunc, name: str
) -> tuple[tirx.PrimFunc, str] | None:
    """``func`` with the tuned schedule of kernel ``key`` and the verdict's why, where the
    verdict is "tuned"; None otherwise. The verdict is recorded for the report under
    ``name``."""
    path = getattr(hub.config, "tuning_database", None)
    if not path:
        return None
    kernels = _kernels(hub, str(path), target)
    entry = kernels.get(key) if kernels else None
    if entry is None:
        return None
    used, why, result = entry["used"], entry["why"], None
    if used == "tuned":
        try:
            result = _replayed(func, entry)
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
    return None if result is None else (result, why)
