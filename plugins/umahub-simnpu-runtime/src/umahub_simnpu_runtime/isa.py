"""The simnpu's program format and instruction set: one definition, shared.

The runtime's C core (``sim.c``) decodes what this module encodes; the
compiler plugin (``umahub_simnpu``) imports this module to encode, so there is
one encoding and no copy to drift (it is plain Python, without numpy or TVM,
safe for either side to import).

A program is little-endian bytes::

    header (32 bytes) | instructions (64 bytes each) | data segment

* header: ``magic`` (``b"SNPU"``), ``version`` (1 or 2), ``header_bytes`` (32),
  ``instruction_bytes`` (64), ``buffers`` (how many DRAM buffers the program
  is run on: the partition's inputs then its outputs), ``instructions``,
  ``data_bytes``, then 12 bytes of zeros;
* instructions: fixed 64-byte words: version 1 executed in order, version 2
  as dataflow between the modules, ordered by dependency tokens;
* data segment: bytes the codegen precomputed (weights in tile order, the
  per-channel bias, multipliers and shifts), copied to device DRAM once at
  load, and read by LOAD through slot :data:`DATA_SLOT`.

The machine (after VTA, Moreau et al. 2019, in its own encoding): three
modules (load: LOAD into INP or WGT; compute: GEMM, ALU and LOAD into ACC;
store: STORE; see :func:`module_of`) around three on-chip buffers:

* ``INP``: int8 activations, addressed in bytes;
* ``WGT``: int8 weights, addressed in bytes; a tile is 16x16 row-major
  (``[output lane][input lane]``, 256 bytes);
* ``ACC``: int32 accumulators, addressed in 32-bit words; a vector is 16
  consecutive words.

Every instruction's first byte is its opcode; the second, ``deps``, holds its
dependency tokens (VTA's pop/push flags, :data:`POP_PREV` ... :data:`PUSH_NEXT`;
"prev" and "next" in the module order load -> compute -> store). Version 2:
each module runs its instructions in program order; one issues when its module
is free and each token it pops has been pushed and its pusher completed, and
pushes its own at its completion. Version 1 executes in order and requires 0.
The fields of each opcode are in the ``*_FORMAT`` structs below and in the
README's tables (with the cycle model).
"""

from __future__ import annotations

import struct

__all__ = [
    "ACC",
    "ACC_WORDS",
    "ALU",
    "ALU_ADD",
    "ALU_FORMAT",
    "ALU_FXP",
    "ALU_MAX",
    "ALU_MIN",
    "DATA_SLOT",
    "DEP_FLAGS",
    "DEP_MASK",
    "FLAG_IMM",
    "FLAG_RESET",
    "FLAG_RESIDUAL",
    "GEMM",
    "GEMM_FORMAT",
    "HEADER",
    "HEADER_BYTES",
    "I8",
    "I32",
    "INP",
    "INP_BYTES",
    "INSTRUCTION_BYTES",
    "LANES",
    "LOAD",
    "LOAD_FORMAT",
    "MAGIC",
    "MODULES",
    "POP_NEXT",
    "POP_PREV",
    "PUSH_NEXT",
    "PUSH_PREV",
    "STORE",
    "STORE_FORMAT",
    "TYPE_BYTES",
    "U8",
    "VERSION",
    "VERSIONS",
    "WGT",
    "WGT_BYTES",
    "alu",
    "gemm",
    "load",
    "module_of",
    "program",
    "store",
]

MAGIC = b"SNPU"
#: The format's version :func:`program` writes by default (2: dependency tokens).
VERSION = 2
#: The versions the runtime reads: 1 (in order, no tokens) and 2.
VERSIONS = (1, 2)
HEADER = struct.Struct("<4sHHHHII12x")
HEADER_BYTES = HEADER.size
INSTRUCTION_BYTES = 64

#: Lanes of a vector: the matrix core's tile is LANES x LANES.
LANES = 16

# Opcodes.
LOAD, GEMM, ALU, STORE = 1, 2, 3, 4

# On-chip buffers.
INP, WGT, ACC = 0, 1, 2
#: Default capacities of the on-chip buffers (the runtime's; a device may be made with others).
INP_BYTES = 64 * 1024
WGT_BYTES = 64 * 1024
ACC_WORDS = 16 * 1024

# DRAM element types.
I8, U8, I32 = 0, 1, 2
TYPE_BYTES = {I8: 1, U8: 1, I32: 4}

#: The slot of the program's own data segment (LOAD only).
DATA_SLOT = 0xFFFF

# ALU operations and flags.
ALU_ADD, ALU_MAX, ALU_MIN, ALU_FXP = 0, 1, 2, 3
#: ADD/MAX/MIN: the second operand is ``imm``, not the vector at ``src``.
FLAG_IMM = 1
#: FXP: add the residual term ``(src * imm) << res_shift[lane]`` before rounding.
FLAG_RESIDUAL = 2
#: GEMM: zero the addressed accumulator vectors instead of accumulating.
FLAG_RESET = 1

#: Wait for (and consume) a token from the previous module (compute: from load;
#: store: from compute). Not on the load module's instructions.
POP_PREV = 1
#: Wait for (and consume) a token from the next module (load: from compute; compute:
#: from store). Not on the store module's instructions.
POP_NEXT = 2
#: At completion, push a token to the previous module (compute: to load; store: to
#: compute). Not on the load module's instructions.
PUSH_PREV = 4
#: At completion, push a token to the next module (load: to compute; compute: to
#: store). Not on the store module's instructions.
PUSH_NEXT = 8
#: The ``deps`` byte's bits by name (version 1: all zero).
DEP_FLAGS = {
    "pop_prev": POP_PREV,
    "pop_next": POP_NEXT,
    "push_prev": PUSH_PREV,
    "push_next": PUSH_NEXT,
}
#: Every bit of ``deps`` that exists.
DEP_MASK = POP_PREV | POP_NEXT | PUSH_PREV | PUSH_NEXT
#: The modules, in the order "prev" and "next" refer to (``snpu_interval.module`` indexes it).
MODULES = ("load", "compute", "store")

# opcode, deps, dst_buf, src_type, src_slot, -, src_offset (bytes), dst_base, pad_value,
# then three dims (outermost first): size, pad_before, pad_after, src_stride, dst_stride
LOAD_FORMAT = struct.Struct("<BBBBHHIIi" + "HBBii" * 3 + "8x")
# opcode, deps, flags, -, extent0..2, -, then base + stride0..2 of ACC, INP, WGT
GEMM_FORMAT = struct.Struct("<BBBBHHHH" + "Iiii" * 3 + "4x")
# opcode, deps, op, flags, extent0, extent1, dst base/stride0/stride1,
# src base/stride0/stride1, imm, mul_base, shift_base, res_shift_base
ALU_FORMAT = struct.Struct("<BBBBHH" + "Iii" * 2 + "iIII" + "16x")
# opcode, deps, src_buf, dst_type, dst_slot, -, dst_offset (bytes), src_base,
# then three dims: size, -, dst_stride, src_stride
STORE_FORMAT = struct.Struct("<BBBBHHII" + "HHii" * 3 + "12x")

for _format in (LOAD_FORMAT, GEMM_FORMAT, ALU_FORMAT, STORE_FORMAT):
    assert _format.size == INSTRUCTION_BYTES, _format.format


def _dims(dims: list[tuple[int, ...]], width: int) -> list[tuple[int, ...]]:
    """``dims`` (outermost first) filled to three with unit dimensions in front."""
    if not 1 <= len(dims) <= 3:
        raise ValueError(f"1 to 3 dimensions, got {len(dims)}")
    return [(1,) + (0,) * (width - 1)] * (3 - len(dims)) + [tuple(d) for d in dims]


def _deps(deps: int) -> int:
    if not 0 <= deps <= DEP_MASK:
        raise ValueError(f"deps 0x{deps:x}: only the bits of DEP_FLAGS (0x{DEP_MASK:02x}) exist")
    return deps


def module_of(instruction: bytes) -> str:
    """The module that executes an encoded instruction: ``"load"`` (LOAD into INP or
    WGT), ``"compute"`` (GEMM, ALU, LOAD into ACC) or ``"store"`` (STORE).

    Raises:
        ValueError: not an instruction (too short, or an unknown opcode).
    """
    if len(instruction) < 3 or instruction[0] not in (LOAD, GEMM, ALU, STORE):
        raise ValueError(f"not a simnpu instruction: {bytes(instruction[:4])!r}...")
    opcode = instruction[0]
    if opcode == LOAD:
        return "compute" if instruction[2] == ACC else "load"
    return "store" if opcode == STORE else "compute"


def load(
    dst_buf: int,
    dst_base: int,
    src_slot: int,
    src_type: int,
    src_offset: int,
    dims: list[tuple[int, int, int, int, int]],
    pad_value: int = 0,
    *,
    deps: int = 0,
) -> bytes:
    """LOAD: a strided DMA of up to three dimensions from DRAM into an on-chip buffer.

    ``dims``: ``(size, pad_before, pad_after, src_stride, dst_stride)`` per
    dimension, outermost first; strides in elements. Along each dimension,
    ``pad_before`` elements of ``pad_value``, ``size`` elements read, then
    ``pad_after`` of ``pad_value``. Into INP or WGT an U8 source is made int8
    by subtracting 128; into ACC, I8 and U8 are widened. ``deps``: its dependency
    flags (:data:`POP_PREV` ...), version 2 only.
    """
    flat = [v for d in _dims(dims, 5) for v in d]
    return LOAD_FORMAT.pack(
        LOAD, _deps(deps), dst_buf, src_type, src_slot, 0, src_offset, dst_base, pad_value, *flat
    )


def gemm(
    extents: list[int],
    acc: tuple[int, ...],
    inp: tuple[int, ...],
    wgt: tuple[int, ...],
    reset: bool = False,
    *,
    deps: int = 0,
) -> bytes:
    """GEMM: ``ACC[a:a+16] += WGT[w] (16x16) @ INP[i:i+16]`` over up to three loops.

    ``extents`` outermost first; ``acc``/``inp``/``wgt`` are ``(base,
    stride, ...)`` with one stride per extent (ACC in words, INP and WGT in bytes).
    ``deps``: its dependency flags (:data:`POP_PREV` ...), version 2 only.
    """
    n = len(extents)
    if not 1 <= n <= 3 or not len(acc) == len(inp) == len(wgt) == n + 1:
        raise ValueError("GEMM: 1 to 3 extents and a base plus one stride per extent")
    pad = 3 - n

    def operand(o: tuple[int, ...]) -> list[int]:
        return [o[0], *([0] * pad), *o[1:]]

    return GEMM_FORMAT.pack(
        GEMM,
        _deps(deps),
        FLAG_RESET if reset else 0,
        0,
        *([1] * pad),
        *extents,
        0,
        *operand(acc),
        *operand(inp),
        *operand(wgt),
    )


def alu(
    op: int,
    extents: tuple[int, int],
    dst: tuple[int, int, int],
    src: tuple[int, int, int] = (0, 0, 0),
    imm: int | None = None,
    mul_base: int = 0,
    shift_base: int = 0,
    res_shift_base: int = 0,
    residual: bool = False,
    *,
    deps: int = 0,
) -> bytes:
    """ALU: a lane-wise operation on ACC vectors over two loops.

    ``dst``/``src`` are ``(base, stride0, stride1)`` in words. ADD, MAX, MIN take the
    vector at ``src`` or, when ``imm`` is given, ``imm``; FXP requantizes ``dst`` with
    the multipliers at ``mul_base`` and shifts at ``shift_base`` (one per lane), with
    ``residual``: plus ``(src * imm) << rs`` before rounding, ``rs`` the lane's value
    of the vector at ``res_shift_base``. ``deps``: its dependency flags
    (:data:`POP_PREV` ...), version 2 only.
    """
    flags = 0
    if op == ALU_FXP:
        flags = FLAG_RESIDUAL if residual else 0
    elif imm is not None:
        flags = FLAG_IMM
    return ALU_FORMAT.pack(
        ALU,
        _deps(deps),
        op,
        flags,
        *extents,
        *dst,
        *src,
        0 if imm is None else imm,
        mul_base,
        shift_base,
        res_shift_base,
    )


def store(
    dst_slot: int,
    dst_type: int,
    dst_offset: int,
    src_base: int,
    dims: list[tuple[int, int, int]],
    *,
    deps: int = 0,
) -> bytes:
    """STORE: ACC words to DRAM over up to three dimensions, saturated to ``dst_type``.

    ``dims``: ``(size, dst_stride, src_stride)`` per dimension, outermost first,
    strides in elements (DRAM: of ``dst_type``; ACC: words). ``deps``: its dependency
    flags (:data:`POP_PREV` ...), version 2 only.
    """
    flat = []
    for size, dst_stride, src_stride in _dims(dims, 3):
        flat += [size, 0, dst_stride, src_stride]
    return STORE_FORMAT.pack(
        STORE, _deps(deps), ACC, dst_type, dst_slot, 0, dst_offset, src_base, *flat
    )


def program(
    instructions: list[bytes], buffers: int, data: bytes = b"", version: int = VERSION
) -> bytes:
    """The program's bytes: the header, ``instructions`` and the data segment.

    ``version`` 2 (the default) orders the modules by the instructions' dependency
    tokens, and runs them overlapped; version 1 runs the instructions one after
    the other, in program order, and takes no tokens.
    """
    if version not in VERSIONS:
        raise ValueError(f"format version {version}: versions {VERSIONS} exist")
    header = HEADER.pack(
        MAGIC, version, HEADER_BYTES, INSTRUCTION_BYTES, buffers, len(instructions), len(data)
    )
    return header + b"".join(instructions) + bytes(data)
