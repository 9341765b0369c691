"""The gain of ``umahub tune`` on the host-heavy models, and the trial budget it took.

For each model, on the host alone (no plugin: the host's kernels are what is
tuned): compiled without tuning, tuned with MetaSchedule into a fresh
database (``--trials`` candidates in all), compiled with that database; both
timed here (median of ``--repeat`` runs, the VM executor), outputs compared
with a relative error. Each model in its own process.

    python benchmarks/tuning.py bert bert2 --trials 64
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine, median_time

RESULTS = Path(__file__).parent / "results" / "tuning.json"


def one(model: str, trials: int, repeat: int) -> dict:
    import numpy as np

    import umahub
    import umahub.models as zoo
    from umahub.frontends import load_model

    mod = load_model(model)
    plain = umahub.Hub(project_config=False, autoload=False)  # the host alone: its kernels
    before = plain.compile(mod)
    inputs = zoo.inputs(model)
    with tempfile.TemporaryDirectory() as db:
        start = time.perf_counter()
        result = plain.tune(mod, database=db, trials=trials)
        tune_seconds = time.perf_counter() - start
        tuned = umahub.Hub(config={"tuning-database": db}, project_config=False, autoload=False)
        after = tuned.compile(mod)
    ref, out = before.run(*inputs, executor="vm"), after.run(*inputs, executor="vm")
    ref, out = (
        np.asarray(ref if not isinstance(ref, tuple) else ref[0]),
        np.asarray(out if not isinstance(out, tuple) else out[0]),
    )
    error = float(np.abs(out - ref).max() / max(1.0, float(np.abs(ref).max())))
    t_before = median_time(lambda: before.run(*inputs, executor="vm"), repeat=repeat)
    t_after = median_time(lambda: after.run(*inputs, executor="vm"), repeat=repeat)
    return {
        "model": model,
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
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.models[0], args.trials, args.repeat)))
        return
    # runs of other models or budgets are kept: one row per model and budget
    old = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    rows, verdicts = old.get("results", {}), old.get("verdicts", {})
    for model in args.models:
        command = [sys.executable, __file__, model, "--one", "--trials", str(args.trials)]
        command += ["--repeat", str(args.repeat)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        name = f"{model}, budget {args.trials}"
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
