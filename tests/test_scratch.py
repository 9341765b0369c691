"""A parallel task's scratch buffers go on its stack (umahub.host.scratch), not through
TVM's workspace pool at every task; the numbers do not change."""

from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
from tvm import s_tir, te  # noqa: E402

from umahub.compiler.tir_phases import PIPELINE_NAME  # noqa: E402
from umahub.host.scratch import STACK_SCRATCH_MAX, SUPPORTED, scratch_on_stack  # noqa: E402

pytestmark = pytest.mark.skipif(
    not SUPPORTED, reason="apache-tvm before 0.27: the pass changes nothing"
)


def _rows_with_scratch(rows: int, width: int) -> tvm.IRModule:
    """out[i] = sum_j 2 * x[i, j], the doubled row a per-task buffer under a parallel loop."""
    x = te.placeholder((rows, width), name="x")
    doubled = te.compute((rows, width), lambda i, j: x[i, j] * 2.0, name="doubled")
    j = te.reduce_axis((0, width), name="j")
    out = te.compute((rows,), lambda i: te.sum(doubled[i, j], axis=j), name="out")
    sch = s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([x, out])}))
    (i, _) = sch.get_loops(sch.get_sblock("out"))
    sch.parallel(i)
    sch.compute_at(sch.get_sblock("doubled"), i)
    return sch.mod


def _workspace_calls(
    mod: tvm.IRModule, pipeline: str, rows: int, width: int
) -> tuple[int, np.ndarray]:
    """How many places of the built kernel ask TVM's pool for memory, and its output."""
    built = tvm.tirx.build(mod, target="llvm", pipeline=pipeline)
    calls = built.inspect_source("ll").count("load ptr, ptr @__TVMBackendAllocWorkspace")
    x = np.arange(rows * width, dtype="float32").reshape(rows, width) % 7
    out = tvm.runtime.tensor(np.zeros(rows, "float32"))
    built["main"](tvm.runtime.tensor(x), out)
    np.testing.assert_array_equal(out.numpy(), (2 * x).sum(axis=1))
    return calls, out.numpy()


def test_a_tasks_scratch_buffer_is_on_its_stack_and_the_numbers_are_the_same():
    mod = _rows_with_scratch(64, 512)  # 2 KiB per task: past TVM's 1 KiB stack limit
    pooled, before = _workspace_calls(mod, "default", 64, 512)
    stacked, after = _workspace_calls(mod, PIPELINE_NAME, 64, 512)
    assert (pooled, stacked) == (1, 0)
    np.testing.assert_array_equal(after, before)


def test_a_buffer_too_big_for_a_stack_stays_in_the_workspace_pool():
    width = STACK_SCRATCH_MAX // 4 + 256  # just over the limit
    assert _workspace_calls(_rows_with_scratch(4, width), PIPELINE_NAME, 4, width)[0] == 1


def test_the_pass_leaves_a_function_without_parallel_loops_as_it_is():
    x = te.placeholder((4, 512), name="x")
    y = te.compute((4, 512), lambda i, j: x[i, j] + 1.0, name="y")
    mod = tvm.IRModule({"main": te.create_prim_func([x, y])})
    tvm.ir.assert_structural_equal(scratch_on_stack(mod), mod)
