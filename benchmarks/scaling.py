"""Growth of partition and placement with model size: chains of 100, 1,000, 10,000 operators.

``hub.explain`` (plan, partition, memory plan, devices and copies: everything
but lowering and building) on a synthetic chain ``relu, add, sigmoid, relu,
add, sigmoid, ...`` with an accelerator of two instances that claims relu and
add, once without merging (one match per partition) and once with TVM's
MergeCompositeFunctions. Target (issue 6): no faster than linear growth,
10,000 operators under 10 s. Then placement by cost (issue 13) on the same
chains, ``hub.explain(mod, placement="auto")`` with a plugin whose
``umahub_cost`` prices every group (the host's two kinds of group are measured
once, then cached): the choice for 10,000 operators in seconds. Results:
``results/scaling.json``.
"""

from __future__ import annotations

import time

import numpy as np
from _common import write

import umahub

SIZES = (100, 1000, 10000)


class Chainer:
    """Claims relu and add, two instances; ``merge`` as the accelerator says."""

    UMAHUB_API = 1

    def __init__(self, merge: bool):
        self.merge = merge

    @umahub.hookimpl
    def umahub_accelerators(self):
        return [
            umahub.Accelerator(
                "chain",
                instances=2,
                merge=self.merge,
                memory=[umahub.MemoryPool("chain.mem", 1 << 30)],
            )
        ]

    @umahub.hookimpl
    def umahub_patterns(self, accelerator):
        from tvm.relax.dpl import is_op, wildcard

        return [
            ("chain.relu", is_op("relax.nn.relu")(wildcard())),
            ("chain.add", is_op("relax.add")(wildcard(), wildcard())),
        ]


class PricedChainer(Chainer):
    """The same accelerator with a cost model: an add is cheap there, a relu dear."""

    @umahub.hookimpl
    def umahub_cost(self, context):
        return 1e-7 if context.patterns == ("chain.add",) else 1e-3


def chain(length: int):
    """A chain of ``length`` operators on a (1, 16) tensor."""
    from tvm import relax

    from umahub._tvm import TensorType

    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((1, 16), "float32"))
    c = relax.const(np.ones((1, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for i in range(length):
                kind = i % 3
                value = (
                    relax.op.nn.relu(h)
                    if kind == 0
                    else relax.op.add(h, c)
                    if kind == 1
                    else relax.op.sigmoid(h)
                )
                h = bb.emit_output(value) if i == length - 1 else bb.emit(value)
        bb.emit_func_output(h)
    return bb.get()


def measure(merge: bool, sizes) -> list[dict]:
    """explain() time for each chain length."""
    hub = umahub.Hub(autoload=False, plugins=[Chainer(merge)])
    rows = []
    for size in sizes:
        mod = chain(size)
        start = time.perf_counter()
        report = hub.explain(mod)
        seconds = time.perf_counter() - start
        rows.append(
            {
                "operators": size,
                "seconds": seconds,
                "stages_s": report.stages,
                "partitions": len(report.partitions),
                "per_operator_us": seconds / size * 1e6,
            }
        )
        print(
            f"merge={merge!s:5} {size:>6} operators: {seconds:.2f} s "
            f"({seconds / size * 1e6:.0f} us per operator), {len(report.partitions)} "
            "partitions",
            flush=True,
        )
    return rows


def measure_auto(sizes) -> list[dict]:
    """explain(placement="auto") time for each chain length, and its parts."""
    import os
    import tempfile

    os.environ.setdefault("UMAHUB_CACHE_DIR", tempfile.mkdtemp(prefix="umahub-scaling-"))
    hub = umahub.Hub(autoload=False, plugins=[PricedChainer(False)])
    hub.explain(chain(6), placement="auto")  # measures the host's two groups once
    rows = []
    for size in sizes:
        mod = chain(size)
        start = time.perf_counter()
        report = hub.explain(mod, placement="auto")
        seconds = time.perf_counter() - start
        rows.append(
            {
                "operators": size,
                "seconds": seconds,
                "auto_s": report.auto["seconds"],
                "stages_s": report.stages,
                "on_accelerator": sum(op.device != "host" for op in report.placement),
            }
        )
        print(
            f"auto {size:>6} operators: {seconds:.2f} s (auto: "
            + ", ".join(f"{k} {v:.2f}s" for k, v in report.auto["seconds"].items())
            + ")",
            flush=True,
        )
    return rows


def main() -> None:
    # One match per partition: umahub's own partitioning and placement.
    rows = measure(False, SIZES)
    growth = rows[-1]["per_operator_us"] / rows[1]["per_operator_us"]
    # With merging, TVM's MergeCompositeFunctions runs too; it grows faster than
    # linearly, so the largest size is left out.
    merged = measure(True, (*SIZES[:-1], 3000))
    merged_growth = merged[-1]["per_operator_us"] / merged[1]["per_operator_us"]
    auto = measure_auto(SIZES)
    path = write(
        "scaling",
        {
            "rows": rows,
            "auto_rows": auto,
            "per_operator_growth_1k_to_10k": growth,
            "merged_rows": merged,
            "merged_per_operator_growth_1k_to_3k": merged_growth,
            "target_10k_seconds": 10,
        },
    )
    print(f"per-operator time from 1,000 to 10,000 operators: x{growth:.2f} (1.0 = linear)")
    print(f"with MergeCompositeFunctions, from 1,000 to 3,000: x{merged_growth:.2f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
