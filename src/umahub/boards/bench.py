"""Latency of an exported model, here or on a board: the numbers of ``umahub bench``.

:func:`bench` runs a model (a :class:`umahub.LoadedModel`, or a
:class:`umahub.boards.rpc.RemoteModel` on a board) once to warm up, then ``repeat``
times, and gives the latency's min, median, p90, max and mean in
milliseconds, with the machine and the versions it was measured with (and
the board's, for a remote run). A remote run also gives the time of ``main``
on the board alone (``board_latency_ms``): the difference is the transfer of
inputs and outputs and the RPC round trip. A local model run by the
concurrent executor gives each device's busy time in its median run
(``device_ms``); the VM cannot tell it (``device_ms_why`` says so). The runs
that measure it can be written as a Chrome trace (``trace=``,
:mod:`umahub.runtime.trace`).
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from umahub.errors import UmahubError

__all__ = ["bench", "machine_info", "summarize"]


def machine_info() -> dict[str, Any]:
    """This machine and the versions that matter (no TVM import)."""
    info: dict[str, Any] = {
        "machine": platform.machine(),
        "system": platform.system(),
        "node": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        if names:
            info["cpu"] = names[0]
    except OSError:
        pass
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("umahub", "apache-tvm", "apache-tvm-ffi", "numpy"):
        try:
            info[dist] = version(dist)
        except PackageNotFoundError:
            info[dist] = None
    return info


def summarize(seconds: Sequence[float]) -> dict[str, float]:
    """min, median, p90, max and mean of ``seconds``, in milliseconds."""
    ms = np.asarray(seconds, dtype=float) * 1e3
    return {
        "min": float(ms.min()),
        "median": float(np.median(ms)),
        "p90": float(np.percentile(ms, 90)),
        "max": float(ms.max()),
        "mean": float(ms.mean()),
    }


def bench(
    model: Any,
    arrays: Sequence[Any],
    repeat: int = 50,
    warmup: int = 1,
    progress: Callable[[int, int], None] | None = None,
    trace: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Time ``model.run(*arrays)``: ``warmup`` runs (more while the ``"auto"``
    executor is still choosing, see :meth:`umahub.LoadedModel.warm_up`), then
    ``repeat`` timed ones.

    Args:
        model: a :class:`umahub.LoadedModel` or :class:`umahub.Compiled`, or a
            :class:`umahub.boards.rpc.RemoteModel`.
        progress: called ``progress(done, repeat)`` after each timed run.
        trace: write the runs that measure each device's time to this file as
            a Chrome trace (a local model on the concurrent executor only).

    Returns:
        JSON-ready: ``latency_ms`` (min, median, p90, max, mean), ``repeat``,
        ``warmup`` (the untimed runs made), ``machine`` (this one), for a remote
        model ``board`` (its machine) and ``board_latency_ms``, for a local one
        ``executor`` (``in_use`` and ``why``: what ran the timed runs and why)
        and ``device_ms`` or ``device_ms_why``.

    Raises:
        UmahubError: (before any run) ``trace`` for a model on a board, or for
            one that runs on the VM alone: neither times its steps.
    """
    if repeat < 1:
        raise ValueError(f"repeat must be 1 or more, not {repeat}")
    remote = hasattr(model, "board_seconds")
    if trace is not None:
        _check_traceable(model, remote)
    if hasattr(model, "warm_up"):  # and, under "auto", until the executor is chosen
        warmup = model.warm_up(*arrays, at_least=warmup)
    else:
        for _ in range(warmup):
            model.run(*arrays)
    times, on_board = [], []
    for i in range(repeat):
        start = time.perf_counter()
        model.run(*arrays)
        times.append(time.perf_counter() - start)
        if remote:
            on_board.append(model.board_seconds())
        if progress is not None:
            progress(i + 1, repeat)
    result: dict[str, Any] = {
        "model": str(getattr(model, "path", "") or ""),
        "where": model.board.name if remote else "this machine",
        "repeat": repeat,
        "warmup": warmup,
        "latency_ms": summarize(times),
        "machine": machine_info(),
    }
    if remote:
        result["board_latency_ms"] = summarize(on_board)
        result["board"] = model.board.info
    else:
        result["executor"] = {"in_use": model.executor_in_use, "why": model.executor_why()}
        result.update(_device_times(model, arrays, trace))
    return result


def _check_traceable(model: Any, remote: bool) -> None:
    """Refuse a trace that the run would not give, before the run."""
    if remote:
        raise UmahubError(
            "a trace is for a run here: a board runs the model on TVM's VM, which times no "
            "steps; bench the library on this machine for its trace"
        )
    why = model.step_graph.unsupported
    if why:
        from umahub.runtime.trace import vm_alone

        raise vm_alone(why)


def _device_times(
    model: Any, arrays: Sequence[Any], trace: str | os.PathLike | None = None
) -> dict[str, Any]:
    """Each device's busy milliseconds in the concurrent executor's median run."""
    profiled = model.profile(*arrays, runs=5, trace=trace)
    if profiled.get("executor") != "concurrent":
        return {"device_ms_why": f"runs on the VM: {profiled.get('why', 'one device')}"}
    busy: dict[str, float] = {}
    for span in profiled["spans"]:
        busy[span["lane"]] = busy.get(span["lane"], 0.0) + (span["end"] - span["start"]) * 1e3
    return {"device_ms": busy, "executor_ms": profiled["concurrent_seconds"] * 1e3}
