"""Relax's static memory plan with several devices: storage is reused within a device, never across.

A chain runs on device 1, then device 0, then device 1 again, each stretch
three ``negative``/``add`` pairs of 64x64 tensors (16 KiB each), so that the
plan can reuse storage within each stretch and, if devices were mixed, across
them.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from umahub._tvm import TensorType, VDevice, name_of
from umahub.host import storage_plan

STRETCHES = (1, 0, 1)


def _chain() -> tvm.IRModule:
    devices = [VDevice("llvm", i, "global") for i in range(2)]
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((64, 64), "float32", devices[0]))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for device in STRETCHES:
                h = bb.emit(relax.op.to_vdevice(h, devices[device]))
                for _ in range(3):
                    h = bb.emit(relax.op.negative(h))
                    h = bb.emit(relax.op.add(h, h))
            out = bb.emit_output(relax.op.to_vdevice(h, devices[0]))
        bb.emit_func_output(out)
    mod = bb.get()
    mod.update_global_info("vdevice", devices)
    return relax.transform.LegalizeOps()(relax.transform.RealizeVDevice()(mod))


def _storages(mod: tvm.IRModule) -> dict[str, tuple[int, str, set[int]]]:
    """storage variable -> (its device, its scope, the devices of the tensors made in it)."""
    found: dict[str, tuple[int, str, set[int]]] = {}
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
                continue
            if value.op.name == "relax.memory.alloc_storage":
                found[name_of(binding.var)] = (int(value.args[1].value), value.args[2].value, set())
            elif value.op.name == "relax.memory.alloc_tensor":
                found[name_of(value.args[0])][2].add(int(value.args[4].value))
    return found


def test_each_device_reuses_its_own_storage_only():
    planned = _storages(storage_plan.plan_storage(_chain()))
    # Two storages per device, taking turns: the ping-pong of a chain.
    assert sorted((device, scope, sorted(users)) for device, scope, users in planned.values()) == [
        (0, "global", [0]),
        (0, "global", [0]),
        (1, "global", [1]),
        (1, "global", [1]),
    ]


def test_tvms_own_plan_would_mix_the_devices():
    """Why umahub plans by device: TVM's plan pools storage by scope and dtype only."""
    mod = tvm.transform.Sequential(storage_plan._lower_calls())(_chain())
    mixed = _storages(relax.transform.StaticPlanBlockMemory()(mod))
    assert any(len(users) > 1 for _, _, users in mixed.values())


def test_the_planned_chain_runs_on_its_two_devices():
    with tvm.transform.PassContext(opt_level=3, disabled_pass=storage_plan.REPLACED_PASSES):
        executable = tvm.compile(storage_plan.plan_storage(_chain()), target="llvm")
    vm = relax.VirtualMachine(executable, [tvm.cpu(0), tvm.cpu(1)])
    x = np.random.default_rng(0).standard_normal((64, 64)).astype("float32")
    out = vm["main"](tvm.runtime.tensor(x, tvm.cpu(0))).numpy()
    # Each stretch negates and doubles three times: (-2)**9, exact in float32.
    np.testing.assert_array_equal(out, x * -512.0)


def test_a_reshape_between_partitions_stays_a_view_of_its_input():
    """TVM's pipeline makes a reshape a view (``vm.builtin.reshape``) after its
    operators are legalized: legalized again after that, it would be a copy."""
    import re

    import umahub

    rng = np.random.default_rng(0)

    def weight():
        return relax.const(rng.standard_normal((64, 64)).astype("float32"))

    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((64, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.matmul(x, weight()))
            r = bb.emit(relax.op.reshape(relax.op.reshape(a, (16, 256)), (64, 64)))
            out = bb.emit_output(relax.op.matmul(r, weight()))
        bb.emit_func_output(out)
    compiled = umahub.Hub(config={"plugins": ["npu"]}, project_config=False).compile(bb.get())
    text = compiled.executable.as_text()
    main = text[text.index("@main:") :]
    calls = re.findall(r"call\s+(\S+)", main[: main.index("\n@")] if "\n@" in main else main)
    assert [c for c in calls if "reshape" in c] == ["vm.builtin.reshape"]
    assert [c for c in calls if c.startswith("npu")] == ["npu_0_matmul", "npu_1_matmul"]
