"""The simnpu's codegen: its program's TIR walked into an instruction stream.

:func:`generate` evaluates the PrimFunc's body: loops of constant extents run
their iterations, ``LetStmt`` binds, sequences run in order, an ``if`` whose
condition is known takes its branch, and every intrinsic call
(:mod:`umahub_simnpu.lowering` lists them) becomes one instruction
(:mod:`umahub_simnpu_runtime.isa`) with its arguments evaluated. What it cannot
translate (a loop of unknown extent, an unknown call, a value out of a field's
range) raises :class:`CodegenError` naming it; umahub then runs the partition
on the host.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
from umahub_simnpu_runtime import isa

import umahub.plugin as up
from umahub_simnpu.lowering import DATA, DATA_ATTR

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

    def slot(self, arg: Any, intrinsic: str) -> int:
        """The DRAM slot an intrinsic's buffer argument names (a parameter or the data)."""
        if type(arg).__name__ == "StringImm":
            if str(arg.value) == DATA:
                return isa.DATA_SLOT
            raise CodegenError(f"{intrinsic} names {arg.value!r}, not a buffer or {DATA!r}")
        for i, buffer in enumerate(self.buffers):
            if arg.same_as(buffer.data):
                return i
            # TVM 0.26+: buffer.data is tirx.buffer_data(buffer), made anew at each use
            if (
                type(arg).__name__ == "Call"
                and getattr(arg.op, "name", "") == "tirx.buffer_data"
                and arg.args[0].same_as(buffer)
            ):
                return i
        raise CodegenError(f"{intrinsic} reads {arg}, which is not a parameter's buffer")

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
            if s.init is not None or list(s.alloc_buffers):
                raise CodegenError("a block with an init or allocations in the program's TIR")
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
        counts = {"simnpu.load": 21, "simnpu.gemm": 16, "simnpu.alu": 15, "simnpu.store": 13}
        if name not in counts:
            raise CodegenError(f"{name} is not an intrinsic of the simnpu ({', '.join(counts)})")
        if len(args) != counts[name]:
            raise CodegenError(f"{name} takes {counts[name]} arguments, got {len(args)}")
        # the buffer argument resolved to its slot once; every other argument compiled
        at = {"simnpu.load": 2, "simnpu.store": 0}.get(name)
        parts: list[Callable[[dict[Any, int]], Any]] = []
        for i, arg in enumerate(args):
            if i == at:
                slot = self.slot(arg, name)
                parts.append(lambda env, slot=slot: slot)
            else:
                parts.append(compile_expr(arg))
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


def _load(v: list[int]) -> bytes:
    dst_buf, dst_base, slot, src_type, offset, pad, *dims = v
    return isa.load(
        dst_buf,
        dst_base,
        slot,
        src_type,
        offset * isa.TYPE_BYTES[src_type],
        [dims[0:5], dims[5:10], dims[10:15]],
        pad,
    )


def _store(v: list[int]) -> bytes:
    slot, dst_type, offset, src_base, *dims = v
    return isa.store(
        slot,
        dst_type,
        offset * isa.TYPE_BYTES[dst_type],
        src_base,
        [dims[0:3], dims[3:6], dims[6:9]],
    )


def _gemm(v: list[int]) -> bytes:
    reset, *extents = v[:4]
    return isa.gemm(extents, tuple(v[4:8]), tuple(v[8:12]), tuple(v[12:16]), reset=bool(reset))


def _alu(v: list[int]) -> bytes:
    op, use_imm, e0, e1 = v[:4]
    imm, mul, shift, res_shift, residual = v[10:15]
    return isa.alu(
        op,
        (e0, e1),
        tuple(v[4:7]),
        tuple(v[7:10]),
        imm if (use_imm or residual) else None,
        mul,
        shift,
        res_shift,
        bool(residual),
    )


#: How each intrinsic's evaluated arguments (the buffer's as its slot) become an instruction.
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
    )
