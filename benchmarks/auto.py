"""Placement by cost against every claiming order and every accelerator alone.

For each model, with the three bundled plugins, each placement in a process
of its own (same thread count, ``--threads``, default 2): the six claiming
orders of npu, vanilla_accel and dsp_cpu, each accelerator alone, and
``placement="auto"``. Every compile's model runs with the default executor
(``auto``: the VM or the concurrent executor, whichever it measured faster),
after warm-up runs, median of ``--repeat``. The auto worker starts with an
empty cost cache and compiles twice: the first compile measures the candidate
groups, the second finds them in the cache; both compile times are kept.

    python benchmarks/auto.py [MODEL ...] [--repeat N] [--threads N]

Results: ``results/auto.json``; the table is printed, with auto's latency over
the best of the others (<= 1.0 is what placement by cost promises, up to the
noise of the machine) and the estimate next to the measurement.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import write
from _models import ZOO

ACCELERATORS = ["npu", "vanilla_accel", "dsp_cpu"]
ORDERS = [list(p) for p in itertools.permutations(ACCELERATORS)]

_WORKER = r"""
import json, os, statistics, sys, time, warnings
warnings.simplefilter("ignore")
name, placement, repeat = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
from _models import relax_model
import numpy as np
import umahub
mod, arrays = relax_model(name)
config = {"plugins": ["npu", "vanilla", "dsp"]}
if placement != "auto":
    config["priority"] = placement
hub = umahub.Hub(config=config, project_config=False)
start = time.perf_counter()
compiled = hub.compile(mod, placement="auto" if placement == "auto" else None)
result = {"compile_s": time.perf_counter() - start}
if placement == "auto":
    auto = compiled.report.auto
    result["auto_s"] = sum(auto["seconds"].values())
    result["estimate_ms"] = auto["estimate_ms"]
    result["baselines_ms"] = auto["baselines_ms"]
    result["costs"] = auto["costs"]
    result["changed"] = len(auto["changed"])
    start = time.perf_counter()
    again = umahub.Hub(config=config, project_config=False).compile(mod, placement="auto")
    result["cached_compile_s"] = time.perf_counter() - start
    result["cached_auto_s"] = sum(again.report.auto["seconds"].values())
result["devices"] = compiled.report.devices_of()
for _ in range(6):  # warm up; the auto executor times the VM and the concurrent one
    compiled.run(*arrays)
times = []
for _ in range(repeat):
    t = time.perf_counter()
    compiled.run(*arrays)
    times.append(time.perf_counter() - t)
result["median_ms"] = statistics.median(times) * 1e3
result["min_ms"] = min(times) * 1e3
result["executor"] = compiled.executor_in_use
print(json.dumps(result))
"""


def _name(placement: object) -> str:
    if placement == "auto":
        return "auto"
    assert isinstance(placement, list)
    return " > ".join(placement) if len(placement) > 1 else f"{placement[0]} alone"


def measure(name: str, placement: object, repeat: int, env: dict) -> dict:
    """One placement of one model, in its own process (with an empty cost cache)."""
    with tempfile.TemporaryDirectory(prefix="umahub-auto-") as cache:
        proc = subprocess.run(
            [sys.executable, "-c", _WORKER, name, json.dumps(placement), str(repeat)],
            capture_output=True,
            text=True,
            env=dict(env, UMAHUB_CACHE_DIR=cache),
            check=False,
        )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": tail[:300]}
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=ZOO)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    env = dict(os.environ, TVM_NUM_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads))
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parent), *env.get("PYTHONPATH", "").split(os.pathsep)]
    )
    placements: list[object] = [*ORDERS, *([a] for a in ACCELERATORS), "auto"]
    rows = {}
    for name in args.models:
        row = {_name(p): measure(name, p, args.repeat, env) for p in placements}
        others = {k: v["median_ms"] for k, v in row.items() if k != "auto" and "median_ms" in v}
        auto = row["auto"]
        if others and "median_ms" in auto:
            best = min(others, key=others.get)
            auto["best_other"] = best
            auto["over_best_other"] = auto["median_ms"] / others[best]
            auto["over_priority"] = auto["median_ms"] / others.get(_name(ORDERS[0]), float("nan"))
        # what auto estimated for each of the others, next to what they measured
        for k, v in row.items():
            if k != "auto" and "median_ms" in v:
                key = k if k.endswith(" alone") else f"priority {k}"
                estimate = auto.get("baselines_ms", {}).get(key)
                if estimate is not None:
                    v["estimate_ms"] = estimate
                    v["estimate_over_measured"] = estimate / v["median_ms"]
        if "median_ms" in auto:
            auto["estimate_over_measured"] = auto["estimate_ms"] / auto["median_ms"]
        rows[name] = row
        print(f"{name}:", flush=True)
        for k, v in row.items():
            if "error" in v:
                print(f"  {k:32} failed: {v['error']}", flush=True)
                continue
            extra = ""
            if k == "auto":
                extra = (
                    f"  estimate {v['estimate_ms']:.1f} ms; "
                    f"auto/best {v.get('over_best_other', 0):.2f}"
                    f" ({v.get('best_other')}); compile {v['compile_s']:.0f}s first, "
                    f"{v['cached_compile_s']:.0f}s cached (auto {v['auto_s']:.1f}s / "
                    f"{v['cached_auto_s']:.1f}s)"
                )
            if k != "auto" and "estimate_ms" in v:
                extra = f"  (estimated {v['estimate_ms']:.1f} ms)"
            print(f"  {k:32} {v['median_ms']:8.2f} ms{extra}", flush=True)
    path = write(
        "auto",
        {
            "threads": args.threads,
            "repeat": args.repeat,
            "plugins": ["npu", "vanilla", "dsp"],
            "models": rows,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
