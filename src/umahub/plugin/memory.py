"""Memory planning: what each partition needs of its pool, checked before codegen.

The model (simple, stated, and the same for every accelerator):

* A partition's tensors are its inputs, its intermediates and its outputs.
  With ``scope-policy = "io"`` the inputs live in the pool too; with
  ``"outputs"`` they are read from where they are and only intermediates and
  outputs count.
* Weights (constant inputs) placed in a pool stay resident there: they are
  loaded once. Everything else is transient: partitions of one instance run one
  after the other, so its pool holds one partition's transient tensors at a time.
* A pool is per instance (each DSP core has its own TCM); the same scope
  declared by two accelerators is still one pool per device.
* The host's plan is the peak of live host tensors over ``main``'s bindings
  (inputs, intermediates, outputs), plus its constants.

``used = resident + peak transient``; a partition fits when the resident
bytes so far plus its own resident bytes plus its transient bytes are within
the pool's size.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "UNBOUNDED",
    "MemoryPlan",
    "Need",
    "PoolUse",
    "bounded",
    "element_bytes",
    "size_bounds",
    "symbolic_sizes",
    "tensor_bytes",
    "upper_bound",
]


@functools.lru_cache(maxsize=64)
def element_bytes(dtype: str) -> int:
    """Bytes of one element of ``dtype`` (a vector type's lanes included)."""
    import tvm

    data_type = tvm.DataType(dtype)
    return (data_type.bits * data_type.lanes + 7) // 8


UNBOUNDED = 2**62
"""What :func:`tensor_bytes` gives with ``unknown=UNBOUNDED``: more than any pool."""

_BOUNDS: contextvars.ContextVar[Mapping[str, int] | None] = contextvars.ContextVar(
    "umahub_size_bounds", default=None
)


def size_bounds(main: Any) -> dict[str, int]:
    """Upper bounds of ``main``'s symbolic sizes, from its ``tir_var_upper_bound`` attribute.

    That attribute is TVM's own way to bound a dynamic dimension (Relax's memory
    planner reads it too): ``main.with_attr("tir_var_upper_bound", {"n": 64})``.
    """
    attrs = getattr(main, "attrs", None)
    if not attrs or "tir_var_upper_bound" not in attrs:
        return {}
    return {str(k): int(v) for k, v in attrs["tir_var_upper_bound"].items()}


@contextlib.contextmanager
def bounded(bounds: Mapping[str, int]) -> Iterator[None]:
    """While inside, :func:`tensor_bytes` sizes symbolic dimensions by these upper bounds."""
    token = _BOUNDS.set(dict(bounds))
    try:
        yield
    finally:
        _BOUNDS.reset(token)


def _dim(dim: Any, bounds: Mapping[str, int]) -> int | None:
    value = getattr(dim, "value", None)
    if value is not None:
        return int(value)
    if not bounds:
        return None
    import tvm

    from umahub._tvm import Analyzer

    tir = getattr(tvm, "tirx", None) or tvm.tir  # renamed in apache-tvm 0.26
    analyzer = Analyzer()
    for var in tir.analysis.undefined_vars(dim):
        if str(var.name) not in bounds:
            return None
        analyzer.bind(var, tvm.ir.Range(0, bounds[str(var.name)] + 1))
    upper = analyzer.const_int_bound(dim).max_value
    return None if upper >= 2**62 else int(upper)


def upper_bound(dim: Any) -> int | None:
    """The largest value a size can take: its value when static; for a size known only
    at run time (a ``tir.Var`` such as a prompt's length, or an expression of them),
    its upper bound while inside :func:`bounded` (``main``'s ``tir_var_upper_bound``,
    which umahub applies for the whole compile); None when nothing bounds it.

    A check or a schedule sizes a bounded dimension by this worst case: a tile
    of a sequence of at most 128 tokens is planned as 128 rows.
    """
    if isinstance(dim, int):
        return dim
    return _dim(dim, _BOUNDS.get() or {})


def symbolic_sizes(struct_info: Any) -> set[str]:
    """Names of the sizes of a tensor type (or tuple) known only at run time."""
    from umahub._tvm import TensorType, TupleType

    if isinstance(struct_info, TupleType):
        return set().union(*(symbolic_sizes(f) for f in struct_info.fields))
    if not isinstance(struct_info, TensorType):
        return set()
    shape = getattr(struct_info.shape, "values", None) if struct_info.shape is not None else None
    if shape is None:
        return {"?"} if struct_info.ndim != 0 else set()
    return {str(d) for d in shape if getattr(d, "value", None) is None}


def tensor_bytes(struct_info: Any, unknown: int = 0) -> int:
    """Bytes of a tensor type (or the sum over a tuple), or of a Relax expression's type.

    ``struct_info`` is a type (``TensorType``, ``TupleType``) or an expression
    that has one: a pattern check may pass an operand as it is (``call.args[1]``,
    a variable or a constant) as it does to :func:`~umahub.plugin.shape_of`.
    A size known only at run time counts by its upper bound while inside
    :func:`bounded`; without one, the tensor counts as ``unknown`` bytes (0 by
    default: the report's sizes; :data:`UNBOUNDED` where a check must not
    assume that a tensor fits).
    """
    from tvm import relax

    from umahub._tvm import TensorType, TupleType, type_of

    if isinstance(struct_info, relax.Expr):  # an operand: its type (not a type: no Expr)
        struct_info = type_of(struct_info)

    if isinstance(struct_info, TupleType):
        return sum(tensor_bytes(f, unknown) for f in struct_info.fields)
    if not isinstance(struct_info, TensorType) or struct_info.shape is None:
        return unknown if isinstance(struct_info, TensorType) else 0
    shape = getattr(struct_info.shape, "values", None)
    if shape is None:
        return unknown
    bounds = _BOUNDS.get() or {}
    count = 1
    for dim in shape:
        value = _dim(dim, bounds)
        if value is None:
            return unknown
        count *= value
    return count * element_bytes(str(struct_info.dtype))


@dataclass(frozen=True)
class Need:
    """What one partition needs of its pool, in bytes."""

    resident: int
    transient: int

    @property
    def total(self) -> int:
        """Resident plus transient bytes."""
        return self.resident + self.transient


@dataclass(frozen=True)
class PoolUse:
    """One pool on one device: its size and what is planned in it so far."""

    device: str
    scope: str
    size_bytes: int
    copy: str
    resident: int = 0
    peak_transient: int = 0

    @property
    def used(self) -> int:
        """Resident bytes plus the largest transient working set."""
        return self.resident + self.peak_transient

    @property
    def free(self) -> int:
        """Bytes left."""
        return self.size_bytes - self.used

    def fits(self, need: Need) -> bool:
        """True when ``need`` can be added without overflowing the pool."""
        return self.resident + need.resident + max(self.peak_transient, need.transient) <= (
            self.size_bytes
        )

    def add(self, need: Need) -> PoolUse:
        """The pool with ``need`` planned in it."""
        return replace(
            self,
            resident=self.resident + need.resident,
            peak_transient=max(self.peak_transient, need.transient),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for the report."""
        return {
            "device": self.device,
            "scope": self.scope,
            "size_bytes": self.size_bytes,
            "copy": self.copy,
            "resident": self.resident,
            "peak_transient": self.peak_transient,
            "used": self.used,
            "free": self.free,
        }


@dataclass(frozen=True)
class MemoryPlan:
    """Every pool's use so far, and the host's planned bytes.

    Immutable: :meth:`add` returns the next plan, so each hook's context keeps
    the plan as it was when its partition was lowered.
    """

    pools: tuple[PoolUse, ...] = ()
    host_bytes: int = 0
    host_constants: int = 0

    @classmethod
    def for_devices(cls, pools: Iterable[PoolUse]) -> MemoryPlan:
        """An empty plan over these pools."""
        return cls(pools=tuple(pools))

    def pool(self, device: str, scope: str) -> PoolUse | None:
        """The pool of ``scope`` on ``device``, or None."""
        for p in self.pools:
            if p.device == device and p.scope == scope:
                return p
        return None

    def free(self, device: str, scope: str) -> int | None:
        """Bytes free in that pool, or None when there is no such pool."""
        p = self.pool(device, scope)
        return None if p is None else p.free

    def add(self, device: str, scope: str, need: Need) -> MemoryPlan:
        """The plan with ``need`` added to the pool of ``scope`` on ``device``."""
        pools = tuple(
            p.add(need) if (p.device, p.scope) == (device, scope) else p for p in self.pools
        )
        return replace(self, pools=pools)

    def with_host(self, host_bytes: int, host_constants: int) -> MemoryPlan:
        """The plan with the host's planned bytes set."""
        return replace(self, host_bytes=host_bytes, host_constants=host_constants)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for the report."""
        return {
            "host": {"bytes": self.host_bytes, "constants": self.host_constants},
            "pools": [p.to_dict() for p in self.pools],
        }
