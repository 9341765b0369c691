"""umahub-simnpu: the compiler plugin of the simnpu, a simulated int8 NPU with DRAM of its own.

Accelerator ``simnpu`` (two instances), a device of its own: its partitions run
as programs on the runtime ``simnpu`` (package ``umahub-simnpu-runtime``, which
a board installs alone), not in the host's process. Built as its hardware is:
three on-chip buffers (``local.simnpu.inp``, ``.wgt``: 64 KiB of int8 each;
``.acc``: 16 Ki int32 words), DMA queues for loads and stores, the load,
compute and store modules running side by side, ordered by dependency tokens,
at a clock of 1 GHz. Each hook does its part:

* patterns: quantized convolutions and matmuls (:func:`umahub.plugin.quantized`)
  that the machine computes exactly: 8-bit input and output, int8 weights that
  are constants (a weight zero point folded in, per-tensor or per-channel
  scales), a dense convolution (groups 1; stride, padding, dilation), a 2-D
  matmul weight; with a bias, ReLU or clip, and a residual add
  (:mod:`umahub_simnpu.operator` says why each refusal);
* relax_to_tir: the operator's integers fixed at compile time
  (:func:`umahub_simnpu.operator.plan`), its tiles cut to fit the buffers
  (:func:`umahub_simnpu.lowering.tiling`: smaller tiles, or a refusal saying
  which buffer), then its program in S-TIR: tiled loops around one block per
  instruction (:mod:`umahub_simnpu.lowering`);
* schedule (S-TIR): each tile into its buffer's memory scope
  (:mod:`umahub_simnpu.schedule`);
* TIR passes (NS-TIR): double buffering (phase 0, unless the option
  ``double-buffering`` is false) and the dependency tokens between the modules
  (phase 1) (:mod:`umahub_simnpu.passes`);
* codegen: the TIR walked into the instruction stream
  (:mod:`umahub_simnpu.codegen`): a :class:`umahub.plugin.DeviceProgram`, with
  its cycles by the simulator's cycle model;
* cost: for placement by cost, the candidate compiled the same way and its
  cycles at the clock (:mod:`umahub_simnpu.pipeline`).

The encoding is the runtime's (:mod:`umahub_simnpu_runtime.isa`), imported: one
definition, the runtime package a dependency of this one.
"""

from __future__ import annotations

import umahub.plugin as up

UMAHUB_API = 1

NAME = "simnpu"
#: The runtime's DRAM of one instance (what the memory planner counts).
DRAM_BYTES = 256 * 1024 * 1024
#: The clock the cycle model's cycles are counted at.
CLOCK_HZ = 1e9
#: The option that turns double buffering off (``[tool.umahub.options.simnpu]``).
DOUBLE_BUFFERING = "double-buffering"

__all__ = [
    "CLOCK_HZ",
    "DOUBLE_BUFFERING",
    "NAME",
    "UMAHUB_API",
    "quantized_ok",
    "umahub_accelerators",
    "umahub_codegen",
    "umahub_cost",
    "umahub_patterns",
    "umahub_relax_to_tir",
    "umahub_schedule",
    "umahub_tir_passes",
]


@up.hookimpl
def umahub_accelerators():
    """The simnpu: two instances, 256 MiB of DRAM each, three on-chip buffers, 1 GHz."""
    return [
        up.Accelerator(
            NAME,
            runtime="simnpu",
            runtime_package="umahub-simnpu-runtime",
            instances=2,
            memory=[up.MemoryPool("simnpu.dram", DRAM_BYTES, copy="async")],
            buffers=[
                up.OnChipBuffer("local.simnpu.inp", 64 << 10, "input tiles, int8"),
                up.OnChipBuffer("local.simnpu.wgt", 64 << 10, "weight tiles, int8"),
                up.OnChipBuffer("local.simnpu.acc", 64 << 10, "accumulators and tables, int32"),
            ],
            clock_hz=CLOCK_HZ,
            merge=False,  # one quantized operator per program
            operators=("relax.nn.conv2d", "relax.matmul"),
            description="simulated int8 NPU (16x16 matrix core, vector unit, DMA), DRAM of its own",
            options=[
                up.Option(
                    DOUBLE_BUFFERING,
                    True,
                    help="two copies of each on-chip tile, so that the next tile loads while "
                    "this one computes",
                )
            ],
        )
    ]


def _double_buffering(context) -> bool:
    return bool(context.options[DOUBLE_BUFFERING])


def quantized_ok(ctx) -> bool | up.Refusal:
    """What the simnpu computes exactly (:func:`umahub_simnpu.operator.refusal_of`)."""
    from umahub_simnpu.operator import refusal_of

    op = up.quantized_operator(ctx)
    bound = dict(ctx.matched_bindings.items())
    reason = refusal_of(op, bound.get)
    return up.Refusal(reason) if reason else True


@up.hookimpl(accelerator=NAME)
def umahub_patterns():
    """Quantized conv2d and matmul with their epilogues, largest match first."""
    return up.quantized(NAME, "conv2d", quantized_ok) + up.quantized(NAME, "matmul", quantized_ok)


@up.hookimpl(accelerator=NAME)
def umahub_relax_to_tir(function, context):
    """The partition's program in S-TIR, tiled for the on-chip buffers
    (:mod:`umahub_simnpu.lowering`)."""
    from umahub_simnpu.lowering import lower, tiling
    from umahub_simnpu.operator import plan
    from umahub_simnpu.pipeline import capacities_of

    operator = plan(function, dict(context.constants))
    copies = 2 if _double_buffering(context) else 1
    cut = tiling(operator, capacities_of(context.accelerator), copies)
    return lower(operator, function, context.symbol, cut)


@up.hookimpl(accelerator=NAME)
def umahub_schedule(schedule, context):
    """Each tile into its on-chip buffer's scope (:mod:`umahub_simnpu.schedule`)."""
    from umahub_simnpu.lowering import TILING_ATTR
    from umahub_simnpu.schedule import place_tiles

    func = schedule.mod[context.symbol]
    cut = str(func.attrs[TILING_ATTR]) if func.attrs and TILING_ATTR in func.attrs else ""
    placed = place_tiles(schedule, context.symbol)
    return f"{cut}; {placed}" if cut else placed


@up.hookimpl(accelerator=NAME)
def umahub_tir_passes(phase, context):
    """Double buffering (phase 0) and the dependency tokens (phase 1)
    (:mod:`umahub_simnpu.passes`)."""
    from umahub_simnpu.pipeline import phase_passes

    return phase_passes(phase, _double_buffering(context)) or None


@up.hookimpl(accelerator=NAME)
def umahub_codegen(module, context):
    """The program's instruction stream and its cycles (:mod:`umahub_simnpu.codegen`)."""
    from umahub_simnpu.codegen import generate

    return generate(module, context.symbol)


@up.hookimpl(accelerator=NAME)
def umahub_cost(function, context):
    """Seconds of one call by the simulator's cycle model at :data:`CLOCK_HZ`: the group
    compiled as its partition would be (:func:`umahub_simnpu.pipeline.compile_program`).
    A group the simnpu cannot compile costs None (then it is measured)."""
    from umahub_simnpu.operator import Unsupported, plan_group
    from umahub_simnpu.pipeline import capacities_of, compile_program

    try:
        operator = plan_group(function)
        program = compile_program(
            operator,
            function,
            capacities=capacities_of(context.accelerator),
            double_buffering=_double_buffering(context),
        )
    except Unsupported:
        return None
    clock = context.accelerator.clock_hz or CLOCK_HZ
    return program.timing.cycles / clock
