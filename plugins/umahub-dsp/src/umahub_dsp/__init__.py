"""umahub-dsp: a two-core DSP with a small tightly coupled memory (TCM).

Accelerator ``dsp_cpu``: two instances (``dsp_cpu:0``, ``dsp_cpu:1``), TVM's C
codegen, a 64 KiB TCM per core filled by the CPU (synchronous copies).

* patterns: elementwise operators and activations (add, subtract, multiply,
  relu, sigmoid, tanh, clip). The check takes a match only when every tensor it
  touches fits a quarter of the TCM, so big tensors stay on the host: the
  pattern check decides, never an out-of-memory at run time.
* schedule: each block's loops are fused and the innermost split by the
  vector width and vectorized. The C codegen lowers the vector loop to a plain
  loop that the C compiler vectorizes (umahub compiles the C at -O3).
"""

from __future__ import annotations

from umahub.plugin import (
    UNBOUNDED,
    Accelerator,
    MemoryPool,
    Refusal,
    dtype_of,
    hookimpl,
    human_size,
    match_bytes,
    op,
)

UMAHUB_API = 1

NAME = "dsp_cpu"
TCM_BYTES = 64 * 1024
VECTOR_LANES = 8
#: A match may use at most this much of the TCM (merged partitions add up).
MATCH_BUDGET = TCM_BYTES // 4

ELEMENTWISE = {
    "add": "relax.add",
    "subtract": "relax.subtract",
    "multiply": "relax.multiply",
    "relu": "relax.nn.relu",
    "sigmoid": "relax.sigmoid",
    "tanh": "relax.tanh",
    "clip": "relax.clip",
}


#: The Relax operators its patterns take (alone or fused), shown by ``umahub plugins``.
OPERATORS = (
    "relax.add",
    "relax.subtract",
    "relax.multiply",
    "relax.nn.relu",
    "relax.clip",
    "relax.sigmoid",
    "relax.tanh",
)


@hookimpl
def umahub_accelerators():
    """The DSP: two cores, each with its own 64 KiB TCM."""
    return [
        Accelerator(
            NAME,
            codegen="c",
            instances=2,
            memory=[MemoryPool("dsp.tcm", TCM_BYTES, copy="sync")],
            description="two-core DSP, elementwise operators, 64 KiB TCM per core",
            operators=OPERATORS,
        )
    ]


def fits_tcm(ctx) -> bool | Refusal:
    """Take float32 matches whose tensors fit the budget; refuse the rest, saying why."""
    for value in ctx.matched_bindings.values():
        if dtype_of(value) != "float32":
            return Refusal(f"a {dtype_of(value)} tensor; the DSP computes float32 only")
    need = match_bytes(ctx)
    if need >= UNBOUNDED:
        return Refusal(
            "tensors whose size is known only at run time, with no upper bound; "
            f"they may not fit the {human_size(TCM_BYTES)} TCM"
        )
    if need > MATCH_BUDGET:
        return Refusal(
            f"its tensors take {human_size(need)}, more than a quarter of the "
            f"{human_size(TCM_BYTES)} TCM ({human_size(MATCH_BUDGET)})"
        )
    if need == 0:
        return Refusal("no tensor of known size")
    return True


@hookimpl(accelerator=NAME)
def umahub_patterns():
    """One pattern per elementwise operator (a clip with its bounds as arguments)."""
    return [(f"{NAME}.{what}", op(name), {}, fits_tcm) for what, name in ELEMENTWISE.items()]


@hookimpl(accelerator=NAME)
def umahub_schedule(schedule):
    """Vectorize every block's innermost (fused) loop by the DSP's vector width."""
    from umahub_dsp.schedule import vectorize_blocks

    count = vectorize_blocks(schedule, VECTOR_LANES)
    return f"vectorized {count} block(s) by {VECTOR_LANES} lanes"
