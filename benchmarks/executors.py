"""The default executor against the VM, on an idle machine and beside a busy neighbour.

``executor = "auto"`` is what every user gets; it must never be slower than the
VM by more than the noise (issue 34). For each model, compiled once with the
bundled plugins and their default priority and exported, every figure is
taken in a process of its own that loads the library (``umahub.load``):

* ``vm``: ``executor="vm"``;
* ``concurrent``: ``executor="concurrent"``;
* ``auto``: the default, timed only after ``warm_up`` (auto has chosen), with
  the executor it chose and why (``executor_why()``: ``why`` the last round's,
  ``whys`` every round's); the timed calls include auto's checks of its choice.

Each under two conditions: ``idle`` (this benchmark alone) and ``busy``: a
CPU-bound neighbour process (a Python loop, one core's worth) started before
the worker, so that auto also makes its choice beside it, as on a shared
machine; and under each thread setting of ``--settings`` (default: all three):

* ``default``: nothing set: umahub's pool, one thread per physical core
  (``umahub.runtime.threadpool.start_pool``; before 0b08e28, TVM's own, half
  the logical CPUs on x86: one thread on a two-vCPU machine);
* ``pool2``: ``OMP_NUM_THREADS=2``, which TVM reads for its pool's size: a pool
  of two threads that "auto" may run on one (what a machine of four or more
  cores gets by default);
* ``tvm2``: ``TVM_NUM_THREADS=2``, set by the user: "auto" keeps it.

``--rounds N`` runs the whole set N times, round-robin, and keeps each
figure's median over the rounds.

**The verdict is paired, in one process.** A process's VM runs at one of two
speeds and keeps it for all its calls (up to 1.7x apart, cause unknown), so
figures from separate processes differ by more than what auto adds. The
``auto`` worker therefore also times, after its own calls, ``--pairs``
triples of blocks of :data:`BLOCK` calls each: the VM asked for
(``executor="vm"``), the default, the VM again. Each triple gives auto's
block median over the mean of the two VM blocks around it, and the VM's
second block over its first: the VM against itself, the noise of one such
comparison. A figure's verdict: ``auto`` is "not slower" when the median of
its ratios over every round's triples is at most 1 plus the noise, the
median distance from 1 of the VM's own ratios (at least 2%). The figures of
separate processes and their old verdict (auto's median against the VM's
plus the spread of the VM's rounds) are kept beside it
(``across_processes``).

Models: the zoo's resnet18, mobilenetv2 and bert, the int8 mobilenetv2 and
resnet18, and torchvision's mobilenet_v3_small and efficientnet_b0 (random
weights; squeeze-and-excitation blocks) when PyTorch is installed.

    python benchmarks/executors.py [MODEL ...] [--repeat N] [--rounds N] [--pairs N]
                                   [--settings ...]

Writes benchmarks/results/executors.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from _common import run_worker, worker_env, write

MODELS = [
    "resnet18",
    "mobilenetv2",
    "bert",
    "mobilenetv2_int8",
    "resnet18_int8",
    "mobilenet_v3_small",
    "efficientnet_b0",
]
EXECUTORS = ["vm", "concurrent", "auto"]
#: Calls in each block of a triple (see the docstring); a block's median is kept.
BLOCK = 3
CONDITIONS = ["idle", "busy"]
#: Each thread setting's environment (see the docstring).
SETTINGS = {
    "default": {},
    "pool2": {"OMP_NUM_THREADS": "2"},
    "tvm2": {"TVM_NUM_THREADS": "2", "OMP_NUM_THREADS": "2"},
}
PLUGINS = {"plugins": ["npu", "vanilla", "dsp"]}

_COMPILE = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
import numpy as np
import umahub
from _models import relax_model
name, path, PLUGINS = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
mod, arrays = relax_model(name)
hub = umahub.Hub(config=PLUGINS, project_config=False)
compiled = hub.compile(mod)
compiled.export_library(path)
np.savez(path + ".inputs.npz", *arrays)
print(json.dumps({"devices": compiled.devices}))
"""

_RUN = r"""
import json, statistics, sys, time
import numpy as np
import umahub
path, executor, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
pairs, block = int(sys.argv[4]), int(sys.argv[5])
with np.load(path + ".inputs.npz") as f:
    arrays = [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]
model = umahub.load(path)
kw = {} if executor == "auto" else {"executor": executor}
model.warm_up(*arrays, at_least=2, **kw)

def timed(calls, **how):
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        model.run(*arrays, **how)
        times.append(time.perf_counter() - start)
    return times

times = timed(repeat, **kw)
triples = []
if executor == "auto":  # the default against the VM asked for, in this process
    for _ in range(pairs):
        vm = {"executor": "vm"}
        before, auto, after = (statistics.median(timed(block, **how)) for how in (vm, {}, vm))
        triples.append([before * 1e3, auto * 1e3, after * 1e3])
print(json.dumps({
    "median_ms": statistics.median(times) * 1e3,
    "min_ms": min(times) * 1e3,
    "triples_ms": triples,
    "in_use": model.executor_in_use,
    "why": model.executor_why(None if executor == "auto" else executor),
}))
"""

_NEIGHBOUR = "while True:\n    pass\n"


def _available(name: str) -> bool:
    import umahub.models as zoo

    if name in zoo.names():
        return True
    try:
        import torchvision  # noqa: F401
    except Exception:
        return False
    return True


def verdict(vm_rounds: list[float], auto_rounds: list[float]) -> dict:
    """``auto`` against the VM across processes: the medians over the rounds, the
    noise, and "not slower" when auto's median is within the VM's plus the noise
    (the spread of the VM's rounds, or 5% with one round; at least 2%)."""
    vm, auto = statistics.median(vm_rounds), statistics.median(auto_rounds)
    noise = (max(vm_rounds) - min(vm_rounds)) if len(vm_rounds) > 1 else 0.05 * vm
    noise = max(noise, 0.02 * vm)
    return {
        "auto_over_vm": auto / vm,
        "noise_ms": noise,
        "verdict": "not slower" if auto <= vm + noise else "slower",
    }


def paired_verdict(triples: list[list[float]]) -> dict:
    """``auto`` against the VM in the same processes, from ``[vm, auto, vm]`` block
    medians: the median of auto over the mean of the VM around it, the noise (the
    median distance from 1 of the second VM block over the first; at least 2%),
    and "not slower" when the ratio is at most 1 plus the noise."""
    ratios = [auto / ((before + after) / 2) for before, auto, after in triples]
    noise = max(0.02, statistics.median(abs(after / before - 1) for before, _, after in triples))
    ratio = statistics.median(ratios)
    return {
        "auto_over_vm": ratio,
        "noise": noise,
        "triples": len(triples),
        "verdict": "not slower" if ratio <= 1 + noise else "slower",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=MODELS)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--pairs", type=int, default=10, help="triples of blocks per auto process (docstring)"
    )
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    args = parser.parse_args()
    env = worker_env(1)
    for name in ("TVM_NUM_THREADS", "OMP_NUM_THREADS"):
        env.pop(name)
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="umahub-executors-") as workdir:
        libraries = {}
        for name in args.models:
            if not _available(name):
                rows[name] = {"skipped": "needs torchvision"}
                continue
            path = os.path.join(workdir, f"{name}.so")
            built = run_worker(_COMPILE, [name, path, json.dumps(PLUGINS)], env, cwd=workdir)
            if "error" in built:
                rows[name] = {"error": built["error"]}
                continue
            libraries[name] = path
            rows[name] = {"devices": built["devices"]}
        results: dict[tuple[str, str, str], list[dict]] = {}
        for _ in range(max(1, args.rounds)):
            for name, path in libraries.items():
                for condition in [f"{c} {s}" for s in args.settings for c in CONDITIONS]:
                    neighbour = None
                    if condition.startswith("busy"):
                        neighbour = subprocess.Popen([sys.executable, "-c", _NEIGHBOUR])
                    setting = dict(env, **SETTINGS[condition.split()[1]])
                    try:
                        for executor in EXECUTORS:
                            got = run_worker(
                                _RUN,
                                [path, executor, str(args.repeat), str(args.pairs), str(BLOCK)],
                                setting,
                            )
                            results.setdefault((name, condition, executor), []).append(got)
                    finally:
                        if neighbour is not None:
                            neighbour.kill()
                            neighbour.wait()
        for name in libraries:
            for condition in [f"{c} {s}" for s in args.settings for c in CONDITIONS]:
                cell: dict = {}
                for executor in EXECUTORS:
                    runs = results[(name, condition, executor)]
                    timed = [r["median_ms"] for r in runs if "median_ms" in r]
                    if not timed:
                        cell[executor] = {"error": runs[-1].get("error", "no run")}
                        continue
                    cell[executor] = {"median_ms": statistics.median(timed), "rounds_ms": timed}
                    if executor == "auto":
                        cell[executor]["chosen"] = [r["in_use"] for r in runs if "in_use" in r]
                        cell[executor]["why"] = runs[-1].get("why", "")
                        cell[executor]["whys"] = [r["why"] for r in runs if "why" in r]
                runs = results[(name, condition, "auto")]
                triples = [t for r in runs for t in r.get("triples_ms", [])]
                if all("rounds_ms" in cell[e] for e in ("vm", "auto")):
                    across = verdict(cell["vm"]["rounds_ms"], cell["auto"]["rounds_ms"])
                    cell["across_processes"] = across
                    cell.update(paired_verdict(triples) if triples else across)
                rows[name][condition] = cell
                shown = "  ".join(
                    f"{e} {cell[e]['median_ms']:7.2f} ms" if "median_ms" in cell[e] else f"{e} -"
                    for e in EXECUTORS
                )
                chosen = ",".join(cell.get("auto", {}).get("chosen", []))
                print(
                    f"{name:20} {condition:13} {shown}  auto chose {chosen or '-'}  "
                    f"auto/VM {cell.get('auto_over_vm', float('nan')):.3f}  "
                    f"{cell.get('verdict', '')}",
                    flush=True,
                )
    path = write(
        "executors",
        {
            "settings": {s: SETTINGS[s] for s in args.settings},
            "repeat": args.repeat,
            "rounds": args.rounds,
            "pairs": args.pairs,
            "block": BLOCK,
            "neighbour": "busy: one Python process in a busy loop (one core's worth) from "
            "before the worker starts until it ends",
            "models": rows,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
