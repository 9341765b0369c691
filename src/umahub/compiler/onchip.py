"""On-chip buffers: what a partition's tiles take of each memory scope its accelerator declares.

An accelerator declares its on-chip buffers (:class:`umahub.plugin.OnChipBuffer`):
memory scopes of fixed capacity. Its plugin's TIR allocates tiles in them.
:func:`use` adds up a PrimFunc's allocations per scope; :func:`check` compares
them with the accelerator's declared capacities and refuses a partition that
does not fit, naming the scope, the need and the capacity. That is the memory
planner's part for tiles: a tile that does not fit is a compile-time refusal
(the partition goes back to the host, or the compile stops with
``on-error = "error"``), never an overflow on the device.

A scope tagged with the accelerator's name (``local.<name>.<buffer>``) that no
buffer of the accelerator declares is refused too, naming the declared ones:
such a scope is the plugin's own, so it is a typo or a buffer left undeclared,
and its capacity could not be checked. Other scopes are not checked (a plugin
that uses TVM's ``local`` or ``shared`` for its own reasons is left alone).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from umahub.errors import CompileError, did_you_mean
from umahub.plugin import compat
from umahub.plugin.accelerator import Accelerator
from umahub.sizes import human_size

__all__ = ["DoesNotFit", "check", "owned_by", "use"]


#: What :func:`use` says of a scope with an allocation whose size is known only at run time.
UNKNOWN = -1


def _bytes(shape: Any, dtype: Any) -> int:
    """Bytes of an allocation at its worst case: a dimension known only at run time
    (a prompt's length) by its upper bound (``tir_var_upper_bound``, see
    :func:`umahub.plugin.memory.upper_bound`), or :data:`UNKNOWN` where none bounds it."""
    from umahub.plugin.memory import upper_bound

    count = 1
    for dim in shape:
        value = getattr(dim, "value", dim)
        if not isinstance(value, int):
            value = upper_bound(dim)
            if value is None:
                return UNKNOWN
        count *= value
    return count * np.dtype(str(dtype)).itemsize


def _bounded_sizes(func: Any, scope: str) -> list[str]:
    """``"n <= 128"`` for each run-time size of the allocations in ``scope``, by name."""
    from tvm import tirx

    from umahub.plugin.memory import upper_bound

    shapes = [
        b.shape
        for block in compat.nodes_in(func.body, compat.SBlock)
        for b in block.alloc_buffers
        if str(b.scope()) == scope
    ]
    allocate = getattr(tirx, "Allocate", None)
    if allocate is not None:
        shapes += [
            n.extents
            for n in compat.nodes_in(func.body, allocate)
            if str(getattr(n.buffer_var.type_annotation, "storage_scope", "")) == scope
        ]
    found = {}
    for shape in shapes:
        for dim in shape:
            for var in tirx.analysis.undefined_vars(dim) if not isinstance(dim, int) else ():
                found[str(var.name)] = upper_bound(var)
    return [f"{name} <= {bound}" for name, bound in sorted(found.items())]


def use(func: Any) -> dict[str, int]:
    """Bytes allocated per storage scope in ``func`` (a PrimFunc): its blocks'
    ``alloc_buffers`` and its ``Allocate`` statements, ``global`` left out;
    :data:`UNKNOWN` for a scope where an allocation's size has no upper bound."""
    from tvm import tirx

    used: dict[str, int] = defaultdict(int)

    def add(scope: str, size: int) -> None:
        known = size != UNKNOWN and used[scope] != UNKNOWN
        used[scope] = used[scope] + size if known else UNKNOWN

    for block in compat.nodes_in(func.body, compat.SBlock):
        for buffer in block.alloc_buffers:
            add(str(buffer.scope()), _bytes(buffer.shape, buffer.dtype))
    allocate = getattr(tirx, "Allocate", None)
    if allocate is not None:
        for node in compat.nodes_in(func.body, allocate):
            scope = str(getattr(node.buffer_var.type_annotation, "storage_scope", "global"))
            add(scope, _bytes(node.extents, node.dtype))
    used.pop("global", None)
    used.pop("", None)
    return dict(used)


def _size(need: int) -> str:
    return "a size known only at run time" if need == UNKNOWN else human_size(need)


def owned_by(scope: str, name: str) -> bool:
    """Whether storage scope ``scope`` is tagged with accelerator ``name``: its tag
    (what follows the rank) is ``name`` or starts with ``name.``."""
    _, _, tag = scope.partition(".")
    return tag.split(".", 1)[0] == name


def _undeclared(acc: Accelerator, used: dict[str, int], symbol: str) -> None:
    """Raise for the first scope in ``used`` tagged with ``acc``'s name that it does not declare."""
    declared = [b.scope for b in acc.buffers]
    for scope, need in used.items():
        if owned_by(scope, acc.name) and scope not in declared:
            has = (
                f"it declares {', '.join(declared)}"
                if declared
                else "it declares none (Accelerator(buffers=...))"
            )
            raise CompileError(
                f"partition {symbol} allocates {_size(need)} in scope {scope}, which no "
                f"on-chip buffer of '{acc.name}' declares ({has}){did_you_mean(scope, declared)}: "
                "its capacity cannot be checked; the plugin must use a declared scope or "
                "declare this one as an OnChipBuffer"
            )


class DoesNotFit(CompileError):
    """A partition's tiles need more of an on-chip buffer than its accelerator has (or
    an amount known only at run time): its operators are offered to the other
    accelerators (see :meth:`umahub.compiler.compilation.Compilation.does_not_fit`)."""


def check(acc: Accelerator, func: Any, symbol: str) -> dict[str, tuple[int, int]]:
    """``{scope: (bytes used, capacity)}`` for each on-chip buffer of ``acc``.

    Raises:
        DoesNotFit: the tiles of partition ``symbol`` need more of a scope than the
            accelerator has, or an amount known only at run time.
        CompileError: its tiles are in a scope tagged with the accelerator's name
            that none of its buffers declares (the plugin's mistake).
    """
    used = use(func)
    _undeclared(acc, used, symbol)
    if not acc.buffers:
        return {}
    result = {}
    for buffer in acc.buffers:
        need = used.get(buffer.scope, 0)
        if need == UNKNOWN:
            raise DoesNotFit(
                f"partition {symbol} does not fit '{acc.name}' for certain: its tiles in "
                f"on-chip buffer {buffer.scope} have a size known only at run time, with no "
                "upper bound; bound it (main's tir_var_upper_bound attribute), or the plugin "
                "must tile it to a static size or refuse it"
            )
        if need > buffer.size_bytes:
            what = f" ({buffer.description})" if buffer.description else ""
            bounded = _bounded_sizes(func, buffer.scope)
            at = f" at the bound of its sizes ({', '.join(bounded)})" if bounded else ""
            raise DoesNotFit(
                f"partition {symbol} does not fit '{acc.name}': its tiles need "
                f"{human_size(need)}{at} of on-chip buffer {buffer.scope}{what}, which holds "
                f"{human_size(buffer.size_bytes)}; the plugin must tile it smaller or refuse it"
            )
        result[buffer.scope] = (need, buffer.size_bytes)
    return result
