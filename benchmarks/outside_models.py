"""Outside models: umahub with a user's default settings against plain ``tvm.compile``.

"Never slower than plain TVM", measured. Each model of :mod:`_outside`
(timm's, torchvision's and Hugging Face's architectures, random weights with
a fixed seed, outputs of order one) is imported once the same way
(``torch.export``, :func:`umahub.frontends.to_relax`) and run by two engines,
each in a process of its own with ``--threads`` threads:

- ``umahub``: ``umahub.Hub()`` as a user gets it, the installed plugins (the
  bundled npu, dsp and vanilla) and the default configuration (the worker
  runs in an empty directory: no ``pyproject.toml``), ``compiled.run`` once
  ``warm_up`` has let the default executor choose (the choice is recorded);
- ``plain TVM``: ``tvm.compile(mod, target=<this CPU>)``, TVM's default
  pipeline, on the Relax VM.

Each records its compile time, the median of ``--repeat`` runs (numpy in,
numpy out) and its output's relative error against PyTorch's (max absolute
difference over the reference's max magnitude, which is recorded too; a row
above 1e-3 is marked invalid). Results: ``results/outside_models_<intel|amd>.json``,
one file per kind of machine.

    python benchmarks/outside_models.py [MODEL ...] [--repeat N] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

os.environ.setdefault("TVM_NUM_THREADS", "2")

from _common import cpu_kind, run_worker, worker_env, write

#: Relative error against PyTorch above which a row is invalid.
TOLERANCE = 1e-3

_WORKER = """
import json, sys
from outside_models import measure
print(json.dumps(measure(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
"""


def measure(name: str, engine: str, repeat: int) -> dict:
    """One engine on outside model ``name``: compile seconds, median ms, error."""
    import time

    import numpy as np
    import tvm
    from _common import median_time
    from _outside import relax_of

    mod, x, reference = relax_of(name)
    start = time.perf_counter()
    if engine == "umahub":
        import umahub

        compiled = umahub.Hub().compile(mod)
        extra = {
            "offloaded": sum(1 for o in compiled.report.placement if o.device != "host"),
            "operators": len(compiled.report.placement),
            "host_schedules": compiled.report.host_schedules,
            "host_unscheduled": compiled.report.host_unscheduled,
        }
    else:
        from umahub.targets import host_target

        ex = tvm.compile(mod, target=tvm.target.Target(host_target()))
        main = tvm.relax.VirtualMachine(ex, tvm.cpu())["main"]

        def run():
            return main(tvm.runtime.tensor(x)).numpy()

        extra = {}
    compile_s = time.perf_counter() - start
    if engine == "umahub":
        from _common import ready

        run = ready(compiled, x)
        extra["executor"] = compiled.executor_in_use
    out = run()
    if isinstance(out, (list, tuple)):
        out = out[0]
    out = np.asarray(out.numpy() if hasattr(out, "numpy") else out)
    scale = float(np.abs(reference).max())
    error = float(np.abs(out.astype("float64") - reference).max() / scale)
    # a slow model gets fewer runs: the median of at least 3
    first = median_time(run, repeat=1, warmup=0)
    runs = repeat if first < 1.0 else max(3, min(repeat, int(10 / first)))
    ms = median_time(run, repeat=runs, warmup=0) * 1e3
    return {
        "compile_s": compile_s, "run_ms": ms, "runs": runs, "rel_error": error,
        "reference_scale": scale, **extra,
    }  # fmt: skip


def main() -> None:
    from _outside import MODELS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(MODELS))
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--threads", type=int, default=int(os.environ["TVM_NUM_THREADS"]))
    args = parser.parse_args()
    env = worker_env(args.threads)
    rows = {}
    with tempfile.TemporaryDirectory() as where:  # no pyproject.toml: the default config
        for name in args.models:
            row = {}
            for engine in ("plain", "umahub"):
                row[engine] = run_worker(_WORKER, [name, engine, str(args.repeat)], env, cwd=where)
            plain, ours = row["plain"], row["umahub"]
            if "error" not in plain and "error" not in ours:
                row["umahub_over_plain"] = ours["run_ms"] / plain["run_ms"]
                row["valid"] = max(plain["rel_error"], ours["rel_error"]) <= TOLERANCE
            rows[name] = row
            print(_line(name, row), flush=True)
    path = write(
        f"outside_models_{cpu_kind()}",
        {"threads": args.threads, "repeat": args.repeat, "tolerance": TOLERANCE, "models": rows},
    )
    print(json.dumps({"written": str(path)}), file=sys.stderr)


def _line(name: str, row: dict) -> str:
    cells = []
    for engine in ("plain", "umahub"):
        r = row[engine]
        if "error" in r:
            cells.append(f"{engine}: error {r['error'][:100]}")
        else:
            cells.append(f"{engine} {r['run_ms']:.1f} ms (err {r['rel_error']:.1e})")
    ratio = row.get("umahub_over_plain")
    tail = "" if ratio is None else f"  umahub/plain {ratio:.2f}"
    return f"{name}: {', '.join(cells)}{tail}" + ("" if row.get("valid", True) else "  INVALID")


if __name__ == "__main__":
    main()
