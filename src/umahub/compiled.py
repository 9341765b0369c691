"""The compiled model: run it, export it as one shared library, load it back.

An exported library is an ordinary TVM shared library (``tvm.runtime.load_module``
opens it) with a small JSON trailer appended after the ELF image, which
``dlopen`` ignores: the device list, the inputs' signatures and the SHA-256 of
the library's bytes, so that :func:`load` can run the model in a new process
without the plugins, and refuses a file that was truncated or changed before
the dynamic loader ever sees it (a damaged shared library can crash the process
or compute wrong numbers).

Threads: :meth:`Compiled.run` and :meth:`LoadedModel.run` may be called from
any number of threads at once. The library and the weights on the devices are
shared; each thread gets a Relax VM of its own (a VM keeps per-call state in
its registers, so one VM must not run two calls at once).

Executors: ``"vm"`` runs ``main`` on TVM's Relax VM, one step after the other;
``"concurrent"`` runs the model's step graph (:mod:`umahub.steps`, carried by
the library) with a worker per device (:mod:`umahub.executor`); ``"auto"``
(the default) is the concurrent one when the model has a step graph (it runs
on more than one device) and the VM otherwise.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from umahub.errors import UmahubError, last_line

__all__ = ["EXECUTORS", "Compiled", "LoadedModel", "load", "signature_of"]

#: The executors a model runs on (see the module's docs).
EXECUTORS = ("auto", "vm", "concurrent")

_MAGIC = b"UMAHUBMETA2"
_TRAILER = len(_MAGIC) + 8
_FORMAT = 2

# One input: its shape (a dimension is an int, or the name of a size known only
# at run time; None: any rank) and its dtype.
InputInfo = tuple[tuple[int | str, ...] | None, str]


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


def _check_inputs(info: Sequence[InputInfo], arrays: Sequence[Any]) -> None:
    """Refuse inputs of the wrong number, rank, static size or dtype.

    A symbolic size (``"n"``) takes any value, the same one wherever it appears.
    """
    if len(arrays) != len(info):
        raise UmahubError(f"the model takes {len(info)} input(s), got {len(arrays)}")
    bound: dict[str, int] = {}
    for i, ((shape, dtype), a) in enumerate(zip(info, arrays)):
        if not dtype:
            continue
        a = np.asarray(a)
        ok = str(a.dtype) == dtype and (shape is None or a.ndim == len(shape))
        for want, got in zip(shape or (), a.shape):
            if isinstance(want, int):
                ok = ok and want == got
            elif want != "?":
                ok = ok and bound.setdefault(want, got) == got
        if not ok:
            shown = "any shape" if shape is None else f"shape {tuple(shape)}"
            raise UmahubError(
                f"input {i}: expected {shown} {dtype}, got {tuple(a.shape)} {a.dtype}"
                + (f" (sizes so far: {bound})" if bound else "")
            )


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


def _append_metadata(path: str, meta: dict[str, Any]) -> None:
    with open(path, "rb") as f:
        meta = {**meta, "sha256": hashlib.sha256(f.read()).hexdigest()}
    payload = json.dumps(meta).encode()
    with open(path, "ab") as f:
        f.write(payload + len(payload).to_bytes(8, "little") + _MAGIC)


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
            meta.get("umahub") == _FORMAT
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


class _Runner:
    """Relax VMs over one loaded library, with numpy in and out; one VM per thread.

    Weights that partitions read on accelerators are extra parameters of
    ``main`` (see :func:`umahub.build.place_on_devices`): they are copied to
    their devices once, here, not at every inference, and shared by all VMs.
    """

    def __init__(self, library: Any, devices: int, weight_devices: Sequence[int] = ()):
        import tvm

        self.library = library
        self.devices = [tvm.cpu(i) for i in range(devices)]
        self._local = threading.local()
        self.weights: list[Any] = []
        if weight_devices:
            values = self._vm()["umahub_weights"]()
            self.weights = [values[i].copyto(self.devices[d]) for i, d in enumerate(weight_devices)]

    def _vm(self) -> Any:
        vm = getattr(self._local, "vm", None)
        if vm is None:
            from tvm import relax

            vm = self._local.vm = relax.VirtualMachine(self.library, self.devices)
            self._local.main = vm["main"]
        return vm

    def tensors(self, arrays: Sequence[Any]) -> list[Any]:
        """The inputs as TVM tensors on the host."""
        import tvm

        # np.require keeps 0-d arrays 0-d (np.ascontiguousarray makes them 1-d).
        host = self.devices[0]
        return [tvm.runtime.tensor(np.require(a, requirements="C"), host) for a in arrays]

    def __call__(self, *arrays: Any) -> Any:
        self._vm()
        return _to_numpy(self._local.main(*self.tensors(arrays), *self.weights))


class _Executors:
    """The executors of one loaded library: the VM runner, and the concurrent
    executor, made at its first use from the step graph the library carries."""

    def __init__(self, runner: _Runner, devices: Sequence[str], executor: str = "auto"):
        self.runner, self.devices = runner, list(devices)
        self.executor = _choice(executor)
        self._graph: Any = None
        self._concurrent: Any = None
        self._lock = threading.Lock()

    @property
    def graph(self) -> Any:
        """The library's :class:`umahub.steps.StepGraph` (``unsupported`` says why not)."""
        if self._graph is None:
            from umahub.steps import StepGraph, read_graph

            if len(self.devices) < 2:
                self._graph = StepGraph(tuple(self.devices), unsupported="one device only")
            else:
                self._graph = read_graph(self.runner._vm(), self.devices)
        return self._graph

    def resolve(self, executor: str | None) -> str:
        """``"vm"`` or ``"concurrent"``, for the requested (or the default) executor."""
        choice = _choice(executor or self.executor)
        if choice == "auto":
            return "vm" if self.graph.unsupported else "concurrent"
        if choice == "concurrent" and self.graph.unsupported:
            raise UmahubError(
                f"the concurrent executor cannot run this model: {self.graph.unsupported}; "
                'use executor="vm"'
            )
        return choice

    def concurrent(self) -> Any:
        """The concurrent executor (made once)."""
        with self._lock:
            if self._concurrent is None:
                from umahub.executor import Executor

                self._concurrent = Executor(self.runner.library, self.graph, self.runner.weights)
            return self._concurrent

    def run(self, arrays: Sequence[Any], executor: str | None, timeout: float | None) -> Any:
        if self.resolve(executor) == "vm":
            return self.runner(*arrays)
        return _to_numpy(self.concurrent().run(self.runner.tensors(arrays), timeout))

    def stream(
        self, batches: Iterable[Any], info: Sequence[InputInfo], executor: str | None,
        depth: int | None,
    ) -> Iterator[Any]:  # fmt: skip
        def checked() -> Iterator[list[Any]]:
            for batch in batches:
                arrays = [batch] if isinstance(batch, np.ndarray) else list(batch)
                _check_inputs(info, arrays)
                yield arrays

        if self.resolve(executor) == "vm":
            for arrays in checked():
                yield self.runner(*arrays)
            return
        ex = self.concurrent()
        tensors = (self.runner.tensors(arrays) for arrays in checked())
        for inference in ex.stream(tensors, depth):
            yield _to_numpy(inference.result())

    def profile(self, arrays: Sequence[Any], runs: int) -> dict[str, Any]:
        """Time both executors on ``arrays``; the concurrent one's steps of its median run."""
        import time

        vm_times = []
        for _ in range(runs):
            start = time.perf_counter()
            self.runner(*arrays)
            vm_times.append(time.perf_counter() - start)
        result: dict[str, Any] = {"runs": runs, "vm_seconds": float(np.median(vm_times))}
        if self.graph.unsupported:
            return {**result, "executor": "vm", "why": self.graph.unsupported, "spans": []}
        ex = self.concurrent()
        tensors = self.runner.tensors(arrays)
        done = []
        for _ in range(runs):
            inference = ex.submit(tensors, profile=True)
            inference.result()
            done.append(inference)
        done.sort(key=lambda i: i.seconds)
        median = done[len(done) // 2]
        return {
            **result,
            "executor": "concurrent",
            "concurrent_seconds": median.seconds,
            "lanes": {lane: ex.cores[lane] for lane in ex.lanes},
            "spans": [m.to_dict() for m in sorted(median.spans, key=lambda m: m.start)],
        }


def _choice(executor: str) -> str:
    if executor not in EXECUTORS:
        from umahub.errors import did_you_mean

        raise UmahubError(
            f"unknown executor {executor!r}{did_you_mean(str(executor), EXECUTORS)}; "
            f"known: {', '.join(EXECUTORS)}"
        )
    return executor


def _to_numpy(value: Any) -> Any:
    """A VM result in numpy: a tensor as an array, a shape (``R.shape``) as an int64
    array, a tuple as a list."""
    if hasattr(value, "numpy"):
        return value.numpy()
    if type(value).__name__ in ("Shape", "ShapeTuple"):
        return np.asarray(list(value), dtype="int64")
    if isinstance(value, (list, tuple)) or hasattr(value, "__len__"):
        return [_to_numpy(v) for v in value]
    return value


class _Running:
    """``run``, ``stream`` and ``profile``, shared by :class:`Compiled` and :class:`LoadedModel`."""

    input_info: list[InputInfo]
    _executors: _Executors

    @property
    def executor(self) -> str:
        """The default executor of :meth:`run`: ``"auto"``, ``"vm"`` or ``"concurrent"``."""
        return self._executors.executor

    @executor.setter
    def executor(self, value: str) -> None:
        self._executors.executor = _choice(value)

    @property
    def step_graph(self) -> Any:
        """The :class:`umahub.steps.StepGraph` the concurrent executor runs."""
        return self._executors.graph

    def run(self, *arrays: Any, executor: str | None = None, timeout: float | None = None) -> Any:
        """Run one inference; numpy in, numpy out (a list for several outputs).

        Args:
            executor: ``"vm"``, ``"concurrent"`` or ``"auto"``; default: :attr:`executor`.
            timeout: (concurrent) seconds to wait before giving up with an error.

        Raises:
            UmahubError: wrong inputs, an unknown executor, or the concurrent
                executor asked for a model it cannot run.
            umahub.executor.ExecutionError: a partition or copy failed (naming
                it and its device), or the timeout passed.
        """
        _check_inputs(self.input_info, arrays)
        return self._executors.run(arrays, executor, timeout)

    def stream(
        self, inputs: Iterable[Any], *, executor: str | None = None, depth: int | None = None
    ) -> Iterator[Any]:
        """Run a stream of inferences, several in flight at once; yield outputs in order.

        Each item of ``inputs`` is the list of a model's inputs (or one array
        for a model of one input). With the concurrent executor up to ``depth``
        inferences (default: one per worker) are in flight, so a stream moves
        through the devices like a pipeline; with the VM, one at a time.
        """
        return self._executors.stream(inputs, self.input_info, executor, depth)

    def profile(self, *arrays: Any, runs: int = 5) -> dict[str, Any]:
        """Run ``arrays`` ``runs`` times on each executor; the measured timeline.

        Returns:
            ``vm_seconds`` and ``concurrent_seconds`` (medians), ``lanes`` (the
            cores of each worker), and ``spans``: every step of the concurrent
            executor's median run (lane, start, end, label, kind; seconds from
            the start of the inference).
        """
        _check_inputs(self.input_info, arrays)
        return self._executors.profile(arrays, max(1, runs))


@dataclass
class LoadedModel(_Running):
    """A model loaded from an exported library: ``run`` it with numpy arrays (thread-safe)."""

    path: str
    devices: list[str]
    input_info: list[InputInfo]
    _runner: _Runner = field(repr=False)

    def __post_init__(self) -> None:
        self._executors = _Executors(self._runner, self.devices)


def _input_info(raw: list) -> list[InputInfo]:
    return [(None if s is None else tuple(s), d) for s, d in raw]


def load(path: str | os.PathLike) -> LoadedModel:
    """Load a library written by :meth:`Compiled.export_library` (no plugins needed).

    Raises:
        UmahubError: no such file, not umahub's, or damaged (checked before
            the library is opened).
    """
    import tvm

    path = str(path)
    if not os.path.isfile(path):
        raise UmahubError(f"{path}: no such file")
    meta = _read_metadata(path)
    try:
        library = tvm.runtime.load_module(path)
        runner = _Runner(library, len(meta["devices"]), meta.get("weights", []))
    except Exception as exc:
        raise UmahubError(f"{path} cannot be loaded: {last_line(exc)}") from exc
    return LoadedModel(path, meta["devices"], _input_info(meta["inputs"]), runner)


class Compiled(_Running):
    """A model compiled by :meth:`umahub.Hub.compile`; ``run`` is thread-safe.

    Attributes:
        report: where every operator runs, what each hook did, copies, memory,
            and the time of each stage (:class:`umahub.report.Report`).
        devices: the virtual devices, index = runtime device index (0 = host).
        input_info: ``(shape, dtype)`` of each input; a symbolic size is a
            string (its name).
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
    ):
        self.executable = executable
        self.weight_devices = list(weight_devices)
        self.devices = devices
        self.input_info = input_info
        self.export_options = export_options
        self.report = report
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._runner = self._load(needs_export)
        self._executors = _Executors(self._runner, devices)

    def _load(self, needs_export: bool) -> _Runner:
        """The runner, made when the model is compiled (not at its first run).

        C partitions are compiled and linked by an export, exactly as
        :meth:`export_library` does; a model with none runs from memory.
        """
        import tvm

        library = self.executable
        if needs_export:
            self._tmp = tempfile.TemporaryDirectory(prefix="umahub-")
            lib_path = os.path.join(self._tmp.name, "model.so")
            self.executable.export_library(lib_path, options=list(self.export_options))
            library = tvm.runtime.load_module(lib_path)
        return _Runner(library, len(self.devices), self.weight_devices)

    def export_library(self, path: str | os.PathLike) -> Path:
        """Write one shared library that :func:`umahub.load` runs, without the plugins."""
        path = Path(path)
        self.executable.export_library(str(path), options=list(self.export_options))
        _append_metadata(
            str(path),
            {
                "devices": self.devices,
                "inputs": [[None if s is None else list(s), d] for s, d in self.input_info],
                "weights": self.weight_devices,
                "umahub": _FORMAT,
            },
        )
        return path
