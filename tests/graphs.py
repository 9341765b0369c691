"""Small Relax graphs for pipeline tests (each compiles in well under a second)."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from umahub._tvm import TensorType


def chain(shape=(4, 16), ops=("relu", "add", "relu", "add", "sigmoid"), seed=0):
    """x -> ops[0] -> ops[1] -> ...; binary ops add a constant. Node names n0, n1, ..."""
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType(shape, "float32"))
    unary = {"relu": relax.op.nn.relu, "sigmoid": relax.op.sigmoid, "tanh": relax.op.tanh}
    binary = {"add": relax.op.add, "multiply": relax.op.multiply, "subtract": relax.op.subtract}
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for i, op in enumerate(ops):
                if op in unary:
                    value = unary[op](h)
                else:
                    c = relax.const(rng.standard_normal(shape).astype("float32"))
                    value = binary[op](h, c)
                if i == len(ops) - 1:
                    h = bb.emit_output(value, name_hint=f"n{i}")
                else:
                    h = bb.emit(value, name_hint=f"n{i}")
        bb.emit_func_output(h)
    return bb.get()


def inputs_for(mod, seed=0):
    """Random inputs for ``main``."""
    rng = np.random.default_rng(seed)
    out = []
    for p in mod["main"].params:
        ty = p.struct_info if hasattr(p, "struct_info") else p.ty
        shape = [int(v.value) for v in ty.shape.values]
        out.append(rng.standard_normal(shape).astype(str(ty.dtype)))
    return out


def reference(mod, inputs):
    """Outputs of plain tvm.compile on the host."""
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in inputs])
    return out.numpy()
