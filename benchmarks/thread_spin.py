"""TVM's thread-pool spin count: TVM's default against the one umahub sets.

An idle worker of TVM's thread pool spins ``TVM_THREAD_POOL_SPIN_COUNT``
turns before it sleeps (see :mod:`umahub.runtime.threadpool`). Each model is compiled
once with the bundled plugins and exported; then, in ``--rounds`` rounds, each
spin count (TVM's 300000, umahub's :data:`umahub.runtime.threadpool.SPIN_COUNT`) and
each executor (``vm``, ``concurrent``, ``auto``: the default, which times both
on the first calls and keeps the faster) is timed in a fresh process: the
median latency of the runs in the 1.5 s after 8 warm-up calls, which is when
the lanes a concurrent run started are still there, and the CPU time the
process took in the 1.5 s after its last call (idle workers spinning). A
configuration's latency is its best round.

    python benchmarks/thread_spin.py [MODEL ...] [--rounds N] [--threads N]

Writes ``benchmarks/results/thread_spin.json``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import run_worker, worker_env, write

from umahub.runtime.threadpool import SPIN_COUNT

SPINS = ["300000", str(SPIN_COUNT)]
EXECUTORS = ["vm", "concurrent", "auto"]

_COMPILE = r"""
import sys, warnings
warnings.simplefilter("ignore")
from _models import relax_model
import umahub
mod, _ = relax_model(sys.argv[1])
hub = umahub.Hub(config={"plugins": ["npu", "vanilla", "dsp"]}, project_config=False)
hub.compile(mod).export_library(sys.argv[2])
print("{}")
"""

_TIME = r"""
import json, statistics, sys, time
from _models import relax_model
import umahub
_, arrays = relax_model(sys.argv[1])
model = umahub.load(sys.argv[2])
model.executor = sys.argv[3]
for _ in range(8):
    model.run(*arrays)
times, end = [], time.perf_counter() + 1.5
while time.perf_counter() < end or len(times) < 10:
    t = time.perf_counter()
    model.run(*arrays)
    times.append(time.perf_counter() - t)
cpu = time.process_time()
time.sleep(1.5)
print(json.dumps({"median_ms": statistics.median(times) * 1e3, "runs": len(times),
                  "idle_cpu_s": time.process_time() - cpu, "chosen": model.executor_in_use}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["resnet18", "mobilenetv2", "bert"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    env = worker_env(args.threads)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="umahub-spin-") as workdir:
        for name in args.models:
            library = str(Path(workdir) / f"{name}.so")
            built = run_worker(_COMPILE, [name, library], env)
            if "error" in built:
                results[name] = {"error": built["error"]}
                print(f"{name}: {built['error']}", flush=True)
                continue
            row: dict[str, dict] = {}
            for _ in range(args.rounds):
                for spin in SPINS:
                    for executor in EXECUTORS:
                        timed = run_worker(
                            _TIME, [name, library, executor],
                            dict(env, TVM_THREAD_POOL_SPIN_COUNT=spin),
                        )  # fmt: skip
                        entry = row.setdefault(f"spin {spin}, {executor}", {"rounds": []})
                        entry["rounds"].append(timed)
            for key, entry in row.items():
                good = [r for r in entry["rounds"] if "median_ms" in r]
                if good:
                    best = min(good, key=lambda r: r["median_ms"])
                    entry.update(median_ms=best["median_ms"], chosen=best["chosen"])
                    entry["idle_cpu_s"] = max(r["idle_cpu_s"] for r in good)
                print(
                    f"{name:20} {key:28} {entry.get('median_ms', float('nan')):8.2f} ms"
                    f"  idle CPU after <= {entry.get('idle_cpu_s', float('nan')):.2f} s"
                    f"  ({entry.get('chosen')})",
                    flush=True,
                )
            results[name] = row
    path = write("thread_spin", {"threads": args.threads, "rounds": args.rounds, "models": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
