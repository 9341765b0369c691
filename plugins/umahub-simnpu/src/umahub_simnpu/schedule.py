"""The simnpu's schedule (S-TIR): each tile placed in its on-chip buffer's memory scope.

The lowering allocates the tiles ``inp``, ``wgt`` and ``acc`` in no particular
memory; :func:`place_tiles` moves each into its scope with the schedule's
``set_scope`` (as VTA's schedules put their buffers in ``local.inp_buffer``),
on the first block that writes it. From then on the TIR says where each tile
lives: umahub checks the scopes' use against the declared capacities, and the
codegen addresses the buffers by scope.
"""

from __future__ import annotations

from typing import Any

import umahub.plugin as up

__all__ = ["SCOPES", "place_tiles"]

#: Each tile's scope: the simnpu's on-chip buffers (declared by its accelerator).
SCOPES = {"inp": "local.simnpu.inp", "wgt": "local.simnpu.wgt", "acc": "local.simnpu.acc"}


def place_tiles(schedule: Any, symbol: str) -> str:
    """Put each tile of ``schedule``'s PrimFunc ``symbol`` in its scope; say which.

    Raises:
        ValueError: a tile of :data:`SCOPES` that no block writes.
    """
    func = schedule.mod[symbol]
    placed = []
    for name, scope in SCOPES.items():
        writer = None
        for block in up.blocks(func):
            writes = [up.buffer_of(region).name for region in block.writes]
            if name in writes:
                writer = (block.name_hint, writes.index(name))
                break
        if writer is None:
            raise ValueError(f"no block of {symbol} writes the tile {name!r}")
        schedule.set_scope(schedule.get_sblock(writer[0], func_name=symbol), writer[1], scope)
        placed.append(f"{name} -> {scope}")
    return "tiles placed: " + ", ".join(placed)
