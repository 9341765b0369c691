"""The simnpu's pipeline: cycles per layer with double buffering on and off, and the
simulator's own speed.

For each quantized zoo model (``cnn_int8``, ``resnet18_int8``), compiled twice with
every quantized operator on the simnpu, ``[tool.umahub.options.simnpu]
double-buffering`` true then false:

* per layer (partition): the simulated cycles of one run of its program, both ways,
  the cycles it would take with no overlap at all (every module's busy cycles
  added: the in-order machine of format version 1), the ratio single / double, and
  the on-chip buffers' use;
* the outputs of both compiles against the host's (the integers must be equal: the
  check is exact, a relative error of 0);
* the simulator's speed: simulated cycles per second of this machine's time, from
  the wall time of each partition's call in a profiled run (which includes the
  crossing into the runtime: the figure is a floor).

The cycles are the simulator's cycle model (deterministic, the same on any
machine); only the speed is a measurement. Results: ``results/simnpu_pipeline.json``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("TVM_NUM_THREADS", "1")

import numpy as np
from _common import write

MODELS = ("cnn_int8", "resnet18_int8")


def _hub(double: bool):
    import umahub_simnpu

    import umahub

    config = {
        "on-error": "error",
        "priority": ["simnpu"],
        "options": {"simnpu": {"double-buffering": double}},
    }
    return umahub.Hub(config=config, autoload=False, plugins=[umahub_simnpu], project_config=False)


def _host(mod, xs):
    import umahub

    return umahub.Hub(autoload=False, plugins=[], project_config=False).compile(mod).run(*xs)


def measure(name: str, runs: int) -> dict:
    """One model: both compiles, per-layer cycles, exactness, the simulator's speed."""
    import umahub.models as zoo

    mod, xs = zoo.get(name), zoo.inputs(name)
    want = _host(mod, xs)
    compiled = {}
    for double in (True, False):
        start = time.perf_counter()
        compiled[double] = _hub(double).compile(mod)
        compile_s = time.perf_counter() - start
        got = compiled[double].run(*xs)
        if not np.array_equal(got, want):
            raise SystemExit(f"{name}: double-buffering={double} differs from the host")
        print(f"{name} double-buffering={double}: compiled in {compile_s:.1f}s, exact")
    on, off = (compiled[d].report.partitions for d in (True, False))
    layer_of = {
        o.partition: o.name
        for o in compiled[True].report.placement
        if o.op in ("relax.nn.conv2d", "relax.matmul")
    }
    layers = []
    for p, q in zip(on, off):
        layers.append(
            {
                "layer": layer_of.get(p.symbol, p.symbol),
                "partition": p.symbol,
                "patterns": list(p.patterns),
                "cycles_double": p.program["cycles"],
                "cycles_single": q.program["cycles"],
                "cycles_serial": p.program["serial_cycles"],
                "single_over_double": round(q.program["cycles"] / p.program["cycles"], 3),
                "serial_over_double": round(p.program["serial_cycles"] / p.program["cycles"], 3),
                "busy": p.program["busy"],
                "buffers_double": p.buffers,
                "buffers_single": q.buffers,
                "tiling": p.schedule[0].split(";")[0],
            }
        )
    total = {key: sum(layer[key] for layer in layers) for key in
             ("cycles_double", "cycles_single", "cycles_serial")}  # fmt: skip
    # the simulator's own speed: cycles of each call over the wall time the host saw
    measured = compiled[True].profile(*xs, runs=runs)
    seconds: dict[str, list[float]] = {}
    for span in measured["spans"]:
        if span["kind"] == "compute":
            seconds.setdefault(span["label"], []).append(span["end"] - span["start"])
    wall = sum(statistics.median(seconds[p.symbol]) for p in on if p.symbol in seconds)
    return {
        "layers": layers,
        "total": total,
        "total_single_over_double": round(total["cycles_single"] / total["cycles_double"], 3),
        "total_serial_over_double": round(total["cycles_serial"] / total["cycles_double"], 3),
        "outputs_equal_to_host": True,
        "device_wall_seconds_per_inference": wall,
        "simulated_cycles_per_second": round(total["cycles_double"] / wall) if wall else None,
    }


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    results = {name: measure(name, runs) for name in MODELS}
    for name, r in results.items():
        print(f"\n{name}: {r['total']} -> single/double {r['total_single_over_double']}x, "
              f"serial/double {r['total_serial_over_double']}x; simulator "
              f"{r['simulated_cycles_per_second']:,} cycles/s")  # fmt: skip
        for layer in r["layers"]:
            print(f"  {layer['layer'][:28]:<28} {layer['cycles_double']:>10,} "
                  f"{layer['cycles_single']:>10,} {layer['cycles_serial']:>10,} "
                  f"{layer['single_over_double']:>6}x")  # fmt: skip
    path = write("simnpu_pipeline", {"clock_hz": 1e9, "runs": runs, "models": results})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
