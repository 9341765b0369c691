"""Where the candidates are measured: MetaSchedule's runners, on this machine or a farm.

``--rpc HOST:PORT --key KEY`` measures on the boards of a TVM tracker with
MetaSchedule's ``RPCRunner``, one session per free board of the key at once
(a farm of eight boards measures eight candidates at a time); without it,
``LocalRunner`` measures here. Before the first build the tracker is asked
whether it answers and how many boards of the key are free: an unreachable
tracker, an unknown key or a key with no free board is a
:class:`~umahub.tuning.database.TuningError` naming it and what to do.
"""

from __future__ import annotations

import socket
import statistics
from dataclasses import dataclass
from typing import Any

from umahub.tuning.database import TuningError

__all__ = ["Measurer", "check_farm", "local", "remote"]

_TRACKER = "python -m tvm.exec.rpc_tracker --host 0.0.0.0 --port PORT"
_BOARD = "python -m umahub.boards.board --tracker HOST:PORT --key KEY"


def _evaluator() -> Any:
    from tvm.s_tir import meta_schedule as ms

    # 5 timings of at least 10 ms each; the median of them is the kernel's time
    return ms.runner.EvaluatorConfig(
        number=1, repeat=5, min_repeat_ms=10, enable_cpu_cache_flush=False
    )


@dataclass
class Measurer:
    """A MetaSchedule runner and where it measures (for messages)."""

    runner: Any
    where: str
    workers: int

    def measure(self, built: list[tuple[str | None, str]], args: list[Any]) -> list[float | None]:
        """The median seconds of each built library (None: not built, or it failed to run)."""
        from tvm.s_tir import meta_schedule as ms

        inputs = [
            ms.runner.RunnerInput(path, "cpu", info)
            for (path, _), info in zip(built, args, strict=True)
            if path is not None
        ]
        futures = iter(self.runner.run(inputs)) if inputs else iter(())
        seconds: list[float | None] = []
        for path, _ in built:
            if path is None:
                seconds.append(None)
                continue
            result = next(futures).result()
            if result.error_msg or not result.run_secs:
                seconds.append(None)
            else:
                seconds.append(statistics.median(float(s) for s in result.run_secs))
        return seconds


def local() -> Measurer:
    """Measure on this machine (MetaSchedule's ``LocalRunner``).

    Its workers time the kernels with the thread pool a compiled model runs
    with (:mod:`umahub.runtime.threadpool`): idle workers that spin briefly, and
    as many threads (one per physical core unless the user chose). With TVM's
    default spin, a schedule of many short parallel loops measures fast alone
    and is slow in the model, whose pool sleeps between them; with TVM's count
    of threads (one on a 2-vCPU VM), a schedule would be chosen for one thread
    and run on two.
    """
    from tvm.s_tir import meta_schedule as ms

    from umahub.runtime.threadpool import spin_briefly, start_pool

    spin_briefly()  # before the workers start: they take it from the environment
    runner = ms.runner.LocalRunner(evaluator_config=_evaluator(), initializer=start_pool)
    return Measurer(runner, "this machine", 1)


def _free_boards(host: str, port: int, key: str, timeout: float) -> int:
    from tvm import rpc

    where = f"tracker {host}:{port}"
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        raise TuningError(
            f"{where} does not answer ({exc.strerror or exc}); start it with `{_TRACKER}` "
            "or fix --rpc"
        ) from None
    try:
        session = rpc.connect_tracker(host, port)
        summary = session.summary()
        session.close()
    except Exception as exc:
        raise TuningError(
            f"{host}:{port} does not answer as a TVM tracker ({type(exc).__name__}); check --rpc"
        ) from None
    queues = summary.get("queue_info", {})
    if key not in queues:
        known = ", ".join(sorted(queues)) or "none"
        raise TuningError(
            f"{where} has no board with key '{key}' (keys: {known}); start one with "
            f"`{_BOARD}` or use one of those keys"
        )
    free = int(queues[key].get("free", 0))
    if free == 0:
        raise TuningError(
            f"{where}: every board with key '{key}' is busy ({queues[key].get('pending', 0)} "
            "requests waiting); tune when one is free, or add boards"
        )
    return free


def check_farm(rpc: str | None, key: str | None, timeout: float = 10.0) -> tuple[str, int, int]:
    """(host, port, free boards) of the tracker ``rpc`` for ``key``; a :class:`TuningError`
    naming what is wrong: ``rpc`` without ``key``, a tracker that does not answer, a key
    with no board or none free."""
    from umahub.boards.rpc import RemoteError, parse_address

    if not rpc or not key:
        raise TuningError("--rpc and --key go together: the tracker and the kind of board")
    try:
        host, port = parse_address(rpc, "--rpc")
    except RemoteError as exc:
        raise TuningError(str(exc)) from None
    return host, port, _free_boards(host, port, key, timeout)


def remote(rpc: str, key: str, timeout: float = 60.0) -> Measurer:
    """Measure on every free board of ``key`` at the tracker ``rpc`` (``HOST:PORT``)."""
    from tvm.s_tir import meta_schedule as ms

    host, port, boards = check_farm(rpc, key, min(timeout, 10.0))
    config = ms.runner.RPCConfig(
        tracker_host=host, tracker_port=port, tracker_key=key, session_timeout_sec=int(timeout)
    )
    runner = ms.runner.RPCRunner(config, evaluator_config=_evaluator(), max_workers=boards)
    plural = "s" if boards != 1 else ""
    return Measurer(
        runner, f"{boards} board{plural} with key '{key}' at tracker {host}:{port}", boards
    )
