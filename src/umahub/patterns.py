"""Helpers for writing a plugin's patterns and their checks.

A pattern's ``check`` receives a ``tvm.relax.transform.PatternCheckContext``;
these functions read what checks usually need from it (shapes, dtypes,
attributes, the bytes a match touches), the same way on every supported TVM.

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

__all__ = ["Refusal", "calls", "dtype_of", "match_bytes", "refusal_reason", "shape_of"]


class Refusal:
    """A pattern check's "no", with the reason: false, so it refuses wherever a bool would.

    ``reason`` is one phrase that completes "the check refused it: ..." (no
    final period), naming what the hardware cannot take and the numbers that
    decided it, e.g. ``"a tensor of 24 KiB, more than a quarter of the 64 KiB
    TCM"``. Sizes go through :func:`umahub.sizes.human_size`.
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
    :data:`umahub.memory.UNBOUNDED`: a check against a pool's size then refuses
    the match rather than assume that it fits.
    """
    from tvm import relax

    from umahub._tvm import TensorType, type_of
    from umahub.memory import UNBOUNDED, tensor_bytes

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
