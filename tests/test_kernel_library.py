"""A plugin's kernel library (``c_sources``) called from an LLVM partition: linked, not JIT-run.

The partition's TIR pass swaps the ReLU's loop nest for a call into the
library with umahub.plugin's TIR helpers, as a vendor's pass does.
"""

from __future__ import annotations

import numpy as np
import pytest

import umahub
import umahub.plugin as up

KERNEL = """
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
int32_t lib_relu(float* x, float* y, int32_t n) {
  for (int32_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  return 0;
}
#ifdef __cplusplus
}
#endif
"""


def _relu_to_kernel():
    """Phase 0: the partition's one loop nest becomes ``lib_relu(x, y, n)``."""
    from tvm import tirx

    def rewrite(func, _mod, _ctx):
        root = up.root_block(func)
        if root is None or len(root.stmts) != 1:
            return func
        x, y = (b for b in up.param_buffers(func) if b is not None)
        n = 1
        for d in x.shape:
            n *= int(d)
        args = [up.data_pointer(x), up.data_pointer(y), tirx.const(n, "int32")]
        call = up.extern_block("lib_relu", args, reads=[x], writes=[y])
        return up.with_root_body(func, [call], alloc_buffers=[])

    return tirx.transform.prim_func_pass(rewrite, opt_level=0, name="test.ReluToKernel")


class KernelLibraryPlugin:
    """An LLVM accelerator whose ReLU runs in a C kernel library of its own."""

    UMAHUB_API = 1

    def __init__(self, source):
        self.source = source

    @up.hookimpl
    def umahub_accelerators(self):
        return [up.Accelerator("libacc", codegen="llvm", c_sources=[str(self.source)])]

    @up.hookimpl(accelerator="libacc")
    def umahub_patterns(self):
        return [("libacc.relu", up.op("relax.nn.relu"))]

    @up.hookimpl(accelerator="libacc")
    def umahub_tir_passes(self, phase):
        return [_relu_to_kernel()] if phase == 0 else None


def _relu_model():
    from tvm import relax
    from tvm.script import relax as R

    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.relu(relax.op.add(x, x))))
        bb.emit_func_output(out)
    return bb.get()


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    source = tmp_path_factory.mktemp("kernels") / "lib_relu.c"
    source.write_text(KERNEL)
    hub = umahub.Hub(autoload=False, plugins=[KernelLibraryPlugin(source)])
    return hub.compile(_relu_model())


def test_the_llvm_partition_calls_the_library_and_runs_in_process(compiled):
    assert [(o.op, o.device) for o in compiled.report.placement] == [
        ("relax.add", "host"),
        ("relax.nn.relu", "libacc:0"),
    ]
    x = np.linspace(-2, 2, 32, dtype="float32").reshape(4, 8)
    np.testing.assert_array_equal(compiled.run(x), np.maximum(x + x, 0))
