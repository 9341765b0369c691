"""How a loaded library runs: TVM's Relax VM or the concurrent executor, chosen per call.

:class:`Running` gives :class:`umahub.Compiled` and :class:`umahub.LoadedModel`
their ``run``, ``stream`` and ``profile``; :class:`Executors` holds the two
ways to run one library:

* ``"vm"``: ``main`` on TVM's Relax VM, one step after the other; one VM per
  calling thread (a VM keeps per-call state in its registers, so one VM must
  not run two calls at once), the library and the weights on the devices shared.
* ``"concurrent"``: the model's step graph (:mod:`umahub.runtime.steps`, carried by the
  library) with a worker per device (:mod:`umahub.runtime.executor`), made at its first use.
* ``"auto"`` (the default): the fastest way to run this model, timed on the
  first calls of ``run`` and checked while it runs
  (:mod:`umahub.runtime.choosing`): the VM on all its threads, the VM on one
  thread (beside a busy process), the concurrent executor (not for a library
  without a step graph: a model on one device). The concurrent executor pays
  for every step a handoff between threads, so a model of tiny kernels stays
  on the VM and a model whose devices can overlap long kernels goes
  concurrent. A stream under "auto" runs concurrently unless auto has chosen the VM.

:meth:`Executors.call_seconds` and :meth:`Executors.step_seconds` time what
each executor runs, call by call and step by step (placement by cost times
candidate groups with them).

Why this module is long: both executors, the choice between them and their
timing share one loaded library, its VMs and its weights; split up, each part
would reach into the others' state.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from umahub.config import EXECUTORS
from umahub.errors import UmahubError
from umahub.runtime.choosing import AUTO_TRIAL_CALLS, ExecutorChoice, compare
from umahub.runtime.executor import tensor_bytes
from umahub.runtime.threadpool import share_cores, spin_briefly, use_threads, vm_threads

__all__ = [
    "Executors",
    "InputInfo",
    "Runner",
    "Running",
    "check_inputs",
    "host_tensor",
    "runtime_devices",
    "to_numpy",
]

# One input: its shape (a dimension is an int, or the name of a size known only
# at run time; None: any rank) and its dtype.
InputInfo = tuple[tuple[int | str, ...] | None, str]


def check_inputs(info: Sequence[InputInfo], arrays: Sequence[Any]) -> None:
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


def runtime_devices(count: int, one_memory: bool = True) -> list[Any]:
    """The runtime device of each of a library's ``count`` virtual devices.

    ``one_memory`` (every library this umahub builds): all ``tvm.cpu(0)``, as
    its ``main`` reads every tensor where it was made
    (:mod:`umahub.compiler.one_memory`) and TVM's kernels take their tensors
    on one device. False, for a library exported before (formats 2 and 3),
    whose ``main`` copies between its devices: ``tvm.cpu(i)`` for device ``i``.
    """
    import tvm

    return [tvm.cpu(0 if one_memory else i) for i in range(count)]


class Runner:
    """Relax VMs over one loaded library, with numpy in and out; one VM per thread.

    Weights that partitions read on accelerators are extra parameters of
    ``main`` (see :func:`umahub.compiler.stages.build.place_on_devices`): they are copied to
    their devices once, here, not at every inference, and shared by all VMs.
    Partitions on devices of their own (``device_calls``) are made ready here,
    before any VM looks their functions up (:func:`umahub.runtime.devices.bind`).
    ``one_memory``: see :func:`runtime_devices`.
    """

    def __init__(
        self,
        library: Any,
        devices: int,
        weight_devices: Sequence[int] = (),
        device_calls: Sequence[Any] = (),
        needed_by: str = "",
        one_memory: bool = True,
    ):
        spin_briefly()  # umahub's spin count, for the models umahub runs (before a kernel runs)

        if device_calls:
            from umahub.runtime.devices import bind

            self.bound = bind(device_calls, needed_by)
        self.library = library
        self.devices = runtime_devices(devices, one_memory)
        self._local = threading.local()
        self.weights: list[Any] = []
        if weight_devices:
            values = self.vm()["umahub_weights"]()
            # in one memory, the library's own constants are read in place, not held twice
            self.weights = [
                values[i]
                if values[i].device == self.devices[d]
                else values[i].copyto(self.devices[d])
                for i, d in enumerate(weight_devices)
            ]

    def vm(self) -> Any:
        """This thread's VM (made at its first use, when this thread's TVM pool is
        also given every core the process may use: :func:`share_cores`)."""
        vm = getattr(self._local, "vm", None)
        if vm is None:
            from tvm import relax

            share_cores()
            vm = self._local.vm = relax.VirtualMachine(self.library, self.devices)
            self._local.main = vm["main"]
        return vm

    def tensors(self, arrays: Sequence[Any]) -> list[Any]:
        """The inputs as TVM tensors on the host."""
        host = self.devices[0]
        return [host_tensor(a, host) for a in arrays]

    def __call__(self, *arrays: Any) -> Any:
        self.vm()
        return to_numpy(self._local.main(*self._inputs(arrays), *self.weights))

    def _inputs(self, arrays: Sequence[Any]) -> list[Any]:
        """The inputs copied into the tensors this thread's last call took, where
        their shapes and types are the same, so that a call allocates no memory for
        its inputs: a fresh tensor per call, memory the kernels then read cold, cost
        0.07 ms of mobilenet_v3_small's 1.4 and 0.09 of squeezenet1_1's 3.8. Safe
        as a call returns, its result copied out, before the next one on this
        thread writes them; the concurrent executor, whose inferences overlap,
        takes :meth:`tensors`. (The arrays' own memory, shared by DLPack, would
        save 0.04 ms more, but a kernel may write its inputs: ``call_tir_inplace``.)
        """
        kept: list[tuple[Any, Any]] = getattr(self._local, "inputs", [])
        now: list[tuple[Any, Any]] = []
        for i, array in enumerate(arrays):
            array = np.require(array, requirements="C")
            view, tensor = kept[i] if i < len(kept) else (None, None)
            if view is not None and view.shape == array.shape and view.dtype == array.dtype:
                np.copyto(view, array, casting="no")
            else:
                tensor = host_tensor(array, self.devices[0])
                view = _numpy_view(tensor)
            now.append((view, tensor))
        self._local.inputs = now
        return [tensor for _, tensor in now]


class Executors:
    """The executors of one loaded library: the VM runner, and the concurrent
    executor, made at its first use from the step graph the library carries."""

    def __init__(self, runner: Runner, devices: Sequence[str], executor: str = "auto"):
        self.runner, self.devices = runner, list(devices)
        self.executor = _choice(executor)
        self._graph: Any = None
        self._concurrent: Any = None
        self._lock = threading.Lock()
        self._auto: ExecutorChoice | None = None
        self._threads: dict[str, int | None] = {}  # each way of "auto" on the VM: its threads

    @property
    def auto(self) -> ExecutorChoice:
        """How "auto" chooses: its ways are the VM's thread counts
        (:func:`umahub.runtime.threadpool.vm_threads`) and the concurrent executor
        where the library has a step graph."""
        with self._lock:
            if self._auto is None:
                counts, reason = vm_threads()
                ways: dict[str, str] = {"vm": "the VM"} if not counts else {}
                self._threads = {"vm": None} if not counts else {}
                for i, n in enumerate(counts):
                    way = "vm" if i == 0 else f"vm{n}"
                    ways[way] = f"the VM on {'one thread' if n == 1 else f'{n} threads'}"
                    self._threads[way] = n
                if self.graph.unsupported:
                    cannot = f"the concurrent executor cannot run it ({self.graph.unsupported})"
                    reason = f"{reason}; {cannot}" if reason else cannot
                else:
                    ways["concurrent"] = "the concurrent executor"
                self._auto = ExecutorChoice(ways, reason)
            return self._auto

    @property
    def graph(self) -> Any:
        """The library's :class:`umahub.runtime.steps.StepGraph` (``unsupported`` says why not)."""
        if self._graph is None:
            from umahub.runtime.steps import StepGraph, read_graph

            if len(self.devices) < 2:
                self._graph = StepGraph(tuple(self.devices), unsupported="one device only")
            else:
                self._graph = read_graph(self.runner.vm(), self.devices)
        return self._graph

    def resolve(self, executor: str | None) -> str:
        """``"vm"`` or ``"concurrent"`` for the requested (or the default) executor;
        ``"auto"`` while auto is still timing both."""
        choice = _choice(executor or self.executor)
        if choice == "auto":
            return _executor_of(self.auto.chosen) or "auto"
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
                from umahub.runtime.executor import Executor

                runner = self.runner
                self._concurrent = Executor(
                    runner.library, self.graph, runner.weights, runner.devices
                )
            return self._concurrent

    def call_seconds(
        self, arrays: Sequence[Any], runs: int, before_each: Callable[[], Any] | None = None
    ) -> tuple[dict[str, list[float]], list[tuple[int, float]]]:
        """Seconds of every function ``main`` calls on the VM over ``runs`` inferences
        (after one to warm up), by name (a partition's symbol, a host kernel's, VM
        builtins'), and every copy between devices as ``(bytes, seconds)``.

        Timed by TVM's VM instrumentation on a VM of its own, on the VM's thread
        pool, as :meth:`run` runs the model. ``before_each`` is called before
        every timed inference, untimed.
        """
        from tvm import relax

        vm = relax.VirtualMachine(self.runner.library, self.runner.devices)
        args = [*self.runner.tensors(arrays), *self.runner.weights]
        seconds: dict[str, list[float]] = {}
        copies: list[tuple[int, float]] = []
        started: list[float] = []
        recording = [False]

        def instrument(func: Any, name: str, before: bool, value: Any, *inputs: Any) -> int:
            if before:
                started.append(time.perf_counter())
                return 0
            spent = time.perf_counter() - started.pop()
            if recording[0]:
                seconds.setdefault(name, []).append(spent)
                if name == "vm.builtin.to_device" and inputs:
                    copies.append((tensor_bytes(inputs[0]), spent))
            return 0

        vm.set_instrument(instrument)
        main = vm["main"]
        main(*args)
        recording[0] = True
        for _ in range(runs):
            if before_each is not None:
                before_each()
            main(*args)
        return seconds, copies

    def step_seconds(
        self, arrays: Sequence[Any], runs: int, before_each: Callable[[], Any] | None = None
    ) -> dict[str, list[float]]:
        """Seconds of every step over ``runs`` inferences on the concurrent executor
        (after one to warm up), by the step's label (a partition's symbol,
        ``"copy x host->npu:0"``, ``"host: lv1"``); one device only: ``{"main": [...]}``,
        the VM's ``main`` on tensors made beforehand, as the concurrent steps are.
        ``before_each`` is called before every timed inference, untimed."""
        self.runner(*arrays)
        if self.graph.unsupported:
            main = self.runner.vm()["main"]
            args = [*self.runner.tensors(arrays), *self.runner.weights]
            times = []
            for _ in range(runs):
                if before_each is not None:
                    before_each()
                start = time.perf_counter()
                main(*args)
                times.append(time.perf_counter() - start)
            return {"main": times}
        ex = self.concurrent()
        tensors = self.runner.tensors(arrays)
        ex.run(tensors)
        seconds: dict[str, list[float]] = {}
        for _ in range(runs):
            if before_each is not None:
                before_each()
            inference = ex.submit(tensors, profile=True)
            inference.result()
            for span in inference.spans:
                seconds.setdefault(span.label, []).append(span.end - span.start)
        return seconds

    def why(self, executor: str | None = None) -> str:
        """Why :meth:`run` runs on the executor it does (``executor``, or the default)."""
        choice = _choice(executor or self.executor)
        if choice == "concurrent" and self.graph.unsupported:
            why = self.graph.unsupported
            return f"the VM: the concurrent executor cannot run this model ({why})"
        if choice != "auto":
            return f"{choice}: asked for (executor = {choice!r})"
        auto = self.auto
        if not auto.chosen:
            return f"auto, not chosen yet: {auto.progress()}"
        threads = self._threads.get(auto.chosen)
        runs = _executor_of(auto.chosen)
        if threads:
            runs += f" on {'one thread' if threads == 1 else f'{threads} threads'}"
        if len(auto.ways) == 1:
            return f"{runs}: {auto.why}"
        return f"{runs}, chosen by auto: {auto.why}"

    def run(self, arrays: Sequence[Any], executor: str | None, timeout: float | None) -> Any:
        if _choice(executor or self.executor) != "auto":
            return self._run(self.resolve(executor), arrays, timeout)
        auto = self.auto
        which = auto.next()
        start = time.perf_counter()
        out = self._run(which, arrays, timeout)
        auto.record(which, time.perf_counter() - start)
        return out

    def _run(self, which: str, arrays: Sequence[Any], timeout: float | None) -> Any:
        """Run on a way of "auto" (the VM on its thread count) or an executor asked for."""
        if which == "concurrent":
            return to_numpy(self.concurrent().run(self.runner.tensors(arrays), timeout))
        use_threads(self._threads.get(which))  # an executor asked for: the pool as it was
        return self.runner(*arrays)

    def stream(
        self, batches: Iterable[Any], info: Sequence[InputInfo], executor: str | None,
        depth: int | None,
    ) -> Iterator[Any]:  # fmt: skip
        def checked() -> Iterator[list[Any]]:
            for batch in batches:
                arrays = [batch] if isinstance(batch, np.ndarray) else list(batch)
                check_inputs(info, arrays)
                yield arrays

        # "auto" still timing runs a stream concurrently: pipelining is what it is for
        if self.resolve(executor) == "vm":
            auto = _choice(executor or self.executor) == "auto"
            for arrays in checked():
                use_threads(self._threads.get(self.auto.chosen) if auto else None)
                yield self.runner(*arrays)
            return
        ex = self.concurrent()
        tensors = (self.runner.tensors(arrays) for arrays in checked())
        for inference in ex.stream(tensors, depth):
            yield to_numpy(inference.result())

    def profile(self, arrays: Sequence[Any], runs: int) -> dict[str, Any]:
        """Time both executors on ``arrays``; the concurrent one's steps of every run
        (``inferences``) and of its median run (``spans``)."""
        use_threads(None)  # the VM as asked for, not on a thread count "auto" chose
        self.runner(*arrays)  # warm up both: the first calls make VMs and threads
        if not self.graph.unsupported:
            self.concurrent().run(self.runner.tensors(arrays))
        vm_times: list[float] = []
        done: list[Any] = []
        for _ in range(runs):  # alternated, so that a change of load hits both alike
            start = time.perf_counter()
            self.runner(*arrays)
            vm_times.append(time.perf_counter() - start)
            if not self.graph.unsupported:
                inference = self.concurrent().submit(self.runner.tensors(arrays), profile=True)
                inference.result()
                done.append(inference)
        result: dict[str, Any] = {"runs": runs, "vm_seconds": float(np.median(vm_times))}
        if self.graph.unsupported:
            return {**result, "executor": "vm", "why": self.graph.unsupported, "spans": []}
        auto, why = compare(vm_times, [i.seconds for i in done])
        median = sorted(done, key=lambda i: i.seconds)[len(done) // 2]
        return {
            **result,
            "executor": "concurrent",
            "auto": {"executor": auto, "why": why},
            "concurrent_seconds": median.seconds,
            "lanes": {lane: self.concurrent().cores[lane] for lane in self.concurrent().lanes},
            "spans": _spans(median),
            "inferences": [
                {
                    "start": i.started - done[0].started,
                    "seconds": i.seconds,
                    "spans": _spans(i),
                }
                for i in done
            ],
        }


def _spans(inference: Any) -> list[dict[str, Any]]:
    """The measured steps of a profiled inference, JSON-ready, in the order they started."""
    return [m.to_dict() for m in sorted(inference.spans, key=lambda m: m.start)]


def _executor_of(way: str) -> str:
    """The executor of a way of "auto" (``"vm1"``: the VM on one thread), ``""`` for none."""
    return "vm" if way.startswith("vm") else way


def _choice(executor: str) -> str:
    if executor not in EXECUTORS:
        from umahub.errors import did_you_mean

        raise UmahubError(
            f"unknown executor {executor!r}{did_you_mean(str(executor), EXECUTORS)}; "
            f"known: {', '.join(EXECUTORS)}"
        )
    return executor


def host_tensor(array: Any, device: Any) -> Any:
    """``array`` (anything numpy takes) copied into a new TVM tensor on ``device``.

    Through DLPack: ``tvm.runtime.tensor`` and ``Tensor.numpy`` go through
    ``ctypes.cast``, which leaves two objects in a reference cycle at every
    call: every inference would feed Python's cycle collector. A dtype numpy
    cannot share by DLPack takes TVM's way.
    """
    import tvm

    # np.require keeps 0-d arrays 0-d (np.ascontiguousarray makes them 1-d).
    array = np.require(array, requirements="C")
    tensor = tvm.runtime.empty(array.shape, array.dtype, device)
    view = _numpy_view(tensor)
    if view is None:  # no DLPack type in numpy: TVM's copy
        return tvm.runtime.tensor(array, device)
    np.copyto(view, array, casting="no")
    return tensor


def _numpy_view(tensor: Any) -> Any:
    """``tensor``'s memory as a numpy array; ``None`` where numpy has no DLPack type for it."""
    try:
        return np.from_dlpack(tensor)
    except (TypeError, BufferError, RuntimeError):
        return None


def to_numpy(value: Any) -> Any:
    """A VM result in numpy: a tensor as an array (a copy, by DLPack where numpy
    has the type: see :func:`host_tensor`), a shape (``R.shape``) as an int64
    array, a tuple as a list."""
    if hasattr(value, "numpy"):
        view = _numpy_view(value)
        return value.numpy() if view is None else view.copy()
    if type(value).__name__ in ("Shape", "ShapeTuple"):
        return np.asarray(list(value), dtype="int64")
    if isinstance(value, (list, tuple)) or hasattr(value, "__len__"):
        return [to_numpy(v) for v in value]
    return value


class Running:
    """``run``, ``stream`` and ``profile``, shared by :class:`Compiled` and :class:`LoadedModel`."""

    input_info: list[InputInfo]
    _executors: Executors

    @property
    def executor(self) -> str:
        """The default executor of :meth:`run`: ``"auto"``, ``"vm"`` or ``"concurrent"``."""
        return self._executors.executor

    @executor.setter
    def executor(self, value: str) -> None:
        self._executors.executor = _choice(value)

    @property
    def executor_in_use(self) -> str:
        """What :meth:`run` uses unless told: ``"vm"``, ``"concurrent"``, or ``"auto"``
        while auto is still timing both."""
        return self._executors.resolve(None)

    def executor_why(self, executor: str | None = None) -> str:
        """Why :meth:`run` runs on the executor it does, given ``executor`` (default:
        :attr:`executor`): asked for, the one a model on one device runs on, or what
        "auto" timed (and, if it switched since, when and why)."""
        return self._executors.why(executor)

    @property
    def step_graph(self) -> Any:
        """The :class:`umahub.runtime.steps.StepGraph` the concurrent executor runs."""
        return self._executors.graph

    def run(self, *arrays: Any, executor: str | None = None, timeout: float | None = None) -> Any:
        """Run one inference; numpy in, numpy out (a list for several outputs).

        Args:
            executor: ``"vm"``, ``"concurrent"`` or ``"auto"``; default: :attr:`executor`.
            timeout: (concurrent) seconds to wait before giving up with an error.

        Raises:
            UmahubError: wrong inputs, an unknown executor, or the concurrent
                executor asked for a model it cannot run.
            umahub.errors.ExecutionError: a partition or copy failed (naming
                it and its device), or the timeout passed.
        """
        check_inputs(self.input_info, arrays)
        return self._executors.run(arrays, executor, timeout)

    def warm_up(self, *arrays: Any, executor: str | None = None, at_least: int = 1) -> int:
        """Run ``arrays`` until :meth:`run` is what later calls will be: ``at_least``
        times (the first call makes VMs and threads), and while ``"auto"`` is still
        timing both executors, until it has chosen. Returns the number of runs.

        Time a model only after this: while ``"auto"`` is choosing, every other call
        runs on the concurrent executor, and a model timed then looks slower (or
        faster) than it will run.
        """
        runs, most = 0, at_least + AUTO_TRIAL_CALLS
        while runs < at_least or (self._executors.resolve(executor) == "auto" and runs < most):
            self.run(*arrays, executor=executor)
            runs += 1
        return runs

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

    def profile(
        self, *arrays: Any, runs: int = 5, trace: str | os.PathLike | None = None
    ) -> dict[str, Any]:
        """Run ``arrays`` ``runs`` times on each executor; the measured timeline.

        Args:
            runs: inferences timed on each executor (after one to warm up).
            trace: also write the timeline to this file as a Chrome trace (the
                Trace Event Format JSON that Perfetto and ``chrome://tracing``
                open): a track per device and per DMA lane, every timed run
                one after the other (:mod:`umahub.runtime.trace`).

        Returns:
            ``runs``, ``executor`` (``"concurrent"``, or ``"vm"`` with ``why``
            when the model runs on the VM only), ``vm_seconds`` and
            ``concurrent_seconds`` (medians; the runs of the two alternate),
            ``auto``: what ``executor = "auto"`` would keep by these runs
            (``executor``, ``why``), ``lanes`` (the cores of each
            worker), ``spans``: every step of the concurrent executor's median
            run (lane, start, end, label, kind, bytes of a copy; seconds from
            the start of the inference), and ``inferences``: every timed run
            in the order it ran (``start``, seconds after the first began;
            ``seconds``; its ``spans``).

        Raises:
            UmahubError: wrong inputs; with ``trace``, a model the VM alone
                runs (no timeline of steps), or a file that cannot be written.
        """
        check_inputs(self.input_info, arrays)
        measured = self._executors.profile(arrays, max(1, runs))
        self._keep_measured(measured)
        if trace is not None:
            from umahub.runtime.trace import save_trace

            save_trace(measured, trace, name=self._trace_name())
        return measured

    def _keep_measured(self, measured: dict[str, Any]) -> None:
        """Where a model keeps what :meth:`profile` measured (nowhere, unless it has a report)."""

    def _trace_name(self) -> str:
        """The model's name in a trace (its process): the library's file name, if any."""
        path = getattr(self, "path", "")
        return os.path.basename(str(path)) if path else ""
