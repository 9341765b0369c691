"""Strided vector loads written as contiguous loads and a shuffle (umahub.host.strided_loads)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

from umahub.compiler.tir_phases import use_phase_passes
from umahub.host.strided_loads import contiguous_loads, strided_load_pass
from umahub.plugin.compat import Load, nodes_in


def _every_other(n: int, stride: int, lanes: int, dtype: str):
    """``y[i] = x[stride * i] + x[stride * i + 1]``, its loop vectorized by ``lanes``."""
    x = te.placeholder((stride * n + 1,), dtype, name="x")
    y = te.compute((n,), lambda i: x[stride * i] + x[stride * i + 1], name="y")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y]))
    (loop,) = sch.get_loops(sch.get_sblock("y"))
    _, inner = sch.split(loop, [None, lanes])
    sch.vectorize(inner)
    return sch.mod


def _lowered(mod):
    """``mod`` through TVM's lowering up to its vectorized loops, then the pass."""
    passes = [
        tvm.s_tir.transform.LowerInitBlock(),
        tvm.s_tir.transform.ConvertBlocksToOpaque(),
        tvm.s_tir.transform.CompactBufferAllocation(),
        tvm.s_tir.transform.LowerOpaqueBlock(),
        tvm.tirx.transform.FlattenBuffer(),
        tvm.tirx.transform.VectorizeLoop(),
    ]
    return tvm.transform.Sequential(passes)(mod)


def _ramps(func) -> list[int]:
    """The strides of the vector loads in ``func``."""
    loads = nodes_in(func.body, Load)
    return [
        int(load.indices[0].stride) for load in loads if isinstance(load.indices[0], tvm.tirx.Ramp)
    ]


@pytest.mark.parametrize(("stride", "lanes"), [(2, 16), (2, 8), (3, 16), (4, 4)])
def test_a_strided_vector_load_becomes_contiguous_loads(stride, lanes):
    before = _lowered(_every_other(64, stride, lanes, "float32"))["main"]
    assert set(_ramps(before)) == {stride}
    after = strided_load_pass()(tvm.IRModule({"main": before}))["main"]
    assert set(_ramps(after)) == {1}
    shuffles = nodes_in(after.body, tvm.tirx.Shuffle)
    assert len(shuffles) == 2  # x[s*i] and x[s*i + 1]
    assert all(len(s.vectors) == stride for s in shuffles)


def test_wide_strides_and_narrow_vectors_are_left_alone():
    wide = _lowered(_every_other(64, 5, 16, "float32"))["main"]
    narrow = _lowered(_every_other(64, 2, 2, "float32"))["main"]
    for func in (wide, narrow):
        after = strided_load_pass()(tvm.IRModule({"main": func}))["main"]
        assert _ramps(after) == _ramps(func)


def test_the_contiguous_loads_read_only_between_the_first_and_last_element():
    buffer = tvm.tirx.decl_buffer((100,), "float32", name="b")
    shuffle = contiguous_loads(buffer, tvm.tirx.const(10, "int32"), 2, 16)
    starts = [int(v.indices[0].base.value) for v in shuffle.vectors]
    assert starts == [10, 10 + 30 - 15]  # 16 lanes from 10 and 16 ending at 40 = 10 + 2 * 15
    picks = [int(i) for i in shuffle.indices]
    # element 2i: lanes 0, 2, .. 14 of the first vector, then of the second (lane 16 + 2i - 15)
    assert picks == [2 * i for i in range(8)] + [16 + 2 * i - 15 for i in range(8, 16)]


@pytest.mark.parametrize(("stride", "dtype"), [(2, "float32"), (2, "int32"), (3, "uint8")])
def test_a_function_built_with_the_pass_computes_the_same(stride, dtype):
    n = 61  # not a multiple of the vector: the last vector's loads end at the buffer's end
    x = te.placeholder((stride * n + 1,), dtype, name="x")
    y = te.compute((n,), lambda i: x[stride * i] + x[stride * i + 1], name="y")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y]))
    (loop,) = sch.get_loops(sch.get_sblock("y"))
    sch.vectorize(loop)  # 61 lanes: the last element read is the buffer's last
    with use_phase_passes({}) as pipeline:  # umahub's TIR pipeline, the pass in it
        built = tvm.tirx.build(sch.mod, target="llvm", pipeline=pipeline)
    rng = np.random.default_rng(0)
    data = rng.integers(0, 100, size=stride * n + 1).astype(dtype)
    out = tvm.runtime.tensor(np.zeros(n, dtype))
    built(tvm.runtime.tensor(data), out)
    expected = (data[0 : stride * n : stride] + data[1 : stride * n + 1 : stride]).astype(dtype)
    np.testing.assert_array_equal(out.numpy(), expected)
