"""Stage 3, memory: what each partition needs of its pool, checked before codegen.

The model of a pool (resident weights, transient working sets, one pool per
instance, the host's peak) is :mod:`umahub.plugin.memory`; this stage applies it to
the partitions in ``lowering-order`` and sends a partition that does not fit
back to the host. Sizes known only at run time count by their upper bounds
(``tir_var_upper_bound``) or not at all, with a note saying so.
"""

from __future__ import annotations

from typing import Any

from tvm import relax

from umahub._tvm import Constant, ret_type, type_of
from umahub.compiler.compilation import Compilation, Partition, Partitioned, written
from umahub.config import HOST
from umahub.errors import MemoryPoolError
from umahub.ir import bindings, partition_calls
from umahub.plugin.memory import (
    MemoryPlan,
    Need,
    PoolUse,
    size_bounds,
    symbolic_sizes,
    tensor_bytes,
)
from umahub.sizes import human_size

__all__ = ["run"]


def _need(p: Partition, func: relax.Function, call_args: list[Any], scope_policy: str) -> Need:
    """What a partition needs of its pool (see :mod:`umahub.plugin.memory`)."""
    resident = transient = 0
    if scope_policy == "io":
        for param, arg in zip(func.params, call_args):
            size = tensor_bytes(type_of(param))
            if isinstance(arg, Constant):
                resident += size
            else:
                transient += size
    intermediates = sum(o.bytes for o in p.operators)  # every operator's output
    transient += max(intermediates, tensor_bytes(ret_type(func)))
    return Need(resident, transient)


def _unbounded_sizes(func: relax.Function, bounds: dict) -> set[str]:
    """Symbolic sizes of a partition's tensors that no upper bound covers."""
    sizes = set().union(*(symbolic_sizes(type_of(p)) for p in func.params))
    sizes |= symbolic_sizes(ret_type(func))
    return {s for s in sizes if s not in bounds}


def _host_plan(part: Partitioned) -> tuple[int, int]:
    """(peak live bytes, constant bytes) of the host's tensors in ``main``."""
    main = part.mod["main"]
    last_use: dict[Any, int] = {}
    steps = list(bindings(main))
    for i, b in enumerate(steps):
        for v in relax.analysis.free_vars(b.value):
            last_use[v] = i
    for v in relax.analysis.free_vars(main.body.body):
        last_use[v] = len(steps)
    live = {p: tensor_bytes(type_of(p)) for p in main.params}
    peak = sum(live.values())
    constants = 0
    for i, b in enumerate(steps):
        live[b.var] = tensor_bytes(type_of(b.var))

        args = b.value.args if isinstance(b.value, relax.Call) else ()
        constants += sum(tensor_bytes(type_of(a)) for a in args if isinstance(a, Constant))
        peak = max(peak, sum(live.values()))
        live = {v: s for v, s in live.items() if last_use.get(v, -1) > i}
    return peak, constants


def _lowering_order(hub: Any, part: Partitioned) -> list[str]:
    """Accelerator names (and "host") in the order in which they are lowered."""
    order = list(hub.config.lowering_order or [HOST, *[a.name for a in hub.accelerators]])
    present = {p.accelerator for p in part.partitions}
    order += [a for a in sorted(present) if a not in order]
    if HOST not in order:
        order.insert(0, HOST)
    return order


def run(comp: Compilation) -> None:
    """Stage 3: plan every pool in lowering order; a partition that does not fit is placed again.

    Writes ``comp.order``, ``comp.plan`` (as planned before lowering) and
    ``comp.needs``; a partition that does not fit its pool is placed again
    elsewhere (:meth:`Compilation.does_not_fit`), or stops the compile with a
    :class:`MemoryPoolError`.
    """
    hub, part, notes = comp.hub, written(comp.partitioned, "partitioned"), comp.notes
    order = comp.order = _lowering_order(hub, part)
    pools = []
    for acc in hub.accelerators:
        for i in range(acc.instances):
            pools += [PoolUse(f"{acc.name}:{i}", p.scope, p.size_bytes, p.copy) for p in acc.memory]
    plan = MemoryPlan.for_devices(pools)
    needs = comp.needs
    calls = partition_calls(part.mod)
    bounds = size_bounds(part.mod["main"])
    for name in order:
        if name == HOST:
            plan = plan.with_host(*_host_plan(part))
            continue
        acc = hub.accelerator(name)
        for p in (p for p in part.partitions if p.accelerator == name):
            needs[p.symbol] = need = _need(p, *calls[p.symbol], hub.config.scope_policy)
            pool = acc.pool
            if pool is None:
                continue
            unknown = _unbounded_sizes(calls[p.symbol][0], bounds)
            if unknown:
                notes.append(
                    f"partition {p.symbol} on {p.device}: sizes {', '.join(sorted(unknown))} are "
                    f"known only at run time; pool '{pool.scope}' is planned with its tensors of "
                    "static shape only (bound the sizes with main's tir_var_upper_bound "
                    "attribute to check the worst case)"
                )
            use = written(plan.pool(p.device, pool.scope), f"pool {pool.scope} of {p.device}")
            if not use.fits(need):
                comp.does_not_fit(
                    p.symbol,
                    f"partition {p.symbol} ({', '.join(p.patterns)}) needs "
                    f"{human_size(need.total)} of pool '{pool.scope}' on {p.device} "
                    f"({human_size(need.resident)} resident + {human_size(need.transient)} "
                    f"working), but only {human_size(use.free)} of {human_size(use.size_bytes)} "
                    "are free",
                    MemoryPoolError,
                )
                continue
            plan = plan.add(p.device, pool.scope, need)
    comp.plan = plan
