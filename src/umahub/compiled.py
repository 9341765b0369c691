"""The compiled model: run it, export it as one shared library, load it back.

An exported library is an ordinary TVM shared library (``tvm.runtime.load_module``
opens it) with a small JSON trailer appended after the ELF image, which
``dlopen`` ignores: the device list and the inputs' shapes, so that
:func:`load` can run the model in a new process without the plugins.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from umahub.errors import UmahubError

__all__ = ["Compiled", "LoadedModel", "load"]

_MAGIC = b"UMAHUBMETA1"


def _append_metadata(path: str, meta: dict[str, Any]) -> None:
    payload = json.dumps(meta).encode()
    with open(path, "ab") as f:
        f.write(payload + len(payload).to_bytes(8, "little") + _MAGIC)


def _read_metadata(path: str) -> dict[str, Any] | None:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        tail = len(_MAGIC) + 8
        if size < tail:
            return None
        f.seek(size - tail)
        trailer = f.read(tail)
        if not trailer.endswith(_MAGIC):
            return None
        length = int.from_bytes(trailer[:8], "little")
        f.seek(size - tail - length)
        return json.loads(f.read(length))


class _Runner:
    """A Relax VM over a loaded library, with numpy in and out.

    Weights that partitions read on accelerators are extra parameters of
    ``main`` (see :func:`umahub.build.place_on_devices`): they are copied to
    their devices once, here, not at every inference.
    """

    def __init__(self, library: Any, devices: int, weight_devices: Sequence[int] = ()):
        import tvm
        from tvm import relax

        self.devices = [tvm.cpu(i) for i in range(devices)]
        self.vm = relax.VirtualMachine(library, self.devices)
        self._main = self.vm["main"]
        self.weights: list[Any] = []
        if weight_devices:
            values = self.vm["umahub_weights"]()
            self.weights = [values[i].copyto(self.devices[d]) for i, d in enumerate(weight_devices)]

    def __call__(self, *arrays: Any) -> Any:
        import tvm

        args = [tvm.runtime.tensor(np.ascontiguousarray(a), self.devices[0]) for a in arrays]
        return _to_numpy(self._main(*args, *self.weights))


def _to_numpy(value: Any) -> Any:
    if hasattr(value, "numpy"):
        return value.numpy()
    if isinstance(value, (list, tuple)) or hasattr(value, "__len__"):
        return [_to_numpy(v) for v in value]
    return value


@dataclass
class LoadedModel:
    """A model loaded from an exported library: ``run`` it with numpy arrays."""

    path: str
    devices: list[str]
    input_info: list[tuple[tuple[int, ...], str]]
    _runner: _Runner = field(repr=False)

    def run(self, *arrays: Any) -> Any:
        """Run one inference; numpy in, numpy out (a list for several outputs)."""
        _check_inputs(self.input_info, arrays)
        return self._runner(*arrays)


def _check_inputs(info: Sequence[tuple[tuple[int, ...], str]], arrays: Sequence[Any]) -> None:
    if len(arrays) != len(info):
        raise UmahubError(f"the model takes {len(info)} input(s), got {len(arrays)}")
    for i, ((shape, dtype), a) in enumerate(zip(info, arrays)):
        a = np.asarray(a)
        if tuple(a.shape) != tuple(shape) or str(a.dtype) != dtype:
            raise UmahubError(
                f"input {i}: expected shape {tuple(shape)} {dtype}, got {tuple(a.shape)} {a.dtype}"
            )


def load(path: str | os.PathLike) -> LoadedModel:
    """Load a library written by :meth:`Compiled.export_library` (no plugins needed)."""
    import tvm

    path = str(path)
    meta = _read_metadata(path)
    if meta is None:
        raise UmahubError(f"{path} was not written by umahub (no umahub metadata at its end)")
    library = tvm.runtime.load_module(path)
    info = [(tuple(s), d) for s, d in meta["inputs"]]
    runner = _Runner(library, len(meta["devices"]), meta.get("weights", []))
    return LoadedModel(path, meta["devices"], info, runner)


class Compiled:
    """A model compiled by :meth:`umahub.Hub.compile`.

    Attributes:
        report: where every operator runs, what each hook did, copies, memory,
            and the time of each stage (:class:`umahub.report.Report`).
        devices: the virtual devices, index = runtime device index (0 = host).
        input_info: ``(shape, dtype)`` of each input.
    """

    def __init__(
        self,
        executable: Any,
        devices: list[str],
        input_info: list[tuple[tuple[int, ...], str]],
        export_options: list[str],
        report: Any,
        weight_devices: Sequence[int] = (),
    ):
        self.executable = executable
        self.weight_devices = list(weight_devices)
        self.devices = devices
        self.input_info = input_info
        self.export_options = export_options
        self.report = report
        self._runner: _Runner | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None

    def export_library(self, path: str | os.PathLike) -> Path:
        """Write one shared library that :func:`umahub.load` runs, without the plugins."""
        path = Path(path)
        self.executable.export_library(str(path), options=list(self.export_options))
        _append_metadata(
            str(path),
            {
                "devices": self.devices,
                "inputs": [[list(s), d] for s, d in self.input_info],
                "weights": self.weight_devices,
                "umahub": 1,
            },
        )
        return path

    def run(self, *arrays: Any) -> Any:
        """Run one inference; numpy in, numpy out (a list for several outputs).

        The first call exports the library to a temporary directory and loads
        it: C partitions are compiled then, exactly as in an export.
        """
        _check_inputs(self.input_info, arrays)
        if self._runner is None:
            import tvm

            self._tmp = tempfile.TemporaryDirectory(prefix="umahub-")
            lib_path = os.path.join(self._tmp.name, "model.so")
            self.executable.export_library(lib_path, options=list(self.export_options))
            self._runner = _Runner(
                tvm.runtime.load_module(lib_path), len(self.devices), self.weight_devices
            )
        return self._runner(*arrays)
