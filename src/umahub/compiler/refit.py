"""Partitions that do not fit their accelerator, placed again.

A partition can be found too big for its accelerator only once it is placed:
its pool is planned after partitioning (the memory stage), and its tiles are
counted against the on-chip buffers once its TIR is scheduled (the lower
stage). Such a partition is recorded (:meth:`Compilation.does_not_fit`), and
the compile starts again with the accelerator's patterns refusing its
operators (:attr:`Compilation.unfit`, enforced by the pattern guard of
:mod:`umahub.compiler.placement`): the next accelerator in priority order
that takes them and fits them gets them, else the host. Each try refuses more
operators, so the tries end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from umahub.compiler.compilation import Compilation, written
from umahub.config import HOST
from umahub.errors import warn

__all__ = ["fitted", "unfit_after"]


def unfit_after(comp: Compilation) -> dict[str, dict[str, str]]:
    """``comp.unfit`` with this try's misfits added: what the next try refuses."""
    unfit = {node: dict(accs) for node, accs in comp.unfit.items()}
    for _, accelerator, nodes, why in comp.misfits:
        for node in nodes:
            unfit.setdefault(node, {}).setdefault(accelerator, why)
    return unfit


def fitted(comp: Compilation, then: Callable[[Compilation], None] | None = None) -> None:
    """``comp`` started again, in place, until its partitions fit their accelerators
    (each new try runs ``then``: the stages after the memory stage that find
    misfits); then the notes and a warning say where the operators went.

    A try that learns nothing new (no operator to refuse), or a compilation
    that cannot start again, stops it: those partitions stay on the host, as
    the report of each says.
    """
    while comp.misfits:
        unfit = unfit_after(comp)
        if comp.restart is None or unfit == comp.unfit:
            for _, _, _, why in comp.misfits:
                comp.notes.append(f"{why}; its partition runs on the host")
                warn(f"{why}; its partition runs on the host")
            break
        again = comp.restart(unfit)
        for f in dataclasses.fields(Compilation):  # the caller's comp goes on as the new try
            setattr(comp, f.name, getattr(again, f.name))
        if then is not None:
            then(comp)
    _placed_again(comp)


def _placed_again(comp: Compilation) -> None:
    """Say in the notes, and in a warning, where the operators that did not fit an
    accelerator in an earlier try went (this try placed them knowing it)."""
    if not comp.unfit:
        return
    where = {op.name: op.device for op in written(comp.partitioned, "partitioned").operators}
    told: dict[str, list[str]] = {}
    for node, accelerators in comp.unfit.items():
        for why in accelerators.values():
            told.setdefault(why, []).append(where.get(node, HOST))
    for why, devices in told.items():
        places = sorted(set(devices), key=lambda d: (d == HOST, d))
        said = " and ".join("the host" if d == HOST else d for d in places)
        comp.notes.append(f"{why}; its operators were placed again: on {said}")
        warn(f"{why}; its operators were placed again: on {said}")
