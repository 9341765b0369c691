"""``umahub tune``: a model's kernels searched, measured and judged into the database.

For each kernel (:mod:`umahub.tuning.tasks`, heaviest share of the budget to
the kernels that occur most), candidates are drawn from its space (a host
kernel's: MetaSchedule's, :mod:`umahub.tuning.search`; a partition's: its
plugin's, :mod:`umahub.tuning.partitions`), built as the compile builds it,
and measured in one batch with the
schedule the compile would give it without tuning, on the same runner
(:mod:`umahub.tuning.runners`: all boards of the key at once). The best
candidate and the hook's schedule are then timed again, in turn, three rounds
(the best of many timings is the one the noise favoured most). The verdict
(:func:`umahub.tuning.database.decide`) keeps the tuned schedule only where it
measured faster; a tie keeps the hook's.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tvm

from umahub.errors import warn
from umahub.tuning import partitions, runners, search
from umahub.tuning.database import (
    TuningDatabase,
    TuningError,
    Verdict,
    decide,
    plain,
)
from umahub.tuning.lookup import key_of
from umahub.tuning.tasks import Task, extract

__all__ = ["TuningResult", "tune"]


@dataclass
class TuningResult:
    """What a tuning run did: per kernel its verdict, and where it measured."""

    database: Path
    where: str  # "this machine", "2 boards with key 'x' at tracker h:p"
    trials: int  # candidates measured in all
    budget: int = 0  # the trials asked for
    verdicts: list[Verdict] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)  # how many functions each kernel is
    #: the partitions on accelerators left to their hooks' schedules, and why
    skipped: list[partitions.Skipped] = field(default_factory=list)

    def lines(self) -> list[str]:
        """One line per kernel, then the summary (what ``umahub tune`` prints)."""
        out = [f"{v.name}: {v.used} ({v.why})" for v in self.verdicts]
        out += [f"{s.name}: not tuned ({s.why})" for s in self.skipped]
        tuned = sum(v.used == "tuned" for v in self.verdicts)
        out.append(
            f"{tuned} of {len(self.verdicts)} kernels tuned faster than their schedule, "
            f"{self.trials} trials measured on {self.where} (a budget of {self.budget}: "
            f"candidates that are the same schedule are measured once); database "
            f"{self.database}"
        )
        return out


def _budget(tasks: list[Task], trials: int) -> list[int]:
    """Trials per task: at least one each, the rest by how often the kernel runs."""
    total = sum(t.count for t in tasks)
    spare = max(0, trials - len(tasks))
    return [1 + spare * t.count // total for t in tasks]


def _bar(done: int, total: int, width: int = 20) -> str:
    filled = width * done // max(total, 1)
    return "[" + "#" * filled + "." * (width - filled) + f"] {done}/{total}"


def tune(
    hub: Any,
    mod: Any,
    *,
    database: str | Path,
    trials: int = 64,
    rpc: str | None = None,
    key: str | None = None,
    progress: Callable[[str, str], None] | None = None,
    seed: int = 0,
) -> TuningResult:
    """Tune ``mod``'s host kernels into ``database`` (see the module's docs).

    Raises:
        TuningError: a database that cannot be written, ``rpc`` without ``key``,
            an unreachable tracker, a key with no free board, a trial budget below 1.
    """
    if trials < 1:
        raise TuningError(f"a trial budget of {trials}: give at least 1 (--trials)")
    try:
        import cloudpickle  # noqa: F401
    except ImportError:
        raise TuningError(
            "umahub tune needs the package cloudpickle (TVM's MetaSchedule runners use it): "
            "pip install cloudpickle"
        ) from None
    if (rpc is None) != (key is None):
        raise TuningError("--rpc and --key go together: the tracker and the kind of board")
    db = TuningDatabase(database, create=True)
    measurer = runners.remote(rpc, key) if rpc is not None and key is not None else runners.local()

    def say(stage: str, detail: str) -> None:
        if progress is not None:
            progress(stage, detail)

    tasks, skipped = extract(hub, mod, progress)
    budgets = _budget(tasks, trials)
    result = TuningResult(db.path, measurer.where, 0, trials, skipped=skipped)
    total = sum(budgets)
    with tempfile.TemporaryDirectory(prefix="umahub-tune-") as where:
        for task, budget in zip(tasks, budgets, strict=True):
            space = (
                f", space: {task.space.description}"
                if task.space and task.space.description
                else ""
            )
            say("tune", f"{_bar(result.trials, total)} {task.name} ({task.hook}{space})")
            verdict = _tune_one(task, budget, measurer, where, seed)
            result.trials += verdict.trials
            result.verdicts.append(verdict)
            result.counts.append(task.count)
            db.put(key_of(hub, task.target), task.key, verdict)
            db.save()  # a run stopped half-way keeps what it measured
    say("tune", f"{_bar(total, total)} done on {measurer.where}")
    if not tasks:
        db.save()
    return result


def _tune_one(
    task: Task, budget: int, measurer: runners.Measurer, where: str, seed: int
) -> Verdict:
    from tvm.s_tir import meta_schedule as ms

    failure = ""
    if task.partition is not None:
        drawn, failure = partitions.candidates(task.partition, task.space, budget, seed)
        scheduled = [task.hooked, *((task.partition.named(s.mod["main"]), []) for s in drawn)]
        built, funcs = partitions.build(task.partition, scheduled, where)
        args = [ms.arg_info.ArgInfo.from_prim_func(f) if f is not None else None for f in funcs]
    else:
        # built alone, a kernel is the library's exported function "main"
        mod = tvm.IRModule({"main": task.func.with_attr("global_symbol", "main")})
        drawn = search.candidates(mod, search.tuning_target(task.target), budget, seed)
        hooked = tvm.IRModule({"main": task.hooked.with_attr("global_symbol", "main")})
        mods = [hooked, *(s.mod for s in drawn)]
        built = search.build(mods, task.target, where)
        args = [ms.arg_info.ArgInfo.from_prim_func(m["main"]) for m in mods]
    seconds = measurer.measure(built, args)
    ran = [(s, i) for i, s in enumerate(seconds[1:]) if s is not None]
    best = min(ran) if ran else None
    hook_seconds, tuned_seconds = seconds[0], None
    if best is not None:
        hook_seconds, tuned_seconds = _final(measurer, built, args, 1 + best[1])
    used, why = decide(task.name, task.hook, hook_seconds, tuned_seconds, len(drawn))
    if failure:
        used, why = "hook", f"{failure}; its hooks' schedule is kept"
        warn(f"{task.name}: {why}")
    if best is not None and failure == "" and (drew := search.draws(drawn[best[1]].trace)):
        why += f"; {'it' if used == 'tuned' else 'the best candidate'} drew {drew}"
    trace = script = None
    if best is not None and task.partition is not None:
        script = drawn[best[1]].mod.script()  # a plugin's trace may not be writable
    elif best is not None:
        trace = plain(drawn[best[1]].trace.as_json())
    verdict = Verdict(task.name, task.hook, hook_seconds, tuned_seconds, len(drawn), used, why)
    verdict.trace, verdict.script = trace, script
    return verdict


#: Rounds of the final comparison: the hook's schedule and the best candidate, in turn.
FINAL_ROUNDS = 3


def _final(
    measurer: runners.Measurer, built: list[Any], args: list[Any], best: int
) -> tuple[float | None, float | None]:
    """The hook's schedule and the best candidate measured again, in turn: their medians.

    The best of many candidates, each timed once, is the one the noise favoured
    most (on a busy machine a kernel's time varies by 2x and more from one
    moment to the next): judged on that timing against the hook's single one,
    a candidate no faster than the hook would win. Timed again, alternately
    with the hook's schedule, it is compared on equal terms.
    """
    pair = [built[0], built[best]] * FINAL_ROUNDS
    seconds = measurer.measure(pair, [args[0], args[best]] * FINAL_ROUNDS)

    def median(values: list[float | None]) -> float | None:
        ran = sorted(v for v in values if v is not None)
        return ran[len(ran) // 2] if len(ran) == len(values) else None

    return median(seconds[0::2]), median(seconds[1::2])


def check_database(path: str | Path | None) -> Path:
    """The database directory to tune into: ``path``, else an error saying how to name one."""
    if not path:
        raise TuningError(
            "no tuning database: give --database DIR, or set tuning-database in [tool.umahub]"
        )
    return Path(path)
