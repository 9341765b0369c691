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
from typing import Any

import numpy as np
from umahub_simnpu_runtime import isa

import umahub.plugin as up
from umahub_simnpu.lowering import DATA, DATA_ATTR

__all__ = ["CodegenError", "evaluate", "generate"]


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
    kind = type(expr).__name__
    if kind == "IntImm":
        return int(expr.value)
    if kind == "StringImm":
        return str(expr.value)
    if kind in ("Var", "SizeVar"):
        if expr in env:
            return env[expr]
        raise CodegenError(f"the variable {expr} is not bound to a known value")
    if kind in _BINARY:
        a, b = evaluate(expr.a, env), evaluate(expr.b, env)
        if kind in ("FloorDiv", "FloorMod") and b == 0:
            raise CodegenError(f"a division by zero in {expr}")
        return int(_BINARY[kind](a, b))
    if kind == "Not":
        return int(not evaluate(expr.a, env))
    if kind == "Cast":
        if not str(expr.dtype).startswith(("int", "uint")):
            raise CodegenError(f"a cast to {expr.dtype} in {expr}")
        return evaluate(expr.value, env)
    if kind == "Select":
        chosen = expr.true_value if evaluate(expr.condition, env) else expr.false_value
        return evaluate(chosen, env)
    if kind == "Call" and getattr(expr.op, "name", "") == "tirx.if_then_else":
        cond, yes, no = expr.args
        return evaluate(yes if evaluate(cond, env) else no, env)
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

    def stmt(self, s: Any, env: dict[Any, int]) -> None:
        kind = type(s).__name__
        if kind == "SeqStmt":
            for child in s.seq:
                self.stmt(child, env)
        elif kind == "For":
            start, extent = evaluate(s.min, env), evaluate(s.extent, env)
            for value in range(start, start + extent):
                env[s.loop_var] = value
                self.stmt(s.body, env)
            env.pop(s.loop_var, None)
        elif kind == "LetStmt":
            env[s.var] = evaluate(s.value, env)
            self.stmt(s.body, env)
            env.pop(s.var, None)
        elif kind == "IfThenElse":
            if evaluate(s.condition, env):
                self.stmt(s.then_case, env)
            elif s.else_case is not None:
                self.stmt(s.else_case, env)
        elif kind in ("SBlockRealize", "BlockRealize"):
            self.stmt(s.block, env)
        elif kind in ("SBlock", "Block"):
            if s.init is not None or list(s.alloc_buffers):
                raise CodegenError("a block with an init or allocations in the program's TIR")
            self.stmt(s.body, env)
        elif kind in ("AttrStmt", "DeclBuffer"):
            self.stmt(s.body, env)
        elif kind == "Evaluate":
            self.call(s.value, env)
        else:
            raise CodegenError(f"a {kind} statement in the program's TIR (not translated)")

    def call(self, value: Any, env: dict[Any, int]) -> None:
        if type(value).__name__ == "IntImm":
            return  # T.evaluate(0)
        if type(value).__name__ != "Call" or getattr(value.op, "name", "") != "tirx.call_extern":
            raise CodegenError(f"{value}: not an intrinsic of the simnpu")
        name, *args = value.args
        name = str(name.value)
        try:
            word = self.encode(name, args, env)
        except struct.error as exc:
            raise CodegenError(f"{name}: a value out of its field's range ({exc})") from exc
        self.instructions.append(word)
        if len(self.instructions) > self.limit:
            raise CodegenError(f"more than {self.limit} instructions")

    def encode(self, name: str, args: list[Any], env: dict[Any, int]) -> bytes:
        counts = {"simnpu.load": 21, "simnpu.gemm": 16, "simnpu.alu": 15, "simnpu.store": 13}
        if name not in counts:
            raise CodegenError(f"{name} is not an intrinsic of the simnpu ({', '.join(counts)})")
        if len(args) != counts[name]:
            raise CodegenError(f"{name} takes {counts[name]} arguments, got {len(args)}")
        if name == "simnpu.load":
            dst_buf, dst_base = (evaluate(a, env) for a in args[:2])
            slot = self.slot(args[2], name)
            src_type, offset, pad, *dims = (evaluate(a, env) for a in args[3:])
            offset *= isa.TYPE_BYTES[src_type]
            return isa.load(
                dst_buf, dst_base, slot, src_type, offset, [dims[0:5], dims[5:10], dims[10:15]], pad
            )
        if name == "simnpu.store":
            slot = self.slot(args[0], name)
            dst_type, offset, src_base, *dims = (evaluate(a, env) for a in args[1:])
            return isa.store(
                slot,
                dst_type,
                offset * isa.TYPE_BYTES[dst_type],
                src_base,
                [dims[0:3], dims[3:6], dims[6:9]],
            )
        values = [evaluate(a, env) for a in args]
        if name == "simnpu.gemm":
            reset, *extents = values[:4]
            acc, inp, wgt = values[4:8], values[8:12], values[12:16]
            return isa.gemm(extents, tuple(acc), tuple(inp), tuple(wgt), reset=bool(reset))
        op, use_imm, e0, e1 = values[:4]
        dst, src = tuple(values[4:7]), tuple(values[7:10])
        imm, mul, shift, res_shift, residual = values[10:15]
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
        )


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
    emitter.stmt(func.body, {})
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
