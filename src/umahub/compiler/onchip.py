"""On-chip buffers: what a partition's tiles take of each memory scope its accelerator declares.

An accelerator declares its on-chip buffers (:class:`umahub.plugin.OnChipBuffer`):
memory scopes of fixed capacity. Its plugin's TIR allocates tiles in them.
:func:`use` adds up a PrimFunc's allocations per scope; :func:`check` compares
them with the accelerator's declared capacities and refuses a partition that
does not fit, naming the scope, the need and the capacity. That is the memory
planner's part for tiles: a tile that does not fit is a compile-time refusal
(the partition goes back to the host, or the compile stops with
``on-error = "error"``), never an overflow on the device.

Scopes the accelerator does not declare are not checked (a plugin that uses
TVM's ``local`` or ``shared`` for its own reasons is left alone).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from umahub.errors import CompileError
from umahub.plugin import compat
from umahub.plugin.accelerator import Accelerator
from umahub.sizes import human_size

__all__ = ["check", "use"]


def _bytes(shape: Any, dtype: Any) -> int:
    count = 1
    for dim in shape:
        count *= int(dim)
    return count * np.dtype(str(dtype)).itemsize


def use(func: Any) -> dict[str, int]:
    """Bytes allocated per storage scope in ``func`` (a PrimFunc): its blocks'
    ``alloc_buffers`` and its ``Allocate`` statements, ``global`` left out."""
    from tvm import tirx

    used: dict[str, int] = defaultdict(int)
    for block in compat.nodes_in(func.body, compat.SBlock):
        for buffer in block.alloc_buffers:
            used[str(buffer.scope())] += _bytes(buffer.shape, buffer.dtype)
    allocate = getattr(tirx, "Allocate", None)
    if allocate is not None:
        for node in compat.nodes_in(func.body, allocate):
            scope = str(getattr(node.buffer_var.type_annotation, "storage_scope", "global"))
            used[scope] += _bytes(node.extents, node.dtype)
    used.pop("global", None)
    used.pop("", None)
    return dict(used)


def check(acc: Accelerator, func: Any, symbol: str) -> dict[str, tuple[int, int]]:
    """``{scope: (bytes used, capacity)}`` for each on-chip buffer of ``acc``.

    Raises:
        CompileError: the tiles of partition ``symbol`` need more of a scope than
            the accelerator has.
    """
    if not acc.buffers:
        return {}
    used = use(func)
    result = {}
    for buffer in acc.buffers:
        need = used.get(buffer.scope, 0)
        if need > buffer.size_bytes:
            what = f" ({buffer.description})" if buffer.description else ""
            raise CompileError(
                f"partition {symbol} does not fit '{acc.name}': its tiles need "
                f"{human_size(need)} of on-chip buffer {buffer.scope}{what}, which holds "
                f"{human_size(buffer.size_bytes)}; the plugin must tile it smaller or refuse it"
            )
        result[buffer.scope] = (need, buffer.size_bytes)
    return result
