"""Intel AMX for the quantized matmul and convolutions: byte dot products on the tile unit.

Sapphire Rapids and later Xeons have AMX: eight tile registers of up to 16
rows of 64 bytes and ``tdpbusd``, which adds to a 16 x 16 int32 tile the
products of a 16 x 64 tile of unsigned bytes by a 64 x 16 one of signed
bytes, stored as 16 rows of 16 x 4 bytes: exactly a 16-channel block of the
packed weight ``[N/16, K/4, 16, 4]`` (:mod:`umahub.host.quantized`), and 16
rows of the input's copy ``[M, K/4, 4]``. The same integer sums as
``vpdpbusd`` (AVX-512 VNNI), so the same bits, at 16384 multiply-adds an
instruction where ``vpdpbusd`` does 64: a 128x768 by 768x3072 product in
0.26 ms on two cores of an Intel Xeon (1169 GMAC/s), about twice the VNNI
kernel's rate.

:func:`schedule_int8 <umahub.host.int8.schedule_int8>` gives a matmul whose
rows are a multiple of 16 and whose reduction is a multiple of 64 bytes tasks
of up to 32 rows x 32 channels (four int32 tiles, two of input, two of
weight: the eight registers), and marks each task's sum with
:data:`AMX_ANNOTATION` (its zeroing included); :func:`amx_dot_pass` writes it
as tile instructions (LLVM's ``llvm.x86.tilezero``, ``tileloadd64``,
``tdpbusd``, ``tilestored64``): the accumulator tiles zeroed, the reduction in
steps of 64 bytes, the accumulators stored once. A 1x1 convolution's tasks
likewise, and a convolution's (:mod:`umahub.host.int8`): a tile of a row's
positions, a row of 64 bytes of channels each, from the input copied channels
last, for every tap of the window.

Linux lets a process use the tile registers only once it asked
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``): umahub asks when
it decides whether a build may use AMX (:func:`has_amx`), and every kernel
that does asks again when it starts (an idempotent system call), so that a
library loaded by any program runs.
"""

from __future__ import annotations

import functools
import platform
from typing import Any

from umahub.plugin.compat import buffer_of, dtype_of_expr

__all__ = ["AMX_ANNOTATION", "AMX_STRIDE", "FROM_ZERO", "amx_dot_pass", "amx_permitted", "has_amx"]

#: The block annotation marking a task's byte dot product for AMX (:func:`amx_dot_pass`):
#: :data:`FROM_ZERO` where the block is the task's whole sum, its zeroing included,
#: anything else where it adds to the accumulator's values.
AMX_ANNOTATION = "umahub.amx"

#: :data:`AMX_ANNOTATION`'s value for a whole sum: the block's body (the zeroing, which
#: TVM has lowered into it by then, and the sum) becomes tile instructions from
#: ``tilezero``, not from a load of the zeros just stored.
FROM_ZERO = "from zero"

#: The block annotation giving a convolution's strides ``[down the rows, along them]``
#: (the rows of a task, and the positions of a tile of the input, are that many apart);
#: only a convolution's task has it.
AMX_STRIDE = "umahub.amx_stride"

_SYS_ARCH_PRCTL = 158  # x86-64
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18
_ROWS = 16  # a tile's rows
_BYTES = 64  # a tile row's bytes


@functools.cache
def amx_permitted() -> bool:
    """Whether Linux lets this process use AMX's tile registers (asked once):
    False on another system, another architecture, or a kernel that refuses."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        asked = libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA)
    except (OSError, AttributeError):
        return False
    return asked == 0


def has_amx(target: Any = None) -> bool:
    """Whether a build for ``target`` (None: this machine) may use AMX's byte dot
    product: the target has ``amx-int8`` and ``amx-tile`` (as LLVM names them), it
    is this machine's CPU (``target`` None, or naming no other ``mtriple``), and
    this process may use the tiles (:func:`amx_permitted`). A cross build does not:
    the board's process would have to ask for them as this one does."""
    from umahub.targets import has_feature, machine_of, this_machine

    if target is not None:
        import tvm

        t = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
        triple = str(t.attrs.get("mtriple", "") or "")
        if triple and machine_of(triple) != this_machine():
            return False
    return has_feature("amx-int8", target) and has_feature("amx-tile", target) and amx_permitted()


def _address(region: Any, shifts: dict[int, Any] | None = None) -> Any:
    """The address of ``region``'s first element, moved along its dimensions by
    ``shifts`` (dimension -> elements): a typed load's address. (Not ``tvm_access_ptr``:
    where ``StorageRewrite`` gives an accumulator written only by ``tilestored64``
    the memory of a byte buffer that is dead by then, it keeps that pointer's int32
    type on the bytes, and the build fails.)"""
    from tvm import tirx

    indices = [r.min for r in region.region]
    for dim, shift in (shifts or {}).items():
        indices[dim] = indices[dim] + shift
    return tirx.address_of(tirx.BufferLoad(buffer_of(region), indices))


def _amx_body(block: Any) -> Any | None:
    """The tile instructions of a marked task (see the module docs), or None where
    the block is none of the forms below (it is then left to its loops: the same
    sums, without AMX).

    * a matmul, ``C[.., m, nb, 16] += A[.., m, k, 4] * B[nb, k, 16, 4]``: the
      input's rows by the weight's blocks of 16 channels (``tdpbusd``);
    * a 1x1 convolution, ``C[n, o, p] += W[o, k, 4] * X[n, k, p, 4]``: the
      weight's rows by the input's blocks of 16 positions (``tdpbsud``);
    * a convolution, ``C[n, ob, y, x, 16] += X[n, y*sy + ky, x*sx + kx, k, 4] *
      W[ob, k, ky, kx, 16, 4]`` (the input copied with each position's channels
      together, the strides in :data:`AMX_STRIDE`): a tile of up to 16 positions
      of an output row, each a row of 64 bytes of its window's channels, by the
      weight's blocks, for each tap of the kernel (``tdpbusd``).

    The tiles start from ``tilezero`` where the block is a whole sum
    (:data:`FROM_ZERO`), else from the accumulator's values.
    """
    from tvm import tirx

    writes = list(block.writes)
    if len(writes) != 1:
        return None
    c = writes[0]
    c_buffer = buffer_of(c)
    reads = {str(buffer_of(r).dtype): r for r in block.reads if not buffer_of(r).same_as(c_buffer)}
    unsigned, signed = reads.get("uint8"), reads.get("int8")
    if unsigned is None or signed is None or str(c_buffer.dtype) != "int32":
        return None
    shape = lambda region: [int(d) for d in buffer_of(region).shape]  # noqa: E731
    index_type = dtype_of_expr(c.region[0].min)
    step = tirx.Var("step", index_type)
    taps: list[Any] = []  # a convolution's kernel rows and columns
    # each operand's tile (row tile r, column block k): dimension -> shift from the region
    if len(signed.region) == 4 and len(c.region) >= 3:  # a matmul: the weight's blocks are B
        a, b, instruction = unsigned, signed, "tdpbusd"
        rows, blocks, lanes = (int(r.extent) for r in c.region[-3:])
        row_tiles, positions = rows // _ROWS, _ROWS
        if rows % _ROWS:
            return None
        c_at = lambda r, k: {-3: r * _ROWS, -2: k}  # noqa: E731
        a_at = lambda r: {-3: r * _ROWS, -2: step * _ROWS}  # noqa: E731
        b_at = lambda k: {0: k, 1: step * _ROWS}  # noqa: E731
        c_row, a_row, b_row = 4 * shape(c)[-2] * shape(c)[-1], shape(a)[-2] * 4, _BYTES
    elif len(signed.region) == 3 and len(unsigned.region) == 4:  # a 1x1 convolution
        a, b, instruction = signed, unsigned, "tdpbsud"
        rows, columns = (int(r.extent) for r in c.region[-2:])
        blocks, lanes = columns // 16, 16 if columns % 16 == 0 else 0
        row_tiles, positions = rows // _ROWS, _ROWS
        if rows % _ROWS:
            return None
        c_at = lambda r, k: {-2: r * _ROWS, -1: k * 16}  # noqa: E731
        a_at = lambda r: {-3: r * _ROWS, -2: step * _ROWS}  # noqa: E731
        b_at = lambda k: {-2: k * 16, 1: step * _ROWS}  # noqa: E731
        c_row, a_row, b_row = 4 * shape(c)[-1], shape(a)[-2] * 4, shape(b)[-2] * 4
    elif len(signed.region) == 6 and len(unsigned.region) == 5 and len(c.region) == 5:
        a, b, instruction = unsigned, signed, "tdpbusd"  # a convolution, the input's rows A
        row_stride, stride = (int(v) for v in block.annotations.get(AMX_STRIDE, (0, 0)))
        _, blocks, row_tiles, positions, lanes = (int(r.extent) for r in c.region)
        ky, kx = (tirx.Var(name, index_type) for name in ("ky", "kx"))
        taps = [(ky, int(b.region[2].extent)), (kx, int(b.region[3].extent))]
        if min(row_stride, stride) < 1 or positions > _ROWS:
            return None
        c_at = lambda r, k: {1: k, 2: r}  # noqa: E731
        a_at = lambda r: {1: r * row_stride + ky, 2: kx, 3: step * _ROWS}  # noqa: E731
        b_at = lambda k: {0: k, 1: step * _ROWS, 2: ky, 3: kx}  # noqa: E731
        c_row, a_row = 4 * shape(c)[-1], stride * shape(a)[-2] * 4
        b_row = shape(b)[2] * shape(b)[3] * _BYTES  # a group's weights, every tap apart
    else:
        return None
    groups = int(a.region[-2].extent)
    if lanes != 16 or blocks not in (1, 2) or row_tiles not in (1, 2):
        return None
    if groups % _ROWS or int(b.region[1].extent) != groups:
        return None
    zeroed = str(block.annotations[AMX_ANNOTATION]) == FROM_ZERO

    def call(name: str, *args: Any) -> Any:
        return tirx.Evaluate(tirx.call_llvm_intrin("void", f"llvm.x86.{name}", *args))

    def tile(i: int) -> Any:
        return tirx.const(i, "uint8")

    def move(name: str, i: int, address: Any, stride: int) -> Any:
        """``tileloadd64`` or ``tilestored64`` of tile ``i``, rows ``stride`` bytes apart."""
        return call(name, tile(i), address, tirx.const(stride, "int64"))

    # tiles 0-3 the accumulators (row tile r, column block k), 4-5 A's rows, 6-7 B's blocks:
    # every tile rows of 64 bytes; B's 16 rows, the others a row a position
    config = tirx.decl_buffer((64,), "uint8", "amx_config", scope="local")
    stmts: list[Any] = [tirx.BufferStore(config, tirx.const(0, "uint8"), [i]) for i in range(64)]
    stmts.append(tirx.BufferStore(config, tirx.const(1, "uint8"), [0]))  # palette 1
    for t in range(8):
        stmts.append(tirx.BufferStore(config, tirx.const(_BYTES, "uint8"), [16 + 2 * t]))
        tile_rows = _ROWS if t >= 6 else positions
        stmts.append(tirx.BufferStore(config, tirx.const(tile_rows, "uint8"), [48 + t]))
    stmts.append(call("ldtilecfg", tirx.address_of(tirx.BufferLoad(config, [0]))))
    accumulators = [(r, k) for r in range(row_tiles) for k in range(blocks)]
    for r, k in accumulators:
        if zeroed:
            stmts.append(call("tilezero", tile(2 * r + k)))
        else:
            stmts.append(move("tileloadd64", 2 * r + k, _address(c, c_at(r, k)), c_row))
    inner = [move("tileloadd64", 4 + r, _address(a, a_at(r)), a_row) for r in range(row_tiles)]
    inner += [move("tileloadd64", 6 + k, _address(b, b_at(k)), b_row) for k in range(blocks)]
    inner += [call(instruction, tile(2 * r + k), tile(4 + r), tile(6 + k)) for r, k in accumulators]
    loop: Any = tirx.For(step, 0, groups // _ROWS, tirx.ForKind.SERIAL, tirx.SeqStmt(inner))
    for var, extent in reversed(taps):
        loop = tirx.For(var, 0, extent, tirx.ForKind.SERIAL, loop)
    stmts.append(loop)
    for r, k in accumulators:
        stmts.append(move("tilestored64", 2 * r + k, _address(c, c_at(r, k)), c_row))
    stmts.append(call("tilerelease"))
    return tirx.SeqStmt(stmts), config


def _first_in_root(body: Any, stmt: Any) -> Any:
    """``body`` (a function's root block, or a statement) with ``stmt`` run first."""
    from tvm import tirx

    from umahub.plugin.compat import SBlock, SBlockRealize

    if not isinstance(body, SBlockRealize):
        return tirx.SeqStmt([stmt, body])
    root = body.block
    block = SBlock(
        root.iter_vars, root.reads, root.writes, root.name_hint,
        tirx.SeqStmt([stmt, root.body]), root.init, root.alloc_buffers, root.match_buffers,
        root.annotations,
    )  # fmt: skip
    return SBlockRealize(body.iter_values, body.predicate, block)


def amx_dot_pass() -> Any:
    """A TIR pass: each block marked with :data:`AMX_ANNOTATION` computed by AMX's
    tile instructions, and the function asking Linux for the tiles first (see the
    module docs). Runs on S-TIR, before blocks are lowered; a function without
    such blocks is left as it is."""
    import tvm
    from tvm import tirx

    def rewrite_func(func: Any, _mod: Any, _ctx: Any) -> Any:
        from umahub.plugin.compat import SBlock
        from umahub.plugin.tir import rewrite

        found = []

        def post(node: Any) -> Any:
            if AMX_ANNOTATION not in node.annotations:
                return node
            annotations = {
                k: v for k, v in node.annotations.items() if k not in (AMX_ANNOTATION, AMX_STRIDE)
            }
            made = _amx_body(node)
            if made is None:
                body, buffers = node.body, list(node.alloc_buffers)
            else:
                body, config = made
                buffers = [*node.alloc_buffers, config]
                found.append(node.name_hint)
            return SBlock(
                node.iter_vars, node.reads, node.writes, node.name_hint, body, node.init,
                buffers, node.match_buffers, annotations,
            )  # fmt: skip

        body = rewrite(func.body, SBlock, post)
        if not found:
            return func
        ask = tirx.call_extern(
            "int64", "syscall", tirx.const(_SYS_ARCH_PRCTL, "int64"),
            tirx.const(_ARCH_REQ_XCOMP_PERM, "int64"), tirx.const(_XFEATURE_XTILEDATA, "int64"),
        )  # fmt: skip
        return func.with_body(_first_in_root(body, tirx.Evaluate(ask)))

    return tvm.tirx.transform.prim_func_pass(rewrite_func, opt_level=0, name="umahub.AmxDot")
