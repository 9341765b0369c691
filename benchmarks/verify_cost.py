"""What ``verify = true`` costs: compile time with and without verification.

Each zoo model is compiled through the three bundled plugins, alternately
without and with ``verify``, and the medians compared; the time of the verify
stage itself is reported too, with the largest error it found per model.
Results: ``results/verify_cost.json``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import warnings

os.environ.setdefault("TVM_NUM_THREADS", "2")

from _common import write

MODELS = ("mlp", "cnn", "mobilenetv2", "resnet18", "bert")


def main(models: list[str]) -> None:
    import umahub
    import umahub.models as zoo

    hub = umahub.Hub(
        config={
            "plugins": ["npu", "vanilla", "dsp"],
            "priority": ["npu", "vanilla_accel", "dsp_cpu"],
        },
        project_config=False,
    )
    rows = {}
    for name in models:
        mod = zoo.get(name)
        off, on, stage = [], [], []
        for _ in range(3):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                start = time.perf_counter()
                hub.compile(mod)
                off.append(time.perf_counter() - start)
                start = time.perf_counter()
                compiled = hub.compile(mod, verify=True)
                on.append(time.perf_counter() - start)
            stage.append(compiled.report.stages.get("verify", 0.0))
        errors = [p.max_error for p in compiled.report.partitions if p.max_error is not None]
        rows[name] = {
            "compile_s": statistics.median(off),
            "compile_verify_s": statistics.median(on),
            "verify_stage_s": statistics.median(stage),
            "added_pct": 100
            * (statistics.median(on) - statistics.median(off))
            / statistics.median(off),
            "partitions": len(compiled.report.partitions),
            "verified": len(errors),
            "largest_error": max(errors, default=None),
            "fell_back": [p.symbol for p in compiled.report.partitions if p.fallback],
        }
        r = rows[name]
        print(
            f"{name:12} compile {r['compile_s']:.2f}s, with verify {r['compile_verify_s']:.2f}s "
            f"({r['added_pct']:+.0f}%; verify stage {r['verify_stage_s']:.2f}s), "
            f"{r['verified']}/{r['partitions']} partitions verified, largest error "
            f"{r['largest_error']}",
            flush=True,
        )
    path = write("verify_cost", {"models": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:] or list(MODELS))
