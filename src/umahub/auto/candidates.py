"""The candidate groups: what each accelerator's patterns could take, on their own.

For every accelerator, the model is partitioned with that accelerator alone
claiming (its patterns in its order, the pins enforced, no merging), exactly as
a compile with ``priority = [that one]`` would match it. Each match is a
candidate :class:`Group`: its operators, its patterns, and the Relax function
of the match alone (weights bound as constants), which is what a cost hook is
shown and what a measurement builds. The operator table (what each operator
reads, how many bytes it makes) comes from the same walk of the model that
placement makes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tvm
from tvm import relax

from umahub._tvm import Constant, ret_type, structural_hash, type_of
from umahub.auto.cache import digest
from umahub.compiler.placement import CheckFailures, Pins, PlannedPattern
from umahub.ir import is_partition
from umahub.plugin.accelerator import Accelerator
from umahub.plugin.context import Operator

__all__ = ["Group", "find_groups", "operator_table"]


@dataclass(frozen=True)
class Group:
    """One candidate: a match of one accelerator's patterns.

    Attributes:
        accelerator: whose patterns matched.
        nodes: its operators' node names, in model order.
        ops: their op names, in the same order.
        patterns: the patterns of the match.
        function: the match alone as a Relax function (``main``, weights bound).
        key: what its cost depends on: the match's structure and shapes (not
            its weights' values), for sharing measurements between equal groups.
        host_key: the same without the pattern's name: equal operators on the host.
        forced: it holds an operator pinned to ``accelerator``.
        static: every shape in it is known at compile time (it can be measured).
    """

    accelerator: str
    nodes: tuple[str, ...]
    ops: tuple[str, ...]
    patterns: tuple[str, ...]
    function: Any
    key: str
    host_key: str
    forced: bool = False
    static: bool = True


def operator_table(mod: tvm.IRModule, pins: Pins) -> tuple[Operator, ...]:
    """Every operator of ``mod``'s ``main`` as placement names them, all on the host."""
    from umahub.compiler.stages.partition import partition

    return partition(mod, [], pins, {}).operators


def _is_static(func: relax.Function) -> bool:
    from umahub.plugin.memory import symbolic_sizes

    return not any(symbolic_sizes(type_of(p)) for p in func.params) and not symbolic_sizes(
        ret_type(func)
    )


def _match_function(
    composite: relax.Function, args: Sequence[Any]
) -> tuple[relax.Function, str, str]:
    """The match alone as ``main`` (constants bound), and its keys (see :class:`Group`)."""
    plain = composite.without_attr("Primitive")
    constants = [isinstance(a, Constant) for a in args]
    shapes = [str(type_of(a)) for a in args]
    key = digest(structural_hash(plain), constants, shapes)
    host_key = digest(structural_hash(plain.without_attr("Composite")), constants, shapes)
    bound = plain.without_attr("Composite").bind_params(
        {p: a for p, a in zip(composite.params, args) if isinstance(a, Constant)}
    )
    return bound.with_attr("global_symbol", "main"), key, host_key


def find_groups(
    mod: tvm.IRModule,
    accelerator: Accelerator,
    planned: Sequence[PlannedPattern],
    pins: Pins,
    position: Mapping[str, int],
    failures: CheckFailures | None = None,
) -> list[Group]:
    """The candidate groups of ``accelerator``: its patterns alone, no merging.

    ``planned`` are the accelerator's patterns, ``position`` every node's place
    in model order. The pattern checks that raise are recorded in
    ``failures``, as partitioning records them.
    """
    from umahub.compiler.stages.partition import partition

    alone = dataclasses.replace(accelerator, merge=False)
    own = [dataclasses.replace(p, accelerator=alone, claims=True) for p in planned]
    part = partition(mod, own, pins, {accelerator.name: alone}, failures)
    calls: dict[str, tuple[relax.Function, list[Any]]] = {}
    for block in part.mod["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar):
                func = part.mod[value.op]
                if is_partition(func):
                    calls[str(func.attrs["global_symbol"])] = (func, list(value.args))
    groups = []
    for p in part.partitions:
        func, args = calls[p.symbol]
        composite = next(
            b.value for b in func.body.blocks[0].bindings if isinstance(b.value, relax.Function)
        )
        function, key, host_key = _match_function(composite, args)
        ordered = sorted(p.operators, key=lambda o: position.get(o.name, -1))
        forced = any(
            (hit := pins.resolve(o.name, o.op, o.pattern)) is not None
            and hit[1].accelerator == accelerator.name
            for o in ordered
        )
        groups.append(
            Group(
                accelerator.name,
                tuple(o.name for o in ordered),
                tuple(o.op for o in ordered),
                p.patterns,
                function,
                key,
                host_key,
                forced,
                _is_static(composite),
            )
        )
    return groups
