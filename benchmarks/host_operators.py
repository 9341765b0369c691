"""Single host operators outside models use, three ways, each in a process of its own.

- ``plain``: ``tvm.compile`` (TVM's default pipeline) for this CPU;
- ``before``: umahub on the host without its ``"columns"`` rule and with
  dlight's ``Reduction`` taking a pooling's window, as before issue 33;
- ``after``: umahub on the host as it is.

Each: the rule each host function got, the median time of a run (numpy in,
numpy out) and the largest difference from plain TVM's output relative to its
largest magnitude. The operators are those that dominated outside models
(``host_functions.py``): CoaT's softmax over the tokens (axis 2 of 4),
PoolFormer's group norm of one group and its stride-1 average pooling minus
its input, ConvNeXt-V2's global response norm (channels last). Results:
``results/host_operators.json``.

    python benchmarks/host_operators.py [--repeat N] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("TVM_NUM_THREADS", "2")

from _common import ready, run_worker, worker_env, write

_WORKER = """
import json, sys
from host_operators import measure
print(json.dumps(measure(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
"""


def _grn(x, gamma, beta):
    from tvm import relax

    norm = relax.op.sqrt(relax.op.sum(relax.op.multiply(x, x), axis=[1, 2], keepdims=True))
    mean = relax.op.mean(norm, axis=[-1], keepdims=True)
    scaled = relax.op.multiply(x, relax.op.divide(norm, relax.op.add(mean, relax.const(1e-6))))
    return relax.op.add(x, relax.op.add(relax.op.multiply(gamma, scaled), beta))


def _pool_mixer(x):
    from tvm import relax

    pooled = relax.op.nn.avg_pool2d(x, 3, 1, 1, count_include_pad=False)
    return relax.op.subtract(pooled, x)


def _operators() -> dict:
    from tvm import relax

    return {
        "softmax axis 2 of (1, 8, 3137, 8)": (
            lambda x: relax.op.nn.softmax(x, axis=2), [(1, 8, 3137, 8)],
        ),
        "group norm, 1 group, (1, 64, 56, 56)": (
            lambda x, g, b: relax.op.nn.group_norm(x, g, b, 1, 1, [2, 3]),
            [(1, 64, 56, 56), (64,), (64,)],
        ),
        "avg pool 3x3 stride 1 minus input, (1, 64, 56, 56)": (_pool_mixer, [(1, 64, 56, 56)]),
        "global response norm, (1, 56, 56, 40)": (_grn, [(1, 56, 56, 40), (40,), (40,)]),
    }  # fmt: skip


def measure(name: str, way: str, repeat: int) -> dict:
    """One operator one way: rules, median ms, relative difference from plain TVM."""
    import numpy as np
    import tvm
    from _common import median_time
    from tvm import relax
    from tvm.script import relax as R

    op, shapes = _operators()[name]
    bb = relax.BlockBuilder()
    xs = [relax.Var(f"x{i}", R.Tensor(s, "float32")) for i, s in enumerate(shapes)]
    with bb.function("main", xs):
        with bb.dataflow():
            out = bb.emit_output(op(*xs))
        bb.emit_func_output(out)
    mod = bb.get()
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype("float32") for s in shapes]

    from umahub.targets import host_target

    vm = relax.VirtualMachine(tvm.compile(mod, target=tvm.target.Target(host_target())), tvm.cpu())

    def plain():
        return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()

    reference = plain()
    if way == "plain":
        return {"ms": median_time(plain, repeat=repeat) * 1e3}
    import umahub
    from umahub.host import schedules

    if way == "before":  # no "columns" rule, and dlight takes a pooling's window
        schedules._columns = lambda func, lanes: None
        schedules._sliding = lambda sch, block: False
    compiled = umahub.Hub(autoload=False).compile(mod)
    run = ready(compiled, *arrays)
    error = float(np.abs(run() - reference).max() / np.abs(reference).max())
    return {
        "ms": median_time(run, repeat=repeat) * 1e3,
        "rules": compiled.report.host_schedules,
        "rel_difference": error,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--threads", type=int, default=int(os.environ["TVM_NUM_THREADS"]))
    args = parser.parse_args()
    env = worker_env(args.threads)
    rows = {}
    with tempfile.TemporaryDirectory() as where:
        for name in _operators():
            row = {w: run_worker(_WORKER, [name, w, str(args.repeat)], env, cwd=where)
                   for w in ("plain", "before", "after")}  # fmt: skip
            rows[name] = row
            cells = []
            for way, r in row.items():
                if "error" in r:
                    cells.append(f"{way} error {r['error'][:80]}")
                else:
                    cells.append(f"{way} {r['ms']:.3f} ms {r.get('rules', '')}")
            print(f"{name}: " + "; ".join(cells), flush=True)
    write("host_operators", {"threads": args.threads, "repeat": args.repeat, "operators": rows})


if __name__ == "__main__":
    main()
