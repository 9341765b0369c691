"""What one call of a partition on a device of its own costs: the crossing into its runtime.

A chain of ``K`` float32 adds on a ``(1, 64)`` tensor (256 bytes) runs in three ways,
each in a process of its own, on the Relax VM:

* ``host``: every add on the host (one fused kernel; the floor);
* ``llvm``: every add its own partition on an LLVM accelerator (host code called
  through ``call_dps_packed``: what a partition costs without a device);
* ``device``: every add its own partition on a device of its own whose runtime is
  as cheap as a runtime can be (device memory a ``bytearray``, the add done by
  numpy): what umahub's crossing costs, the host stub, the packed call into
  Python, one write per input, one execute, one read, the waits.

``per_call_us`` is ``(device - llvm) / K`` per inference: the crossing's cost beyond
an ordinary partition call. Results: ``results/device_call.json``; the outputs are
checked against numpy with a relative error.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TVM_NUM_THREADS", "1")

from _common import run_worker, worker_env, write

K = 32

WORKER = r"""
import json, statistics, sys, time, warnings
import numpy as np
import tvm
from tvm import relax
import umahub
import umahub.plugin as up
from umahub.runtime.devices import register_runtime

way, K = sys.argv[1], int(sys.argv[2])


class Memory(up.Device):
    def __init__(self):
        self.mem, self.top = bytearray(1 << 20), 0
    def allocate(self, n):
        if self.top + n > len(self.mem):
            self.top = 0
        at, self.top = self.top, self.top + n
        return at
    def free(self, b):
        pass
    def write(self, b, data):
        self.mem[b : b + len(data)] = data
        return up.done()
    def read(self, b, out):
        out[:] = self.mem[b : b + len(out)]
        return up.done()
    def load(self, program):
        return int(program.metadata["n"])
    def execute(self, n, buffers):
        a, c, out = (np.frombuffer(self.mem, np.float32, n, b) for b in buffers)
        self.mem[buffers[2] : buffers[2] + 4 * n] = (a + c).tobytes()
        return up.done()


class Runtime(up.DeviceRuntime):
    name = "bench_null"
    def open(self, instance):
        return Memory()


class Plugin:
    UMAHUB_API = 1
    @up.hookimpl
    def umahub_accelerators(self):
        device = way == "device"
        return [up.Accelerator("bench", runtime="bench_null" if device else "",
                               codegen="" if device else "llvm", merge=False)]
    @up.hookimpl(accelerator="bench")
    def umahub_patterns(self):
        return [("bench.add", up.op("relax.add"))]
    @up.hookimpl(accelerator="bench")
    def umahub_codegen(self, module, context):
        if way != "device":
            return None
        return up.DeviceProgram(b"add", {"n": 64})


register_runtime(Runtime())
bb = relax.BlockBuilder()
from umahub._tvm import TensorType
x = relax.Var("x", TensorType((1, 64), "float32"))
consts = [np.full((1, 64), i / K, dtype="float32") for i in range(K)]
with bb.function("main", [x]):
    with bb.dataflow():
        v = x
        for c in consts:
            v = bb.emit(relax.op.add(v, relax.const(c)))
        out = bb.emit_output(v)
    bb.emit_func_output(out)
plugins = [] if way == "host" else [Plugin()]
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    compiled = umahub.Hub(autoload=False, plugins=plugins).compile(bb.get())
on = sorted({o.device for o in compiled.report.placement})
xs = np.random.default_rng(0).standard_normal((1, 64)).astype("float32")
want = xs + sum(consts)
got = compiled.run(xs, executor="vm")
rel = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
for _ in range(20):
    compiled.run(xs, executor="vm")
times = []
for _ in range(7):
    start = time.perf_counter()
    for _ in range(100):
        compiled.run(xs, executor="vm")
    times.append((time.perf_counter() - start) / 100)
print(json.dumps({"seconds": statistics.median(times), "devices": on, "rel_error": rel}))
"""


def main() -> None:
    env = worker_env(int(os.environ["TVM_NUM_THREADS"]))
    rows = {way: run_worker(WORKER, [way, str(K)], env) for way in ("host", "llvm", "device")}
    print(json.dumps(rows, indent=2))
    if any("error" in r for r in rows.values()):
        sys.exit("a worker failed")
    if any(r["rel_error"] > 1e-5 for r in rows.values()):
        sys.exit("an output is wrong")
    per_call = (rows["device"]["seconds"] - rows["llvm"]["seconds"]) / K
    partition = (rows["llvm"]["seconds"] - rows["host"]["seconds"]) / K
    path = write(
        "device_call",
        {
            "partitions": K,
            "tensor_bytes": 256,
            "ways": rows,
            "per_call_us": per_call * 1e6,
            "llvm_partition_call_us": partition * 1e6,
        },
    )
    print(f"crossing into the runtime: {per_call * 1e6:.1f} us per partition call -> {path}")


if __name__ == "__main__":
    main()
