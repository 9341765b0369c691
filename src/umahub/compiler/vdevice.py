"""Virtual devices: where a tensor lives and where an operator runs, partly known.

A :class:`VirtualDevice` has the four fields of TVM's ``VirtualDevice`` (once
``SEScope``): device type, virtual device id, target and memory scope. Any field
may be left unconstrained (``None``). Placement planning joins the constraints
that pins, an accelerator's memory pools and the scope policy put on a
partition; a conflict is reported with both sides.

The rules are TVM's, with one change: targets are compared by value (their
canonical string), not by object identity, so ``"llvm"`` and
``Target("llvm")`` are the same target.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["DEVICE_TYPES", "VirtualDevice"]

#: DLPack's device type numbers, by name.
DEVICE_TYPES = {
    "cpu": 1,
    "cuda": 2,
    "cuda_host": 3,
    "opencl": 4,
    "vulkan": 7,
    "metal": 8,
    "vpi": 9,
    "rocm": 10,
    "rocm_host": 11,
    "ext_dev": 12,
    "cuda_managed": 13,
    "oneapi": 14,
    "webgpu": 15,
    "hexagon": 16,
}
_DEVICE_NAMES = {v: k for k, v in DEVICE_TYPES.items()}


def _device_type(value: int | str | None) -> int | None:
    if value is None or value == -1:
        return None
    if isinstance(value, str):
        try:
            return DEVICE_TYPES[value]
        except KeyError:
            raise ValueError(
                f"unknown device type {value!r}; known: {', '.join(DEVICE_TYPES)}"
            ) from None
    if isinstance(value, int) and value > 0:
        return value
    raise ValueError(f"device_type must be a name, a DLDeviceType number or None, got {value!r}")


def _canonical_target(target: Any) -> tuple[str, int] | None:
    """(canonical string, device type) of a target, or None when unconstrained."""
    if target is None or target == "":
        return None
    import tvm

    t = tvm.target.Target(target)
    return str(t), int(t.get_target_device_type())


@dataclass(frozen=True, init=False)
class VirtualDevice:
    """A partly constrained device: ``VirtualDevice("cpu", 1, "llvm", "npu.sram")``.

    Args:
        device_type: a name (``"cpu"``, ``"cuda"``) or a DLDeviceType number;
            None (or -1) leaves it unconstrained. Derived from ``target`` when
            only the target is given.
        virtual_device_id: which device of that type; None (or -1) = any.
        target: a ``tvm.target.Target`` or its string; None (or "") = any.
        memory_scope: e.g. ``"global"`` or ``"npu.sram"``; None (or "") = any.

    Instances compare by value and are hashable.
    """

    device_type: int | None
    virtual_device_id: int | None
    target: str | None
    memory_scope: str | None

    def __init__(
        self,
        device_type: int | str | None = None,
        virtual_device_id: int | None = None,
        target: Any = None,
        memory_scope: str | None = None,
    ):
        dtype = _device_type(device_type)
        canon = _canonical_target(target)
        if canon is not None:
            if dtype is None:
                dtype = canon[1]
            elif dtype != canon[1]:
                raise ValueError(
                    f"target {canon[0]!r} is for device type {_DEVICE_NAMES.get(canon[1])}, "
                    f"not {_DEVICE_NAMES.get(dtype, dtype)}"
                )
        vid = None if virtual_device_id in (None, -1) else int(virtual_device_id)
        object.__setattr__(self, "device_type", dtype)
        object.__setattr__(self, "virtual_device_id", vid)
        object.__setattr__(self, "target", canon[0] if canon else None)
        object.__setattr__(self, "memory_scope", memory_scope or None)

    @property
    def is_fully_unconstrained(self) -> bool:
        """True when no field is constrained."""
        return self == VirtualDevice()

    def join(self, other: VirtualDevice) -> VirtualDevice | None:
        """The most constrained device that agrees with both, or None on a conflict."""
        fields = {}
        for name in ("device_type", "virtual_device_id", "target", "memory_scope"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine is not None and theirs is not None and mine != theirs:
                return None
            fields[name] = mine if mine is not None else theirs
        return _make(**fields)

    def default(self, other: VirtualDevice) -> VirtualDevice:
        """Fill this device's unconstrained fields from ``other``.

        The target is taken from ``other`` only when ``other``'s target is for
        the device type the result has.
        """
        dtype = self.device_type if self.device_type is not None else other.device_type
        vid = self.virtual_device_id
        if vid is None:
            vid = other.virtual_device_id
        target = self.target
        if target is None and other.target is not None:
            canonical = _canonical_target(other.target)
            if canonical is not None and canonical[1] == dtype:
                target = other.target
        scope = self.memory_scope if self.memory_scope is not None else other.memory_scope
        return _make(dtype, vid, target, scope)

    def conflict(self, other: VirtualDevice) -> str:
        """Name the fields on which the two devices disagree (for error messages)."""
        parts = []
        for name in ("device_type", "virtual_device_id", "target", "memory_scope"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine is not None and theirs is not None and mine != theirs:
                parts.append(f"{name} {mine!r} vs {theirs!r}")
        return ", ".join(parts)

    def __str__(self) -> str:
        return self.describe()

    def describe(self, shown_target: str | None = None) -> str:
        """``(device type,id,target kind,memory scope)``, ``-`` for what is unconstrained;
        ``shown_target`` in place of the target kind (``"device"``: a device of its own,
        whose code is no TVM target)."""
        dtype = (
            "-"
            if self.device_type is None
            else _DEVICE_NAMES.get(self.device_type, str(self.device_type))
        )
        vid = "-" if self.virtual_device_id is None else str(self.virtual_device_id)
        kind = shown_target or _target_kind(self.target)
        return f"({dtype},{vid},{kind},{self.memory_scope or '-'})"


def _target_kind(target: str | None) -> str:
    """The target's kind for display (``"llvm"``), whatever TVM's canonical form."""
    if target is None:
        return "-"
    if target.startswith("{"):
        import json

        return str(json.loads(target).get("kind", target))
    return target.split()[0]


def _make(device_type, virtual_device_id, target, memory_scope) -> VirtualDevice:
    # Fields are already canonical: skip re-parsing the target.
    vd = object.__new__(VirtualDevice)
    for name, value in (
        ("device_type", device_type),
        ("virtual_device_id", virtual_device_id),
        ("target", target),
        ("memory_scope", memory_scope),
    ):
        object.__setattr__(vd, name, value)
    return vd
