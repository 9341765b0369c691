"""The simnpu's compiler in one call: what its hooks do for a partition, chained.

umahub drives the hooks one by one (:mod:`umahub_simnpu` implements them);
:func:`compile_program` runs the same steps without umahub, for the plugin's
cost model (``umahub_cost`` compiles the candidate group and asks the
simulator's cycle model) and for tests:

1. :func:`~umahub_simnpu.lowering.tiling` and :func:`~umahub_simnpu.lowering.lower`
   (``umahub_relax_to_tir``): the program in S-TIR, tiled for the buffers;
2. :func:`~umahub_simnpu.schedule.place_tiles` (``umahub_schedule``): each tile
   in its memory scope;
3. :func:`~umahub_simnpu.passes.double_buffer` (phase 0, when on) and
   :func:`~umahub_simnpu.passes.dependency_tokens` (phase 1) (``umahub_tir_passes``);
4. :func:`~umahub_simnpu.codegen.generate` (``umahub_codegen``): the instructions.
"""

from __future__ import annotations

from typing import Any

import umahub.plugin as up
from umahub_simnpu.lowering import DEFAULT_CAPACITIES, Capacities, lower, tiling
from umahub_simnpu.operator import OperatorPlan
from umahub_simnpu.schedule import place_tiles

__all__ = ["capacities_of", "compile_program", "phase_passes"]


def capacities_of(accelerator: Any) -> Capacities:
    """The on-chip capacities ``accelerator`` declares (its on-chip buffers)."""
    from umahub_simnpu.schedule import SCOPES

    sizes = {}
    for kind, scope in SCOPES.items():
        buffer = accelerator.buffer(scope) if accelerator is not None else None
        if buffer is not None:
            sizes[kind] = buffer.size_bytes // (4 if kind == "acc" else 1)
    return Capacities(**sizes)


def phase_passes(phase: int, double_buffering: bool) -> list[Any]:
    """The simnpu's TIR passes at ``phase``."""
    from umahub_simnpu.passes import dependency_tokens, double_buffer

    if phase == 0:
        return [double_buffer()] if double_buffering else []
    if phase == 1:
        return [dependency_tokens(2 if double_buffering else 1)]
    return []


def compile_program(
    plan: OperatorPlan,
    function: Any,
    symbol: str = "main",
    capacities: Capacities = DEFAULT_CAPACITIES,
    double_buffering: bool = True,
) -> up.DeviceProgram:
    """The :class:`~umahub.plugin.DeviceProgram` of ``plan`` (the partition or group
    ``function``), compiled as the hooks compile it.

    Raises:
        Unsupported: a shape the buffers do not take.
        CodegenError: what the codegen could not translate.
    """
    import tvm

    from umahub_simnpu.codegen import generate

    cut = tiling(plan, capacities, 2 if double_buffering else 1)
    schedule = tvm.s_tir.Schedule(lower(plan, function, symbol, cut))
    place_tiles(schedule, symbol)
    module = schedule.mod
    for phase in (0, 1, 2, 3):
        for tir_pass in phase_passes(phase, double_buffering):
            module = tir_pass(module)
    return generate(module, symbol)
