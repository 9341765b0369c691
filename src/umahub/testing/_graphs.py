"""Random small Relax graphs of the operators an accelerator claims (hypothesis strategies).

The vocabulary of a graph is read from the accelerator's own patterns: every
``is_op("relax....")`` they mention, kept when this module knows how to
generate it (:data:`GENERATORS`). A graph is a chain of 2 to 6 steps over
small float32 tensors, each step applied to the previous result, a binary step
taking either a constant or an earlier result of the same shape as its second
operand (so the graph is a DAG with skip connections, and every node reaches
the output). Shapes stay small (at most 16 KiB per tensor) so that any
accelerator's pool, and the host, compile them in a fraction of a second.

A :class:`GraphSpec` is plain data with a readable ``repr``: hypothesis prints
it when an example fails, and :func:`build` turns it back into the module.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "GENERATORS",
    "GraphSpec",
    "Step",
    "build",
    "graph_inputs",
    "graphs",
    "pattern_ops",
    "vocabulary",
]

_BINARY = ("relax.add", "relax.subtract", "relax.multiply")
_UNARY = (
    "relax.nn.relu",
    "relax.sigmoid",
    "relax.tanh",
    "relax.nn.gelu",
    "relax.nn.gelu_tanh",
    "relax.nn.silu",
    "relax.clip",
)

#: The operators random graphs are made of, by Relax op name -> the tensor ranks
#: they apply to (matmul on 2-D activations, conv2d on NCHW).
GENERATORS: dict[str, tuple[int, ...]] = {
    **{op: (2, 4) for op in _BINARY + _UNARY},
    "relax.matmul": (2,),
    "relax.nn.conv2d": (4,),
}


def pattern_ops(patterns: Iterable[Any]) -> set[str]:
    """The names of every operator the DFPatterns mention (``is_op`` calls, at any depth)."""
    import tvm

    found: set[str] = set()
    stack = list(patterns)
    budget = 100_000  # patterns are small DAGs; this only guards against a cyclic object
    while stack and budget:
        budget -= 1
        node = stack.pop()
        if node is None:
            continue
        if isinstance(node, tvm.ir.Op):
            found.add(str(node.name))
            continue
        if isinstance(node, (list, tuple)):
            stack.extend(node)
            continue
        for attr in ("op", "args", "left", "right", "pattern", "fields", "tuple", "reject", "expr"):
            try:
                child = getattr(node, attr)
            except Exception:  # FFI objects raise for fields they do not have
                continue
            if isinstance(child, (str, bytes)) or inspect.ismethod(child):
                continue
            if hasattr(child, "__len__") and hasattr(child, "__getitem__"):
                stack.extend(child[i] for i in range(len(child)))  # an FFI array
            else:
                stack.append(child)
    return found


def vocabulary(mentioned: Iterable[str]) -> tuple[str, ...]:
    """The operators of ``mentioned`` that random graphs can be made of, sorted."""
    return tuple(sorted(op for op in set(mentioned) if op in GENERATORS))


@dataclass(frozen=True)
class Step:
    """One operator of a random graph.

    Attributes:
        op: the Relax op name (``"relax.add"``).
        other: for a binary op, the index of the earlier value (0 = the input)
            used as second operand; None for a constant of the same shape.
        features: the output channels (conv2d) or features (matmul).
        kernel: conv2d's kernel size (padding keeps the spatial size).
        bias: matmul / conv2d are followed by a bias add.
    """

    op: str
    other: int | None = None
    features: int = 0
    kernel: int = 1
    bias: bool = False

    def __repr__(self) -> str:
        short = self.op.removeprefix("relax.").removeprefix("nn.")
        if self.op in _BINARY:
            return f"{short}({'const' if self.other is None else f'v{self.other}'})"
        if self.op == "relax.matmul":
            return f"matmul({self.features}{', bias' if self.bias else ''})"
        if self.op == "relax.nn.conv2d":
            return f"conv2d({self.features}, {self.kernel}x{self.kernel}" + (
                ", bias)" if self.bias else ")"
            )
        return short


@dataclass(frozen=True)
class GraphSpec:
    """A random graph: the input shape, the steps, the seed of its constants and inputs."""

    shape: tuple[int, ...]
    steps: tuple[Step, ...] = field(default_factory=tuple)
    seed: int = 0

    def __repr__(self) -> str:
        chain = " -> ".join(repr(s) for s in self.steps)
        return f"GraphSpec(x{list(self.shape)} -> {chain}, seed={self.seed})"

    @property
    def operators(self) -> int:
        """How many Relax operators the graph has (a bias add counts)."""
        return sum(2 if s.bias else 1 for s in self.steps)


def _shape_after(shape: tuple[int, ...], step: Step) -> tuple[int, ...]:
    if step.op == "relax.matmul":
        return (shape[0], step.features)
    if step.op == "relax.nn.conv2d":
        return (shape[0], step.features, shape[2], shape[3])
    return shape


def graphs(ops: Sequence[str]) -> Any:
    """A hypothesis strategy of :class:`GraphSpec` over ``ops`` (see :func:`vocabulary`)."""
    from hypothesis import strategies as st

    ops = tuple(ops)
    if not ops:
        raise ValueError("no operator to build random graphs of")

    @st.composite
    def strategy(draw: Any) -> GraphSpec:
        ranks = sorted({r for op in ops for r in GENERATORS[op]})
        # conv2d only applies to 4-D and matmul to 2-D: pick the rank they need.
        rank = draw(st.sampled_from(ranks))
        if rank == 4:
            c, hw = draw(st.sampled_from((8, 16))), draw(st.sampled_from((4, 6, 8)))
            shape: tuple[int, ...] = (1, c, hw, hw)
        else:
            shape = (draw(st.sampled_from((1, 2, 4, 8))), draw(st.sampled_from((8, 16, 32))))
        usable = [op for op in ops if rank in GENERATORS[op]]
        shapes = [shape]
        steps = []
        for _ in range(draw(st.integers(2, 6))):
            op = draw(st.sampled_from(usable))
            step = Step(op)
            if op in _BINARY:
                same = [i for i, s in enumerate(shapes) if s == shapes[-1]]
                step = Step(op, other=draw(st.sampled_from([None, *same])))
            elif op == "relax.matmul":
                step = Step(
                    op, features=draw(st.sampled_from((8, 16, 24))), bias=draw(st.booleans())
                )
            elif op == "relax.nn.conv2d":
                step = Step(
                    op,
                    features=draw(st.sampled_from((8, 16))),
                    kernel=draw(st.sampled_from((1, 3))),
                    bias=draw(st.booleans()),
                )
            steps.append(step)
            shapes.append(_shape_after(shapes[-1], step))
        return GraphSpec(shape, tuple(steps), draw(st.integers(0, 2**16)))

    return strategy()


def build(spec: GraphSpec) -> Any:
    """The Relax module of ``spec``: ``main(x)`` with its constants bound in."""
    import numpy as np
    from tvm import relax

    from umahub._tvm import TensorType

    rng = np.random.default_rng(spec.seed)

    def const(shape: Sequence[int], scale: float = 1.0) -> Any:
        return relax.const((rng.standard_normal(shape) * scale).astype("float32"))

    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType(spec.shape, "float32"))
    # Looked up when called: an op missing from some TVM version only fails a graph using it.
    unary = {
        "relax.nn.relu": lambda v: relax.op.nn.relu(v),
        "relax.sigmoid": lambda v: relax.op.sigmoid(v),
        "relax.tanh": lambda v: relax.op.tanh(v),
        "relax.nn.gelu": lambda v: relax.op.nn.gelu(v),
        "relax.nn.gelu_tanh": lambda v: relax.op.nn.gelu_tanh(v),
        "relax.nn.silu": lambda v: relax.op.nn.silu(v),
        "relax.clip": lambda v: relax.op.clip(v, -1.0, 1.0),
    }
    binary = {
        "relax.add": relax.op.add,
        "relax.subtract": relax.op.subtract,
        "relax.multiply": relax.op.multiply,
    }
    with bb.function("main", [x]):
        with bb.dataflow():
            values, shapes = [x], [spec.shape]
            for i, step in enumerate(spec.steps):
                last = i == len(spec.steps) - 1
                h, shape = values[-1], shapes[-1]
                if step.op in binary:
                    rhs = const(shape) if step.other is None else values[step.other]
                    expr = binary[step.op](h, rhs)
                elif step.op == "relax.matmul":
                    expr = relax.op.matmul(h, const((shape[1], step.features), shape[1] ** -0.5))
                elif step.op == "relax.nn.conv2d":
                    k, c = step.kernel, shape[1]
                    weight = const((step.features, c, k, k), (c * k * k) ** -0.5)
                    expr = relax.op.nn.conv2d(h, weight, padding=k // 2)
                else:
                    expr = unary[step.op](h)
                if step.bias:
                    out = _shape_after(shape, step)
                    bias_shape = (1, out[1], 1, 1) if len(out) == 4 else (out[1],)
                    expr = relax.op.add(bb.emit(expr, name_hint=f"n{i}"), const(bias_shape))
                emit = bb.emit_output if last else bb.emit
                values.append(emit(expr, name_hint=f"n{i}_bias" if step.bias else f"n{i}"))
                shapes.append(_shape_after(shape, step))
        bb.emit_func_output(values[-1])
    return bb.get()


def graph_inputs(spec: GraphSpec) -> list[Any]:
    """The input of ``spec``'s graph: standard normal, drawn from its seed."""
    import numpy as np

    rng = np.random.default_rng(spec.seed + 1)
    return [rng.standard_normal(spec.shape).astype("float32")]
