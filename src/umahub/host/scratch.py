"""A parallel task's scratch buffers on its own stack, not in TVM's workspace pool.

A tiled kernel computes into a buffer per task: the accumulator of a tile
whose epilogue runs while it is hot, the padded rows a depthwise convolution
reads. TVM allocates a buffer that is not tiny (1 KiB and more) with
``TVMBackendAllocWorkspace`` where it is declared, which for a task is inside
the parallel loop: once per task, and a mobile CNN's kernels run thousands of
tasks per inference, each paying an allocation and a free with a search of
the pool.

:func:`scratch_on_stack` marks every allocation of a known size up to
:data:`STACK_SCRATCH_MAX` under a parallel loop so that TVM leaves it to the
code generator (TVM's own ``disable_lower_builtin`` annotation): LLVM puts it
in the entry block of the task's function, on the stack of the thread that
runs it, allocated once per launch and per thread. The buffers' contents and
the kernels' numbers do not change.

It runs in umahub's TIR pipeline (``umahub.compiler.tir_phases``), for the
accelerators' kernels and the host's. With apache-tvm before 0.27 (whose
allocations are ``Allocate`` statements, not ``AllocBuffer``) it leaves the
function as it is.
"""

from __future__ import annotations

import math
from typing import Any

import tvm_ffi
from tvm import tirx

from umahub.plugin.memory import element_bytes

__all__ = ["STACK_SCRATCH_MAX", "SUPPORTED", "scratch_on_stack"]

#: The most a task puts on its stack, all its buffers together (a thread's
#: stack is 8 MiB on Linux; the npu's tiles are sized to its 256 KiB scratchpad).
STACK_SCRATCH_MAX = 256 * 1024

#: TVM's annotation: an allocation that its builtin lowering leaves alone.
_NOT_LOWERED = "disable_lower_builtin"

#: Smaller buffers are on the stack already (TVM's ``kMaxStackAlloca``).
_STACK_ALREADY = 1024


def _size(buffer: Any) -> int | None:
    try:
        elements = math.prod(int(d) for d in buffer.shape)
    except TypeError:  # a size known only at run time
        return None
    return elements * element_bytes(str(buffer.dtype))


def _in_parallel(node: Any, mutator: Any) -> Any:
    if node.kind != tirx.ForKind.PARALLEL:
        return mutator.default_mutate(node)
    room = [STACK_SCRATCH_MAX]

    def on_stack(alloc: Any, _mutator: Any) -> Any:
        size = _size(alloc.buffer)
        if size is None or size < _STACK_ALREADY or size > room[0]:
            return alloc
        room[0] -= size
        annotations = dict(alloc.annotations)
        annotations[_NOT_LOWERED] = tirx.const(True, "bool")
        return tirx.AllocBuffer(alloc.buffer, annotations)

    body = tvm_ffi.structural_mutate(node.body, [(tirx.AllocBuffer, on_stack)])
    return tirx.For(
        node.loop_var,
        node.min,
        node.extent,
        node.kind,
        body,
        node.thread_binding,
        node.annotations,
    )


#: Whether this TVM has what the pass needs (apache-tvm 0.27's ``AllocBuffer``).
SUPPORTED = hasattr(tirx, "AllocBuffer") and hasattr(tvm_ffi, "structural_mutate")


@tirx.transform.prim_func_pass(opt_level=0, name="umahub.ScratchOnStack")
def scratch_on_stack(func: tirx.PrimFunc, _mod: Any, _ctx: Any) -> tirx.PrimFunc:
    """The pass: ``func`` with its tasks' scratch buffers on the stack (see the module)."""
    if not SUPPORTED:
        return func
    return func.with_body(tvm_ffi.structural_mutate(func.body, [(tirx.For, _in_parallel)]))
