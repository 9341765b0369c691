"""The compiled model: run it, export it as one shared library, load it back.

An exported library is an ordinary TVM shared library (``tvm.runtime.load_module``
opens it) with a small JSON trailer appended after the ELF image, which
``dlopen`` ignores: the device list, the inputs' signatures and the SHA-256 of
the library's bytes, so that :func:`load` can run the model in a new process
without the plugins, and refuses a file that was truncated or changed before
the dynamic loader ever sees it (a damaged shared library can crash the process
or compute wrong numbers).

Running: :meth:`Compiled.run` and :meth:`LoadedModel.run` may be called from
any number of threads at once, on TVM's Relax VM or on the concurrent executor
(one worker per device); :mod:`umahub.runtime.running` says how one is chosen.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from umahub.errors import UmahubError, last_line
from umahub.runtime.running import Executors, InputInfo, Runner, Running
from umahub.targets import elf_machine, this_machine

__all__ = ["Compiled", "LoadedModel", "load", "open_library", "signature_of"]

_MAGIC = b"UMAHUBMETA2"
_TRAILER = len(_MAGIC) + 8
_FORMAT = 4
#: Formats :func:`load` reads: 3 adds the programs of partitions on devices of their own;
#: 4, the programs or not, has ``main`` in one memory (:func:`one_memory`).
_FORMATS = (2, 3, 4)


def one_memory(meta: dict[str, Any]) -> bool:
    """Whether a library's ``main`` runs all its devices on one runtime device (format 4
    on; see :func:`umahub.runtime.running.runtime_devices`)."""
    return int(meta["umahub"]) >= 4


def signature_of(main: Any) -> list[InputInfo]:
    """The inputs of a Relax ``main``: ``(shape, dtype)`` each, symbolic sizes by name."""
    from umahub._tvm import TensorType, type_of

    info: list[InputInfo] = []
    for param in main.params:
        ty = type_of(param)
        if not isinstance(ty, TensorType):
            info.append((None, ""))
            continue
        values = getattr(ty.shape, "values", None) if ty.shape is not None else None
        if values is None:
            info.append((None if ty.ndim < 0 else ("?",) * ty.ndim, str(ty.dtype)))
            continue
        dims = tuple(int(d.value) if hasattr(d, "value") else str(d) for d in values)
        info.append((dims, str(ty.dtype)))
    return info


def example_inputs(info: Sequence[InputInfo], seed: int = 0, size: int = 1) -> list[np.ndarray]:
    """Random inputs of the model's signature; symbolic sizes get ``size``.

    Raises:
        UmahubError: an input is not a tensor (a shape, a tuple): its values
            cannot be made up.
    """
    rng = np.random.default_rng(seed)
    arrays = []
    for i, (shape, dtype) in enumerate(info):
        if not dtype:
            raise UmahubError(
                f"input {i} is not a tensor: random inputs cannot be made for it; give the "
                "inputs (umahub run --inputs x.npz)"
            )
        dims = [d if isinstance(d, int) else size for d in (shape or ())]
        if dtype == "bool":
            arrays.append(rng.integers(0, 2, dims).astype(bool))
        elif np.issubdtype(np.dtype(dtype), np.integer):
            arrays.append(rng.integers(0, 4, dims).astype(dtype))
        else:
            arrays.append(rng.standard_normal(dims).astype(dtype))
    return arrays


def open_library(path: str | os.PathLike) -> Any:
    """The TVM module of a shared library, open for as long as the module is referenced.

    ``tvm.runtime.load_module`` keeps every library it opens in a static of
    libtvm_ffi's until the process exits (and with it the model's weights). A
    library that has run holds the functions its device calls were bound to
    (Python callables, :func:`umahub.runtime.devices.bind`), and tvm-ffi 0.1.12
    (apache-tvm 0.25) releasing one from that static, after Python is finalized,
    crashes the exiting process. Held by the model that runs it, the library is
    released with the model, while Python still runs.
    """
    import tvm  # noqa: F401  # TVM's runtime: the loaders of the modules a library holds
    import tvm_ffi

    return tvm_ffi.load_module(os.path.realpath(path), keep_module_alive=False)


def _runs_from_memory(executable: Any) -> bool:
    """Whether TVM runs ``executable`` from memory: no module of its import tree is C
    source or a static library. Otherwise TVM's VM exports and loads it itself
    (``Executable.jit``), through ``tvm.runtime.load_module``: see :func:`open_library`."""
    stack = [executable.mod]
    while stack:
        module = stack.pop()
        if module.kind in ("c", "static_library"):
            return False
        stack.extend(module.imports)
    return True


def _append_metadata(path: str, meta: dict[str, Any], device_calls: Sequence[Any] = ()) -> None:
    """Append the trailer: the device programs' blob (when there are any), then the JSON
    and its length; the hash covers everything before the JSON."""
    if device_calls:
        from umahub.runtime.device_library import to_library

        blob, entries = to_library(device_calls)
        with open(path, "rb") as f:
            start = len(f.read())
        with open(path, "ab") as f:
            f.write(blob)
        meta = {**meta, "device": {"at": start, "size": len(blob), "calls": entries}}
    with open(path, "rb") as f:
        meta = {**meta, "sha256": hashlib.sha256(f.read()).hexdigest()}
    payload = json.dumps(meta).encode()
    with open(path, "ab") as f:
        f.write(payload + len(payload).to_bytes(8, "little") + _MAGIC)


def _device_calls(path: str, meta: dict[str, Any]) -> list[Any]:
    """The device calls a library carries (none without the trailer's ``device``).

    Raises:
        UmahubError: they do not fit the library (damaged).
    """
    device = meta.get("device")
    if not device:
        return []
    from umahub.runtime.device_library import from_library

    try:
        with open(path, "rb") as f:
            f.seek(int(device["at"]))
            blob = f.read(int(device["size"]))
        return from_library(device["calls"], blob)
    except (KeyError, TypeError, ValueError) as exc:
        raise UmahubError(
            f"{path} is damaged (its device programs: {exc}); export it again with "
            "Compiled.export_library or `umahub compile`"
        ) from exc


def _read_metadata(path: str) -> dict[str, Any]:
    """The trailer of an exported library, checked against the library's bytes.

    Raises:
        UmahubError: not a umahub library, or a damaged one.
    """
    damaged = (
        f"{path} is damaged ({{}}); export it again with Compiled.export_library "
        "or `umahub compile`"
    )
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < _TRAILER or not data.endswith(_MAGIC):
        if b"UMAHUBMETA" in data[-_TRAILER - 4 :]:
            raise UmahubError(f"{path} was written by an older umahub; export it again")
        raise UmahubError(
            f"{path} was not written by umahub (no umahub metadata at its end; a library "
            "cut short loses it too)"
        )
    length = int.from_bytes(data[-_TRAILER : -len(_MAGIC)], "little")
    if length > len(data) - _TRAILER:
        raise UmahubError(damaged.format("its trailer is cut"))
    end = len(data) - _TRAILER - length
    try:
        meta = json.loads(data[end : len(data) - _TRAILER])
        ok = (
            meta.get("umahub") in _FORMATS
            and isinstance(meta.get("sha256"), str)
            and isinstance(meta.get("devices"), list)
            and isinstance(meta.get("inputs"), list)
            and isinstance(meta.get("weights", []), list)
        )
    except (ValueError, AttributeError):
        ok = False
    if not ok:
        raise UmahubError(damaged.format("its trailer is not umahub's"))
    if hashlib.sha256(data[:end]).hexdigest() != meta["sha256"]:
        raise UmahubError(damaged.format("its bytes differ from those written at export"))
    return meta


@dataclass
class LoadedModel(Running):
    """A model loaded from an exported library: ``run`` it with numpy arrays (thread-safe)."""

    path: str
    devices: list[str]
    input_info: list[InputInfo]
    _runner: Runner = field(repr=False)

    def __post_init__(self) -> None:
        self._executors = Executors(self._runner, self.devices)


def _input_info(raw: list) -> list[InputInfo]:
    return [(None if s is None else tuple(s), d) for s, d in raw]


def load(path: str | os.PathLike) -> LoadedModel:
    """Load a library written by :meth:`Compiled.export_library` (no plugins needed).

    Raises:
        UmahubError: no such file, not umahub's, damaged, or built for another
            architecture (checked before the library is opened).
    """
    path = str(path)
    if not os.path.isfile(path):
        raise UmahubError(f"{path}: no such file")
    meta = _read_metadata(path)
    built_for, here = elf_machine(path), this_machine()
    if built_for and built_for != here:
        raise UmahubError(
            f"{path} is built for {built_for}, not for this machine ({here}); run it on such "
            f"a board: umahub run {path} --rpc HOST:PORT --key KEY (or --rpc-server HOST:PORT)"
        )
    calls = _device_calls(path, meta)
    try:
        library = open_library(path)
        runner = Runner(
            library, len(meta["devices"]), meta.get("weights", []), calls, path, one_memory(meta)
        )
    except UmahubError:  # a device runtime not installed, a device that refused: said already
        raise
    except Exception as exc:
        raise UmahubError(f"{path} cannot be loaded: {last_line(exc)}") from exc
    return LoadedModel(path, meta["devices"], _input_info(meta["inputs"]), runner)


class _NotHere:
    """The executors of a model built for another machine: every use is one clear error."""

    def __init__(self, why: str):
        self.why = why
        self.executor = "auto"

    def __getattr__(self, name: str) -> Any:
        raise UmahubError(self.why)


class Compiled(Running):
    """A model compiled by :meth:`umahub.Hub.compile`; ``run`` is thread-safe.

    Attributes:
        report: where every operator runs, what each hook did, copies, memory,
            and the time of each stage (:class:`umahub.report.report.Report`).
        devices: the virtual devices, index = runtime device index (0 = host).
        input_info: ``(shape, dtype)`` of each input; a symbolic size is a
            string (its name).
        executor: how :meth:`run` runs it unless told (``"auto"``, ``"vm"``,
            ``"concurrent"``; see :mod:`umahub.runtime.running`); :meth:`stream` keeps
            several inferences in flight, :meth:`profile` times both executors.
        target: the :class:`umahub.targets.BuildTarget` it was built for (None:
            this machine). Built for another architecture, it cannot run here:
            :meth:`run` says so; export it and run it on a board.
    """

    def __init__(
        self,
        executable: Any,
        devices: list[str],
        input_info: list[InputInfo],
        export_options: list[str],
        report: Any,
        weight_devices: Sequence[int] = (),
        needs_export: bool = False,
        target: Any = None,
        device_calls: Sequence[Any] = (),
    ):
        self.executable = executable
        self.device_calls = list(device_calls)
        self.target = target
        self.weight_devices = list(weight_devices)
        self.devices = devices
        self.input_info = input_info
        self.export_options = export_options
        self.report = report
        self._tmp: tempfile.TemporaryDirectory | None = None
        if target is not None and not target.native:  # built for a board: nothing to load here
            self._executors = _NotHere(target.not_here())  # type: ignore[assignment]
            return
        try:
            self._runner = self._load(needs_export)
        except UmahubError as exc:
            if not self.device_calls:
                raise
            # a device runtime that is not installed here: the model still exports
            self._executors = _NotHere(f"{exc} (export_library works without it)")  # type: ignore[assignment]
            return
        self._executors = Executors(self._runner, devices)

    def _load(self, needs_export: bool) -> Runner:
        """The runner, made when the model is compiled (not at its first run).

        C partitions are compiled and linked by an export, exactly as
        :meth:`export_library` does; a model with none runs from memory.
        """
        library = self.executable
        if needs_export or not _runs_from_memory(self.executable):
            self._tmp = tempfile.TemporaryDirectory(prefix="umahub-")
            lib_path = os.path.join(self._tmp.name, "model.so")
            self.executable.export_library(lib_path, **self._export_arguments())
            library = open_library(lib_path)
        return Runner(library, len(self.devices), self.weight_devices, self.device_calls)

    def _export_arguments(self) -> dict[str, Any]:
        """What TVM's ``export_library`` is given: the options, and a cross build's compiler."""
        arguments: dict[str, Any] = {"options": list(self.export_options)}
        if self.target is not None and self.target.cc:
            arguments["cc"] = self.target.cc  # TVM's create_shared compiles and links with it
        return arguments

    def export_library(self, path: str | os.PathLike) -> Path:
        """Write one shared library that :func:`umahub.load` runs, without the plugins.

        A model built for another machine (``compile(target=..., cc=...)``) is
        compiled and linked by its ``cc``; run the library on such a board
        (``umahub run model.so --rpc ...``).
        """
        path = Path(path)
        self.executable.export_library(str(path), **self._export_arguments())
        _append_metadata(
            str(path),
            {
                "devices": self.devices,
                "inputs": [[None if s is None else list(s), d] for s, d in self.input_info],
                "weights": self.weight_devices,
                "umahub": _FORMAT,
            },
            self.device_calls,
        )
        return path

    def run(self, *arrays: Any, executor: str | None = None, timeout: float | None = None) -> Any:
        """:meth:`LoadedModel.run`; a model built for another machine is an error saying
        where to run it."""
        self._here()
        return super().run(*arrays, executor=executor, timeout=timeout)

    def _here(self) -> None:
        if isinstance(self._executors, _NotHere):
            raise UmahubError(self._executors.why)

    def profile(
        self, *arrays: Any, runs: int = 5, trace: str | os.PathLike | None = None
    ) -> dict[str, Any]:
        """:meth:`LoadedModel.profile`, also kept in ``report.measured`` (JSON, picture)."""
        self._here()
        return super().profile(*arrays, runs=runs, trace=trace)

    def _keep_measured(self, measured: dict[str, Any]) -> None:
        if self.report is not None:
            self.report.measured = measured

    def _trace_name(self) -> str:
        return str(getattr(self.report, "model", "") or "")

    def profile_into_report(self, runs: int = 5) -> None:
        """Profile on random inputs of the model's signature (``[tool.umahub] profile``);
        a model that cannot run on them gets a note instead."""
        try:
            self.profile(*example_inputs(self.input_info), runs=runs)
        except UmahubError as exc:
            self.report.notes.append(f"profile: not measured: {exc}")
