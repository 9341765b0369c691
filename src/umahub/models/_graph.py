"""A thin layer over ``relax.BlockBuilder`` that builds zoo models with bound weights.

Each layer emits plain Relax operators (``R.matmul`` + ``R.add`` for a dense
layer, ``R.nn.conv2d`` + ``R.add`` for a conv with bias), one binding per
operator, named after the weight it uses, so that accelerator patterns and
placement pins see the graph a frontend would produce. Weights become
``relax.Constant`` nodes: ``main`` takes only the model inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import tvm
from tvm import relax

from umahub._tvm import TensorType

from ._spec import TensorSpec, Weights


class Graph:
    """Emits the layers of one model into a dataflow block of ``main``."""

    def __init__(self, bb: relax.BlockBuilder, weights: Weights):
        self.bb = bb
        self.weights = weights

    def emit(self, expr: relax.Expr, name: str) -> relax.Var:
        """Bind ``expr`` to a new variable named ``name`` (dots become underscores)."""
        return self.bb.emit(expr, name_hint=name.replace(".", "_"))

    def const(self, name: str, transform: Callable[[np.ndarray], np.ndarray] | None = None):
        """The weight ``name`` as a Relax constant, after ``transform`` if given."""
        value = self.weights[name]
        if transform is not None:
            value = np.ascontiguousarray(transform(value))
        return relax.const(value)

    def linear(self, x: relax.Expr, prefix: str) -> relax.Var:
        """``x @ W.T + b`` as ``R.matmul`` with a pre-transposed constant, then ``R.add``."""
        y = self.emit(relax.op.matmul(x, self.const(f"{prefix}.weight", np.transpose)), prefix)
        return self.emit(relax.op.add(y, self.const(f"{prefix}.bias")), f"{prefix}.bias_add")

    def conv2d(
        self, x: relax.Expr, prefix: str, stride: int = 1, padding: int = 0, groups: int = 1
    ) -> relax.Var:
        """``R.nn.conv2d`` (NCHW, OIHW) then ``R.add`` of the bias broadcast as (1, C, 1, 1)."""
        weight = self.const(f"{prefix}.weight")
        y = self.emit(
            relax.op.nn.conv2d(x, weight, strides=stride, padding=padding, groups=groups), prefix
        )
        bias = self.const(f"{prefix}.bias", lambda b: b.reshape(1, -1, 1, 1))
        return self.emit(relax.op.add(y, bias), f"{prefix}.bias_add")

    def layer_norm(self, x: relax.Expr, prefix: str, eps: float) -> relax.Var:
        """``R.nn.layer_norm`` over the last axis."""
        gamma, beta = self.const(f"{prefix}.weight"), self.const(f"{prefix}.bias")
        return self.emit(relax.op.nn.layer_norm(x, gamma, beta, axes=[-1], epsilon=eps), prefix)

    def relu(self, x: relax.Expr, name: str) -> relax.Var:
        """``R.nn.relu``."""
        return self.emit(relax.op.nn.relu(x), name)

    def relu6(self, x: relax.Expr, name: str) -> relax.Var:
        """ReLU6 as ``R.clip(x, 0, 6)``."""
        return self.emit(relax.op.clip(x, 0.0, 6.0), name)

    def add(self, a: relax.Expr, b: relax.Expr, name: str) -> relax.Var:
        """``R.add``."""
        return self.emit(relax.op.add(a, b), name)

    def reshape(self, x: relax.Expr, shape: Sequence[int], name: str) -> relax.Var:
        """``R.reshape``."""
        return self.emit(relax.op.reshape(x, shape), name)


def build_main(
    weights: Weights,
    inputs: dict[str, TensorSpec],
    body: Callable[..., relax.Expr],
) -> tvm.IRModule:
    """A module with one public function ``main(*inputs)`` whose body is ``body(graph, *vars)``."""
    bb = relax.BlockBuilder()
    params = [relax.Var(n, TensorType(s.shape, s.dtype)) for n, s in inputs.items()]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(Graph(bb, weights), *params))
        bb.emit_func_output(out)
    return bb.get()
