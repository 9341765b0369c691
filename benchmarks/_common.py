"""Shared by the benchmarks: the machine's details and the results files."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            cpu = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), ""
            )
    except OSError:
        pass
    versions = {}  # read from the installed metadata: importing torchvision can fail
    for name, dist in (
        ("tvm", "apache-tvm"),
        ("pluggy", "pluggy"),
        ("numpy", "numpy"),
        ("torch", "torch"),
        ("torchvision", "torchvision"),
        ("onnxruntime", "onnxruntime"),
        ("onnx", "onnx"),
        ("transformers", "transformers"),
    ):
        try:
            versions[name] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "cpu": cpu,
        "cpu_kind": cpu_kind(cpu),
        "commit": _commit(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "TVM_NUM_THREADS": os.environ.get("TVM_NUM_THREADS"),
        "versions": versions,
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def cpu_kind(cpu: str | None = None) -> str:
    """``"intel"``, ``"amd"`` or ``"other"``: which kind of machine ``cpu`` (a
    ``/proc/cpuinfo`` model name; default this machine's) is, for results kept
    per kind of machine (``engines_intel.json``, ``engines_amd.json``)."""
    if cpu is None:
        cpu = machine()["cpu"]
    name = cpu.lower()
    return "intel" if "intel" in name else "amd" if "amd" in name else "other"


def _commit() -> str | None:
    """The checkout's commit (``+`` when it has changes), or None outside git."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], capture_output=True, text=True, cwd=root, check=True)
        return done.stdout.strip()

    try:
        head, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "-uno")
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+" if dirty else "")


def add_rounds_option(parser: Any) -> None:
    """``--rounds N`` on a benchmark's ``argparse`` parser (see :func:`fastest`)."""
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="time every engine this many times, round-robin, each in a new process, and "
        "keep each engine's fastest round (a machine shared with other work)",
    )


def fastest(results: list[dict], key: str, kept: dict[str, str]) -> dict:
    """Of one engine's rounds, the one with the lowest ``key`` (the last, an error, when
    every round failed); with several rounds, each field ``f`` of ``kept`` is recorded
    over all of them as ``kept[f]``: a round another job disturbed does not count
    against one engine only."""
    timed = [r for r in results if key in r]
    if not timed:
        return results[-1]
    best = dict(min(timed, key=lambda r: r[key]))
    if len(results) > 1:
        for field, name in kept.items():
            best[name] = [r.get(field) for r in results]
    return best


def median_time(fn: Callable[[], Any], repeat: int = 5, warmup: int = 1) -> float:
    """Median seconds of ``fn()`` over ``repeat`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def ready(compiled: Any, *arrays: Any) -> Callable[[], Any]:
    """``compiled.run(*arrays)`` as a user's later calls run it, to time.

    The default executor, ``"auto"``, chooses how to run a model from its first
    calls, taking turns on each way (the VM on all its threads, on one, the
    concurrent executor): a benchmark timing those calls times the trials, a mix
    of the ways, not the one chosen. So the model runs until it has chosen
    (``warm_up``, as its docstring asks of anything timing a model) first.
    """
    compiled.warm_up(*arrays)
    return lambda: compiled.run(*arrays)


def worker_env(threads: int) -> dict[str, str]:
    """The environment of a worker process: ``threads`` threads for TVM and
    OpenMP, and this directory on the path (``_models``, ``_common``)."""
    env = dict(os.environ, TVM_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parent), *env.get("PYTHONPATH", "").split(os.pathsep)]
    )
    return env


def run_worker(script: str, args: list[str], env: dict, cwd: str | None = None) -> dict:
    """Run ``script`` in a process of its own; its last line of JSON, or
    ``{"error": ...}`` with the last line it wrote to stderr."""
    proc = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, env=env,
        check=False, cwd=cwd,
    )  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": tail[:300]}
    return json.loads(lines[-1])


def write(name: str, data: dict[str, Any]) -> Path:
    """Write ``results/<name>.json`` with the machine's details; return the path."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **data}, indent=2) + "\n")
    return path


#: Seconds between two engines' turns in :func:`interleave`: ONNX Runtime's and TVM's
#: thread pools spin for a while after a run, and would take the cores from the next.
PAUSE_S = 0.3


def serve(run: Callable[[], Any], state: Callable[[], Any] | None = None, **info: Any) -> None:
    """The worker's side of :func:`interleave`: print ``info`` as a ready line, then
    answer each ``time N`` read from stdin with the milliseconds of ``N`` calls of
    ``run`` (after one untimed call: the caches another process used are this one's
    again) until stdin closes. ``state``: what the engine says of itself after each
    round (umahub: how "auto" runs it, which a slow round can change), in the reply."""
    print(json.dumps({"ready": True, **info}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if words[:1] != ["time"]:
            continue
        run()
        times = []
        for _ in range(int(words[1])):
            start = time.perf_counter()
            run()
            times.append((time.perf_counter() - start) * 1e3)
        reply: dict[str, Any] = {"times_ms": times}
        if state is not None:
            reply["state"] = state()
        print(json.dumps(reply), flush=True)


class _Worker:
    """One engine's long-lived process, started by :func:`interleave`."""

    def __init__(self, script: str, args: list[str], env: dict, cwd: str | None) -> None:
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script, *args], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env, cwd=cwd,
        )  # fmt: skip

    def reply(self) -> dict:
        """The worker's next JSON line; ``{"error": ...}`` (its last line on stderr)
        if it ended first."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                return json.loads(line)
        self.proc.wait()
        self.stderr.seek(0)
        tail = (self.stderr.read().strip().splitlines() or ["no output"])[-1]
        return {"error": tail[:300]}

    def ask(self, command: str) -> dict:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # it ended: reply() says why
        return self.reply()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.stderr.close()


def interleave(
    workers: dict[str, tuple[str, list[str], dict]],
    rounds: int,
    repeat: int | dict[str, int],
    cwd: str | None = None,
    rounds_of: dict[str, int] | None = None,
) -> dict[str, dict]:
    """Time several engines in turns, each in a long-lived process of its own.

    ``workers`` maps each engine to ``(script, args, env)``: a Python script that
    loads its model and hands its run function to :func:`serve`. The engines start
    one after the other (a compile is not timed beside another's runs); then in each
    of ``rounds`` rounds every engine in turn runs ``repeat`` calls (per engine, if a
    dict), the order rotating from round to round, with :data:`PAUSE_S` between turns;
    an engine named in ``rounds_of`` takes its turn in that many rounds only, the
    first (a reference whose calls take seconds, timed for information).
    A machine whose speed moves over minutes (another job, a neighbour's) moves
    every engine's rounds alike, where engines timed one after the other each got
    their own period of it.

    Each engine's result: what its ready line said, ``ms`` (the median of its
    rounds' medians), ``round_ms`` (each round's median), ``round_state`` (what the
    engine said of itself after each round, where :func:`serve` was given ``state``)
    and ``min_ms``; or
    ``{"error": ...}``. :func:`paired_ratio` compares two engines round by round.
    """
    started: dict[str, _Worker] = {}
    results: dict[str, dict] = {}
    try:
        for name, (script, args, env) in workers.items():
            worker = _Worker(script, args, env, cwd)
            ready = worker.reply()
            if "error" in ready:
                worker.close()
                results[name] = ready
                continue
            ready.pop("ready", None)
            started[name] = worker
            results[name] = {**ready, "round_ms": [], "min_ms": float("inf")}
        names = list(started)
        for r in range(max(1, rounds) if names else 0):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                if "error" in results[name] or r >= (rounds_of or {}).get(name, rounds):
                    continue
                count = repeat[name] if isinstance(repeat, dict) else repeat
                got = started[name].ask(f"time {count}")
                if "error" in got:
                    results[name] = got
                    continue
                results[name]["round_ms"].append(statistics.median(got["times_ms"]))
                if "state" in got:  # each round's, where the engine reports one
                    results[name].setdefault("round_state", []).append(got["state"])
                results[name]["min_ms"] = min(results[name]["min_ms"], *got["times_ms"])
                time.sleep(PAUSE_S)
    finally:
        for worker in started.values():
            worker.close()
    for result in results.values():
        if result.get("round_ms"):
            result["ms"] = statistics.median(result["round_ms"])
        elif "round_ms" in result:  # started, never timed
            del result["min_ms"]
    return results


def paired_ratio(a: dict, b: dict) -> float | None:
    """The median over rounds of ``a``'s round time over ``b``'s, for two engines of
    one :func:`interleave`: each round's two times were taken minutes apart at most,
    so the machine's slow periods divide out. None unless both have every round."""
    ra, rb = a.get("round_ms") or [], b.get("round_ms") or []
    if not ra or len(ra) != len(rb):
        return None
    return statistics.median(x / y for x, y in zip(ra, rb, strict=True))
