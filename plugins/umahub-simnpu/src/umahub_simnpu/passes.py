"""The simnpu's TIR passes (NS-TIR): double buffering, then the dependency tokens.

The program the lowering writes is correct for a machine that runs one
instruction at a time. The simnpu runs three modules side by side (load,
compute, store; :mod:`umahub_simnpu.intrinsics` says which runs what), each in
its own order, and orders them only by the tokens the instructions pop and
push. Two passes make the program one for that machine:

:func:`double_buffer`
    Every on-chip tile gets two copies, used alternately by successive
    *generations*: one generation of a tile is one iteration of the innermost
    loop around all of its uses (a reduction step for INP and WGT, an output
    block for ACC). The load of the next step then has a copy to write while
    the matrix core still reads this one.

:func:`dependency_tokens`
    Each tile is written by one module and read by the next (INP and WGT:
    load then compute; ACC: compute then store). Per generation of a tile,
    the producer's last instruction on it pushes a token to the consumer,
    whose first instruction on it pops it; the consumer's last pushes a token
    back, which the producer's first of the generation ``copies`` later pops
    (``copies``: 2 when double-buffered, else 1). Tiles that share producer,
    consumer and generation share tokens. The flags are expressions of the
    loop variables (a pop only from generation ``copies`` on, a push back only
    when a generation will take it), evaluated by the codegen per instruction.

The simulator checks what these passes promise: an instruction that touches
a tile out of the order the tokens allow faults as a hazard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from umahub_simnpu_runtime import isa

import umahub.plugin as up
from umahub_simnpu.intrinsics import BY_NAME, MODULES, Intrinsic, kind_of_scope

__all__ = ["dependency_tokens", "double_buffer"]


@dataclass
class _Site:
    """One intrinsic call: its block, its loops (outermost first), what it touches."""

    block: Any
    intrinsic: Intrinsic
    args: list[Any]
    loops: list[Any]
    buffers: list[Any] = field(default_factory=list)  # the on-chip buffers it touches
    module: str = ""


def _buffer_of_pointer(arg: Any, tiles: list[Any]) -> Any:
    """The tile whose pointer ``arg`` is (``buffer.data``), or None."""
    return next((tile for tile in tiles if up.points_to(arg, tile)), None)


def _sites(func: Any) -> tuple[Any, list[Any], list[_Site]]:
    """The root, its on-chip tiles, and every intrinsic call in program order."""
    from tvm import tirx

    root = up.root_block(func)
    if root is None:
        raise ValueError("the simnpu's passes work on S-TIR with a root block")
    tiles = [b for b in root.block.alloc_buffers if kind_of_scope(str(b.scope()))]
    sites: list[_Site] = []

    def walk(stmt: Any, loops: list[Any]) -> None:
        if isinstance(stmt, tirx.SeqStmt):
            for child in stmt.seq:
                walk(child, loops)
        elif isinstance(stmt, tirx.For):
            walk(stmt.body, [*loops, stmt])
        elif isinstance(stmt, up.SBlockRealize):
            block = stmt.block
            value = getattr(block.body, "value", None)
            name = str(value.args[0].value) if _is_extern(value) else ""
            if name in BY_NAME:
                intrinsic = BY_NAME[name]
                site = _Site(block, intrinsic, list(value.args[1:]), loops)
                for position, _ in intrinsic.pointers:
                    tile = _buffer_of_pointer(site.args[position], tiles)
                    if tile is None:
                        raise ValueError(
                            f"{name} in block {block.name_hint} names an on-chip buffer that is "
                            "in no simnpu scope (was the schedule run?)"
                        )
                    if not any(tile.same_as(t) for t in site.buffers):
                        site.buffers.append(tile)
                first = kind_of_scope(str(site.buffers[0].scope()))
                site.module = intrinsic.module(first or "")
                sites.append(site)
            else:
                walk(block.body, loops)
        elif hasattr(stmt, "body"):
            walk(stmt.body, loops)

    walk(root.block.body, [])
    return root, tiles, sites


def _is_extern(value: Any) -> bool:
    return (
        value is not None
        and type(value).__name__ == "Call"
        and getattr(value.op, "name", "") == "tirx.call_extern"
    )


def _generation_loops(sites: list[_Site]) -> list[Any]:
    """The loops around all of ``sites`` (a common prefix of their loop nests)."""
    common = list(sites[0].loops)
    for site in sites[1:]:
        n = 0
        while n < min(len(common), len(site.loops)) and common[n].same_as(site.loops[n]):
            n += 1
        common = common[:n]
    return common


def _generation(loops: list[Any]) -> tuple[Any, int]:
    """The generation index (an expression of the loops' variables) and how many."""
    from tvm import tirx

    index: Any = tirx.const(0, "int32")
    total = 1
    for loop in loops:
        extent = int(loop.extent)
        index = index * extent + (loop.loop_var - loop.min)
        total *= extent
    return index, total


def _edge(site: _Site, outer: int, last: bool) -> Any:
    """True in the first (last) iteration of ``site``'s loops inside the generation."""
    from tvm import tirx

    cond: Any = tirx.const(True, "bool")
    for loop in site.loops[outer:]:
        value = loop.min + (int(loop.extent) - 1 if last else 0)
        cond = tirx.And(cond, tirx.EQ(loop.loop_var, value))
    return cond


def _rebuilt(func: Any, root: Any, args: dict[str, list[Any]], swap: dict[Any, Any]) -> Any:
    """``func`` with each named block's call given new arguments, and every tile in
    ``swap`` (old -> new) replaced in allocations and regions."""
    from tvm import tirx

    def region(r: Any) -> Any:
        buffer = up.buffer_of(r)
        new = next((n for o, n in swap.items() if o.same_as(buffer)), None)
        return up.full_region(new) if new is not None else r

    def replace(block: Any) -> Any:
        if block.name_hint in args:
            name = block.body.value.args[0]
            body = tirx.Evaluate(tirx.call_extern("int32", name, *args[block.name_hint]))
            return up.SBlock(
                [],
                [region(r) for r in block.reads],
                [region(r) for r in block.writes],
                block.name_hint,
                body,
            )
        return block

    body = up.rewrite(root.block.body, up.SBlock, replace)
    allocs = [
        next((n for o, n in swap.items() if o.same_as(b)), b) for b in root.block.alloc_buffers
    ]
    return up.with_root_body(func, [body], alloc_buffers=allocs)


def _double(func: Any) -> Any:
    from tvm import tirx

    root, tiles, sites = _sites(func)
    swap: dict[Any, Any] = {}
    args = {s.block.name_hint: list(s.args) for s in sites}
    doubled = []
    for tile in tiles:
        users = [s for s in sites if any(t.same_as(tile) for t in s.buffers)]
        loops = _generation_loops(users) if users else []
        if not loops:
            continue  # one generation: nothing to alternate
        size = int(tile.shape[0])
        new = tirx.decl_buffer((2 * size,), tile.dtype, tile.name, scope=str(tile.scope()))
        swap[tile] = new
        index, _ = _generation(loops)
        shift = tirx.floormod(index, 2) * size
        for site in users:
            new_args = args[site.block.name_hint]
            for position, offsets in site.intrinsic.pointers:
                if _buffer_of_pointer(site.args[position], [tile]) is None:
                    continue
                new_args[position] = up.data_pointer(new)
                for at in offsets:
                    new_args[at] = new_args[at] + shift
        kind = kind_of_scope(str(tile.scope()))
        doubled.append(f"{kind} (x2, alternating per {loops[-1].loop_var.name})")
    if not swap:
        return func.with_attr("simnpu.double_buffered", "")
    func = _rebuilt(func, root, args, swap)
    return func.with_attr("simnpu.double_buffered", ", ".join(doubled))


def double_buffer() -> Any:
    """The pass: two copies of every on-chip tile, alternating by generation."""
    from tvm import tirx

    return tirx.transform.prim_func_pass(
        lambda func, _mod, _ctx: _double(func), opt_level=0, name="simnpu.double_buffer"
    )


def _tokens(func: Any, copies: int) -> Any:
    from tvm import tirx

    root, tiles, sites = _sites(func)
    flags: dict[str, dict[int, Any]] = {s.block.name_hint: {} for s in sites}
    order = {s.block.name_hint: i for i, s in enumerate(sites)}
    groups: dict[tuple[str, str, tuple[int, ...]], list[Any]] = {}
    for tile in tiles:
        users = [s for s in sites if any(t.same_as(tile) for t in s.buffers)]
        modules = sorted({s.module for s in users}, key=MODULES.index)
        if len(modules) < 2:
            continue
        if len(modules) > 2:
            raise ValueError(f"the tile {tile.name} is touched by three modules: {modules}")
        loops = _generation_loops(users)
        key = (modules[0], modules[1], tuple(id(loop) for loop in loops))
        groups.setdefault(key, []).append((tile, users, loops))
    for (producer, consumer, _), members in groups.items():
        users = sorted(
            {s.block.name_hint: s for _, us, _ in members for s in us}.values(),
            key=lambda s: order[s.block.name_hint],
        )
        loops = members[0][2]
        index, total = _generation(loops)
        made = [s for s in users if s.module == producer]
        taken = [s for s in users if s.module == consumer]

        def add(site: _Site, bit: int, cond: Any) -> None:
            mine = flags[site.block.name_hint]
            if bit in mine:
                raise ValueError(
                    f"block {site.block.name_hint} would take two tokens from one queue"
                )
            mine[bit] = cond

        outer = len(loops)
        add(made[0], isa.POP_NEXT, tirx.And(_edge(made[0], outer, False), index >= copies))
        add(made[-1], isa.PUSH_NEXT, _edge(made[-1], outer, True))
        add(taken[0], isa.POP_PREV, _edge(taken[0], outer, False))
        add(
            taken[-1],
            isa.PUSH_PREV,
            tirx.And(_edge(taken[-1], outer, True), index + copies < total),
        )
    args = {}
    for site in sites:
        deps: Any = tirx.const(0, "int32")
        for bit, cond in sorted(flags[site.block.name_hint].items()):
            deps = deps + tirx.Select(cond, tirx.const(bit, "int32"), tirx.const(0, "int32"))
        args[site.block.name_hint] = [deps, *site.args[1:]]
    return _rebuilt(func, root, args, {}).with_attr("simnpu.tokens", len(groups))


def dependency_tokens(copies: int) -> Any:
    """The pass: tokens between the modules for tiles of ``copies`` copies each."""
    from tvm import tirx

    return tirx.transform.prim_func_pass(
        lambda func, _mod, _ctx: _tokens(func, copies), opt_level=0, name="simnpu.dependency_tokens"
    )
