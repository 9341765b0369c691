"""The model's structure as the picture sees it: groups of operators, and the copies between.

A :class:`Group` is a run of consecutive operators (in model order) of one
partition, or of the host. :func:`attribute` says which group produces and
which receives each copy; :func:`split` sorts the copies of one inference into
those received by a group and those that leave the model (outputs). Weights
copied once, when the model is loaded (``Copy.when == "load"``), are not part
of an inference (:func:`at_load`).

Which copy feeds which group: the build stage names each copy's ``consumer``
and ``producer`` (an operator or a partition symbol), and those are used; for
a copy without them (a report written by hand, an older report), copies,
which the report lists in the order they happen, are matched in order to the
next group on their destination device, and the producer is the operator the
tensor is named after, or else the latest group on the source device before
the consumer.

No drawing and no times here: :mod:`umahub.report.picture.timeline` and
:mod:`umahub.report.picture.layout` build on this.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from umahub.config import HOST

if TYPE_CHECKING:
    from umahub.plugin.context import Copy, Operator

__all__ = [
    "Group",
    "at_load",
    "attribute",
    "groups",
    "has_edges",
    "load_bytes",
    "loaded_into",
    "per_inference",
    "split",
]


@dataclass
class Group:
    """Consecutive operators of one partition (or of the host), in model order."""

    index: int
    device: str
    partition: str
    ops: list[Operator] = field(default_factory=list)


def groups(placement: Sequence[Operator]) -> list[Group]:
    """The placement cut into groups: a new one wherever partition or device changes."""
    out: list[Group] = []
    for op in placement:
        if not out or (out[-1].partition, out[-1].device) != (op.partition, op.device):
            out.append(Group(len(out), op.device, op.partition))
        out[-1].ops.append(op)
    return out


def has_edges(ops: Sequence[Operator]) -> bool:
    """True when the operators carry their inputs (data edges), so order is not sequential."""
    return any(op.inputs for op in ops)


def at_load(c: Copy) -> bool:
    """True for a copy made once when the model is loaded (weights), not per inference."""
    return c.when == "load"


def per_inference(copies: Sequence[Copy]) -> list[Copy]:
    """The copies made at every inference, in the report's order."""
    return [c for c in copies if not at_load(c)]


def load_bytes(copies: Sequence[Copy]) -> dict[str, int]:
    """Bytes of weights copied at load, per destination device."""
    loaded: dict[str, int] = defaultdict(int)
    for c in copies:
        if at_load(c):
            loaded[c.dst] += c.bytes
    return loaded


def _named(c: Copy, role: str) -> str:
    """The ``producer`` or ``consumer`` a copy names, or ""."""
    return getattr(c, role, "") or ""


def _index(gs: list[Group]) -> dict[str, int]:
    """Partition symbol or operator name -> the first group it is in."""
    by_name: dict[str, int] = {}
    for g in gs:
        if g.partition:
            by_name.setdefault(g.partition, g.index)
        for op in g.ops:
            by_name.setdefault(op.name, g.index)
    return by_name


def attribute(gs: list[Group], copies: Sequence[Copy]) -> list[tuple[Copy, int | None, int | None]]:
    """(copy, producer group, consumer group) per copy; None: model input/constant, output."""
    by_name = _index(gs)
    edges = has_edges([op for g in gs for op in g.ops])
    links: list[tuple[Copy, int | None, int | None]] = []
    pointer = 0
    for c in copies:
        named_consumer = _named(c, "consumer")
        named_producer = _named(c, "producer")
        producer = by_name.get(named_producer) if named_producer else None
        if producer is None and not named_producer and not c.constant:
            named = by_name.get(c.tensor)
            if named is not None and gs[named].device == c.src:
                producer = named
        if named_consumer:
            consumer = by_name.get(named_consumer)
        else:
            start = pointer if producer is None else max(pointer, producer + 1)
            if producer is None and not c.constant and c.src != HOST:
                # the tensor is made on c.src: its consumer comes after a group there
                first = next((g.index for g in gs if g.device == c.src), None)
                start = max(start, first + 1) if first is not None else start
            candidates = [g for g in gs[start:] if g.device == c.dst]
            if edges:  # prefer the first that reads something made where the copy comes from
                reading = [
                    g
                    for g in candidates
                    if any(
                        (k := by_name.get(i)) is not None
                        and k != g.index
                        and (k == producer if producer is not None else gs[k].device == c.src)
                        for op in g.ops
                        for i in op.inputs
                    )
                ]
                candidates = reading or candidates
            consumer = candidates[0].index if candidates else None
        if consumer is not None:
            pointer = consumer
        if producer is None and not named_producer and not c.constant:
            before = consumer if consumer is not None else pointer + 1
            producer = next((g.index for g in reversed(gs[:before]) if g.device == c.src), None)
        links.append((c, producer, consumer))
    return links


def split(
    gs: list[Group], copies: Sequence[Copy]
) -> tuple[dict[int, list[tuple[Copy, int | None]]], list[tuple[Copy, int | None]]]:
    """The copies of one inference as (group -> [(copy, producer)], outputs [(copy, producer)])."""
    incoming: dict[int, list[tuple[Copy, int | None]]] = defaultdict(list)
    outputs: list[tuple[Copy, int | None]] = []
    for c, producer, consumer in attribute(gs, per_inference(copies)):
        (incoming[consumer] if consumer is not None else outputs).append((c, producer))
    return incoming, outputs


def loaded_into(gs: list[Group], copies: Sequence[Copy]) -> dict[int, list[Copy]]:
    """Group -> the weights loaded for it, for the load copies that name their consumer.

    A load copy without a consumer cannot be placed (a partition may read
    several weights, and a weight read by several partitions is loaded once);
    those are counted per device in the legend only.
    """
    index = _index(gs)
    into: dict[int, list[Copy]] = defaultdict(list)
    for c in copies:
        named = _named(c, "consumer")
        if at_load(c) and named and named in index:
            into[index[named]].append(c)
    return into
