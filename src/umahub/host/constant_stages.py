"""Stages of a kernel that read only constants: computed once, at compile time.

A kernel often begins with stages that depend on its weights alone. The int8
convolutions' are the example: the requantization's multiplier and shift per
output channel (a float64 division each), the bias in the accumulator's units,
and the weight's sums per channel, which correct the dot product for the
input's zero point. In the kernel they run at every call: loops over the
channels and a pass over the whole weight, one more parallel launch: a
960-to-160 1x1 convolution took 16.5 us on one position, 12.8 without them,
and 0.91x the time on 7x7 positions (an AMD EPYC, 2 threads). ONNX Runtime
computes them when it loads the model.

:func:`split` takes them out of a scheduled kernel. A statement at the root of
the kernel's TIR is such a stage when everything it reads is an input that the
partition's call passes as a constant, or a buffer that another such stage
wrote. They become a PrimFunc of their own (:class:`ConstantStages`). The
buffers they leave for the rest of the kernel become new inputs of the
kernel, after its own inputs. The build computes them once, on the model's
constants (:func:`compute`, from :func:`umahub.host.prepack.fold`), and passes
them to each call as constants. A plugin has nothing to do: any schedule's
such stages are taken, whoever wrote them.

Not taken:

- stages whose results are large: while all the results come to more than
  :data:`MOST_BYTES` and more than the constants they read, the stage of the
  largest is left to the kernel, with the stages that read it (a copy of a
  weight in another layout is :func:`umahub.plugin.pack_weight`'s, which
  replaces the weight); the others are still taken;
- any stage of a kernel built for another machine (a board's target): the
  build cannot run that code, and the host's may round floats differently.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import tirx

from umahub._tvm import name_of
from umahub.plugin.compat import (
    Load,
    SBlock,
    SBlockRealize,
    buffer_of,
    nodes_in,
    param_buffers,
    vars_in,
)
from umahub.sizes import human_size

__all__ = ["MOST_BYTES", "ConstantStages", "compute", "describe", "split"]

#: Results of a kernel's constant stages up to this size are always taken; above it,
#: only when they are no larger than the constants the stages read.
MOST_BYTES = 64 * 1024


@dataclass(frozen=True)
class ConstantStages:
    """The stages :func:`split` took out of one kernel.

    Attributes:
        prim: the PrimFunc computing them: its parameters are the kernel inputs
            it reads (``inputs``), then its results.
        inputs: the indices of the kernel's inputs that ``prim`` reads, in order.
        results: ``(shape, dtype)`` of each result: the kernel's new inputs, in order.
        names: the stages' blocks, for the report.
    """

    prim: Any
    inputs: tuple[int, ...]
    results: tuple[tuple[tuple[int, ...], str], ...]
    names: tuple[str, ...]

    @property
    def nbytes(self) -> int:
        """The results' size in bytes."""
        return sum(_size(shape, dtype) for shape, dtype in self.results)


def _size(shape: Sequence[Any], dtype: Any) -> int:
    """Bytes of a tensor of ``shape`` (ints or constant TIR sizes) and ``dtype``."""
    return int(np.prod([int(d) for d in shape], dtype=np.int64)) * np.dtype(str(dtype)).itemsize


def _accesses(stmt: Any) -> tuple[list[Any], list[Any]]:
    """The buffers ``stmt``'s blocks read and write (their own local buffers left out)."""
    reads: list[Any] = []
    writes: list[Any] = []
    local: list[Any] = []
    for block in nodes_in(stmt, SBlock):
        local += list(block.alloc_buffers)
        reads += [buffer_of(r) for r in block.reads]
        writes += [buffer_of(w) for w in block.writes]

    def outside(bufs: list[Any]) -> list[Any]:
        return _unique(b for b in bufs if not _among(b, local))

    return outside(reads), outside(writes)


def _among(buf: Any, bufs: Iterable[Any]) -> bool:
    return any(buf.same_as(b) for b in bufs)


def _unique(bufs: Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    for b in bufs:
        if not _among(b, out):
            out.append(b)
    return out


def _constant_statements(
    stmts: Sequence[Any],
    access: Sequence[tuple[list[Any], list[Any]]],
    constant_inputs: list[Any],
    params: list[Any],
    left: Iterable[int] = (),
) -> list[int]:
    """Indices of the root statements computed from ``constant_inputs`` alone (see the
    module's docs): each reads only those and what earlier such statements wrote, and
    writes no parameter and nothing another statement writes. ``access``: each
    statement's reads and writes (:func:`_accesses`); ``left``: statements not to take."""
    variable = [p for p in params if not _among(p, constant_inputs)]
    chosen: list[int] = []
    made: list[Any] = []
    for i, (reads, writes) in enumerate(access):
        if i in left or not writes or any(_among(w, params) for w in writes):
            continue
        if _touches(stmts[i], variable):  # beyond its blocks' declared reads too
            continue
        if _from((reads, writes), constant_inputs, made):
            chosen.append(i)
            made += writes
    while True:  # a buffer another statement writes too: that statement is not constant
        others = [w for i, (_, ws) in enumerate(access) if i not in chosen for w in ws]
        dropped = [i for i in chosen if any(_among(w, others) for w in access[i][1])]
        if not dropped:
            break
        chosen = [i for i in chosen if i not in dropped]
        made = [w for i in chosen for w in access[i][1]]
        chosen = [i for i in chosen if _from(access[i], constant_inputs, made)]
    return chosen


def _result_bytes(writes: list[Any], results: list[Any]) -> int:
    """Bytes of the ``results`` among a statement's ``writes``."""
    return sum(_size(b.shape, b.dtype) for b in writes if _among(b, results))


def _touches(stmt: Any, bufs: list[Any]) -> bool:
    """Whether ``stmt`` uses any of ``bufs`` at all: a load of it, or its data pointer
    (an opaque access, ``T.call_extern`` with ``buf.data``)."""
    touched = vars_in(stmt) + [buffer_of(load) for load in nodes_in(stmt, Load)]
    return any(t.same_as(b) or t.same_as(b.data) for t in touched for b in bufs)


def _from(access: tuple[list[Any], list[Any]], constant_inputs: list[Any], made: list[Any]) -> bool:
    """Whether a statement (its reads and writes) reads only ``constant_inputs``, what
    ``made`` holds, and its own results (a reduction's)."""
    reads, writes = access
    return all(_among(r, constant_inputs) or _among(r, made) or _among(r, writes) for r in reads)


def _prim_func(params: list[Any], body: Any, attrs: dict[str, Any]) -> Any:
    """A PrimFunc of buffer parameters ``params`` (0.25's form: handles and a
    ``buffer_map``; 0.26's and 0.27's: the buffers themselves)."""
    if "buffer_map" in inspect.signature(tirx.PrimFunc.__init__).parameters:
        handles = [tirx.Var(f"{b.name}_handle", "handle") for b in params]
        func = tirx.PrimFunc(handles, body, buffer_map=dict(zip(handles, params)))
    else:
        func = tirx.PrimFunc(params, body)
    for key, value in attrs.items():
        func = func.with_attr(key, value)
    return func


def _root(block: Any, stmts: list[Any], allocated: list[Any]) -> Any:
    """``block`` (a PrimFunc's root) with body ``stmts`` and buffers ``allocated``."""
    body = stmts[0] if len(stmts) == 1 else tirx.SeqStmt(stmts)
    new = SBlock(
        block.iter_vars, block.reads, block.writes, block.name_hint, body, block.init,
        allocated, block.match_buffers, block.annotations,
    )  # fmt: skip
    return SBlockRealize([], True, new)


def split(
    mod: tvm.IRModule, symbol: str, n_inputs: int, constants: frozenset[int]
) -> tuple[tvm.IRModule, ConstantStages | None]:
    """The kernel ``symbol`` of ``mod`` without its constant stages, and those stages.

    Args:
        mod: the scheduled module (its weights' packing already split off).
        n_inputs: how many of the kernel's parameters are inputs (the rest: outputs).
        constants: indices of the inputs the partition's call passes as constants.

    Returns:
        The module with the kernel taking the stages' results as new inputs after
        its own, and the stages; or ``mod`` unchanged and None where there are none.
    """
    prim = mod[symbol]
    if not isinstance(prim, tirx.PrimFunc) or not isinstance(prim.body, SBlockRealize):
        return mod, None
    params = param_buffers(prim)
    if any(p is None for p in params):
        return mod, None  # a scalar parameter: not a kernel of buffers
    root = prim.body.block
    stmts = list(root.body.seq) if isinstance(root.body, tirx.SeqStmt) else [root.body]
    constant_inputs = [params[i] for i in sorted(constants) if i < n_inputs]
    access = [_accesses(s) for s in stmts]
    left: set[int] = set()  # stages whose results are too large: the kernel's
    while True:
        chosen = _constant_statements(stmts, access, constant_inputs, params, left)
        if not chosen or len(chosen) == len(stmts):
            return mod, None
        made = _unique(w for i in chosen for w in access[i][1])
        rest = [s for i, s in enumerate(stmts) if i not in chosen]
        results = [b for b in made if any(_touches(s, [b]) for s in rest)]
        if not results:
            return mod, None
        read = _unique(r for i in chosen for r in access[i][0] if _among(r, constant_inputs))
        size = sum(_size(b.shape, b.dtype) for b in results)
        if size <= MOST_BYTES or size <= sum(_size(b.shape, b.dtype) for b in read):
            break
        # the stage of the largest result is left to the kernel (and the stages that
        # read it with it), not all of them: the small ones are still taken
        left.add(max(chosen, key=lambda i: _result_bytes(access[i][1], results)))
    inputs = tuple(i for i, p in enumerate(params[:n_inputs]) if _among(p, read))
    kept = [b for b in root.alloc_buffers if not _among(b, made)]
    inner = [b for b in root.alloc_buffers if _among(b, made) and not _among(b, results)]
    attrs = {str(k): v for k, v in (prim.attrs or {}).items()}
    kernel = _prim_func(
        [*params[:n_inputs], *results, *params[n_inputs:]], _root(root, rest, kept), attrs
    )
    stages_attrs = {"global_symbol": f"{symbol}_constants", "tirx.noalias": True}
    stages = _prim_func(
        [params[i] for i in inputs] + results,
        _root(root, [stmts[i] for i in chosen], inner),
        stages_attrs,
    )
    out = tvm.IRModule({gv: f for gv, f in mod.functions.items() if name_of(gv) != symbol})
    out[symbol] = kernel
    blocks = {b.name_hint for i in chosen for b in nodes_in(stmts[i], SBlock)}
    names = tuple(sorted({re.sub(r"_(init|update)$", "", n) for n in blocks}))
    shapes = tuple((tuple(int(d) for d in b.shape), str(b.dtype)) for b in results)
    return out, ConstantStages(stages, inputs, shapes, names)


def compute(todo: Sequence[tuple[ConstantStages, Sequence[Any]]]) -> list[list[Any]]:
    """Each :class:`ConstantStages` run on its inputs' values (the kernel's inputs,
    all of them, by index): its results as ``tvm.runtime.Tensor``, on the CPU. One
    LLVM build for all of them."""
    if not todo:
        return []
    funcs = {
        f"umahub_constants_{i}": stages.prim.with_attr("global_symbol", f"umahub_constants_{i}")
        for i, (stages, _) in enumerate(todo)
    }
    from umahub.targets import host_target

    built = tvm.tirx.build(tvm.IRModule(funcs), target=tvm.target.Target(host_target()))
    out = []
    for i, (stages, values) in enumerate(todo):
        results = [tvm.runtime.empty(shape, dtype, tvm.cpu()) for shape, dtype in stages.results]
        built[f"umahub_constants_{i}"](*[values[j] for j in stages.inputs], *results)
        out.append(results)
    return out


def describe(stages: ConstantStages) -> str:
    """``"bias_q, requant_k, requant_m, weight_sum (2.5 KiB)"``: the report's line."""
    return f"{', '.join(stages.names)} ({human_size(stages.nbytes)})"
