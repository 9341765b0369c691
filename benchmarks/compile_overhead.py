"""umahub's own compile cost: the same model through umahub (no plugins) vs plain tvm.compile.

Target (issue 3): umahub's overhead under 5% of compile time. Each model is
compiled alternately by both, several times, and the medians compared; the
time of umahub's own stages (plan, partition, memory, devices) and of hook
dispatch per stage (with the three bundled plugins) is reported too.
Results: ``results/compile_overhead.json``.
"""

from __future__ import annotations

import os
import statistics
import time

os.environ.setdefault("TVM_NUM_THREADS", "2")

from _common import write

MODELS = ("mlp", "cnn", "resnet18", "bert")


def main() -> None:
    import tvm

    import umahub
    import umahub.models as zoo

    bare = umahub.Hub(autoload=False)
    three = umahub.Hub(
        config={
            "plugins": ["npu", "vanilla", "dsp"],
            "priority": ["npu", "vanilla_accel", "dsp_cpu"],
        }
    )
    rows = {}
    for name in MODELS:
        mod = zoo.get(name)
        plain_s, umahub_s, own_s = [], [], []
        for _ in range(3):
            start = time.perf_counter()
            tvm.compile(mod, target="llvm")
            plain_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            compiled = bare.compile(mod)
            umahub_s.append(time.perf_counter() - start)
            own_s.append(
                sum(v for k, v in compiled.report.stages.items() if k not in ("build", "load"))
            )
        with_plugins = three.compile(mod)
        plain, ours = statistics.median(plain_s), statistics.median(umahub_s)
        rows[name] = {
            "plain_tvm_s": plain,
            "umahub_no_plugins_s": ours,
            "overhead_pct": 100 * (ours - plain) / plain,
            "umahub_own_stages_s": statistics.median(own_s),
            "own_stages_pct": 100 * statistics.median(own_s) / plain,
            "three_plugins": {
                "stages_s": with_plugins.report.stages,
                "hook_dispatch_s": with_plugins.report.hook_seconds,
            },
        }
        print(
            f"{name:10} plain {plain:.2f}s, umahub {ours:.2f}s "
            f"({rows[name]['overhead_pct']:+.1f}%); "
            f"umahub's own stages {rows[name]['umahub_own_stages_s'] * 1e3:.0f} ms "
            f"({rows[name]['own_stages_pct']:.1f}%); hooks with 3 plugins: "
            + ", ".join(
                f"{k} {v * 1e3:.0f} ms" for k, v in with_plugins.report.hook_seconds.items()
            ),
            flush=True,
        )
    path = write("compile_overhead", {"models": rows, "target_overhead_pct": 5})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
