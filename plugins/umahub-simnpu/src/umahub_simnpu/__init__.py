"""umahub-simnpu: the compiler plugin of the simnpu, a simulated int8 NPU with DRAM of its own.

Accelerator ``simnpu`` (two instances), a device of its own: its partitions run
as programs on the runtime ``simnpu`` (package ``umahub-simnpu-runtime``, which
a board installs alone), not in the host's process.

* patterns: quantized convolutions and matmuls (:func:`umahub.plugin.quantized`)
  that the machine computes exactly: 8-bit input and output, int8 weights that
  are constants (a weight zero point folded in, per-tensor or per-channel
  scales), a dense convolution (groups 1; stride, padding, dilation), a 2-D
  matmul weight; with a bias, ReLU or clip, and a residual add
  (:mod:`umahub_simnpu.operator` says why each refusal);
* relax_to_tir: the operator's integers fixed at compile time
  (:func:`umahub_simnpu.operator.plan`), then its program in TIR, tiled loops
  around the intrinsics ``simnpu.load/gemm/alu/store``
  (:mod:`umahub_simnpu.lowering`);
* codegen: that TIR walked into the instruction stream
  (:mod:`umahub_simnpu.codegen`): a :class:`umahub.plugin.DeviceProgram`.

The encoding is the runtime's (:mod:`umahub_simnpu_runtime.isa`), imported: one
definition, the runtime package a dependency of this one.
"""

from __future__ import annotations

import umahub.plugin as up

UMAHUB_API = 1

NAME = "simnpu"
#: The runtime's DRAM of one instance (what the memory planner counts).
DRAM_BYTES = 256 * 1024 * 1024

__all__ = [
    "NAME",
    "UMAHUB_API",
    "quantized_ok",
    "umahub_accelerators",
    "umahub_codegen",
    "umahub_patterns",
    "umahub_relax_to_tir",
]


@up.hookimpl
def umahub_accelerators():
    """The simnpu: two instances, 256 MiB of DRAM each, filled by DMA."""
    return [
        up.Accelerator(
            NAME,
            runtime="simnpu",
            runtime_package="umahub-simnpu-runtime",
            instances=2,
            memory=[up.MemoryPool("simnpu.dram", DRAM_BYTES, copy="async")],
            merge=False,  # one quantized operator per program
            operators=("relax.nn.conv2d", "relax.matmul"),
            description="simulated int8 NPU (16x16 matrix core, vector unit), DRAM of its own",
        )
    ]


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
    """The partition's program in TIR (:mod:`umahub_simnpu.lowering`)."""
    from umahub_simnpu.lowering import lower
    from umahub_simnpu.operator import plan

    return lower(plan(function, dict(context.constants)), function, context.symbol)


@up.hookimpl(accelerator=NAME)
def umahub_codegen(module, context):
    """The program's instruction stream (:mod:`umahub_simnpu.codegen`)."""
    from umahub_simnpu.codegen import generate

    return generate(module, context.symbol)
