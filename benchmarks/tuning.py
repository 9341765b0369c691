"""The gain of ``umahub tune`` on the host-heavy models, and the trial budget it took.

For each model (the zoo's, or torchvision's with random weights), by default
on the host alone (no plugin: the host's kernels are what is tuned), or with
the plugins of ``--plugins`` (their partitions are tuned too where a plugin
offers a search space, as the npu does): compiled without tuning, tuned with
MetaSchedule into a fresh database (``--trials`` candidates in all), compiled
with that database; both timed here, in turn (``--repeat`` runs each, in
rounds of alternating calls, the median of each; the VM executor), outputs
compared with a relative error. Each model in its own process.

    python benchmarks/tuning.py bert bert2 --trials 64
    python benchmarks/tuning.py vit_b_16 resnet18 --plugins npu --trials 128
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine, median_time

RESULTS = Path(__file__).parent / "results" / "tuning.json"


def _hub(plugins: list[str], **config) -> Any:
    import umahub

    if not plugins:  # the host alone: its kernels
        return umahub.Hub(config=config or None, project_config=False, autoload=False)
    return umahub.Hub(config={"plugins": plugins, **config}, project_config=False)


def one(model: str, trials: int, repeat: int, plugins: list[str]) -> dict:
    import numpy as np
    from _models import relax_model

    mod, inputs = relax_model(model)
    before = _hub(plugins).compile(mod)
    with tempfile.TemporaryDirectory() as db:
        start = time.perf_counter()
        result = _hub(plugins).tune(mod, database=db, trials=trials)
        tune_seconds = time.perf_counter() - start
        after = _hub(plugins, **{"tuning-database": db}).compile(mod)
    ref, out = before.run(*inputs, executor="vm"), after.run(*inputs, executor="vm")
    ref, out = (
        np.asarray(ref if not isinstance(ref, tuple) else ref[0]),
        np.asarray(out if not isinstance(out, tuple) else out[0]),
    )
    error = float(np.abs(out - ref).max() / max(1.0, float(np.abs(ref).max())))
    t_before, t_after = [], []
    for _ in range(repeat):  # in turn: a load that comes and goes touches both alike
        for fn, times in ((before, t_before), (after, t_after)):
            times.append(median_time(lambda fn=fn: fn.run(*inputs, executor="vm"), 1, 0))
    t_before, t_after = statistics.median(t_before), statistics.median(t_after)
    return {
        "model": model,
        "plugins": plugins,
        "partitions_tuned": sum(v.used == "tuned" and " on " in v.name for v in result.verdicts),
        "partitions_not_tuned": [f"{s.name}: {s.why}" for s in result.skipped],
        "trials": result.trials,
        "tune_seconds": round(tune_seconds, 1),
        "kernels": len(result.verdicts),
        "tuned": sum(v.used == "tuned" for v in result.verdicts),
        "verdicts": [f"{v.name}: {v.used} ({v.why})" for v in result.verdicts],
        "host_schedules_after": after.report.host_schedules,
        "ms_before": round(t_before * 1e3, 3),
        "ms_after": round(t_after * 1e3, 3),
        "gain": round(t_before / t_after, 3),
        "relative_error": error,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument(
        "--plugins", nargs="*", default=[], help="plugins to compile with (default: none)"
    )
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.models[0], args.trials, args.repeat, args.plugins)))
        return
    # runs of other models or budgets are kept: one row per model and budget
    old = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    rows, verdicts = old.get("results", {}), old.get("verdicts", {})
    for model in args.models:
        command = [sys.executable, __file__, model, "--one", "--trials", str(args.trials)]
        command += ["--repeat", str(args.repeat), "--plugins", *args.plugins]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        name = f"{model}, budget {args.trials}"
        if args.plugins:
            name += f", plugins {' '.join(args.plugins)}"
        verdicts[name] = row.pop("verdicts")
        row["host_schedules_after"] = ", ".join(
            f"{how} {n}" for how, n in row["host_schedules_after"].items()
        )
        rows[name] = row
        print(
            f"{model}: {row['ms_before']} -> {row['ms_after']} ms ({row['gain']}x), "
            f"{row['tuned']}/{row['kernels']} kernels tuned, {row['trials']} trials, "
            f"{row['tune_seconds']} s, error {row['relative_error']:.1e}",
            flush=True,
        )
    data = {"machine": machine(), "results": rows, "verdicts": verdicts}
    RESULTS.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
