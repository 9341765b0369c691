"""Placement by cost against every claiming order and every accelerator alone.

For each model, with the three bundled plugins (same thread count for all,
``--threads``, default 2), ten placements: the six claiming orders of npu,
vanilla_accel and dsp_cpu, each accelerator alone, and ``placement="auto"``.

1. **Compile**, each placement in a process of its own, the library exported.
   The auto process starts with an empty cost cache and compiles twice: the
   first compile measures the candidate groups, the second finds them in the
   cache; both compile times are kept, with auto's estimates of every other
   placement. Auto's ``estimate_ms`` is that of the placement it built: its
   choice's (``choice_estimate_ms``), or, when the knockout kept a contender
   (``finalists.kept``), that contender's.
2. **Time**, in ``--rounds`` rounds (default 5), each round every library in a
   fresh process (``umahub.load``, the default executor: the VM or the
   concurrent one, whichever it measures faster, after warm-up runs), median
   of ``--repeat`` runs (fewer for a slow one: about 3 s, at least 3 runs); a
   placement's latency is its best round. Rounds
   interleave the placements, each round in its own shuffled order, so that a
   load on the machine that comes and goes touches them all alike.

    python benchmarks/auto.py [MODEL ...] [--repeat N] [--rounds N] [--threads N]
                              [--only PLACEMENT ...]

``--only auto`` (or any placements by the table's names: ``"npu > dsp_cpu >
vanilla_accel"``, ``"npu alone"``) compiles and times those alone: auto's
estimates next to its measurement, in a fraction of the time, with no
comparison against the others; its results go to ``results/auto-only.json``,
never over the full run's.

Results: ``results/auto.json``; the table is printed, with auto's latency over
the best of the others and auto's worst ratio, round by round, against any
other placement (placement by cost promises <= 1.0, up to the noise of the
machine; see :func:`compare`; five rounds or more are needed to call auto
worse), and each estimate next to its measurement.
``--summarize`` recomputes the comparison of ``results/auto.json`` without
running anything, and prints the table of the results (the benchmarks page has it too).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from _common import RESULTS, run_worker, worker_env, write
from _models import ZOO

from umahub.auto.finalists import SIGNIFICANCE, slower_by_chance

ACCELERATORS = ["npu", "vanilla_accel", "dsp_cpu"]
ORDERS = [list(p) for p in itertools.permutations(ACCELERATORS)]

_COMPILE = r"""
import hashlib, json, sys, time, warnings
warnings.simplefilter("ignore")
name, placement, library = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
from _models import relax_model
import umahub
mod, arrays = relax_model(name)
config = {"plugins": ["npu", "vanilla", "dsp"]}
if placement != "auto":
    config["priority"] = placement
hub = umahub.Hub(config=config, project_config=False)
start = time.perf_counter()
compiled = hub.compile(mod, placement="auto" if placement == "auto" else None)
result = {"compile_s": time.perf_counter() - start, "devices": compiled.report.devices_of()}
where = json.dumps([(op.name, op.op, op.device) for op in compiled.report.placement])
result["placement_id"] = hashlib.sha1(where.encode()).hexdigest()[:12]
if placement == "auto":
    auto = compiled.report.auto
    kept = (auto.get("finalists") or {}).get("kept", "auto")
    result.update(
        auto_s=sum(auto["seconds"].values()),
        # the estimate of what was built: the choice's, or the contender's that the knockout kept
        estimate_ms=auto["estimate_ms"] if kept == "auto" else auto["baselines_ms"][kept],
        choice_estimate_ms=auto["estimate_ms"],
        baselines_ms=auto["baselines_ms"],
        costs=auto["costs"],
        changed=len(auto["changed"]),
        finalists=auto.get("finalists"),
    )
    start = time.perf_counter()
    again = umahub.Hub(config=config, project_config=False).compile(mod, placement="auto")
    result["cached_compile_s"] = time.perf_counter() - start
    result["cached_auto_s"] = sum(again.report.auto["seconds"].values())
compiled.export_library(library)
print(json.dumps(result))
"""

_TIME = r"""
import json, statistics, sys, time
name, library, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
from _models import relax_model
import umahub
_, arrays = relax_model(name)
model = umahub.load(library)
model.warm_up(*arrays)  # until the auto executor has chosen between the VM and the concurrent one
t = time.perf_counter()
model.run(*arrays)
repeat = min(repeat, max(3, int(3.0 / (time.perf_counter() - t))))  # a slow one: 3 s or 3 runs
times = []
for _ in range(repeat):
    t = time.perf_counter()
    model.run(*arrays)
    times.append(time.perf_counter() - t)
print(json.dumps({"median_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3,
                  "executor": model.executor_in_use}))
"""


def _name(placement: object) -> str:
    if placement == "auto":
        return "auto"
    assert isinstance(placement, list)
    return " > ".join(placement) if len(placement) > 1 else f"{placement[0]} alone"


def bench(name: str, args: argparse.Namespace, env: dict, workdir: Path) -> dict:
    """The ten placements of one model: compiled, then timed in interleaved rounds."""
    placements: list[object] = [*ORDERS, *([a] for a in ACCELERATORS), "auto"]
    if args.only:
        placements = [p for p in placements if _name(p) in args.only]
    row: dict[str, dict] = {}
    libraries: dict[str, str] = {}
    for p in placements:
        library = str(workdir / f"{name}.{len(libraries)}.so")
        with tempfile.TemporaryDirectory(prefix="umahub-auto-cache-") as cache:
            result = run_worker(
                _COMPILE, [name, json.dumps(p), library], dict(env, UMAHUB_CACHE_DIR=cache)
            )
        row[_name(p)] = result
        if "error" not in result:
            libraries[_name(p)] = library
    shuffle = random.Random(name)  # the same orders in every run of this model
    for _ in range(args.rounds):
        order = list(libraries.items())
        shuffle.shuffle(order)  # no placement always next to the same neighbours in time
        for key, library in order:
            timed = run_worker(_TIME, [name, library, str(args.repeat)], env)
            entry = row[key]
            if "error" in timed:
                entry.setdefault("errors", []).append(timed["error"])
                continue
            entry.setdefault("rounds_ms", []).append(timed["median_ms"])
            entry["median_ms"] = min(entry["rounds_ms"])
            entry.setdefault("executors", []).append(timed["executor"])  # each round's choice
            entry["executor"] = timed["executor"]
    if "auto" in row:  # rows of several sittings (--append): each says when and from what
        row["auto"]["run"] = {"when": time.strftime("%Y-%m-%d %H:%M %Z"), "commit": _commit()}
    return compare(row)


def _commit() -> str:
    """The commit measured, ``-dirty`` when the code differs from it (the
    results this run writes as it goes do not count)."""
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str:
        proc = subprocess.run(["git", *args], capture_output=True, text=True, check=False, cwd=here)
        return proc.stdout.strip()

    commit = git("describe", "--always") or "unknown"
    changed = git(
        "status", "--porcelain", "--untracked-files=no", "--",
        ":(top)", ":(top,exclude)benchmarks/results",
    )  # fmt: skip
    return f"{commit}-dirty" if changed else commit


def _key_of(starting_point: str) -> str:
    """The benchmark's name of a starting point of auto's (``"priority a > b"`` -> ``"a > b"``)."""
    return starting_point.removeprefix("priority ")


#: The verdicts of auto against another placement, from the best to the worst.
VERDICTS = ("not worse", "the same placement", "within the noise", "worse")


def _same_placement(a: dict, b: dict) -> bool:
    """Whether two placements of a model put every operator on the same device
    (rows measured before ``placement_id`` was kept: the same operator count
    on every device)."""
    if "placement_id" in a and "placement_id" in b:
        return a["placement_id"] == b["placement_id"]
    return bool(a.get("devices")) and a.get("devices") == b.get("devices")


def _ratios(a: dict, b: dict) -> list[float]:
    """``a``'s time over ``b``'s in each round (none when a round failed for one of them)."""
    ra, rb = a.get("rounds_ms", []), b.get("rounds_ms", [])
    if not ra or len(ra) != len(rb):
        return []
    return [x / y for x, y in zip(ra, rb)]


def _paired(a: dict, b: dict) -> float | None:
    """The median over the rounds of ``a``'s time over ``b``'s in the same round."""
    ratios = _ratios(a, b)
    return statistics.median(ratios) if ratios else None


def compare(row: dict) -> dict:
    """Auto against the others of one model's row: each estimate next to its
    measurement, the best other placement, the ratios, and what they mean.

    Every placement is timed once per round, the rounds interleaving them, so
    auto is judged against each other placement by the median over the rounds
    of their ratio in the same round (``paired``): a load on the machine that
    comes and goes touches both sides of a ratio alike, where a best round can
    come from a quiet moment one placement had alone.

    ``noise``: the largest paired ratio between two *other* placements that
    place every operator alike (two builds of one placement, each timed in its
    own processes): a ratio above 1 by less than that is the machine's, not
    the placement's. A ratio above that is still the machine's unless the
    rounds show it (``chance``, :func:`slower_by_chance`, under
    :data:`SIGNIFICANCE`): on a machine whose load moves a round by 20%, two
    builds that ran next to each other can agree within 2% and say little of
    two placements timed seconds apart. The verdict is auto's worst against
    any other placement: not worse, the same placement (auto built what that
    placement builds), within the noise, or worse.
    """
    if "auto" not in row:  # --only without auto: nothing to compare with
        return row
    auto = row["auto"]
    for key, v in row.items():  # auto's estimate of each placement, next to its measurement
        est = auto.get("estimate_ms") if key == "auto" else None
        if key != "auto":
            est = auto.get("baselines_ms", {}).get(
                key if key.endswith(" alone") else f"priority {key}"
            )
        if est is not None and "median_ms" in v:
            v["estimate_ms"], v["estimate_over_measured"] = est, est / v["median_ms"]
    others = {k: v for k, v in row.items() if k != "auto" and "median_ms" in v}
    if not others or "median_ms" not in auto:
        return row
    best = min(others, key=lambda k: others[k]["median_ms"])
    auto["best_other"] = best
    auto["over_best_other"] = auto["median_ms"] / others[best]["median_ms"]
    auto["over_priority"] = auto["median_ms"] / others.get(_name(ORDERS[0]), {}).get(
        "median_ms", float("nan")
    )
    auto["noise"] = max(
        [abs(r - 1) for p, q in itertools.combinations(others.values(), 2)
         if _same_placement(p, q) and (r := _paired(p, q)) is not None],
        default=0.0,
    )  # fmt: skip
    judged = {}
    for key, v in others.items():
        ratios = _ratios(auto, v)
        ratio = statistics.median(ratios) if ratios else auto["median_ms"] / v["median_ms"]
        chance = slower_by_chance(ratios) if ratios else 1.0
        if ratio <= 1.0:
            verdict = "not worse"
        elif _same_placement(auto, v):
            verdict = "the same placement"
        elif ratio <= 1.0 + auto["noise"] or chance >= SIGNIFICANCE:
            verdict = "within the noise"
        else:
            verdict = "worse"
        judged[key] = {"paired": ratio, "chance": chance, "verdict": verdict}
    worst = max(judged, key=lambda k: (VERDICTS.index(judged[k]["verdict"]), judged[k]["paired"]))
    auto["paired"] = {k: j["paired"] for k, j in judged.items()}
    auto["chance"] = {k: j["chance"] for k, j in judged.items()}
    auto["against"], auto["verdict"] = worst, judged[worst]["verdict"]
    return row


def _short(key: str) -> str:
    return key.replace("vanilla_accel", "vanilla").replace("dsp_cpu", "dsp")


def markdown(models: dict[str, dict]) -> str:
    """The table of ``results/auto.json``'s models, one row each."""
    lines = [
        "| model | auto | best of the 6 orders and 3 alone | auto / best | worst by rounds"
        " (against) | chance | noise | verdict | auto kept | auto's estimate |"
        " compile, first / cached | measured at |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in models.items():
        a = row.get("auto", {})
        if "verdict" not in a:
            continue
        best, against = a["best_other"], a["against"]
        kept = (a.get("finalists") or {}).get("kept", "auto")
        kept = "its choice" if kept == "auto" else _short(_key_of(kept))
        lines.append(
            f"| {name} | {a['median_ms']:.2f} ms | {row[best]['median_ms']:.2f} ms"
            f" ({_short(best)}) | {a['over_best_other']:.2f} | {a['paired'][against]:.3f}"
            f" ({_short(against)}) | {a.get('chance', {}).get(against, 1.0):.2f}"
            f" | {a['noise']:.1%} | {a['verdict']} | {kept} | {a['estimate_ms']:.1f} ms"
            f" | {a['compile_s']:.0f} s / {a['cached_compile_s']:.0f} s"
            f" | `{a.get('run', {}).get('commit', '?')}` |"
        )
    return "\n".join(lines)


def _print(name: str, row: dict) -> None:
    print(f"{name}:", flush=True)
    for k, v in row.items():
        if "median_ms" not in v:
            print(f"  {k:32} failed: {v.get('error') or v.get('errors')}", flush=True)
            continue
        extra = (
            f"  (estimated {v['estimate_ms']:.1f} ms, {v['estimate_over_measured']:.2f}x)"
            if "estimate_ms" in v
            else ""
        )
        if k == "auto" and "verdict" in v:
            against = v.get("against")
            extra += (
                f"; auto/best {v.get('over_best_other', 0):.2f} ({v.get('best_other')});"
                f" worst against {against}: {v.get('paired', {}).get(against, 0):.3f} by round"
                f" (noise {v.get('noise', 0):.1%}, chance"
                f" {v.get('chance', {}).get(against, 1.0):.2f}): {v.get('verdict')};"
                f" compile {v['compile_s']:.0f}s first, {v['cached_compile_s']:.0f}s "
                f"cached (auto {v['auto_s']:.1f}s / {v['cached_auto_s']:.1f}s)"
            )
        print(f"  {k:32} {v['median_ms']:8.2f} ms{extra}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=ZOO)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="PLACEMENT",
        help='only these placements ("auto", "npu > dsp_cpu > vanilla_accel", "npu alone"); '
        "results in results/auto-only.json",
    )
    parser.add_argument(
        "--append",
        action="store_true",
        help="keep the models already in results/auto.json (a run in several sittings)",
    )
    parser.add_argument(
        "--summarize",
        action="store_true",
        help="recompute the comparisons of results/auto.json and print them; run nothing",
    )
    args = parser.parse_args()
    names = {_name(p) for p in [*ORDERS, *([a] for a in ACCELERATORS), "auto"]}
    if unknown := set(args.only or ()) - names:
        parser.error(f"--only: no placement {sorted(unknown)}; the placements: {sorted(names)}")
    if args.summarize:
        path = RESULTS / "auto.json"
        data = json.loads(path.read_text())  # the machine and versions it was measured with
        for name, row in data["models"].items():
            _print(name, compare(row))
        print(markdown(data["models"]))
        path.write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {path}")
        return
    env = worker_env(args.threads)
    rows = {}
    result = "auto-only" if args.only else "auto"
    previous = RESULTS / f"{result}.json"
    if args.append and previous.exists():
        rows.update(json.loads(previous.read_text()).get("models", {}))
    with tempfile.TemporaryDirectory(prefix="umahub-auto-") as workdir:
        for name in args.models:
            rows[name] = row = bench(name, args, env, Path(workdir))
            _print(name, row)
            path = write(  # after every model: a long run stopped keeps what it measured
                result,
                {
                    "threads": args.threads,
                    "repeat": args.repeat,
                    "rounds": args.rounds,
                    "plugins": ["npu", "vanilla", "dsp"],
                    "models": rows,
                },
            )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
