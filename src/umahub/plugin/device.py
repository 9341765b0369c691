"""The runtime side of the contract: a device with memory of its own, and its runtime.

An accelerator whose device the host cannot reach into (its own DRAM, its own
command stream, a compiled program format: most NPUs, every discrete
accelerator) has two halves, shipped as two packages:

* the **compiler plugin** (entry point group ``umahub.plugins``) declares
  ``Accelerator(name, runtime="my_npu", runtime_package="my-npu-runtime")``
  and its ``umahub_codegen`` returns a :class:`DeviceProgram`, an opaque
  compiled program, instead of host code;
* the **runtime** (entry point group ``umahub.runtimes``, the name given as
  ``runtime=``), in a package that needs neither TVM's compiler nor the
  compiler plugin: what a board installs next to umahub. It subclasses
  :class:`DeviceRuntime`, whose :meth:`~DeviceRuntime.open` gives one
  :class:`Device` per instance.

What umahub does with them (see :mod:`umahub.runtime.devices`):

* at export, each program goes into the library with the weights its
  partition reads (the partition's constant inputs);
* at load, umahub finds the runtime by name (a library whose runtime is not
  installed fails to load with one line naming the package), opens each
  instance once per process, :meth:`~Device.load`\\ s each program once and
  writes its weights to device buffers once;
* at every call of a partition, it writes the partition's other inputs to
  device buffers, :meth:`~Device.execute`\\ s the program on all of its buffers
  (inputs in the partition's order, then its outputs), waits for the
  completion (with a time limit) and reads the outputs back. Calls to one
  instance are serialised (one queue per instance); instances run side by side.

The memory is the delegate's: tensors cross between the host and the device
only at a partition's boundaries, through :meth:`~Device.write` and
:meth:`~Device.read`, and the report counts each crossing as a copy. A
buffer is an opaque handle that umahub never dereferences; asking a device
for a host pointer into its memory (:meth:`Device.host_pointer`) is refused.

Errors: a runtime raises :class:`DeviceError` (a program the device rejects, a
fault mid-run, a device that went away); umahub raises it again as an
``ExecutionError`` naming the accelerator, the instance and the partition.

This module imports neither TVM nor numpy: a runtime package on a board
imports it and nothing else of umahub.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "RUNTIME_ENTRY_POINTS",
    "Completion",
    "Device",
    "DeviceError",
    "DeviceProgram",
    "DeviceRuntime",
    "Pending",
    "ProgramTiming",
    "done",
]

#: The entry point group under which runtime packages declare their runtime.
RUNTIME_ENTRY_POINTS = "umahub.runtimes"


class DeviceError(Exception):
    """What a runtime raises when its device fails: it rejects a program, faults
    mid-run, runs out of memory or has gone away. The message says what happened
    in the device's terms; umahub adds the accelerator, instance and partition."""


def _span(span: Any, cycles: int) -> tuple[str, int, int]:
    """``span`` as ``(module, start, end)``, checked against the run's ``cycles``."""
    fields = tuple(span) if isinstance(span, (tuple, list)) else ()
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in fields[1:])
    if len(fields) != 3 or not isinstance(fields[0], str) or not ints:
        raise TypeError(f"ProgramTiming.spans holds (module, start, end) cycles, got {span!r}")
    module, start, end = fields
    if not 0 <= start <= end <= cycles:
        raise ValueError(
            f"ProgramTiming.spans needs 0 <= start <= end <= cycles ({cycles}), got {span!r}"
        )
    return module, start, end


@dataclass(frozen=True)
class ProgramTiming:
    """What one run of a device program takes, in the device's cycles: the vendor's
    cycle model (a simulator's, a performance model's), not a measurement.

    The report shows it per partition (in microseconds too, at the accelerator's
    ``clock_hz``), and draws ``spans`` as one lane per module of the device.

    Args:
        cycles: the whole run, with whatever overlap the device's modules allow.
        busy: busy cycles per module of the device (``{"load": ..., "compute": ...,
            "store": ...}``), in the order the lanes are drawn; each at most ``cycles``.
        spans: when each module was busy, ``(module, start, end)`` in cycles from
            the start of the run, ``0 <= start <= end <= cycles``, each module one
            that ``busy`` names; () = not given. umahub draws at most a few
            thousand of them (neighbouring spans of a module are merged to fit).
        notes: short facts about the program for the report (``"double-buffered:
            INP, WGT, ACC"``).

    Raises:
        TypeError: a field of the wrong type.
        ValueError: an impossible timing (negative cycles, a module busy longer
            than the run, a span past its end or of a module ``busy`` does not name),
            the message naming the field.
    """

    cycles: int
    busy: Mapping[str, int] = field(default_factory=dict)
    spans: Sequence[tuple[str, int, int]] = ()
    notes: Sequence[str] = ()

    def __post_init__(self) -> None:
        if isinstance(self.cycles, bool) or not isinstance(self.cycles, int):
            raise TypeError(f"ProgramTiming.cycles must be an int, got {self.cycles!r}")
        if self.cycles < 0:
            raise ValueError(f"ProgramTiming.cycles must be >= 0, got {self.cycles}")
        busy = dict(self.busy)
        for module, value in busy.items():
            if not isinstance(module, str) or isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(
                    f"ProgramTiming.busy maps module names to ints, got {module!r}: {value!r}"
                )
            if not 0 <= value <= self.cycles:
                raise ValueError(
                    f"ProgramTiming.busy[{module!r}] = {value} must be between 0 and the "
                    f"run's cycles ({self.cycles}): a module is busy at most the whole run"
                )
        object.__setattr__(self, "busy", busy)
        spans = [_span(span, self.cycles) for span in self.spans]
        for module in dict.fromkeys(m for m, _, _ in spans):
            if module not in busy:
                named = ", ".join(map(repr, busy)) or "nothing"
                raise ValueError(
                    f"ProgramTiming.spans has a span of module {module!r}, which busy does "
                    f"not name (busy names {named}): give its busy cycles too"
                )
        object.__setattr__(self, "spans", tuple(spans))
        object.__setattr__(self, "notes", tuple(str(n) for n in self.notes))

    @property
    def serial_cycles(self) -> int:
        """The cycles the run would take with no overlap: every module's busy cycles added."""
        return sum(self.busy.values())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (spans left out: the picture draws them)."""
        return {"cycles": self.cycles, "busy": dict(self.busy), "notes": list(self.notes)}


@dataclass(frozen=True)
class DeviceProgram:
    """A partition compiled for a device: what a device accelerator's ``umahub_codegen``
    returns, and what its runtime's :meth:`Device.load` is given back at load time.

    ``data`` is the program, opaque to umahub (an instruction stream, a vendor
    compiler's binary), carried in the exported library as it is; ``metadata``
    is what the runtime needs to call it, as JSON values (str, int, float,
    bool, None, lists and dicts of them), for example the format's version or
    the sizes of its scratch memory. ``timing``: what one run takes by the
    vendor's cycle model, when the compiler knows it (:class:`ProgramTiming`),
    shown in the report; not carried to the runtime.
    """

    data: bytes
    metadata: Mapping[str, Any] = field(default_factory=dict)
    timing: ProgramTiming | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.data, (bytes, bytearray, memoryview)):
            raise TypeError(f"DeviceProgram.data must be bytes, got {type(self.data).__name__}")
        object.__setattr__(self, "data", bytes(self.data))
        if not isinstance(self.metadata, Mapping):
            raise TypeError(
                f"DeviceProgram.metadata must be a mapping, got {type(self.metadata).__name__}"
            )
        object.__setattr__(self, "metadata", dict(self.metadata))
        if self.timing is not None and not isinstance(self.timing, ProgramTiming):
            raise TypeError(
                f"DeviceProgram.timing must be a ProgramTiming or None, got "
                f"{type(self.timing).__name__}"
            )


class Completion:
    """Something the host can wait on: a transfer or a program run.

    A runtime that works synchronously returns :func:`done`; one whose device
    works asynchronously returns a :class:`Pending` and finishes it when the
    device signals completion.
    """

    def wait(self, timeout: float | None = None) -> None:
        """Return once the work is complete.

        Raises:
            DeviceError: the work failed (the runtime's message).
            TimeoutError: it did not complete within ``timeout`` seconds.
        """


class _Done(Completion):
    def __repr__(self) -> str:
        return "done()"


_DONE = _Done()


def done() -> Completion:
    """The completion of work that is already complete (a synchronous runtime's)."""
    return _DONE


class Pending(Completion):
    """A completion finished later, from any thread, by :meth:`finish` (once)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._error: BaseException | None = None

    def finish(self, error: BaseException | None = None) -> None:
        """Mark the work complete, or failed with ``error`` (a :class:`DeviceError`)."""
        self._error = error
        self._event.set()

    @property
    def finished(self) -> bool:
        """Whether :meth:`finish` has been called."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> None:
        """See :meth:`Completion.wait`."""
        if not self._event.wait(timeout):
            raise TimeoutError(f"not complete after {timeout} s")
        if self._error is not None:
            raise self._error


class Device(ABC):
    """One instance of a device, as its runtime drives it.

    Buffers and loaded programs are opaque handles of the runtime's choosing
    (an offset into device memory, a driver's handle); umahub only passes them
    back. umahub calls one device from one thread at a time; a device shared
    with other users guards itself.
    """

    #: The instance (``accelerator:instance``) this device is; set by the runtime.
    instance: int = 0

    @abstractmethod
    def allocate(self, nbytes: int) -> Any:
        """A buffer of ``nbytes`` bytes in device memory.

        Raises:
            DeviceError: out of device memory (say how much is free).
        """

    @abstractmethod
    def free(self, buffer: Any) -> None:
        """Give back a buffer from :meth:`allocate`."""

    @abstractmethod
    def write(self, buffer: Any, data: memoryview) -> Completion:
        """Copy ``data`` (host bytes, C-contiguous) to the start of ``buffer``.

        The host may reuse ``data`` only after the completion."""

    @abstractmethod
    def read(self, buffer: Any, out: memoryview) -> Completion:
        """Copy ``len(out)`` bytes from the start of ``buffer`` into ``out`` (writable host
        memory), complete when the completion is."""

    @abstractmethod
    def load(self, program: DeviceProgram) -> Any:
        """Load a program (checked, and kept on the device) for any number of runs.

        Raises:
            DeviceError: the device rejects the program (say why).
        """

    @abstractmethod
    def execute(self, program: Any, buffers: Sequence[Any]) -> Completion:
        """Run a loaded program on its buffers: the partition's inputs in order (its
        weights among them, written once at load), then its outputs."""

    def unload(self, program: Any) -> None:  # noqa: B027 (optional: nothing to do by default)
        """Forget a loaded program (optional)."""

    def host_pointer(self, buffer: Any) -> int:
        """The host address of a buffer: refused, device memory is the device's own.

        A runtime whose memory the host maps may override it; umahub never calls it.

        Raises:
            DeviceError: always, by default.
        """
        raise DeviceError(
            f"{type(self).__name__}: device memory is not addressable by the host; "
            "move data with write() and read()"
        )

    def close(self) -> None:  # noqa: B027 (optional: nothing to do by default)
        """Release the instance (optional); called when the process is done with it."""


class DeviceRuntime(ABC):
    """A device's runtime, found by umahub through the ``umahub.runtimes`` entry point.

    The entry point names a subclass (made with no arguments) or an instance;
    its name is the runtime's :attr:`name`, which the compiler plugin's
    ``Accelerator(runtime=...)`` gives::

        [project.entry-points."umahub.runtimes"]
        my_npu = "my_npu_runtime:MyNpuRuntime"
    """

    #: The runtime's name: the entry point's name and ``Accelerator.runtime``.
    name: str = ""

    @abstractmethod
    def open(self, instance: int) -> Device:
        """The device of instance ``instance`` (0, 1, ...), ready to allocate and load.

        Called once per instance per process; umahub keeps the device.

        Raises:
            DeviceError: no such instance, or the device cannot be opened.
        """

    def describe(self) -> Mapping[str, Any]:
        """What the runtime reports about itself (a version, the devices found): JSON values."""
        return {}
