"""The pieces without umahub's glue: a partition's TIR, the codegen's program, the device
run on numpy buffers; and what the codegen refuses."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import umahub_simnpu
from simnpu_models import host_hub, quantized_model
from tvm import tirx
from umahub_simnpu.codegen import CodegenError, evaluate, generate
from umahub_simnpu.lowering import lower
from umahub_simnpu.operator import plan
from umahub_simnpu.pipeline import compile_program
from umahub_simnpu_runtime import SimNpuRuntime, isa

import umahub
import umahub.plugin as up


class _Recorder:
    """A plugin that records what ``umahub_relax_to_tir`` is given for the simnpu's
    partitions (and lets the simnpu's own hook lower them)."""

    UMAHUB_API = 1

    def __init__(self):
        self.partitions = []

    @up.hookimpl(tryfirst=True)
    def umahub_relax_to_tir(self, accelerator, function, context):
        if accelerator.name == "simnpu":
            constants = {i: v.numpy() for i, v in context.constants.items()}
            self.partitions.append((function, constants))


def _partition(mod: tvm.IRModule):
    """The one partition umahub makes of ``mod`` for the simnpu, and its constants."""
    recorder = _Recorder()
    umahub.Hub(config={}, autoload=False, plugins=[umahub_simnpu, recorder]).compile(mod)
    (found,) = recorder.partitions
    return found


def test_tir_to_program_to_device_on_numpy_buffers():
    mod, (x,) = quantized_model("conv2d", x_dtype="uint8", activation="relu", strides=(2, 1))
    want = host_hub().compile(mod).run(x)
    function, constants = _partition(mod)
    p = plan(function, constants)
    tir = lower(p, function, "part")
    text = tir.script()
    for name in ("simnpu.load", "simnpu.gemm", "simnpu.alu", "simnpu.store"):
        assert name in text
    with pytest.raises(CodegenError, match=r"the tile acc is in scope 'global', not one of"):
        generate(tir, "part")  # not scheduled: the tiles are in no on-chip scope
    program = compile_program(p, function, "part")
    assert program.data[:4] == isa.MAGIC
    assert program.metadata["buffers"] == len(function.params) + 1
    device = SimNpuRuntime(dram_bytes=1 << 22).open(3)
    try:
        loaded = device.load(program)
        buffers = []
        for value in [x, *(constants[i] for i in sorted(constants))]:
            array = np.ascontiguousarray(value)
            buffer = device.allocate(max(array.nbytes, 1))
            device.write(buffer, memoryview(array).cast("B")).wait(10)
            buffers.append(buffer)
        out = device.allocate(want.nbytes)
        device.execute(loaded, [*buffers, out]).wait(10)
        got = np.empty_like(want)
        device.read(out, memoryview(got).cast("B")).wait(10)
        assert np.array_equal(got, want)
        counters = device.counters()
        assert counters["instructions"] == program.metadata["instructions"]
        assert counters["macs"] > 0
    finally:
        device.close()


def test_the_codegen_evaluates_loop_arithmetic():
    i, j = tirx.Var("i", "int32"), tirx.Var("j", "int32")
    expr = tirx.max(tirx.floordiv(i * 7 - j, 3), tirx.min(j, 2)) + tirx.floormod(i, 4)
    assert evaluate(expr, {i: 5, j: 1}) == max((35 - 1) // 3, 1) + 1
    with pytest.raises(CodegenError, match="not bound"):
        evaluate(i + 1, {})


def test_what_the_codegen_cannot_translate_is_named():
    mod, (x,) = quantized_model("matmul", x_shape=(2, 16))
    function, constants = _partition(mod)
    tir = lower(plan(function, constants), function, "part")
    func = tir["part"]
    bad = tirx.Evaluate(tirx.call_extern("int32", "simnpu.sort", 1, 2))
    broken = up.with_root_body(func, [bad])
    with pytest.raises(CodegenError, match=r"simnpu\.sort is not an intrinsic"):
        generate(tvm.IRModule({"part": broken}), "part")
    k = tirx.Var("k", "int32")
    nothing = tirx.Evaluate(tirx.const(0, "int32"))
    unknown = tirx.For(k, 0, tirx.Var("n", "int32"), tirx.ForKind.SERIAL, nothing)
    with pytest.raises(CodegenError, match="not bound"):
        generate(tvm.IRModule({"part": up.with_root_body(func, [unknown])}), "part")
