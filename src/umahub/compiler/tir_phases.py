"""TVM's default TIR pipeline cut into UMA's four phases, with plugin passes at the cuts.

TVM builds a PrimFunc with the ``s_tir`` pipeline (``tvm/s_tir/pipeline.py`` in
the apache-tvm wheel).
umahub runs the same passes in the same order, in four stretches, and runs the
passes returned by ``umahub_tir_passes(phase=N)`` before stretch N:

=====  ===================================================================
phase  where it sits
=====  ===================================================================
0      before lowering starts: scheduled S-TIR with its blocks and
       buffers intact (before ``CanonicalizeLoop``). Pattern-matching a
       loop nest to replace it with a kernel call belongs here.
1      after blocks are lowered and buffers flattened (after
       ``LowerOpaqueBlock`` and ``FlattenBuffer``): plain loops over
       1-D buffers, not yet vectorized.
2      after loop partitioning, vectorization, unrolling, storage rewrite,
       simplification and common-subexpression elimination (after
       ``CommonSubexprElim``), before memory is verified.
3      just before the packed API is made (before ``MakePackedAPI``),
       after host/device split: the last look at the kernel as a plain
       function.
=====  ===================================================================

Before ``MakePackedAPI`` umahub runs one pass of its own,
:func:`umahub.host.scratch.scratch_on_stack`: in the accelerators' kernels, and in
the host's where :meth:`umahub.Hub.compile` builds them
(``tvm.compile(..., tir_pipeline="umahub")``).

The pass lists are looked up by name, so a pass that an older TVM does not
have is skipped rather than failing the build.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import tvm
from tvm import s_tir, tirx

from umahub.host.amx import amx_dot_pass
from umahub.host.int8 import vnni_dot_pass
from umahub.host.lookup_tables import table_gather_pass, table_read_pass
from umahub.host.scratch import scratch_on_stack
from umahub.host.strided_loads import strided_load_pass

__all__ = ["PHASES", "PIPELINE_NAME", "phased_pipeline", "use_phase_passes"]

PIPELINE_NAME = "umahub"
PHASES = (0, 1, 2, 3)

_PASSES: contextvars.ContextVar[dict[int, list[Any]] | None] = contextvars.ContextVar(
    "umahub_phase_passes", default=None
)


def _p(name: str, *args: Any) -> Any:
    """TVM's pass ``name`` from s_tir or tirx, or None when this TVM lacks it."""
    for module in (s_tir.transform, tirx.transform):
        make = getattr(module, name, None)
        if make is not None:
            return make(*args)
    return None


def _stretches(config: Any) -> list[list[Any]]:
    """The default s_tir passes, cut at the phase points (one list per phase)."""
    flag = lambda key: bool(config.get(key, False))  # noqa: E731
    lower_blocks = [
        vnni_dot_pass(),  # umahub's: the int8 schedules' vpdpbusd steps (before any lowering)
        _p("CanonicalizeLoop"),
        _p("LowerCrossThreadReduction"),
        _p("LowerInitBlock"),
        _p("PlanAndUpdateBufferAllocationLocation"),
        _p("ConvertBlocksToOpaque"),
        _p("LiftThreadBinding"),
        _p("ManifestSharedMemoryLocalStage"),
        _p("CompactBufferAllocation"),
        amx_dot_pass(),  # umahub's: the int8 kernels' AMX tasks (on the buffers as compacted)
        _p("LowerAutoCopy"),
        _p("UnifyThreadBinding"),
        _p("LowerMatchBuffer"),
        _p("StmtSimplify"),
        _p("InjectPermutedLayout"),
        _p("AnnotateIrregularLoop"),
        _p("InjectSoftwarePipeline"),
        _p("TransformMmaBufferLayout"),
        _p("LowerOpaqueBlock"),
        _p("FlattenBuffer"),
        table_read_pass(),  # umahub's: the int8 schedules' tables read by vpermi2b
    ]
    loops = [
        _p("BF16ComputeLegalize"),
        _p("NarrowDataType", 32),
        _p("LoopPartition"),
        _p("VectorizeLoop", not flag("tirx.disable_vectorize")),
        table_gather_pass(),  # umahub's: a table read in a vectorized epilogue, by vpermi2b
        strided_load_pass(),  # umahub's: a strided vector load as contiguous ones, shuffled
        _p("InjectVirtualThread"),
        _p("InjectDoubleBuffer"),
        None if flag("tirx.disable_storage_rewrite") else _p("StorageRewrite"),
        _p("LowerAsyncDMA") if flag("tirx.use_async_copy") else None,
        _p("HoistIfThenElse"),
        _p("UnrollLoop"),
        _p("RenormalizeSplitPattern"),
        _p("StmtSimplify"),
        _p("RemoveNoOp"),
        _p("RewriteUnsafeSelect"),
        _p("InstrumentBoundCheckers") if flag("tirx.instrument_bound_checkers") else None,
        None if flag("tirx.disable_cse_tir") else _p("CommonSubexprElim"),
    ]
    verify = [
        _p("FP8ComputeLegalize"),
        _p("VerifyVTCMLimit"),
        _p("LowerVtcmAlloc"),
        _p("VerifyMemory"),
        _p("AnnotateEntryFunc"),
        _p("ThreadSync", "shared"),
        _p("ThreadSync", "shared.dyn"),
        _p("ThreadSync", "warp"),
        _p("InferFragment"),
        _p("LowerThreadAllreduce"),
        _p("MergeSharedMemoryAllocations"),
        _p("SplitHostDevice"),
    ]
    packed = [
        scratch_on_stack,
        _p("MakePackedAPI"),
        _p("FP8StorageLegalize"),
        _p("BF16StorageLegalize"),
    ]
    return [
        [p for p in stretch if p is not None] for stretch in (lower_blocks, loops, verify, packed)
    ]


def phased_pipeline(phase_passes: Mapping[int, Sequence[Any]]) -> tvm.transform.Pass:
    """The s_tir pipeline with ``phase_passes[N]`` run before stretch N."""

    @tvm.transform.module_pass(opt_level=0, name="umahub.PhasedTIRPipeline")
    def _pipeline(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        config = tvm.transform.PassContext.current().config
        passes: list[Any] = []
        for phase, stretch in zip(PHASES, _stretches(config)):
            passes.extend(phase_passes.get(phase, ()))
            passes.extend(stretch)
        return tvm.transform.Sequential(passes)(mod)

    return _pipeline


def _factory() -> tuple[Any, Any, Any]:
    from tvm.s_tir.pipeline import finalize_device_passes, finalize_host_passes

    return phased_pipeline(_PASSES.get() or {}), finalize_host_passes, finalize_device_passes


tvm.tirx.compilation_pipeline.register_tir_pipeline(PIPELINE_NAME, _factory)


@contextlib.contextmanager
def use_phase_passes(phase_passes: Mapping[int, Sequence[Any]]) -> Iterator[str]:
    """Within the block, ``tvm.tirx.build(..., pipeline="umahub")`` runs these phase passes.

    Yields the pipeline name to pass to ``tvm.tirx.build``.
    """
    token = _PASSES.set({k: list(v) for k, v in phase_passes.items()})
    try:
        yield PIPELINE_NAME
    finally:
        _PASSES.reset(token)
