"""The simnpu's codegen: its program's TIR walked into an instruction stream.

:func:`generate` evaluates the PrimFunc's body: loops of constant extents run
their iterations, ``LetStmt`` binds, sequences run in order, an ``if`` whose
condition is known takes its branch, and every intrinsic call
(:mod:`umahub_simnpu.intrinsics` lists them) becomes one instruction
(:mod:`umahub_simnpu_runtime.isa`) with its arguments evaluated: the tiles'
pointers become the on-chip buffer their scope names and a base in it, the
dependency tokens the passes set become the instruction's ``deps``. What it
cannot translate (a loop of unknown extent, an unknown call, a tile in no
simnpu scope, a value out of a field's range) raises :class:`CodegenError`
naming it; umahub then runs the partition on the host.

The program's cycles come from the runtime's own cycle model
(:func:`umahub_simnpu_runtime.timing`): the vendor's numbers, not a measurement.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
from umahub_simnpu_runtime import isa

import umahub.plugin as up
from umahub_simnpu.intrinsics import BY_NAME, DATA, kind_of_scope
from umahub_simnpu.lowering import DATA_ATTR

__all__ = ["CodegenError", "compile_expr", "evaluate", "generate"]


class CodegenError(ValueError):
    """A TIR the codegen cannot translate into the simnpu's instructions (says what)."""


_BINARY = {
    "Add": operator.add,
    "Sub": operator.sub,
    "Mul": operator.mul,
    "FloorDiv": operator.floordiv,
    "FloorMod": operator.mod,
    "Min": min,
    "Max": max,
    "LT": operator.lt,
    "LE": operator.le,
    "GT": operator.gt,
    "GE": operator.ge,
    "EQ": operator.eq,
    "NE": operator.ne,
    "And": lambda a, b: bool(a) and bool(b),
    "Or": lambda a, b: bool(a) or bool(b),
}


def evaluate(expr: Any, env: dict[Any, int]) -> Any:
    """The value of a PrimExpr whose variables ``env`` binds: an int, or a str for a
    string immediate.

    Raises:
        CodegenError: a variable not bound, or an expression it does not evaluate.
    """
    return compile_expr(expr)(env)


def compile_expr(expr: Any) -> Callable[[dict[Any, int]], Any]:
    """``expr`` made once into a Python function of the variables' values (what the
    codegen calls at every iteration of the loops around it).

    Raises:
        CodegenError: an expression it does not evaluate (at once); a variable not
            bound, or a division by zero (when the function is called).
    """
    kind = type(expr).__name__
    if kind == "IntImm":
        value = int(expr.value)
        return lambda env: value
    if kind == "StringImm":
        text = str(expr.value)
        return lambda env: text
    if kind in ("Var", "SizeVar"):

        def variable(env: dict[Any, int]) -> int:
            try:
                return env[expr]
            except KeyError:
                raise CodegenError(f"the variable {expr} is not bound to a known value") from None

        return variable
    if kind in _BINARY:
        a, b, function = compile_expr(expr.a), compile_expr(expr.b), _BINARY[kind]
        if kind in ("FloorDiv", "FloorMod"):

            def divide(env: dict[Any, int]) -> int:
                divisor = b(env)
                if divisor == 0:
                    raise CodegenError(f"a division by zero in {expr}")
                return int(function(a(env), divisor))

            return divide
        return lambda env: int(function(a(env), b(env)))
    if kind == "Not":
        a = compile_expr(expr.a)
        return lambda env: int(not a(env))
    if kind == "Cast":
        if not str(expr.dtype).startswith(("int", "uint")):
            raise CodegenError(f"a cast to {expr.dtype} in {expr}")
        return compile_expr(expr.value)
    if kind == "Select" or (kind == "Call" and getattr(expr.op, "name", "") == "tirx.if_then_else"):
        parts = (
            (expr.condition, expr.true_value, expr.false_value) if kind == "Select" else expr.args
        )
        cond, yes, no = (compile_expr(e) for e in parts)
        return lambda env: yes(env) if cond(env) else no(env)
    raise CodegenError(f"an expression the simnpu's codegen does not evaluate: {expr} ({kind})")


class _Emitter:
    """The walk over one PrimFunc: instructions in order."""

    def __init__(self, func: Any, limit: int):
        self.buffers = [b for b in up.param_buffers(func) if b is not None]
        self.instructions: list[bytes] = []
        self.limit = limit
        self.tiles = _tiles(func)

    def slot(self, arg: Any, intrinsic: str) -> int:
        """The DRAM slot an intrinsic's buffer argument names (a parameter or the data)."""
        if type(arg).__name__ == "StringImm":
            if str(arg.value) == DATA:
                return isa.DATA_SLOT
            raise CodegenError(f"{intrinsic} names {arg.value!r}, not a buffer or {DATA!r}")
        for i, buffer in enumerate(self.buffers):
            if up.points_to(arg, buffer):
                return i
        raise CodegenError(f"{intrinsic} reads {arg}, which is not a parameter's buffer")

    def tile(self, arg: Any, intrinsic: str) -> tuple[int, int]:
        """The on-chip buffer (INP, WGT, ACC) and base an intrinsic's tile pointer names."""
        for buffer, place in self.tiles:
            if up.points_to(arg, buffer):
                if place is None:
                    raise CodegenError(
                        f"the tile {buffer.name} is in scope {buffer.scope()!r}, not one of "
                        "the simnpu's on-chip buffers (local.simnpu.inp, .wgt, .acc)"
                    )
                return place
        raise CodegenError(f"{intrinsic} names {arg}, which is not a tile the program allocates")

    def compile_stmt(self, s: Any) -> Callable[[dict[Any, int]], None]:
        """``s`` made once into a Python function that emits its instructions for the
        variables' values it is given (loops run their iterations)."""
        kind = type(s).__name__
        if kind == "SeqStmt":
            children = [self.compile_stmt(child) for child in s.seq]

            def sequence(env: dict[Any, int]) -> None:
                for child in children:
                    child(env)

            return sequence
        if kind == "For":
            start, extent = compile_expr(s.min), compile_expr(s.extent)
            var, body = s.loop_var, self.compile_stmt(s.body)

            def loop(env: dict[Any, int]) -> None:
                first = start(env)
                for value in range(first, first + extent(env)):
                    env[var] = value
                    body(env)
                env.pop(var, None)

            return loop
        if kind == "LetStmt":
            value, var, body = compile_expr(s.value), s.var, self.compile_stmt(s.body)

            def let(env: dict[Any, int]) -> None:
                env[var] = value(env)
                body(env)
                env.pop(var, None)

            return let
        if kind == "IfThenElse":
            cond, then = compile_expr(s.condition), self.compile_stmt(s.then_case)
            other = self.compile_stmt(s.else_case) if s.else_case is not None else None

            def branch(env: dict[Any, int]) -> None:
                if cond(env):
                    then(env)
                elif other is not None:
                    other(env)

            return branch
        if kind in ("SBlockRealize", "BlockRealize"):
            return self.compile_stmt(s.block)
        if kind in ("SBlock", "Block"):
            if s.init is not None:
                raise CodegenError("a block with an init in the program's TIR")
            return self.compile_stmt(s.body)
        if kind in ("AttrStmt", "DeclBuffer"):
            return self.compile_stmt(s.body)
        if kind == "Evaluate":
            return self.compile_call(s.value)
        raise CodegenError(f"a {kind} statement in the program's TIR (not translated)")

    def compile_call(self, value: Any) -> Callable[[dict[Any, int]], None]:
        """One intrinsic call made into a function emitting its instruction."""
        if type(value).__name__ == "IntImm":
            return lambda env: None  # T.evaluate(0)
        if type(value).__name__ != "Call" or getattr(value.op, "name", "") != "tirx.call_extern":
            raise CodegenError(f"{value}: not an intrinsic of the simnpu")
        name, *args = value.args
        name = str(name.value)
        if name not in BY_NAME:
            raise CodegenError(f"{name} is not an intrinsic of the simnpu ({', '.join(BY_NAME)})")
        intrinsic = BY_NAME[name]
        if len(args) != intrinsic.arity:
            raise CodegenError(f"{name} takes {intrinsic.arity} arguments, got {len(args)}")
        # pointers resolved once: a DRAM one to its slot, a tile's to its buffer, whose
        # base is added to each of its offsets; every other argument compiled
        pointers = {at for at, _ in intrinsic.pointers} | {intrinsic.dram}
        parts: list[Callable[[dict[Any, int]], Any]] = [
            (lambda env: None) if i in pointers else compile_expr(a) for i, a in enumerate(args)
        ]
        if intrinsic.dram is not None:
            slot = self.slot(args[intrinsic.dram], name)
            parts[intrinsic.dram] = lambda env, slot=slot: slot
        for position, offsets in intrinsic.pointers:
            buffer, base = self.tile(args[position], name)
            parts[position] = lambda env, buffer=buffer: buffer
            for at in offsets:
                parts[at] = lambda env, f=parts[at], base=base: f(env) + base
        encode = _ENCODERS[name]
        instructions, limit = self.instructions, self.limit

        def emit(env: dict[Any, int]) -> None:
            values = [part(env) for part in parts]
            try:
                instructions.append(encode(values))
            except (struct.error, KeyError, ValueError) as exc:
                raise CodegenError(f"{name}{tuple(values)}: a value out of range ({exc})") from exc
            if len(instructions) > limit:
                raise CodegenError(f"more than {limit} instructions")

        return emit


_BUFFER_IDS = {"inp": isa.INP, "wgt": isa.WGT, "acc": isa.ACC}


def _tiles(func: Any) -> list[tuple[Any, tuple[int, int] | None]]:
    """Each tile the program allocates, with its on-chip buffer and base (elements), or
    None where it is in no simnpu scope: the tiles of one scope laid out one after the
    other, in allocation order."""
    placed: list[tuple[Any, tuple[int, int] | None]] = []
    used = dict.fromkeys(_BUFFER_IDS, 0)
    for block in up.blocks(func):
        for buffer in block.alloc_buffers:
            kind = kind_of_scope(str(buffer.scope()))
            if kind is None:
                placed.append((buffer, None))
                continue
            placed.append((buffer, (_BUFFER_IDS[kind], used[kind])))
            used[kind] += int(np.prod([int(d) for d in buffer.shape]))
    return placed


def _load(v: list[int]) -> bytes:
    deps, dst_buf, dst_base, slot, src_type, offset, pad, *dims = v
    return isa.load(
        dst_buf,
        dst_base,
        slot,
        src_type,
        offset * isa.TYPE_BYTES[src_type],
        [dims[0:5], dims[5:10], dims[10:15]],
        pad,
        deps=deps,
    )


def _store(v: list[int]) -> bytes:
    deps, slot, dst_type, offset, _acc, src_base, *dims = v
    return isa.store(
        slot,
        dst_type,
        offset * isa.TYPE_BYTES[dst_type],
        src_base,
        [dims[0:3], dims[3:6], dims[6:9]],
        deps=deps,
    )


def _gemm(v: list[int]) -> bytes:
    deps, reset, *extents = v[:5]
    operands = [tuple(v[at + 1 : at + 5]) for at in (5, 10, 15)]  # base, three strides
    return isa.gemm(extents, *operands, reset=bool(reset), deps=deps)


def _alu(v: list[int]) -> bytes:
    deps, op, use_imm, e0, e1, _acc = v[:6]
    dst, src = tuple(v[6:9]), tuple(v[9:12])
    imm, mul, shift, res_shift, residual = v[12:17]
    return isa.alu(
        op,
        (e0, e1),
        dst,
        src,
        imm if (use_imm or residual) else None,
        mul,
        shift,
        res_shift,
        bool(residual),
        deps=deps,
    )


#: How each intrinsic's evaluated arguments (pointers as slots and buffers) become an instruction.
_ENCODERS = {"simnpu.load": _load, "simnpu.store": _store, "simnpu.gemm": _gemm, "simnpu.alu": _alu}


#: The most instructions one program may have (a bound on the codegen's work).
INSTRUCTIONS_MAX = 2_000_000


def generate(module: Any, symbol: str) -> up.DeviceProgram:
    """The :class:`~umahub.plugin.DeviceProgram` of the PrimFunc ``symbol`` of ``module``.

    Raises:
        CodegenError: what could not be translated.
    """
    func = module[symbol]
    data_tensor = func.attrs[DATA_ATTR] if func.attrs and DATA_ATTR in func.attrs else None
    data = b"" if data_tensor is None else np.ascontiguousarray(data_tensor.numpy()).tobytes()
    emitter = _Emitter(func, INSTRUCTIONS_MAX)
    emitter.compile_stmt(func.body)({})
    if not emitter.instructions:
        raise CodegenError("the PrimFunc holds no simnpu instructions")
    buffers = emitter.buffers
    program = isa.program(emitter.instructions, len(buffers), data)
    sizes = [
        int(np.prod([int(d) for d in b.shape])) * np.dtype(str(b.dtype)).itemsize for b in buffers
    ]
    return up.DeviceProgram(
        program,
        {
            "format": "simnpu",
            "version": isa.VERSION,
            "buffers": len(buffers),
            "buffer_bytes": sizes,
            "instructions": len(emitter.instructions),
            "data_bytes": len(data),
        },
        timing=program_timing(program, _notes(func)),
    )


def _notes(func: Any) -> list[str]:
    """What the lowering and the passes left on the PrimFunc, for the report."""
    attrs = func.attrs or {}
    notes = []
    if "simnpu.double_buffered" in attrs:
        doubled = str(attrs["simnpu.double_buffered"])
        notes.append(
            f"double-buffered: {doubled}"
            if doubled
            else "double buffering on: one step, nothing to alternate"
        )
    else:
        notes.append("single-buffered")
    if "simnpu.tokens" in attrs:
        notes.append(f"dependency tokens: {int(attrs['simnpu.tokens'])} producer/consumer pair(s)")
    return notes


def program_timing(program: bytes, notes: list[str] = ()) -> up.ProgramTiming:  # type: ignore[assignment]
    """The runtime's cycle model of one run of ``program``, with each module's spans."""
    from umahub_simnpu_runtime import timing

    t = timing(program, trace=True)
    return up.ProgramTiming(
        cycles=t.cycles, busy=dict(t.busy), spans=t.intervals, notes=list(notes)
    )
