"""Random small Relax graphs of the operators an accelerator claims (hypothesis strategies).

The vocabulary of a graph is read from the accelerator's own patterns: every
``is_op("relax....")`` they mention, kept when this module knows how to
generate it (:data:`GENERATORS`). A graph is a chain of 2 to 6 steps over
small float32 tensors, each step applied to the previous result, a binary step
taking either a constant or an earlier result of the same shape as its second
operand (so the graph is a DAG with skip connections, and every node reaches
the output). Shapes stay small (at most 16 KiB per tensor) so that they fit
any accelerator's pool and every example compiles quickly.

``graphs(ops, dag=True)`` draws the graphs of the cross-accelerator check:
a step may read any earlier value (branches), values read later or by several
steps are also returned (a tuple output), and constants are shared between
steps (one weight read by operators that may run on different devices).
:func:`placements` draws pins for such a graph: each operator, by node name,
to an accelerator, one of its instances or ``host``, or left free.

A :class:`GraphSpec` is plain data with a readable ``repr``: hypothesis prints
it when an example fails, and :func:`build` turns it back into the module.

Why this module is long: the graphs of one accelerator and the cross-accelerator
graphs (several outputs, shared constants, branches) share one vocabulary, one
spec and one builder; split, the two halves would import each other.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "GENERATORS",
    "GraphSpec",
    "Step",
    "accelerator_ops",
    "build",
    "graph_inputs",
    "graphs",
    "kit_settings",
    "pattern_ops",
    "pin_choices",
    "placements",
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


def accelerator_ops(hub: Any, accelerator: str) -> set[str]:
    """The operators the patterns of ``accelerator`` (in ``hub``) mention."""
    from umahub.compiler.placement import normalise_pattern

    acc = hub.accelerator(accelerator)
    return pattern_ops(
        normalise_pattern(acc, p)[1]
        for result in hub.hook.umahub_patterns(accelerator=acc)
        for p in (result or [])
    )


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
        src: the index of the earlier value (0 = the input) the step applies
            to; None for the previous step's result.
        const: the constant operand (a binary op's second operand when
            ``other`` is None, a matmul's or conv2d's weight) is the graph's
            shared constant number ``const`` of its shape: every step with the
            same number and shape reads the same ``relax.Constant``. None for a
            constant of its own.
    """

    op: str
    other: int | None = None
    features: int = 0
    kernel: int = 1
    bias: bool = False
    src: int | None = None
    const: int | None = None

    def __repr__(self) -> str:
        short = self.op.removeprefix("relax.").removeprefix("nn.")
        weight = "const" if self.const is None else f"c{self.const}"
        if self.op in _BINARY:
            return f"{short}({weight if self.other is None else f'v{self.other}'})"
        if self.op == "relax.matmul":
            shared = "" if self.const is None else f", {weight}"
            return f"matmul({self.features}{shared}{', bias' if self.bias else ''})"
        if self.op == "relax.nn.conv2d":
            shared = "" if self.const is None else f", {weight}"
            return f"conv2d({self.features}, {self.kernel}x{self.kernel}{shared}" + (
                ", bias)" if self.bias else ")"
            )
        return short


@dataclass(frozen=True)
class GraphSpec:
    """A random graph: the input shape, the steps, the seed of its constants and inputs.

    Value 0 is the input ``x``, value ``i + 1`` the result of step ``i``
    (node ``n<i>``, or ``n<i>_bias`` after a bias add, whose matmul or conv2d
    is node ``n<i>``). ``main`` returns the last value, or, when ``outputs``
    names more values, the tuple ``(last, *outputs)``.
    """

    shape: tuple[int, ...]
    steps: tuple[Step, ...] = field(default_factory=tuple)
    seed: int = 0
    outputs: tuple[int, ...] = ()

    @property
    def chain(self) -> bool:
        """Whether every step applies to the previous result (the one-accelerator graphs)."""
        return not self.outputs and all(s.src is None and s.const is None for s in self.steps)

    def __repr__(self) -> str:
        if self.chain:
            chain = " -> ".join(repr(s) for s in self.steps)
            return f"GraphSpec(x{list(self.shape)} -> {chain}, seed={self.seed})"
        lines = [f"v0=x{list(self.shape)}"]
        for i, s in enumerate(self.steps):
            src, text = f"v{i if s.src is None else s.src}", repr(s)
            call = text.replace("(", f"({src}, ", 1) if "(" in text else f"{text}({src})"
            lines.append(f"v{i + 1}={call}")
        out = ", ".join(f"v{v}" for v in (len(self.steps), *self.outputs))
        return f"GraphSpec({'; '.join(lines)}; out {out}; seed={self.seed})"

    @property
    def operators(self) -> int:
        """How many Relax operators the graph has (a bias add counts)."""
        return sum(2 if s.bias else 1 for s in self.steps)

    @property
    def nodes(self) -> list[tuple[str, str]]:
        """``(node name, op name)`` of every Relax operator, in order (the names pins use)."""
        found = []
        for i, s in enumerate(self.steps):
            found.append((f"n{i}", s.op))
            if s.bias:
                found.append((f"n{i}_bias", "relax.add"))
        return found


def _shape_after(shape: tuple[int, ...], step: Step) -> tuple[int, ...]:
    if step.op == "relax.matmul":
        return (shape[0], step.features)
    if step.op == "relax.nn.conv2d":
        return (shape[0], step.features, shape[2], shape[3])
    return shape


def _shapes(spec: GraphSpec) -> list[tuple[int, ...]]:
    """The shape of every value of ``spec`` (0 = the input)."""
    shapes = [spec.shape]
    for i, step in enumerate(spec.steps):
        shapes.append(_shape_after(shapes[i if step.src is None else step.src], step))
    return shapes


def kit_settings(examples: int) -> Any:
    """The kit's hypothesis settings: ``examples`` examples, deterministic
    (``derandomize``), no example database, no shrinking, no health checks."""
    from hypothesis import HealthCheck, Phase, settings

    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        report_multiple_bugs=False,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
    )


def graphs(ops: Sequence[str], *, dag: bool = False, max_steps: int = 6) -> Any:
    """A hypothesis strategy of :class:`GraphSpec` over ``ops`` (see :func:`vocabulary`).

    Args:
        ops: the operators to draw steps from.
        dag: False: a chain with skip connections (each step applies to the
            previous result). True: each step may apply to any earlier value,
            constants are shared between steps (``Step.const``), and every
            value no step reads, plus some that are read, are outputs too:
            the shapes of the cross-accelerator check.
        max_steps: at most this many steps (at least 2).
    """
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
        shared = st.sampled_from((None, 0, 1)) if dag else st.just(None)
        for _ in range(draw(st.integers(2, max(2, max_steps)))):
            op = draw(st.sampled_from(usable))
            src = None
            if dag and draw(st.integers(0, 2)) == 0:  # a branch: one step in three
                src = draw(st.integers(0, len(shapes) - 1))
            here = shapes[-1 if src is None else src]
            step = Step(op, src=src)
            if op in _BINARY:
                same = [i for i, s in enumerate(shapes) if s == here]
                other = draw(st.sampled_from([None, *same]))
                step = Step(op, other=other, src=src, const=draw(shared) if other is None else None)
            elif op == "relax.matmul":
                step = Step(
                    op,
                    features=draw(st.sampled_from((8, 16, 24))),
                    bias=draw(st.booleans()),
                    src=src,
                    const=draw(shared),
                )
            elif op == "relax.nn.conv2d":
                step = Step(
                    op,
                    features=draw(st.sampled_from((8, 16))),
                    kernel=draw(st.sampled_from((1, 3))),
                    bias=draw(st.booleans()),
                    src=src,
                    const=draw(shared),
                )
            steps.append(step)
            shapes.append(_shape_after(here, step))
        outputs: tuple[int, ...] = ()
        if dag:
            last = len(steps)
            read = {i if s.src is None else s.src for i, s in enumerate(steps)}
            read |= {s.other for s in steps if s.other is not None}
            unread = [v for v in range(1, last) if v not in read]
            # Values also read by a later step: returning one makes a value that
            # a partition computes and uses itself leave the partition too.
            extra = draw(st.lists(st.sampled_from(range(1, last)), max_size=2, unique=True))
            outputs = tuple(sorted(set(unread) | set(extra)))
        return GraphSpec(shape, tuple(steps), draw(st.integers(0, 2**16)), outputs)

    return strategy()


def pin_choices(accelerators: Iterable[tuple[str, int]]) -> list[str]:
    """Every place a pin can send an operator: ``accel``, ``accel:i`` for each instance, ``host``.

    Args:
        accelerators: ``(name, instances)`` pairs.
    """
    choices = []
    for name, instances in accelerators:
        choices += [name, *(f"{name}:{i}" for i in range(instances))]
    return [*choices, "host"]


def placements(
    spec: GraphSpec, choices: Sequence[str], likely: Mapping[str, Sequence[str]] | None = None
) -> Any:
    """A hypothesis strategy of pins for ``spec``: ``{node name: choice}``, about half the nodes.

    Nodes are named as :attr:`GraphSpec.nodes` says; ``choices`` come from
    :func:`pin_choices`. With ``likely`` (op name -> the choices whose
    patterns mention it), half the pins are drawn from the op's likely
    choices, so that more pins can be honoured. The pins go to
    ``hub.compile(mod, placement=...)``.
    """
    from hypothesis import strategies as st

    choices = tuple(choices)
    likely = likely or {}

    @st.composite
    def strategy(draw: Any) -> dict[str, str]:
        pins = {}
        for node, op in spec.nodes:
            if not draw(st.booleans()):
                continue
            preferred = tuple(likely.get(op, ()))
            pool = preferred if preferred and draw(st.booleans()) else choices
            pins[node] = draw(st.sampled_from(pool))
        return pins

    return strategy()


def build(spec: GraphSpec) -> Any:
    """The Relax module of ``spec``: ``main(x)`` with its constants bound in."""
    import numpy as np
    from tvm import relax

    from umahub._tvm import TensorType

    rng = np.random.default_rng(spec.seed)
    shared: dict[tuple[int | None, tuple[int, ...]], Any] = {}

    def const(shape: Sequence[int], scale: float = 1.0, number: int | None = None) -> Any:
        key = (number, tuple(shape))
        if number is not None and key in shared:
            return shared[key]
        value = relax.const((rng.standard_normal(shape) * scale).astype("float32"))
        if number is not None:
            shared[key] = value
        return value

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
    returned = {len(spec.steps), *spec.outputs}
    with bb.function("main", [x]):
        with bb.dataflow():
            values, shapes = [x], [spec.shape]
            for i, step in enumerate(spec.steps):
                src = i if step.src is None else step.src
                h, shape = values[src], shapes[src]
                if step.op in binary:
                    rhs = (
                        const(shape, number=step.const)
                        if step.other is None
                        else values[step.other]
                    )
                    expr = binary[step.op](h, rhs)
                elif step.op == "relax.matmul":
                    weight = const((shape[1], step.features), shape[1] ** -0.5, step.const)
                    expr = relax.op.matmul(h, weight)
                elif step.op == "relax.nn.conv2d":
                    k, c = step.kernel, shape[1]
                    weight = const((step.features, c, k, k), (c * k * k) ** -0.5, step.const)
                    expr = relax.op.nn.conv2d(h, weight, padding=k // 2)
                else:
                    expr = unary[step.op](h)
                if step.bias:
                    out = _shape_after(shape, step)
                    bias_shape = (1, out[1], 1, 1) if len(out) == 4 else (out[1],)
                    expr = relax.op.add(bb.emit(expr, name_hint=f"n{i}"), const(bias_shape))
                emit = bb.emit_output if i + 1 in returned else bb.emit
                values.append(emit(expr, name_hint=f"n{i}_bias" if step.bias else f"n{i}"))
                shapes.append(_shape_after(shape, step))
        if spec.outputs:
            bb.emit_func_output(relax.Tuple([values[-1], *(values[v] for v in spec.outputs)]))
        else:
            bb.emit_func_output(values[-1])
    return bb.get()


def graph_inputs(spec: GraphSpec) -> list[Any]:
    """The input of ``spec``'s graph: standard normal, drawn from its seed."""
    import numpy as np

    rng = np.random.default_rng(spec.seed + 1)
    return [rng.standard_normal(spec.shape).astype("float32")]
