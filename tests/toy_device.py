"""A toy device for the runtime contract's tests: float32 adds and multiplies on memory of
its own (a bytearray addressed by offsets), through a Python runtime.

The compiler half (:data:`plugin`) claims ``relax.add`` and ``relax.multiply`` of float32 on
the accelerator ``toy``; its codegen gives a program naming the operator. The runtime
(:class:`ToyRuntime`) keeps every instance's memory apart from the host's, can be told to
fail (a program it rejects, a fault mid-run, a run that never completes, a device gone) and
counts what crosses.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import numpy as np

import umahub.plugin as up

MEMORY = 1 << 20


class ToyDevice(up.Device):
    """One toy instance: ``MEMORY`` bytes, a bump allocator with reuse of freed blocks."""

    def __init__(self, instance: int, asynchronous: bool = False):
        self.instance = instance
        self.memory = bytearray(MEMORY)
        self.blocks: dict[int, int] = {}  # offset -> size
        self.free_list: list[tuple[int, int]] = []
        self.top = 0
        self.asynchronous = asynchronous
        self.fault = ""  # "reject", "fault", "hang", "gone"
        self.writes = self.reads = self.runs = 0

    def _alive(self) -> None:
        if self.fault == "gone":
            raise up.DeviceError(f"toy:{self.instance} is gone")

    def allocate(self, nbytes: int) -> int:
        self._alive()
        for i, (offset, size) in enumerate(self.free_list):
            if size >= nbytes:
                del self.free_list[i]
                self.blocks[offset] = size
                return offset
        if self.top + nbytes > MEMORY:
            raise up.DeviceError(f"out of memory: {nbytes} bytes asked, {MEMORY - self.top} free")
        offset, self.top = self.top, self.top + nbytes
        self.blocks[offset] = nbytes
        return offset

    def free(self, buffer: int) -> None:
        self.free_list.append((buffer, self.blocks.pop(buffer)))

    def write(self, buffer: int, data: memoryview) -> up.Completion:
        self._alive()
        assert len(data) <= self.blocks[buffer]
        self.memory[buffer : buffer + len(data)] = data
        self.writes += 1
        return up.done()

    def read(self, buffer: int, out: memoryview) -> up.Completion:
        self._alive()
        out[:] = self.memory[buffer : buffer + len(out)]
        self.reads += 1
        return up.done()

    def load(self, program: up.DeviceProgram) -> Any:
        self._alive()
        if self.fault == "reject" or program.data not in (b"add", b"multiply"):
            raise up.DeviceError(f"program rejected: unknown operation {program.data!r}")
        return SimpleNamespace(op=program.data.decode(), size=int(program.metadata["size"]))

    def _run(self, program: Any, buffers: list[int]) -> None:
        if self.fault == "fault":
            raise up.DeviceError("fault at instruction 1: bus error")
        *ins, out = (
            np.frombuffer(self.memory, np.float32, program.size, offset) for offset in buffers
        )
        a, b = ins if len(ins) == 2 else (ins[0], ins[0])  # x * x: one input
        result = np.add(a, b) if program.op == "add" else np.multiply(a, b)
        self.memory[buffers[-1] : buffers[-1] + result.nbytes] = result.tobytes()
        self.runs += 1

    def execute(self, program: Any, buffers: Any) -> up.Completion:
        self._alive()
        if self.fault == "hang":
            return up.Pending()  # never finished
        if not self.asynchronous:
            self._run(program, list(buffers))
            return up.done()
        pending = up.Pending()

        def work() -> None:
            try:
                self._run(program, list(buffers))
                pending.finish()
            except up.DeviceError as exc:
                pending.finish(exc)

        threading.Thread(target=work, daemon=True).start()
        return pending


class ToyRuntime(up.DeviceRuntime):
    """The toy's runtime: instances 0 and 1."""

    name = "toy"

    def __init__(self, asynchronous: bool = False):
        self.asynchronous = asynchronous
        self.opened: dict[int, ToyDevice] = {}

    def open(self, instance: int) -> ToyDevice:
        if instance > 1:
            raise up.DeviceError(f"no toy instance {instance}")
        self.opened[instance] = ToyDevice(instance, self.asynchronous)
        return self.opened[instance]


def _float32(ctx: Any) -> bool | up.Refusal:
    return up.dtype_of(ctx.matched_expr) == "float32" or up.Refusal("float32 only")


class _Plugin:
    """The toy's compiler half."""

    UMAHUB_API = 1

    @up.hookimpl
    def umahub_accelerators(self) -> list[up.Accelerator]:
        return [
            up.Accelerator(
                "toy",
                runtime="toy",
                runtime_package="umahub-toy-runtime",
                instances=2,
                memory=[up.MemoryPool("toy.dram", MEMORY, copy="async")],
                merge=False,
            )
        ]

    @up.hookimpl(accelerator="toy")
    def umahub_patterns(self) -> list:
        return [
            ("toy.add", up.op("relax.add"), {}, _float32),
            ("toy.multiply", up.op("relax.multiply"), {}, _float32),
        ]

    @up.hookimpl(accelerator="toy")
    def umahub_codegen(self, module: Any, context: Any) -> up.DeviceProgram:
        size = 1
        for d in up.param_buffers(module[context.symbol])[-1].shape:
            size *= int(d)
        op = context.operators[0].op.rsplit(".", 1)[-1]
        return up.DeviceProgram(op.encode(), {"size": size})


plugin = _Plugin()
