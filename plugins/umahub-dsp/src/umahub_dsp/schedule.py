"""The DSP's schedule: fuse each elementwise block's loops, vectorize the inner part."""

from __future__ import annotations

from typing import Any

__all__ = ["vectorize_blocks"]


def _blocks(sch: Any) -> list[Any]:
    # umahub hands over the schedule working on the partition's PrimFunc.
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def vectorize_blocks(sch: Any, lanes: int) -> int:
    """Vectorize every spatial block whose fused extent is a multiple of ``lanes``.

    Returns how many blocks were vectorized; blocks with reductions or odd
    extents are left as they are.
    """
    done = 0
    for block in _blocks(sch):
        loops = sch.get_loops(block)
        if not loops:
            continue
        kinds = sch.get(block).iter_vars
        if any(int(iv.iter_type) != 0 for iv in kinds):  # a reduction: not elementwise
            continue
        fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        extent = sch.get(fused).extent
        if not hasattr(extent, "value") or int(extent.value) % lanes:
            continue
        _, inner = sch.split(fused, factors=[None, lanes])
        sch.vectorize(inner)
        done += 1
    return done
