"""The simnpu's intrinsics in TIR: one table that the lowering, the passes and the codegen read.

Each intrinsic is a ``T.call_extern("int32", name, *args)``, alone in a block of
its own (the block says which buffers it reads and writes). Argument 0 is
always ``deps``, the dependency tokens of the instruction (0 until the
:mod:`umahub_simnpu.passes` set them). On-chip buffers are passed as a pointer
(``up.data_pointer(buffer)``, which ``up.points_to`` recognises) followed by
offsets into it, in the buffer's elements (bytes of INP and WGT, words of
ACC); DRAM as a parameter's pointer (or
:data:`DATA`, the program's data segment) and an offset in elements of the
DRAM type.

=================  ===========================================================
``simnpu.load``    ``deps, dst, dst_offset, src, src_type, src_offset, pad,
                   (size, before, after, src_stride, dst_stride) x 3``
``simnpu.gemm``    ``deps, reset, extent x 3, acc, acc_offset, stride x 3,
                   inp, inp_offset, stride x 3, wgt, wgt_offset, stride x 3``
``simnpu.alu``     ``deps, op, use_imm, extent x 2, acc, dst_offset, stride x 2,
                   src_offset, stride x 2, imm, mul_offset, shift_offset,
                   res_shift_offset, residual``
``simnpu.store``   ``deps, dst, dst_type, dst_offset, acc, src_offset,
                   (size, dst_stride, src_stride) x 3``
=================  ===========================================================
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BY_NAME", "DATA", "KINDS", "MODULES", "Intrinsic", "kind_of_scope"]

#: The string naming the program's data segment as a load's source.
DATA = "simnpu.data"

#: The on-chip buffers, by the last part of their scope (``local.simnpu.inp``).
KINDS = ("inp", "wgt", "acc")
#: The machine's modules, in pipeline order ("prev" and "next" of the tokens).
MODULES = ("load", "compute", "store")


@dataclass(frozen=True)
class Intrinsic:
    """One intrinsic's signature.

    Attributes:
        name: the ``call_extern`` name.
        arity: how many arguments, ``deps`` included.
        pointers: ``(position of an on-chip pointer, positions of its offsets)``.
        dram: the position of its DRAM pointer, or None.
    """

    name: str
    arity: int
    pointers: tuple[tuple[int, tuple[int, ...]], ...]
    dram: int | None = None

    def module(self, destination_kind: str) -> str:
        """The module that executes it; a load's depends on where it writes (a load
        into ACC is the compute module's, as in VTA)."""
        if self.name == "simnpu.load":
            return "compute" if destination_kind == "acc" else "load"
        return "store" if self.name == "simnpu.store" else "compute"


LOAD = Intrinsic("simnpu.load", 22, ((1, (2,)),), dram=3)
GEMM = Intrinsic("simnpu.gemm", 20, ((5, (6,)), (10, (11,)), (15, (16,))))
ALU = Intrinsic("simnpu.alu", 17, ((5, (6, 9, 13, 14, 15)),))
STORE = Intrinsic("simnpu.store", 15, ((4, (5,)),), dram=1)

#: Every intrinsic by its name.
BY_NAME = {i.name: i for i in (LOAD, GEMM, ALU, STORE)}


def kind_of_scope(scope: str) -> str | None:
    """``"inp"``, ``"wgt"`` or ``"acc"`` for the simnpu's scopes, None for any other."""
    prefix, _, kind = scope.rpartition(".")
    return kind if prefix == "local.simnpu" and kind in KINDS else None
