"""Partitions on devices of their own: their programs, carried by the library, run by
their runtimes.

A partition placed on an accelerator with a runtime (``Accelerator(runtime=...)``,
see :mod:`umahub.plugin.device`) is compiled to a :class:`DeviceCall`: the
plugin's :class:`~umahub.plugin.device.DeviceProgram`, the partition's constant
inputs (its weights, scales and zero points) and where each input comes from.
The host calls the partition through a stub, a host function of the
partition's symbol that passes its tensors to the packed function
``umahub.device.<key>`` (:func:`stub_module`); ``key`` is a hash of the call's
content, so two libraries loaded in one process never call each other's
programs, and two copies of one library share theirs. Everything else (the
Relax VM, the concurrent executor, profiling, verification) sees an ordinary
partition.

When a library is loaded, :func:`bind` finds each runtime by name (entry point
group ``umahub.runtimes``, or :func:`register_runtime`), opens each instance
once per process, loads each program once, writes its constants to device
buffers once, and registers ``umahub.device.<key>``. A call of it writes the
other inputs to the device, executes the program, waits (at most
:data:`TIMEOUT` seconds for each completion) and reads the outputs back.

Why delegate-owned memory with transfers at partition boundaries, not a TVM
device type (``ext_dev`` with a ``DeviceAPI``): a ``DeviceAPI`` is a C++ class
compiled against the exact libtvm a board runs, registered per device *type*
(one ``ext_dev`` for every vendor in the process), and TVM's VM would then
allocate every tensor of a partition's boundary on it, through it. The
delegate's way (ONNX Runtime's execution providers, ExecuTorch's backends)
needs no C++ against TVM, lets any number of vendors' devices live in one
process, and keeps what must stay on the device there: the weights (written
once, at load) and every value between two operators of one partition (inside
its program). What crosses to the host goes through the runtime's
:meth:`~umahub.plugin.device.Device.write` and
:meth:`~umahub.plugin.device.Device.read`, and the report counts each crossing
as a copy. Values between two neighbouring partitions of one device cross
through the host; a partition that keeps a chain of operators is one program.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from umahub.errors import ExecutionError, UmahubError, last_line
from umahub.plugin.device import (
    RUNTIME_ENTRY_POINTS,
    Completion,
    Device,
    DeviceError,
    DeviceProgram,
    DeviceRuntime,
)

__all__ = [
    "PREFIX",
    "TIMEOUT",
    "DeviceCall",
    "Instance",
    "bind",
    "instance",
    "register_runtime",
    "runtime_named",
    "stub_module",
]

#: The packed functions the stubs call are named ``PREFIX + key``.
PREFIX = "umahub.device."

#: Seconds umahub waits for one completion of a device (a transfer, a program run)
#: before the call fails; ``UMAHUB_DEVICE_TIMEOUT`` overrides it.
TIMEOUT = float(os.environ.get("UMAHUB_DEVICE_TIMEOUT", "60"))


@dataclass(frozen=True)
class DeviceCall:
    """One partition compiled for a device: what a library carries to run it.

    Attributes:
        symbol: the partition's symbol.
        accelerator: the accelerator's name.
        instance: which instance it was placed on.
        runtime: the runtime's name (``umahub.runtimes`` entry point).
        package: the distribution to install for that runtime.
        program: the plugin's compiled program.
        inputs: for each input of the partition, in order: -1 (passed at every
            call) or the index of its value in ``constants`` (resident).
        constants: the values of the resident inputs (C-contiguous arrays).
    """

    symbol: str
    accelerator: str
    instance: int
    runtime: str
    package: str
    program: DeviceProgram
    inputs: tuple[int, ...]
    constants: tuple[np.ndarray, ...] = ()

    @property
    def device(self) -> str:
        """The virtual device, ``"accelerator:instance"``."""
        return f"{self.accelerator}:{self.instance}"

    @property
    def key(self) -> str:
        """A hash of everything the call computes with: the packed function's name."""
        h = hashlib.sha256()
        head = [self.symbol, self.device, self.runtime, self.inputs, self.program.metadata]
        h.update(json.dumps(head, sort_keys=True, default=str).encode())
        h.update(self.program.data)
        for c in self.constants:
            h.update(f"{c.dtype}{c.shape}".encode())
            h.update(np.ascontiguousarray(c).tobytes())
        return h.hexdigest()[:24]

    @property
    def function(self) -> str:
        """The name of the packed function the partition's stub calls."""
        return PREFIX + self.key

    @property
    def resident_bytes(self) -> int:
        """Bytes of the constants written to the device at load."""
        return sum(int(c.nbytes) for c in self.constants)


def stub_module(call: DeviceCall, prim_func: Any, target: Any = None) -> Any:
    """The host's side of a device partition: an LLVM module with a function of the
    partition's symbol that passes its tensors (inputs passed at every call, then
    outputs) to :attr:`DeviceCall.function`.

    ``prim_func``: the partition's TIR (its parameters give the buffers' types);
    ``target``: the LLVM target of a cross build, None for this machine.
    """
    import tvm
    from tvm import te, tirx

    from umahub.plugin.compat import param_buffers

    buffers = param_buffers(prim_func)
    n_inputs = len(call.inputs)
    if any(b is None for b in buffers) or len(buffers) <= n_inputs:
        raise UmahubError(
            f"partition {call.symbol}: its TIR must take {n_inputs} input buffer(s) then its "
            f"output buffer(s), it takes {len(buffers)} parameter(s)"
        )
    inputs = [
        te.placeholder(b.shape, b.dtype, b.name)
        for b, where in zip(buffers, call.inputs)
        if where < 0
    ]
    outputs = buffers[n_inputs:]
    results = te.extern(
        [b.shape for b in outputs],
        inputs,
        lambda ins, outs: tirx.call_packed(call.function, *ins, *outs),
        dtype=[b.dtype for b in outputs],
        name=call.symbol,
    )
    results = results if isinstance(results, list) else [results]
    stub = te.create_prim_func([*inputs, *results]).with_attr("global_symbol", call.symbol)
    module = tvm.IRModule({call.symbol: stub})
    return tvm.tirx.build(module, target=target if target is not None else "llvm")


# ------------------------------------------------------------------ runtimes


_RUNTIMES: dict[str, DeviceRuntime] = {}
_RUNTIMES_LOCK = threading.Lock()


def register_runtime(runtime: DeviceRuntime) -> None:
    """Use ``runtime`` for its name in this process, before any installed one (for
    embedding a runtime without installing it, and for tests)."""
    if not isinstance(runtime, DeviceRuntime) or not runtime.name:
        raise UmahubError(f"register_runtime takes a named DeviceRuntime, got {runtime!r}")
    with _RUNTIMES_LOCK:
        _RUNTIMES[runtime.name] = runtime
        for key in [k for k in _QUEUES if k[0] == runtime.name]:  # devices of the one it replaces
            del _QUEUES[key]


def _entry_point(name: str) -> Any:
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group=RUNTIME_ENTRY_POINTS) if ep.name == name]
    return found[0] if found else None


def runtime_named(name: str, package: str = "", needed_by: str = "") -> DeviceRuntime:
    """The runtime called ``name``: a registered one, else the installed entry point.

    Raises:
        UmahubError: not installed (one line naming the package to install), or
            its entry point fails to load or gives no :class:`DeviceRuntime`.
    """
    with _RUNTIMES_LOCK:
        if name in _RUNTIMES:
            return _RUNTIMES[name]
        ep = _entry_point(name)
        package = package or name
        who = f"{needed_by} runs" if needed_by else "running this model needs"
        if ep is None:
            raise UmahubError(
                f"{who} partitions on the device runtime '{name}', which is not installed "
                f"here: pip install {package}"
            )
        try:
            value = ep.load()
            runtime = value() if isinstance(value, type) else value
        except Exception as exc:
            raise UmahubError(
                f"the device runtime '{name}' ({ep.value}, package {package}) failed to load: "
                f"{type(exc).__name__}: {last_line(exc)}"
            ) from exc
        if not isinstance(runtime, DeviceRuntime):
            raise UmahubError(
                f"the entry point '{name}' of group {RUNTIME_ENTRY_POINTS} ({ep.value}, package "
                f"{package}) gives {type(runtime).__name__}, not a umahub.plugin.DeviceRuntime"
            )
        _RUNTIMES[name] = runtime
        return runtime


# ------------------------------------------------------------------ devices


class Instance:
    """One device instance of this process (``device``), and the lock that makes its work
    one queue (``lock``); ``broken`` says why it may no longer be used ("" while it may)."""

    def __init__(self, device: Device, name: str):
        self.device, self.name = device, name
        self.lock = threading.Lock()
        self.broken = ""  # why the device may no longer be used (it timed out)


_QUEUES: dict[tuple[str, int], Instance] = {}


def instance(runtime: DeviceRuntime, number: int, accelerator: str = "") -> Instance:
    """The process's :class:`Instance` ``number`` of ``runtime`` (opened at the first use).

    Raises:
        ExecutionError: the runtime cannot open it, or gives no :class:`Device`.
    """
    key = (runtime.name, number)
    name = f"{accelerator or runtime.name}:{number}"
    with _RUNTIMES_LOCK:
        if key not in _QUEUES:
            try:
                device = runtime.open(number)
            except Exception as exc:
                what = str(exc) if isinstance(exc, DeviceError) else f"{type(exc).__name__}: {exc}"
                raise ExecutionError(f"{name} cannot be opened: {what}") from exc
            if not isinstance(device, Device):
                raise ExecutionError(
                    f"{name}: the runtime '{runtime.name}' opened "
                    f"{type(device).__name__}, not a umahub.plugin.Device"
                )
            _QUEUES[key] = Instance(device, name)
        return _QUEUES[key]


def _failure(call: DeviceCall, doing: str, exc: BaseException) -> ExecutionError:
    """The error a device's failure becomes: accelerator, instance, partition, its message."""
    if isinstance(exc, TimeoutError):
        what = f"no completion within {TIMEOUT:g} s (UMAHUB_DEVICE_TIMEOUT)"
    elif isinstance(exc, DeviceError):
        what = str(exc) or type(exc).__name__
    else:
        what = f"the runtime '{call.runtime}' failed: {type(exc).__name__}: {last_line(exc)}"
    return ExecutionError(f"{call.device}, partition {call.symbol}: {doing}: {what}")


def _wait(completion: Any, call: DeviceCall, doing: str, queue: Instance) -> None:
    if not isinstance(completion, Completion):
        raise ExecutionError(
            f"{call.device}, partition {call.symbol}: {doing}: the runtime '{call.runtime}' "
            f"returned {type(completion).__name__}, not a Completion (return done() when "
            "the work is complete)"
        )
    try:
        completion.wait(TIMEOUT)
    except TimeoutError as exc:
        queue.broken = f"it gave no completion within {TIMEOUT:g} s before"
        raise _failure(call, doing, exc) from exc


def _bytes(array: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array (written to, for an output's view)."""
    return array.data.cast("B")


class _Bound:
    """A device call made ready: its program loaded and its constants resident on the
    device; calling it runs the partition on tensors of the host's VM."""

    def __init__(self, call: DeviceCall, runtime: DeviceRuntime):
        self.call = call
        self.queue = instance(runtime, call.instance, call.accelerator)
        self.passed = sum(1 for where in call.inputs if where < 0)
        device = self.queue.device
        with self.queue.lock:
            self._usable()
            try:
                self.program = device.load(call.program)
            except Exception as exc:
                raise _failure(call, "the program was not loaded", exc) from exc
            self.resident: list[Any] = []
            try:
                for value in call.constants:
                    buffer = device.allocate(max(int(value.nbytes), 1))
                    self.resident.append(buffer)
                    value = np.require(value, requirements="C")  # 0-d stays 0-d
                    _wait(device.write(buffer, _bytes(value)), call, "writing a weight", self.queue)
            except ExecutionError:
                raise
            except Exception as exc:
                raise _failure(call, "writing its weights", exc) from exc

    def _usable(self) -> None:
        if self.queue.broken:
            raise ExecutionError(
                f"{self.call.device}, partition {self.call.symbol}: the device is not used "
                f"again: {self.queue.broken}; load the model again"
            )

    def __call__(self, *tensors: Any) -> None:
        call, device = self.call, self.queue.device
        inputs, outputs = tensors[: self.passed], tensors[self.passed :]
        with self.queue.lock:
            self._usable()
            made: list[Any] = []
            try:
                buffers: list[Any] = []
                given = iter(inputs)
                for where in call.inputs:
                    if where >= 0:
                        buffers.append(self.resident[where])
                        continue
                    value = next(given).numpy()
                    buffer = device.allocate(max(int(value.nbytes), 1))
                    made.append(buffer)
                    buffers.append(buffer)
                    _wait(device.write(buffer, _bytes(value)), call, "writing an input", self.queue)
                # the tensors the VM passes are borrowed: copied, never viewed (a DLPack
                # view of a borrowed tensor crashes the process)
                hosts = [np.empty(tuple(out.shape), str(out.dtype)) for out in outputs]
                for host in hosts:
                    buffer = device.allocate(max(int(host.nbytes), 1))
                    made.append(buffer)
                    buffers.append(buffer)
                _wait(device.execute(self.program, buffers), call, "running", self.queue)
                for out, host, buffer in zip(outputs, hosts, buffers[len(call.inputs) :]):
                    _wait(device.read(buffer, _bytes(host)), call, "reading an output", self.queue)
                    out.copyfrom(host)
            except ExecutionError:
                raise
            except Exception as exc:
                raise _failure(call, "running", exc) from exc
            finally:
                for buffer in made:
                    try:
                        device.free(buffer)
                    except Exception:
                        pass


def bind(calls: Iterable[DeviceCall], needed_by: str = "") -> list[Any]:
    """Make every call ready (runtime found, instance open, program loaded, constants
    written) and register its packed function; returns what must be kept alive.

    Raises:
        UmahubError: a runtime is not installed (naming the package to install).
        ExecutionError: a device refuses a program or its constants.
    """
    import tvm_ffi

    # so that the error a device call raises inside the VM reaches the caller as itself
    tvm_ffi.register_error("umahub.ExecutionError", ExecutionError)
    bound = []
    for call in calls:
        runtime = runtime_named(call.runtime, call.package, needed_by)
        ready = _Bound(call, runtime)
        tvm_ffi.register_global_func(call.function, ready, override=True)
        bound.append(ready)
    return bound
