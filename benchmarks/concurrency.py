"""Sequential (TVM's Relax VM) against concurrent (a worker per device) on this machine.

Three models, each compiled once with the bundled plugins and run both ways:

* ``npu+host``: two independent branches, matmuls on the npu (async copies, a
  DMA lane) and host code on the host, joined on the host;
* ``dsp0+dsp1``: two elementwise branches, one on each DSP core (C code,
  sync copies), joined on the host: kernels of microseconds;
* ``pipeline``: two stages, the npu's matmuls and then host code: a stream of
  inputs through ``Compiled.stream`` against one ``run`` after the other;
* ``resnet18``: the zoo model through the three plugins, a chain whose
  partitions alternate between the npu and the vanilla accelerator: nothing
  to overlap within an inference, which shows what the executor costs.
* ``balanced``: issue 34's two balanced branches, a chain of elementwise
  operators on 1x64x128x128 tensors on ``dsp_cpu:0`` and the same on
  ``dsp_cpu:1`` (the DSP's TCM enlarged for it), joined on the host: each
  branch alone (the model without the other branch), both on the VM, both
  concurrently, and the floor: the two branches alone in two processes at
  once. The bound: concurrent <= 1.2 x the slower branch alone + 0.5 ms.
  Each figure in a process of its own, the four alternated in rounds; each
  round says how many cores other processes kept busy.

Latency is the median of single inferences, the two executors timed
alternately; throughput is inferences per second over a stream. Each of
``--repeat`` rounds also measures how many cores other processes kept busy
meanwhile (``/proc/stat``): the figures kept are those of the quietest round,
with the medians of all rounds next to them. The measured timeline of one concurrent inference
(``Compiled.profile``) is written next to the timeline estimate of the
report, to compare the overlap measured with the overlap estimated.

    python benchmarks/concurrency.py [--quick]

Writes benchmarks/results/concurrency.json. The machine has 2 cores, and other
work (another compile) may run on the second one during a measurement: the
concurrent executor needs both, the VM one, so such rounds understate it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "1")  # one thread per kernel, both executors

import numpy as np
from tvm import relax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, write

import umahub
import umahub.models as zoo
from umahub._tvm import TensorType
from umahub.report.picture.timeline import timeline
from umahub.runtime.choosing import AUTO_TRIAL_CALLS

PLUGINS = {"plugins": ["npu", "vanilla", "dsp"]}


def _const(rng, shape):
    return relax.const((rng.standard_normal(shape) / np.sqrt(shape[0])).astype("float32"))


def npu_and_host(n: int, npu_layers: int, host_rank: int, host_layers: int, seed=0):
    """x (n x n) -> [npu: npu_layers matmuls] + [host: host_layers low-rank products, tanh]."""
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((n, n), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = x
            for i in range(npu_layers):
                a = bb.emit(relax.op.matmul(a, _const(rng, (n, n))), name_hint=f"npu{i}")
            b = x
            for i in range(host_layers):
                low = bb.emit(relax.op.matmul(b, _const(rng, (n, host_rank))), name_hint=f"hd{i}")
                up = bb.emit(relax.op.matmul(low, _const(rng, (host_rank, n))), name_hint=f"hu{i}")
                b = bb.emit(relax.op.tanh(up), name_hint=f"ht{i}")
            out = bb.emit_output(relax.op.add(a, b), name_hint="out")
        bb.emit_func_output(out)
    pins = {f"npu{i}": "npu" for i in range(npu_layers)}
    pins.update({f"h{k}{i}": "host" for i in range(host_layers) for k in "du"})
    return bb.get(), {**pins, "out": "host"}


def two_stages(n: int, npu_layers: int, host_rank: int, host_layers: int, seed=1):
    """x -> [npu: matmuls] -> [host: low-rank products, tanh]: a two-stage pipeline."""
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((n, n), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for i in range(npu_layers):
                h = bb.emit(relax.op.matmul(h, _const(rng, (n, n))), name_hint=f"npu{i}")
            for i in range(host_layers):
                low = bb.emit(relax.op.matmul(h, _const(rng, (n, host_rank))), name_hint=f"hd{i}")
                up = bb.emit(relax.op.matmul(low, _const(rng, (host_rank, n))), name_hint=f"hu{i}")
                h = bb.emit(relax.op.tanh(up), name_hint=f"ht{i}")
            out = bb.emit_output(h, name_hint="out")
        bb.emit_func_output(out)
    pins = {f"npu{i}": "npu" for i in range(npu_layers)}
    pins.update({f"h{k}{i}": "host" for i in range(host_layers) for k in "du"})
    return bb.get(), pins


def dsp_branches(shape=(16, 64), layers=3, seed=2, cores=(0, 1)):
    """x -> [dsp_cpu:0: add, multiply ...] + [dsp_cpu:1: the same] -> add on the host; a
    branch left out of ``cores`` is x itself (the same join, the same constants drawn)."""
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType(shape, "float32"))
    pins = {}
    with bb.function("main", [x]):
        with bb.dataflow():
            ends = []
            for core in (0, 1):
                h = x
                for i in range(layers):
                    c = relax.const(rng.standard_normal(shape).astype("float32"))
                    if core in cores:
                        op = (relax.op.add, relax.op.multiply)[i % 2]
                        h = bb.emit(op(h, c), name_hint=f"d{core}_{i}")
                        pins[f"d{core}_{i}"] = f"dsp_cpu:{core}"
                ends.append(h)
            out = bb.emit_output(relax.op.add(*ends), name_hint="out")
        bb.emit_func_output(out)
    return bb.get(), {**pins, "out": "host"}


def latencies(compiled, x, runs: int) -> tuple[float, float]:
    """Median seconds of one inference, (VM, concurrent), timed alternately so that other
    work on the machine weighs on both alike."""
    times: dict[str, list[float]] = {"vm": [], "concurrent": []}
    for executor in times:
        compiled.run(x, executor=executor)
    for _ in range(runs):
        for executor, got in times.items():
            start = time.perf_counter()
            compiled.run(x, executor=executor)
            got.append(time.perf_counter() - start)
    return statistics.median(times["vm"]), statistics.median(times["concurrent"])


def throughput(compiled, xs, executor: str) -> float:
    """Inferences per second over the stream ``xs``."""
    start = time.perf_counter()
    count = sum(1 for _ in compiled.stream(xs, executor=executor))
    return count / (time.perf_counter() - start)


def _busy_jiffies() -> int:
    with open("/proc/stat") as f:
        user, nice, system, idle, iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    return user + nice + system + irq + softirq + steal


class OtherLoad:
    """How many cores other processes kept busy while the block ran (from /proc/stat)."""

    def __enter__(self):
        self.start, self.wall, self.own = _busy_jiffies(), time.perf_counter(), sum(os.times()[:2])
        return self

    def __exit__(self, *exc):
        hz = os.sysconf("SC_CLK_TCK")
        busy = (_busy_jiffies() - self.start) / hz
        own = sum(os.times()[:2]) - self.own
        self.cores = max(0.0, (busy - own) / (time.perf_counter() - self.wall))
        return False


def lane_busy(spans) -> dict[str, float]:
    busy: dict[str, float] = {}
    for s in spans:
        busy[s["lane"]] = busy.get(s["lane"], 0.0) + s["end"] - s["start"]
    return busy


def estimate(report) -> dict[str, float]:
    """The timeline estimate: its length and the sum of its compute spans (the sequential time)."""
    spans = timeline(report)
    end = max(s.end for s in spans)
    compute = sum(s.end - s.start for s in spans if not s.label.startswith("copy "))
    return {"estimate_seconds": end, "estimate_compute_seconds": compute}


def measure(name, mod, pins, runs, repeat, stream_len):
    config = {**PLUGINS, "priority": ["npu", "vanilla_accel", "dsp_cpu"]}
    hub = umahub.Hub(config=config, project_config=False)
    compiled = hub.compile(mod, placement=pins)
    assert compiled.step_graph.unsupported == "", compiled.step_graph.unsupported
    x = umahub.runtime.compiled.example_inputs(compiled.input_info)[0]
    for _ in range(AUTO_TRIAL_CALLS):
        compiled.run(x)  # auto times both executors and keeps the faster
    auto = compiled.executor_in_use
    assert np.array_equal(compiled.run(x, executor="vm"), compiled.run(x, executor="concurrent"))
    rounds = []
    xs = [x] * stream_len
    for _ in range(repeat):
        with OtherLoad() as load:
            vm, concurrent = latencies(compiled, x, runs)
            r = {"vm_latency": vm, "concurrent_latency": concurrent}
            r["vm_throughput"] = throughput(compiled, xs, "vm")
            r["concurrent_throughput"] = throughput(compiled, xs, "concurrent")
        r["latency_ratio"] = r["vm_latency"] / r["concurrent_latency"]
        r["throughput_ratio"] = r["concurrent_throughput"] / r["vm_throughput"]
        r["other_load_cores"] = load.cores
        rounds.append(r)
    # the round in which other processes used the least CPU: what the machine can do
    quiet = min(rounds, key=lambda r: r["other_load_cores"])
    result = {k: quiet[k] for k in quiet}
    result["median_of_rounds"] = {k: statistics.median(r[k] for r in rounds) for k in quiet}
    profile = compiled.profile(x, runs=runs)
    busy = lane_busy(profile["spans"])
    result.update(
        {
            "auto_chose": auto,
            "rounds": rounds,
            "steps": len(compiled.step_graph.steps),
            "lanes": profile["lanes"],
            "measured_lane_busy_seconds": busy,
            "measured_seconds": profile["concurrent_seconds"],
            # the overlap: how much of the busy time ran side by side
            "measured_overlap": sum(busy.values()) / profile["concurrent_seconds"],
            "measured_spans": profile["spans"],
            **estimate(compiled.report),
        }
    )
    result["estimated_overlap"] = (
        result["estimate_compute_seconds"] / result["estimate_seconds"]
        if result["estimate_seconds"]
        else 0.0
    )
    print(
        f"{name:10s} latency vm {result['vm_latency'] * 1e3:8.2f} ms  concurrent "
        f"{result['concurrent_latency'] * 1e3:8.2f} ms  x{result['latency_ratio']:.2f}   "
        f"throughput vm {result['vm_throughput']:7.1f}/s  concurrent "
        f"{result['concurrent_throughput']:7.1f}/s  x{result['throughput_ratio']:.2f}   "
        f"busy {', '.join(f'{k} {v * 1e3:.1f}ms' for k, v in busy.items())}   auto: {auto}   "
        f"others used {result['other_load_cores']:.2f} cores"
    )
    return result


BALANCED_SHAPE = (1, 64, 128, 128)
BALANCED_LAYERS = 12
#: The bound of issue 34: concurrent <= FACTOR x the slower branch alone + SLACK seconds.
BOUND_FACTOR, BOUND_SLACK = 1.2, 0.5e-3

_BALANCED_WORKER = r"""
import json, os, statistics, sys, time
import numpy as np
import umahub
path, executor, runs, at = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
model = umahub.load(path)
x = umahub.runtime.compiled.example_inputs(model.input_info)[0]
for _ in range(3):
    out = model.run(x, executor=executor)
while time.time() < at:  # two processes start timing together
    time.sleep(0.001)
hz = os.sysconf("SC_CLK_TCK")
def busy():
    with open("/proc/stat") as f:
        v = list(map(int, f.readline().split()[1:9]))
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / hz
b, own, wall = busy(), sum(os.times()[:2]), time.perf_counter()
times = []
for _ in range(runs):
    start = time.perf_counter()
    model.run(x, executor=executor)
    times.append(time.perf_counter() - start)
wall = time.perf_counter() - wall
own = sum(os.times()[:2]) - own
other = max(0.0, (busy() - b - own) / wall)
np.save(path + f".{executor}.npy", out)
print(json.dumps({"seconds": statistics.median(times), "min": min(times), "other_load_cores": other,
                  "load1": os.getloadavg()[0]}))
"""


def balanced(layers: int = BALANCED_LAYERS, cores=(0, 1), seed=3):
    """:func:`dsp_branches` on 1x64x128x128 tensors: issue 34's balanced branches."""
    return dsp_branches(BALANCED_SHAPE, layers, seed, cores)


def measure_balanced(runs: int, repeat: int, workdir: Path) -> dict:
    """Issue 34's balanced branches: alone, both on the VM, both concurrent, the floor."""
    import subprocess

    import umahub_dsp
    from _common import worker_env

    # 4 MiB tensors: the TCM (and a match's budget) made big enough to hold them
    umahub_dsp.MATCH_BUDGET = umahub_dsp.TCM_BYTES = 1 << 30
    hub = umahub.Hub(config={"plugins": ["dsp"]}, project_config=False)
    libs = {}
    for name, cores in (("both", (0, 1)), ("alone0", (0,)), ("alone1", (1,))):
        mod, pins = balanced(cores=cores)
        compiled = hub.compile(mod, placement=pins)
        libs[name] = str(workdir / f"balanced_{name}.so")
        compiled.export_library(libs[name])
    env = worker_env(1)

    def start(name, executor, at):
        return subprocess.Popen(
            [sys.executable, "-c", _BALANCED_WORKER, libs[name], executor, str(runs), str(at)],
            stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip

    def result(proc):
        out, _ = proc.communicate()
        return json.loads(out.strip().splitlines()[-1])

    rounds = []
    for _ in range(repeat):
        r = {}
        for key, name, executor in (
            ("alone0", "alone0", "vm"),
            ("alone1", "alone1", "vm"),
            ("vm", "both", "vm"),
            ("concurrent", "both", "concurrent"),
        ):
            r[key] = result(start(name, executor, 0.0))
        at = time.time() + 3.0  # both processes loaded and warm by then
        pair = [start("alone0", "vm", at), start("alone1", "vm", at)]
        r["floor"] = [result(p) for p in pair]
        r["other_load_cores"] = max(
            [r[k]["other_load_cores"] for k in ("alone0", "alone1", "vm", "concurrent")]
            + [f["other_load_cores"] for f in r["floor"]]
        )
        slower = max(r["alone0"]["seconds"], r["alone1"]["seconds"])
        r["bound_seconds"] = BOUND_FACTOR * slower + BOUND_SLACK
        r["floor_seconds"] = max(f["seconds"] for f in r["floor"])
        r["within_bound"] = r["concurrent"]["seconds"] <= r["bound_seconds"]
        rounds.append(r)
        print(
            f"balanced   alone {r['alone0']['seconds'] * 1e3:6.2f} / "
            f"{r['alone1']['seconds'] * 1e3:6.2f} ms  vm {r['vm']['seconds'] * 1e3:6.2f} ms  "
            f"concurrent {r['concurrent']['seconds'] * 1e3:6.2f} ms  "
            f"(bound {r['bound_seconds'] * 1e3:6.2f}, floor of two processes "
            f"{r['floor_seconds'] * 1e3:6.2f})  others used {r['other_load_cores']:.2f} cores"
        )
    vm_out = np.load(libs["both"] + ".vm.npy")
    concurrent_out = np.load(libs["both"] + ".concurrent.npy")
    quiet = min(rounds, key=lambda r: r["other_load_cores"])
    return {
        "model": f"{BALANCED_LAYERS} elementwise operators per branch on "
        f"{'x'.join(map(str, BALANCED_SHAPE))} float32, branch k on dsp_cpu:k, joined by an add "
        "on the host; a branch alone is the model with the other branch replaced by x",
        "bound": f"concurrent <= {BOUND_FACTOR} x slower branch alone + {BOUND_SLACK * 1e3} ms",
        "outputs_identical": bool(np.array_equal(vm_out, concurrent_out)),
        "quietest_round": quiet,
        "within_bound_in_quietest_round": quiet["within_bound"],
        "rounds": rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per figure (median)")
    parser.add_argument(
        "--only", choices=["balanced"], help="measure only this case (others keep their results)"
    )
    args = parser.parse_args()
    if args.only == "balanced":
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            case = measure_balanced(15, args.repeat, Path(tmp))
        old = json.loads((RESULTS / "concurrency.json").read_text())
        old.pop("machine", None)
        old["results"]["balanced"] = case
        print(f"wrote {write('concurrency', old)}")
        return
    runs, stream_len = (5, 10) if args.quick else (15, 40)
    results = {
        "npu+host": measure(
            "npu+host", *npu_and_host(256, 18, 24, 3), runs, args.repeat, stream_len
        ),
        "dsp0+dsp1": measure("dsp0+dsp1", *dsp_branches(), runs, args.repeat, stream_len),
        "pipeline": measure("pipeline", *two_stages(256, 18, 24, 3), runs, args.repeat, stream_len),
    }
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        results["balanced"] = measure_balanced(runs, args.repeat, Path(tmp))
    if not args.quick:
        runs_zoo, len_zoo = max(3, runs // 3), max(4, stream_len // 4)
        results["resnet18"] = measure(
            "resnet18", zoo.get("resnet18"), None, runs_zoo, args.repeat, len_zoo
        )
    path = write(
        "concurrency",
        {
            "note": (
                "2 cores; other work (another compile) may have run during some rounds: "
                "each figure is from the round with the least other load "
                "(other_load_cores), medians of all rounds in median_of_rounds"
            ),
            "repeat": args.repeat,
            "runs": runs,
            "stream_length": stream_len,
            "results": results,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
