"""The host's functions of outside models: each one's schedule rule and its time.

For each outside model (:mod:`_outside`), in a process of its own: compiled by
umahub with the default settings a user gets (the installed plugins, the
default configuration), the host's part as :func:`umahub.host.lowering.lower_host`
left it; every host PrimFunc then built alone and timed on random inputs
(TVM's ``time_evaluator``, ``TVM_NUM_THREADS`` threads), times the number of
calls ``main`` makes of it. What dominates a model, and under which rule
(:func:`umahub.host.schedules.default_schedule`), is the top of each list.
``--host-only``: no plugins, every operator on the host. Results:
``results/host_functions.json``.

    python benchmarks/host_functions.py [MODEL ...] [--host-only] [--top N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

os.environ.setdefault("TVM_NUM_THREADS", "2")

from _common import run_worker, worker_env, write

_WORKER = """
import json, sys
sys.argv = sys.argv[1:]
from host_functions import measure
print(json.dumps(measure(sys.argv[0], sys.argv[1] == "host-only")))
"""


def _calls(mod) -> dict[str, int]:
    """How many times the Relax functions of ``mod`` call each PrimFunc."""
    import tvm
    from tvm import relax

    calls: dict[str, int] = {}

    def visit(node) -> None:
        if isinstance(node, relax.Call):
            for arg in node.args:
                if isinstance(arg, tvm.ir.GlobalVar):
                    calls[arg.name_hint] = calls.get(arg.name_hint, 0) + 1

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return calls


def _random_args(func, rng) -> list | None:
    """Random tensors for ``func``'s buffers; None when a shape is not static."""
    import numpy as np
    import tvm

    from umahub.plugin.compat import param_buffers

    args = []
    for buf in param_buffers(func):
        if buf is None:
            return None
        try:
            shape = [int(d) for d in buf.shape]
        except TypeError:
            return None
        dtype = str(buf.dtype)
        if dtype.startswith("float"):
            value = rng.standard_normal(shape).astype(dtype)
        else:
            value = np.zeros(shape, dtype)
        args.append(tvm.runtime.tensor(value))
    return args


def time_functions(mod, functions: dict[str, str], target) -> list[dict]:
    """Each PrimFunc of ``mod`` built alone and timed: name, rule, calls, ms per call."""
    import numpy as np
    import tvm

    calls = _calls(mod)
    rng = np.random.default_rng(0)
    rows = []
    for gv, func in mod.functions.items():
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        name = gv.name_hint
        row = {"name": name, "rule": functions.get(name, "?"), "calls": calls.get(name, 0)}
        args = _random_args(func, rng)
        if args is None:
            rows.append({**row, "ms": None, "why": "shapes not static"})
            continue
        try:
            lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                              target=target)  # fmt: skip
            timer = lib.jit().time_evaluator(
                "main", tvm.cpu(), number=1, repeat=3, min_repeat_ms=20
            )
            ms = float(np.median(timer(*args).results)) * 1e3
        except Exception as exc:  # a function that does not build or run alone
            rows.append({**row, "ms": None, "why": f"{type(exc).__name__}: {str(exc)[:120]}"})
            continue
        rows.append({**row, "ms": ms})
    rows.sort(key=lambda r: -(r["ms"] or 0) * max(1, r["calls"]))
    return rows


def measure(name: str, host_only: bool) -> dict:
    """The host's functions of outside model ``name``, timed (see the module doc)."""
    import tvm
    from _outside import relax_of

    import umahub
    import umahub.compiler.stages.build as build

    mod, _, _ = relax_of(name)
    kept: dict = {}
    lower = build.lower_host

    def keep(hub, host, target=None):
        kept["mod"], kept["functions"] = lower(hub, host, target)
        kept["target"] = target
        return kept["mod"], kept["functions"]

    build.lower_host = keep
    hub = (
        umahub.Hub(config={"plugins": [], "priority": []}, autoload=False)
        if host_only
        else umahub.Hub()
    )
    compiled = hub.compile(mod)
    target = kept["target"] or tvm.target.Target(build.HOST_TARGET)
    rows = time_functions(kept["mod"], kept["functions"], target)
    total = sum((r["ms"] or 0) * max(1, r["calls"]) for r in rows)
    by_rule: dict[str, float] = {}
    for r in rows:
        by_rule[r["rule"]] = by_rule.get(r["rule"], 0.0) + (r["ms"] or 0) * max(1, r["calls"])
    return {
        "host_ms": total,
        "by_rule_ms": dict(sorted(by_rule.items(), key=lambda kv: -kv[1])),
        "unscheduled": compiled.report.host_unscheduled,
        "functions": rows,
    }


def main() -> None:
    from _outside import MODELS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(MODELS))
    parser.add_argument("--host-only", action="store_true", help="no plugins")
    parser.add_argument("--top", type=int, default=5, help="functions printed per model")
    parser.add_argument("--threads", type=int, default=int(os.environ["TVM_NUM_THREADS"]))
    args = parser.parse_args()
    env = worker_env(args.threads)
    results = {}
    with tempfile.TemporaryDirectory() as where:  # no pyproject.toml: the default config
        for name in args.models:
            mode = "host-only" if args.host_only else "default"
            result = run_worker(_WORKER, [name, mode], env, cwd=where)
            results[name] = result
            if "error" in result:
                print(f"{name}: error: {result['error']}", flush=True)
                continue
            rules = ", ".join(f"{k} {v:.1f}" for k, v in result["by_rule_ms"].items())
            print(f"{name}: host {result['host_ms']:.1f} ms ({rules})", flush=True)
            for r in result["functions"][: args.top]:
                ms = "-" if r["ms"] is None else f"{r['ms']:.2f} ms"
                print(f"  {r['rule']:>12} {ms:>10} x{r['calls']}  {r['name']}", flush=True)
    path = write(
        "host_functions",
        {"threads": args.threads, "host_only": args.host_only, "models": results},
    )
    print(json.dumps({"written": str(path)}), file=sys.stderr)


if __name__ == "__main__":
    main()
