"""The simnpu as a :class:`umahub.plugin.device.Device`, and its runtime.

Each instance is a C device (:mod:`umahub_simnpu_runtime.native`) with DRAM of
its own, driven by one worker thread: :meth:`SimNpuDevice.write`,
:meth:`~SimNpuDevice.read` and :meth:`~SimNpuDevice.execute` queue their work
and return a :class:`~umahub.plugin.device.Pending`, finished in order (a
command queue), with a :class:`~umahub.plugin.device.DeviceError` when the work
fails. Allocation is the host driver's bookkeeping (:mod:`.memory`) and happens
at once; buffers are DRAM offsets.

Test aids (what a test uses to make the device fail the way hardware does):
:meth:`SimNpuDevice.inject_fault` (a fault at an instruction of the next run,
or a run that never completes), :meth:`SimNpuDevice.lose` (the device goes
away), and the environment variable :data:`FAULT_ENV`, read when an instance is
opened, so a test can make a device of another process (a board) fail.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from umahub.plugin.device import (
    Completion,
    Device,
    DeviceError,
    DeviceProgram,
    DeviceRuntime,
    Pending,
)
from umahub_simnpu_runtime import isa, native
from umahub_simnpu_runtime.memory import Allocator

__all__ = [
    "DRAM_BYTES",
    "FAULT_ENV",
    "INSTANCES",
    "LoadedProgram",
    "SimNpuDevice",
    "SimNpuRuntime",
    "parse_faults",
]

#: Default DRAM of one instance (``UMAHUB_SIMNPU_DRAM`` overrides it, in bytes).
DRAM_BYTES = 256 * 1024 * 1024
#: Default number of instances (``UMAHUB_SIMNPU_INSTANCES`` overrides it).
INSTANCES = 4
#: Faults to inject, read when an instance is opened: items separated by commas,
#: each ``fault:N`` (every run faults at instruction N), ``hang`` (no run
#: completes), ``gone`` (the device is lost once opened) or ``reject`` (every
#: program is rejected), optionally ``@I`` for instance I only (else every
#: instance): ``UMAHUB_SIMNPU_FAULT="fault:3@1,hang@0"``.
FAULT_ENV = "UMAHUB_SIMNPU_FAULT"

_KINDS = ("fault", "hang", "gone", "reject")


def parse_faults(text: str, instance: int) -> dict[str, Any]:
    """The faults :data:`FAULT_ENV`'s ``text`` asks of ``instance``: ``{"fault": N,
    "hang": True, ...}``.

    Raises:
        DeviceError: an item that is not one of the forms (naming it).
    """
    faults: dict[str, Any] = {}
    for item in filter(None, (i.strip() for i in text.split(","))):
        spec, _, where = item.partition("@")
        kind, _, arg = spec.partition(":")
        try:
            if kind not in _KINDS or (kind == "fault") != bool(arg):
                raise ValueError
            if where and int(where) != instance:
                continue
            faults[kind] = int(arg) if kind == "fault" else True
        except ValueError:
            raise DeviceError(
                f"{FAULT_ENV}: {item!r} is not fault:N, hang, gone or reject (with @instance)"
            ) from None
    return faults


@dataclass
class LoadedProgram:
    """A program kept on a device: what :meth:`SimNpuDevice.load` returns.

    Attributes:
        handle: the C core's program.
        buffers: how many buffers a run takes.
        data: the DRAM buffer holding its data segment (None: it has none).
        metadata: the program's metadata, as the codegen gave it.
        number: its number on the device, for messages.
    """

    handle: int
    buffers: int
    data: int | None
    metadata: Mapping[str, Any]
    number: int


def _address(view: memoryview, writable: bool) -> tuple[np.ndarray, int]:
    """A byte array over ``view`` (kept alive by the caller) and its address."""
    flat = view if view.format == "B" and view.ndim == 1 else view.cast("B")
    array = np.frombuffer(flat, dtype=np.uint8)
    if writable and not array.flags.writeable:
        raise DeviceError("read() needs writable host memory")
    return array, array.ctypes.data


class SimNpuDevice(Device):
    """One simnpu instance: DRAM of ``dram_bytes``, the C core, a worker thread.

    Args:
        instance: its number (``simnpu:<instance>``).
        dram_bytes: its DRAM.
        onchip: capacities of INP and WGT (bytes) and ACC (32-bit words).
        faults: faults to inject from the start (see :func:`parse_faults`).
    """

    def __init__(
        self,
        instance: int,
        dram_bytes: int = DRAM_BYTES,
        onchip: tuple[int, int, int] = (isa.INP_BYTES, isa.WGT_BYTES, isa.ACC_WORDS),
        faults: Mapping[str, Any] | None = None,
    ):
        self.instance = instance
        self.name = f"simnpu:{instance}"
        self._lib = native.library()
        error = ctypes.create_string_buffer(native.ERROR_BYTES)
        handle = self._lib.snpu_create(dram_bytes, *onchip, error, native.ERROR_BYTES)
        if not handle:
            raise DeviceError(f"{self.name} cannot be opened: {error.value.decode()}")
        self._handle: int | None = handle
        self.dram_bytes = dram_bytes
        self.onchip = onchip
        self._memory = Allocator(dram_bytes, self.name)
        self._extent: dict[int, int] = {}  # buffer -> bytes asked
        self._programs: dict[int, LoadedProgram] = {}
        self._numbers = itertools.count()
        self._lock = threading.Lock()  # host-side state: allocator, programs, faults
        self._gone = ""
        self._released = threading.Event()  # ends a hung run (lose, close)
        faults = dict(faults or {})
        self._fault_every: int | None = faults.get("fault")
        self._hang_always = bool(faults.get("hang"))
        self._reject = bool(faults.get("reject"))
        self._fault_next: int | None = None
        self._hang_next = False
        self._work: queue.Queue = queue.Queue()
        self._worker = threading.Thread(target=self._serve, name=self.name, daemon=True)
        self._worker.start()
        if faults.get("gone"):
            self.lose()

    # ------------------------------------------------------------ the worker

    def _serve(self) -> None:
        while True:
            job = self._work.get()
            if job is None:
                return
            work, pending = job
            if self._gone:
                pending.finish(DeviceError(self._gone))
                continue
            try:
                work()
            except DeviceError as exc:
                pending.finish(exc)
            except Exception as exc:  # a bug of the simulator's Python side: still an error
                pending.finish(DeviceError(f"{self.name}: {type(exc).__name__}: {exc}"))
            else:
                pending.finish()

    def _submit(self, work: Callable[[], None]) -> Completion:
        pending = Pending()
        self._work.put((work, pending))
        return pending

    def _call(self, function: Callable[..., int], *args: Any) -> None:
        """Call a C function that reports failure with a message; raise it as a DeviceError."""
        error = ctypes.create_string_buffer(native.ERROR_BYTES)
        if function(*args, error, native.ERROR_BYTES):
            raise DeviceError(f"{self.name}: {error.value.decode()}")

    def _alive(self) -> int:
        if self._gone:
            raise DeviceError(self._gone)
        assert self._handle is not None
        return self._handle

    def _extent_of(self, buffer: Any) -> int:
        try:
            return self._extent[buffer]
        except (KeyError, TypeError):
            raise DeviceError(f"{self.name}: {buffer!r} is not a buffer of this device") from None

    # ------------------------------------------------------------ memory

    def allocate(self, nbytes: int) -> int:
        """A buffer of ``nbytes`` bytes: its offset in DRAM.

        Raises:
            DeviceError: out of memory (requested and free bytes), or the device is gone.
        """
        self._alive()
        with self._lock:
            offset = self._memory.allocate(nbytes)
            self._extent[offset] = nbytes
            return offset

    def free(self, buffer: int) -> None:
        """Give back a buffer (a no-op once the device is gone)."""
        if self._gone:
            return
        with self._lock:
            self._extent_of(buffer)
            self._memory.free(buffer)
            del self._extent[buffer]

    def write(self, buffer: int, data: memoryview) -> Completion:
        """Copy ``data`` to the start of ``buffer``, in the device's queue."""
        handle = self._alive()
        view = memoryview(data)
        if view.nbytes > self._extent_of(buffer):
            raise DeviceError(
                f"{self.name}: writing {view.nbytes} bytes into a buffer of "
                f"{self._extent_of(buffer)}"
            )

        def work() -> None:
            array, address = _address(view, writable=False)
            self._call(self._lib.snpu_write, handle, buffer, address, array.nbytes)

        return self._submit(work)

    def read(self, buffer: int, out: memoryview) -> Completion:
        """Copy the start of ``buffer`` into ``out``, in the device's queue."""
        handle = self._alive()
        view = memoryview(out)
        if view.readonly:
            raise DeviceError(f"{self.name}: read() needs writable host memory")
        if view.nbytes > self._extent_of(buffer):
            raise DeviceError(
                f"{self.name}: reading {view.nbytes} bytes from a buffer of "
                f"{self._extent_of(buffer)}"
            )

        def work() -> None:
            array, address = _address(view, writable=True)
            self._call(self._lib.snpu_read, handle, buffer, address, array.nbytes)

        return self._submit(work)

    # ------------------------------------------------------------ programs

    def load(self, program: DeviceProgram) -> LoadedProgram:
        """Check a program and keep it; its data segment goes to DRAM now.

        Raises:
            DeviceError: ``"program rejected: ..."`` (what is wrong with it).
        """
        handle = self._alive()
        if not isinstance(program, DeviceProgram):
            raise DeviceError(f"program rejected: {type(program).__name__}, not a DeviceProgram")
        if self._reject:
            raise DeviceError(f"program rejected: {self.name} rejects every program ({FAULT_ENV})")
        data = program.data
        buffers, data_bytes = ctypes.c_uint32(), ctypes.c_uint32()
        self._call(
            self._lib.snpu_check,
            handle,
            data,
            len(data),
            ctypes.byref(buffers),
            ctypes.byref(data_bytes),
        )
        segment = self.allocate(data_bytes.value) if data_bytes.value else None
        error = ctypes.create_string_buffer(native.ERROR_BYTES)
        loaded = self._lib.snpu_load(
            handle, data, len(data), segment or 0, error, native.ERROR_BYTES
        )
        if not loaded:
            if segment is not None:
                self.free(segment)
            raise DeviceError(f"{self.name}: {error.value.decode()}")
        with self._lock:
            number = next(self._numbers)
            result = LoadedProgram(loaded, buffers.value, segment, program.metadata, number)
            self._programs[number] = result
        return result

    def unload(self, program: LoadedProgram) -> None:
        """Forget a loaded program and free its data segment."""
        with self._lock:
            if self._programs.pop(getattr(program, "number", -1), None) is not program:
                return
        self._lib.snpu_unload(program.handle)
        if program.data is not None:
            self.free(program.data)

    def execute(self, program: LoadedProgram, buffers: Sequence[int]) -> Completion:
        """Run ``program`` on ``buffers`` (the partition's inputs, then its outputs), queued.

        The completion fails with a DeviceError on a fault mid-run (an access outside
        a buffer's extent, an injected fault).

        Raises:
            DeviceError: at once, for a program not loaded here or the wrong number of buffers.
        """
        handle = self._alive()
        if self._programs.get(getattr(program, "number", -1)) is not program:
            raise DeviceError(f"{self.name}: {program!r} is not a program loaded on this device")
        if len(buffers) != program.buffers:
            raise DeviceError(
                f"{self.name}: the program runs on {program.buffers} buffers, "
                f"{len(buffers)} were given"
            )
        sizes = [self._extent_of(b) for b in buffers]
        offsets = (ctypes.c_uint64 * len(buffers))(*buffers)
        extents = (ctypes.c_uint64 * len(buffers))(*sizes)
        with self._lock:
            fault, self._fault_next = self._fault_next, None
            hang, self._hang_next = self._hang_next, False
        if fault is None:
            fault = self._fault_every
        if hang or self._hang_always:

            def stuck() -> None:
                self._released.wait()
                raise DeviceError(f"{self._gone}: the run never completed (a hang was injected)")

            return self._submit(stuck)

        def work() -> None:
            self._call(
                self._lib.snpu_execute,
                handle,
                program.handle,
                offsets,
                extents,
                len(buffers),
                -1 if fault is None else fault,
            )

        return self._submit(work)

    # ------------------------------------------------------------ what tests and reports read

    def counters(self) -> dict[str, int]:
        """What the C core counted since the device was made (the README's cycle model).

        * ``instructions``: executed; ``runs``: programs run to the end;
        * busy cycles, added per instruction executed: ``load_cycles`` (the load
          module: LOAD into INP or WGT), ``compute_cycles`` (the compute module:
          GEMM, ALU and LOAD into ACC), of which ``gemm_cycles`` and ``alu_cycles``,
          and ``store_cycles``;
        * ``cycles``: the sum over completed runs of each run's total, its modules
          overlapping (what :func:`umahub_simnpu_runtime.timing` says of the
          program); ``last_cycles``: the last completed run's;
        * ``macs``: int8 multiply-accumulates.
        """
        self._drain()
        counters = native.Counters()
        self._lib.snpu_counters_get(self._alive(), ctypes.byref(counters))
        return counters.to_dict()

    @property
    def free_bytes(self) -> int:
        """DRAM not allocated."""
        return self._memory.free_bytes

    def _drain(self) -> None:
        """Wait until the queue's work so far is done."""
        self._submit(lambda: None).wait(60)

    # ------------------------------------------------------------ test aids

    def inject_fault(self, after_instructions: int | None = None, hang: bool = False) -> None:
        """Test aid: make the next run fault before instruction ``after_instructions``
        (a DeviceError ``fault at instruction N``), or, with ``hang``, never complete
        (until :meth:`lose` or :meth:`close`). One run each."""
        with self._lock:
            if after_instructions is not None:
                self._fault_next = int(after_instructions)
            self._hang_next = self._hang_next or hang

    def lose(self) -> None:
        """Test aid: the device goes away; every later call raises ``simnpu:<i> is gone``
        and queued work fails with it."""
        self._gone = f"{self.name} is gone"
        self._released.set()

    def close(self) -> None:
        """Stop the worker and free the C device (the instance can no longer be used)."""
        if self._handle is None:
            return
        if not self._gone:
            self._gone = f"{self.name} is closed"
        self._released.set()
        self._work.put(None)
        self._worker.join(timeout=5)
        if self._worker.is_alive():
            return  # a stuck worker still holds the device: leave it to the process's exit
        with self._lock:
            programs, self._programs = list(self._programs.values()), {}
        for program in programs:
            self._lib.snpu_unload(program.handle)
        self._lib.snpu_destroy(self._handle)
        self._handle = None

    def __repr__(self) -> str:
        return f"<SimNpuDevice {self.name}, {self.dram_bytes} bytes of DRAM>"


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        return int(value, 0)
    except ValueError:
        raise DeviceError(f"{name}={value!r} is not an integer") from None


class SimNpuRuntime(DeviceRuntime):
    """The simnpu's runtime, entry point ``simnpu`` of group ``umahub.runtimes``.

    Args:
        instances: how many instances exist (``UMAHUB_SIMNPU_INSTANCES``, else 4).
        dram_bytes: DRAM of each (``UMAHUB_SIMNPU_DRAM``, else 256 MiB).
    """

    name = "simnpu"

    def __init__(self, instances: int | None = None, dram_bytes: int | None = None):
        self.instances = (
            instances if instances is not None else _env_int("UMAHUB_SIMNPU_INSTANCES", INSTANCES)
        )
        self.dram_bytes = (
            dram_bytes if dram_bytes is not None else _env_int("UMAHUB_SIMNPU_DRAM", DRAM_BYTES)
        )

    def open(self, instance: int) -> SimNpuDevice:
        """A new device for ``instance`` (faults from :data:`FAULT_ENV` applied).

        Raises:
            DeviceError: no such instance, or the simulator cannot be built or made.
        """
        if isinstance(instance, bool) or not isinstance(instance, int):
            raise DeviceError(f"simnpu: instance {instance!r} is not a number")
        if not 0 <= instance < self.instances:
            raise DeviceError(
                f"simnpu: no instance {instance}; there are {self.instances} "
                "(UMAHUB_SIMNPU_INSTANCES)"
            )
        faults = parse_faults(os.environ.get(FAULT_ENV, ""), instance)
        return SimNpuDevice(instance, self.dram_bytes, faults=faults)

    def describe(self) -> dict[str, Any]:
        """Version, format (the version written by default, and those read), instances and
        each one's memories."""
        from umahub_simnpu_runtime import __version__

        return {
            "version": __version__,
            "format_version": isa.VERSION,
            "format_versions": list(isa.VERSIONS),
            "instances": self.instances,
            "dram_bytes": self.dram_bytes,
            "inp_bytes": isa.INP_BYTES,
            "wgt_bytes": isa.WGT_BYTES,
            "acc_words": isa.ACC_WORDS,
        }
