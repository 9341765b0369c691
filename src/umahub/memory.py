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

import functools
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["MemoryPlan", "Need", "PoolUse", "tensor_bytes"]


@functools.lru_cache(maxsize=64)
def _element_bytes(dtype: str) -> int:
    import tvm

    data_type = tvm.DataType(dtype)
    return (data_type.bits * data_type.lanes + 7) // 8


def tensor_bytes(struct_info: Any) -> int:
    """Bytes of a tensor type (or the sum over a tuple) with a static shape; 0 if unknown."""
    from umahub._tvm import TensorType, TupleType

    if isinstance(struct_info, TupleType):
        return sum(tensor_bytes(f) for f in struct_info.fields)
    if not isinstance(struct_info, TensorType) or struct_info.shape is None:
        return 0
    shape = getattr(struct_info.shape, "values", None)
    if shape is None:
        return 0
    count = 1
    for dim in shape:
        value = getattr(dim, "value", None)
        if value is None:
            return 0
        count *= int(value)
    return count * _element_bytes(str(struct_info.dtype))


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
