"""Helpers for writing a plugin's patterns and their checks.

A pattern's ``check`` receives a ``tvm.relax.transform.PatternCheckContext``;
these functions read what checks usually need from it (shapes, dtypes,
attributes, the bytes a match touches), the same way on every supported TVM.

The pattern factories (:func:`matmul`, :func:`conv2d`, :func:`bias_add`,
:func:`activated`, :func:`hardswish`, :func:`epilogues`...) build the
``tvm.relax.dpl`` patterns that accelerators claim most often, written the way
TVM's frontends (ONNX, PyTorch's ``torch.export``) emit those operators, so
that a plugin claims "a convolution with its bias and activation" in one line.

A check returns True to take a match and a false value to refuse it. To say
*why* it refuses, it returns a :class:`Refusal` (``umahub.Refusal``), which is
false too: ``return Refusal(f"a tensor of {human_size(n)}, more than a quarter
of the 64 KiB TCM")``. When an operator pinned to the accelerator stays
elsewhere, the user's message passes that reason on. A check that returns a
plain bool keeps working; its refusals are reported without a reason.
"""

from __future__ import annotations

from typing import Any

# TVM is imported inside the functions: plugins import this module when they
# are loaded, and loading a plugin must not import TVM.

__all__ = [
    "ACTIVATIONS",
    "Refusal",
    "Unsupported",
    "activated",
    "bias_add",
    "calls",
    "conv2d",
    "dtype_of",
    "epilogues",
    "hardsigmoid",
    "hardswish",
    "match_bytes",
    "matmul",
    "op",
    "refusal_reason",
    "relu6",
    "shape_of",
]


class Refusal:
    """A pattern check's "no", with the reason: false, so it refuses wherever a bool would.

    ``reason`` is one phrase that completes "the check refused it: ..." (no
    final period), naming what the hardware cannot take and the numbers that
    decided it, e.g. ``"a tensor of 24 KiB, more than a quarter of the 64 KiB
    TCM"``. Sizes go through :func:`umahub.plugin.human_size`.
    """

    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = str(reason)

    def __bool__(self) -> bool:
        return False

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Refusal) and other.reason == self.reason

    def __hash__(self) -> int:
        return hash((Refusal, self.reason))

    def __repr__(self) -> str:
        return f"Refusal({self.reason!r})"

    def __str__(self) -> str:
        return self.reason


class Unsupported(Exception):
    """A lowering hook's "no" to its partition, with the reason: the partition goes
    back to the host with that message, as a pattern check's :class:`Refusal` does
    before partitioning.

    Raise it from ``umahub_relax_to_tir``, ``umahub_schedule``, ``umahub_tir_passes``
    or ``umahub_codegen`` when a partition turns out to be one the accelerator
    cannot take (a shape whose tiles cannot fit its buffers, an attribute its
    instructions lack)::

        raise up.Unsupported(f"a 12x12 kernel's weight tiles ({need} bytes) do not fit WGT")

    Unlike any other exception, which is the plugin's failure (a warning, and
    the end of the compile with ``on-error = "error"``), a refusal is a decision:
    the report shows the partition on the host, saying ``plugin '<name>' refused
    partition <symbol> in <hook>: <reason>``, with ``on-error = "error"`` too.
    Raise it from the hook's own Python code: TVM does not carry the type out of
    a pass it runs. The message is one phrase, no final period, like a
    :class:`Refusal`'s reason; subclass it for a type of your own.
    """


def refusal_reason(result: Any) -> str | None:
    """What a check's ``result`` says: None when it takes the match, else the reason ("" if none).

    A :class:`Refusal` gives its reason; any other false value refuses without one.
    """
    if isinstance(result, Refusal):
        return result.reason
    return None if result else ""


def shape_of(expr: Any) -> tuple[int, ...] | None:
    """The static shape of a tensor expression, or None when it is not static."""
    from umahub._tvm import TensorType, type_of

    ty = type_of(expr)
    if not isinstance(ty, TensorType) or ty.shape is None:
        return None
    values = getattr(ty.shape, "values", None)
    if values is None or not all(hasattr(v, "value") for v in values):
        return None
    return tuple(int(v.value) for v in values)


def bounded_shape_of(expr: Any) -> tuple[int, ...] | None:
    """The shape of a tensor expression at its worst case: static sizes as they are,
    a size known only at run time by its upper bound (``tir_var_upper_bound`` on
    ``main``, see :func:`~umahub.plugin.memory.upper_bound`); None when a size has
    no bound or the rank is unknown.

    What a check uses to take an operator of a bounded symbolic size (a prefill's
    sequence length) and to size its tensors: :func:`shape_of` is None for it.
    """
    from umahub._tvm import TensorType, type_of
    from umahub.plugin.memory import upper_bound

    ty = type_of(expr)
    if not isinstance(ty, TensorType) or ty.shape is None:
        return None
    values = getattr(ty.shape, "values", None)
    if values is None:
        return None
    bounds = [upper_bound(v) for v in values]
    known = [b for b in bounds if b is not None]
    return tuple(known) if len(known) == len(bounds) else None


def dtype_of(expr: Any) -> str:
    """The dtype of a tensor expression (``"float32"``)."""
    from umahub._tvm import type_of

    return str(type_of(expr).dtype)


def calls(ctx: Any, op_name: str | None = None) -> list[Any]:
    """The operator calls of a match (only those of ``op_name`` if given)."""
    import tvm
    from tvm import relax

    found = []
    for value in ctx.matched_bindings.values():
        if (
            isinstance(value, relax.Call)
            and isinstance(value.op, tvm.ir.Op)
            and (op_name is None or value.op.name == op_name)
        ):
            found.append(value)
    return found


def match_bytes(ctx: Any) -> int:
    """Bytes of every tensor a match reads or writes: inputs, intermediates, outputs.

    A tensor whose size is known only at run time counts by the upper bound of
    its sizes (``tir_var_upper_bound`` on ``main``), and without one as
    :data:`umahub.plugin.memory.UNBOUNDED`: a check against a pool's size then refuses
    the match rather than assume that it fits.
    """
    from tvm import relax

    from umahub._tvm import TensorType, type_of
    from umahub.plugin.memory import UNBOUNDED, tensor_bytes

    produced = list(ctx.matched_bindings.keys())
    total = sum(tensor_bytes(type_of(v), UNBOUNDED) for v in ctx.matched_bindings.values())
    inputs: list[Any] = []
    for value in ctx.matched_bindings.values():
        args = value.args if isinstance(value, relax.Call) else ()
        for arg in args:
            for a in arg.fields if isinstance(arg, relax.Tuple) else [arg]:
                if any(a.same_as(v) for v in produced) or any(a.same_as(i) for i in inputs):
                    continue
                inputs.append(a)
    return total + sum(
        tensor_bytes(type_of(a), UNBOUNDED) for a in inputs if isinstance(type_of(a), TensorType)
    )


# ----------------------------------------------------------------- pattern factories


#: The activations :func:`activated` takes by default: one operator each
#: (``relax.clip`` with its two bounds: ReLU6 and the like).
ACTIVATIONS = ("relax.nn.relu", "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.clip")

# The arity of the operators :func:`op` knows beyond one argument.
_ARITY = {"relax.clip": 3, "relax.nn.conv2d": 2, "relax.matmul": 2}


def op(name: str, *args: Any) -> Any:
    """A call of the Relax operator ``name`` on ``args`` (patterns); fresh wildcards
    where none are given (two for a binary operator, three for ``relax.clip``)."""
    from tvm.relax.dpl import is_op, wildcard

    if not args:
        binary = name.rpartition(".")[2] in ("add", "subtract", "multiply", "divide", "matmul")
        args = tuple(wildcard() for _ in range(_ARITY.get(name, 2 if binary else 1)))
    return is_op(name)(*args)


def matmul() -> Any:
    """``relax.matmul(a, b)`` of any two tensors."""
    return op("relax.matmul")


def conv2d(data: Any = None) -> Any:
    """``relax.nn.conv2d(data, weight)``; ``data`` any tensor unless given."""
    from tvm.relax.dpl import wildcard

    return op("relax.nn.conv2d", data if data is not None else wildcard(), wildcard())


def bias_add(producer: Any, bias: Any = None) -> Any:
    """``producer + bias`` in either order (frontends write both); ``bias`` any tensor
    unless given (``is_const()`` for a constant bias only)."""
    from tvm.relax.dpl import is_op, wildcard

    first = bias if bias is not None else wildcard()
    second = bias if bias is not None else wildcard()
    return is_op("relax.add")(producer, first) | is_op("relax.add")(second, producer)


def activated(producer: Any, activations: tuple[str, ...] = ACTIVATIONS, silu: bool = True) -> Any:
    """One of ``activations`` applied to ``producer`` and, with ``silu``, SiLU as
    frontends write it (``x * sigmoid(x)``, in either order)."""
    from tvm.relax.dpl import is_op, wildcard

    # Fresh wildcards per argument: one pattern object used twice would require
    # both arguments to be the same expression.
    alternatives = [
        is_op(name)(producer, *[wildcard() for _ in range(2 if name == "relax.clip" else 0)])
        for name in activations
    ]
    if silu:
        # x * sigmoid(x): here one pattern used twice is what it means
        sigmoid = is_op("relax.sigmoid")(producer)
        alternatives += [
            is_op("relax.multiply")(producer, sigmoid),
            is_op("relax.multiply")(sigmoid, producer),
        ]
    pattern = alternatives[0]
    for alternative in alternatives[1:]:
        pattern = pattern | alternative
    return pattern


def relu6(producer: Any) -> Any:
    """``relu6(producer + 3)``: one clip, or torch.export's two."""
    from tvm.relax.dpl import is_const, is_op, wildcard

    clipped = is_op("relax.clip")(is_op("relax.add")(producer, is_const()), wildcard(), wildcard())
    return clipped | is_op("relax.clip")(clipped, wildcard(), wildcard())


def hardsigmoid(producer: Any) -> Any:
    """Hardsigmoid of ``producer``: ``relu6(x + 3) / 6`` (PyTorch's, divided or
    multiplied by a constant) or ``clip(alpha * x + beta, 0, 1)`` (ONNX's)."""
    from tvm.relax.dpl import is_const, is_op, wildcard

    scaled = is_op("relax.multiply")(is_const(), producer)
    scaled = scaled | is_op("relax.multiply")(producer, is_const())
    onnx = is_op("relax.clip")(is_op("relax.add")(scaled, is_const()), wildcard(), wildcard())
    shifted = relu6(producer)
    divided = is_op("relax.divide")(shifted, is_const())
    return divided | is_op("relax.multiply")(shifted, is_const()) | onnx


def hardswish(producer: Any) -> Any:
    """Hardswish of ``producer``: ``x * relu6(x + 3) / 6`` (torch.export's) or
    ``x * hardsigmoid(x)`` (TVM's PyTorch and ONNX frontends')."""
    from tvm.relax.dpl import is_const, is_op

    shifted = relu6(producer)
    gated = is_op("relax.multiply")(producer, shifted)
    gated = gated | is_op("relax.multiply")(shifted, producer)
    sigmoid = hardsigmoid(producer)
    return (
        is_op("relax.divide")(gated, is_const())
        | is_op("relax.multiply")(producer, sigmoid)
        | is_op("relax.multiply")(sigmoid, producer)
    )


def epilogues(
    accelerator: str,
    kind: str,
    producer: Any,
    check: Any = None,
    activations: tuple[str, ...] = ACTIVATIONS,
    silu: bool = True,
) -> list[tuple[str, Any, dict, Any]]:
    """``producer`` (a matmul, a convolution) with every epilogue a kernel computes per tile,
    as named patterns, largest match first (the order in which partitioning tries them).

    The names are ``"<accelerator>.<kind>"`` plus, for each epilogue:
    ``_bias_hswish``, ``_hswish``, ``_bias_hsigmoid``, ``_hsigmoid``,
    ``_bias_residual_act``, ``_bias_residual`` (the bias add's result plus a
    tensor computed at run time, a residual block's sum), ``_bias_act``,
    ``_bias``, ``_act``, and the producer alone. Hardswish comes before the
    bias patterns, which would take its ``+ 3`` for a bias, and before
    hardsigmoid, which is part of it. Each pattern has ``check``. The
    activations of the ``_act`` patterns are ``activations`` and, with
    ``silu``, SiLU (see :func:`activated`).
    """
    from tvm.relax.dpl import is_const, is_op

    bias = bias_add(producer)
    # a residual block's input is a tensor computed at run time: hardswish's "+ 3" is no residual
    block_input = ~is_const()
    residual = is_op("relax.add")(bias, block_input) | is_op("relax.add")(block_input, bias)
    name = f"{accelerator}.{kind}"
    return [
        (f"{name}_bias_hswish", hardswish(bias), {}, check),
        (f"{name}_hswish", hardswish(producer), {}, check),
        (f"{name}_bias_hsigmoid", hardsigmoid(bias), {}, check),
        (f"{name}_hsigmoid", hardsigmoid(producer), {}, check),
        (f"{name}_bias_residual_act", activated(residual, activations, silu), {}, check),
        (f"{name}_bias_residual", residual, {}, check),
        (f"{name}_bias_act", activated(bias, activations, silu), {}, check),
        (f"{name}_bias", bias, {}, check),
        (f"{name}_act", activated(producer, activations, silu), {}, check),
        (name, producer, {}, check),
    ]
