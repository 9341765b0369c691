"""The zoo models: compile time and latency, plain TVM vs umahub vs PyTorch eager.

For each model, in one run on one machine: compile time and run latency
(median of repeated runs after warm-up, numpy in and numpy out for all three
TVM variants) for plain ``tvm.compile``, umahub with
no plugins, umahub with the three bundled plugins, and PyTorch eager where it is
installed; plus umahub's per-stage compile time. ``TVM_NUM_THREADS`` (default
2) is set before TVM is imported and recorded. Results: ``results/zoo.json``.

    python benchmarks/zoo.py [MODEL ...] [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TVM_NUM_THREADS", "2")

import numpy as np
from _common import median_time, ready, write

PRIORITY = ["npu", "vanilla_accel", "dsp_cpu"]
PLUGINS = ["npu", "vanilla", "dsp"]


def plain(name: str, repeat: int) -> dict:
    """Plain tvm.compile on the host."""
    import tvm

    import umahub.models as zoo

    mod, xs = zoo.get(name), zoo.inputs(name)
    start = time.perf_counter()
    ex = tvm.compile(mod, target="llvm")
    compile_s = time.perf_counter() - start
    main = tvm.relax.VirtualMachine(ex, tvm.cpu())["main"]

    def run():  # numpy in, numpy out: what Compiled.run does too
        return main(*[tvm.runtime.tensor(x) for x in xs]).numpy()

    out = run()
    return {"compile_s": compile_s, "run_ms": median_time(run, repeat=repeat) * 1e3, "out": out}


def through_umahub(name: str, plugins: list[str], repeat: int) -> dict:
    """umahub with the given plugins (none: everything on the host)."""
    import umahub
    import umahub.models as zoo

    config = {"plugins": plugins, "priority": PRIORITY if plugins else []}
    hub = umahub.Hub(config=config, autoload=bool(plugins))
    mod, xs = zoo.get(name), zoo.inputs(name)
    start = time.perf_counter()
    compiled = hub.compile(mod)
    compile_s = time.perf_counter() - start
    run = ready(compiled, *xs)  # the first run exports and loads the library
    out = run()
    taken = sum(1 for o in compiled.report.placement if o.device != "host")
    return {
        "compile_s": compile_s,
        "run_ms": median_time(run, repeat=repeat) * 1e3,
        "stages_s": compiled.report.stages,
        "hooks_s": compiled.report.hook_seconds,
        "operators": len(compiled.report.placement),
        "offloaded": taken,
        "fallbacks": sum(1 for p in compiled.report.partitions if p.fallback),
        "out": out,
    }


_TORCH = """
import os, statistics, sys, time
import torch
from umahub.models import torch_zoo
torch.set_num_threads(int(os.environ["TVM_NUM_THREADS"]))
module, inputs = torch_zoo.torch_module(sys.argv[1])
module.eval()
times = []
with torch.no_grad():
    for i in range(int(sys.argv[2]) + 2):
        start = time.perf_counter()
        module(*inputs)
        times.append(time.perf_counter() - start)
print(statistics.median(times[2:]) * 1e3, torch.get_num_threads())
"""


def torch_eager(name: str, repeat: int) -> dict | None:
    """PyTorch eager with the same weights, where torch is installed.

    Measured in a process of its own: TVM's worker threads keep spinning for a
    while after each run and would take the cores from PyTorch's.
    """
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("torch") is None:
        return None
    out = subprocess.run(
        [sys.executable, "-c", _TORCH, name, str(repeat)],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ),
    )
    ms, threads = out.stdout.split()
    return {"run_ms": float(ms), "threads": int(threads)}


def main() -> None:
    import umahub.models as zoo

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=zoo.names())
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rows = {}
    for name in args.models:
        base = plain(name, args.repeat)
        bare = through_umahub(name, [], args.repeat)
        three = through_umahub(name, PLUGINS, args.repeat)
        eager = torch_eager(name, args.repeat)
        reference = base.pop("out")
        scale = max(1.0, float(np.abs(reference).max()))
        for result in (bare, three):
            result["max_error"] = float(np.abs(np.asarray(result.pop("out")) - reference).max())
        rows[name] = {
            "plain_tvm": base,
            "umahub_no_plugins": bare,
            "umahub_three_plugins": three,
            "torch_eager": eager,
            "umahub_overhead_pct": 100
            * (bare["compile_s"] - base["compile_s"])
            / base["compile_s"],
            "speedup_vs_plain": base["run_ms"] / three["run_ms"],
            "output_scale": scale,
        }
        t = f"{eager['run_ms']:.1f}" if eager else "-"
        print(
            f"{name:12} compile plain {base['compile_s']:.2f}s, umahub {bare['compile_s']:.2f}s "
            f"({rows[name]['umahub_overhead_pct']:+.1f}%), 3 plugins {three['compile_s']:.2f}s | "
            f"run plain {base['run_ms']:.1f} ms, 3 plugins {three['run_ms']:.1f} ms "
            f"(x{rows[name]['speedup_vs_plain']:.1f}), torch {t} ms | offloaded "
            f"{three['offloaded']}/{three['operators']}",
            flush=True,
        )
    path = write("zoo", {"models": rows, "priority": PRIORITY})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
