"""The concurrent executor: a compiled model run as a dependency graph, one worker per device.

The graph is :class:`umahub.runtime.steps.StepGraph` (read from the library, so a
model loaded without the plugins runs the same way). Every lane has one worker
thread and a queue: each device instance (the host, ``dsp_cpu:0``, ``npu:0``)
runs its partition and host steps, and each accelerator whose pool is filled
by DMA (``copy = "async"``) has a copy lane (``"npu:0 DMA"``) whose copies
overlap compute. A ``sync`` copy runs on the worker of its accelerator end, so
it occupies that device as on a board where the core copies into its own
memory. A step is queued as soon as all its inputs are there; aliases (tuple
fields) are resolved at once, in the thread that made their input.

Several inferences may be in flight (from several threads, or
:meth:`Executor.stream`): a queue serves the oldest inference first, so a
stream flows through the lanes as through a pipeline.

Emulated devices are CPU cores here. When the machine has a core for each
accelerator lane, each accelerator's worker is pinned to its own core
(``os.sched_setaffinity`` on the thread) and its kernels run on one thread
(TVM's thread pool is per calling thread: ``runtime.config_threadpool`` makes
it one thread for that worker); the host and the DMA lanes may use every core
and the host keeps its pool's number of threads (one per physical core:
:func:`umahub.runtime.threadpool.start_pool`), its pool sharing the host
lane's cores (:func:`umahub.runtime.threadpool.share_cores`). TVM pins a thread
that first starts its thread pool to core 0 (and a thread inherits its
creator's pinning), so every worker sets its affinity after starting TVM's pool.

A copy writes into the destination of the same copy of an earlier inference
once nothing else holds it (:mod:`umahub.runtime.spares` says why).

Why this module is long: an inference's bookkeeping, the lanes' workers and
the executor that dispatches between them share one set of state (the values,
the waits, the spans) under one lock discipline; split, each piece would have
to expose it to the others.

A step that raises fails its inference: the caller gets an
:class:`ExecutionError` naming the partition and device (or the copy), the
other steps of that inference are dropped, other inferences go on. A worker
with nothing to do for a while ends; the next step starts a new one, so an
executor that is no longer used holds no thread.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from umahub.errors import ExecutionError, last_line
from umahub.lanes import dma_lane, is_dma
from umahub.runtime.spares import Spares
from umahub.runtime.steps import Step, StepGraph
from umahub.runtime.threadpool import share_cores, usable_cores

__all__ = ["ExecutionError", "Executor", "Inference", "Measured", "tensor_bytes"]

#: Seconds a worker waits for work before its thread ends.
IDLE_SECONDS = 2.0


@dataclass(frozen=True)
class Measured:
    """One step of a real run: on which lane, from when to when (seconds since the inference
    started), what it was (``kind``: ``"compute"``, ``"sync"``, ``"async"``) and, for a copy,
    the bytes it moved (0 for compute)."""

    lane: str
    start: float
    end: float
    label: str
    kind: str
    bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return dict(self.__dict__)


def tensor_bytes(tensor: Any) -> int:
    """Bytes of a TVM tensor, from its shape and dtype (0 when it is no tensor)."""
    try:
        return int(np.prod([int(d) for d in tensor.shape])) * np.dtype(str(tensor.dtype)).itemsize
    except (AttributeError, TypeError, ValueError):
        return 0


def plan_cores(lanes: Sequence[str], host: str, cores: Sequence[int]) -> dict[str, set[int]]:
    """Which cores each lane's thread may run on.

    Accelerator lanes get a core each, from the last core down (the first
    core is where TVM pins the threads it starts), when there are enough; the
    host and DMA lanes, and every lane when cores are too few, get them all.
    """
    accelerators = [lane for lane in lanes if lane != host and not is_dma(lane)]
    every = set(cores)
    plan = {lane: every for lane in lanes}
    if accelerators and len(accelerators) <= len(cores):
        for k, lane in enumerate(accelerators):
            plan[lane] = {cores[len(cores) - 1 - k]}
    return plan


class Inference:
    """One inference in flight: its values, what each step still waits for, its outcome."""

    def __init__(self, executor: Executor, seq: int, args: Sequence[Any], profile: bool):
        graph = executor.graph
        self.executor, self.seq, self.profile = executor, seq, profile
        self.values: list[Any] = [None] * graph.values
        self.values[: len(args)] = list(args)
        self.waiting = list(executor.waits)
        self.uses = list(executor.uses)
        self.remaining = len(graph.steps)
        self.running: dict[int, str] = {}
        self.error: BaseException | None = None
        self.spans: list[Measured] = []
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.started = time.perf_counter()
        self.finished = 0.0

    def result(self, timeout: float | None = None) -> Any:
        """The model's result (TVM objects); raises the failure of any step.

        Raises:
            ExecutionError: a step failed, or the inference did not finish
                within ``timeout`` seconds.
        """
        if not self.done.wait(timeout):
            with self.lock:
                running = ", ".join(_what(self.executor.graph.steps[i]) for i in self.running)
                left = self.remaining
            raise ExecutionError(
                f"the inference did not finish within {timeout:g} s: {left} step(s) left"
                + (f", running: {running}" if running else "")
            )
        if self.error is not None:
            raise self.error
        return _gather(self.executor.graph.output, self.values)

    @property
    def seconds(self) -> float:
        """Wall time of the inference (once done)."""
        return self.finished - self.started

    # ------------------------------------------------------------------ progress

    def fail(self, error: BaseException) -> None:
        """Stop the inference with ``error`` (the first failure wins)."""
        with self.lock:
            if self.error is None:
                self.error = error
                self.finished = time.perf_counter()
        self.done.set()

    def complete(self, index: int, outputs: Sequence[Any]) -> list[int]:
        """Record the outputs of step ``index``; return the steps now ready to queue."""
        graph, executor = self.executor.graph, self.executor
        ready: list[int] = []
        with self.lock:
            self.running.pop(index, None)
            work = deque([(index, outputs)])
            while work:
                i, outs = work.popleft()
                step = graph.steps[i]
                for v, value in zip(step.outputs, outs):
                    self.values[v] = value
                for v in set(step.inputs):
                    self.uses[v] -= 1
                    if self.uses[v] == 0 and v not in executor.kept:
                        value, self.values[v] = self.values[v], None  # nothing reads it any more
                        if v in executor.copied_by and value is not None:
                            executor.spares.give(executor.copied_by[v], value)
                        del value
                self.remaining -= 1
                for v in step.outputs:
                    for c in executor.consumers[v]:
                        self.waiting[c] -= 1
                        if self.waiting[c] == 0:
                            if graph.steps[c].kind == "alias":
                                work.append((c, [_alias(graph.steps[c], self.values)]))
                            else:
                                ready.append(c)
            if self.remaining == 0 and self.error is None:
                self.finished = time.perf_counter()
                self.done.set()
        return ready


def _alias(step: Step, values: list[Any]) -> Any:
    if step.mode == "get":
        return values[step.inputs[0]][step.field]
    if step.mode == "tuple":
        return tuple(values[v] for v in step.fields)
    return values[step.inputs[0]]


def _gather(output: Any, values: list[Any]) -> Any:
    if isinstance(output, list):
        return [_gather(o, values) for o in output]
    return values[output]


class _Lane:
    """One worker thread and its queue; the thread ends when idle and starts again on demand."""

    def __init__(self, executor: Executor, name: str, cores: set[int], single_thread: bool):
        self.executor, self.name, self.cores = executor, name, cores
        self.single_thread = single_thread
        self.queue: queue.PriorityQueue = queue.PriorityQueue()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.order = itertools.count()

    def put(self, inference: Inference, index: int) -> None:
        """Queue step ``index`` of ``inference`` (oldest inference first); start the
        thread if it is not running."""
        with self.lock:
            self.queue.put((inference.seq, index, next(self.order), inference))
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._loop, name=f"umahub {self.name}", daemon=True
                )
                self.thread.start()

    def _setup(self) -> Any:
        import tvm
        from tvm import relax

        if self.single_thread:
            tvm.get_global_func("runtime.config_threadpool")(1, 1)
        else:
            share_cores(self.cores)  # TVM's own count of threads, not pinned from core 0
        try:
            os.sched_setaffinity(0, self.cores)
        except (OSError, AttributeError):  # not Linux, or cores not ours: run unpinned
            pass
        ex = self.executor
        return relax.VirtualMachine(ex.library, ex.devices)

    def _loop(self) -> None:
        vm = None
        functions: dict[str, Any] = {}
        while True:
            try:
                _, index, _, inference = self.queue.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                with self.lock:
                    if self.queue.empty():
                        self.thread = None
                        return
                continue
            if inference.error is not None:
                continue
            step = self.executor.graph.steps[index]
            try:
                if vm is None:
                    vm = self._setup()
                with inference.lock:
                    inference.running[index] = self.name
                args = [inference.values[v] for v in step.inputs]
                start = time.perf_counter()
                if step.kind == "copy":
                    outputs = [self.executor.copy(index, step, args[0])]
                else:
                    fn = functions.get(step.function)
                    if fn is None:
                        fn = functions[step.function] = vm[step.function]
                    outputs = list(fn(*args))
                end = time.perf_counter()
            except ExecutionError as exc:  # a device's: it names its partition already
                inference.fail(exc)
                continue
            except Exception as exc:
                inference.fail(ExecutionError(f"{_what(step)} failed: {last_line(exc)}"))
                continue
            if inference.profile:
                kind, size = "compute", 0
                if step.kind == "copy":
                    kind, size = step.mode, tensor_bytes(args[0])
                t0 = inference.started
                inference.spans.append(
                    Measured(self.name, start - t0, end - t0, step.label, kind, size)
                )
            try:
                for ready in inference.complete(index, outputs):
                    self.executor.dispatch(inference, ready)
            except Exception as exc:  # an alias of a value of the wrong kind: umahub's bug
                inference.fail(ExecutionError(f"after {_what(step)}: {last_line(exc)}"))


def _what(step: Step) -> str:
    if step.kind == "copy":
        return f"the {step.mode} copy {step.label.removeprefix('copy ')} (on {step.device})"
    if step.partition:
        return f"partition {step.partition} on {step.device}"
    return f"host code ({step.label.removeprefix('host: ')})"


class Executor:
    """Runs a :class:`~umahub.runtime.steps.StepGraph` over a loaded library, one worker per lane.

    Args:
        library: the loaded library (``main``, the step functions, the partitions).
        graph: its step graph.
        weights: the lifted weights, already on their devices (``main``'s extra
            parameters, after the inputs).
        devices: the runtime device of each virtual device, the runner's
            (:func:`umahub.runtime.running.runtime_devices`).
        pin: pin accelerator workers to cores (see the module's docs).
    """

    def __init__(
        self,
        library: Any,
        graph: StepGraph,
        weights: Sequence[Any],
        devices: Sequence[Any],
        pin: bool = True,
    ):
        self.library, self.graph, self.weights = library, graph, list(weights)
        self.devices = list(devices)
        self.consumers: list[list[int]] = [[] for _ in range(graph.values)]
        self.uses = [0] * graph.values
        self.waits = [0] * len(graph.steps)
        for i, step in enumerate(graph.steps):
            for v in set(step.inputs):
                self.uses[v] += 1
                if v >= graph.params:
                    self.consumers[v].append(i)
                    self.waits[i] += 1
        self.kept = set(_flat(graph.output))
        # a copy's output, by the copy step that makes it (its destination may be reused)
        self.copied_by = {s.outputs[0]: i for i, s in enumerate(graph.steps) if s.kind == "copy"}
        self.spares = Spares()
        self.starts = [i for i, w in enumerate(self.waits) if w == 0]
        host = graph.devices[0]
        lanes = graph.lanes
        usable = usable_cores()  # a user's taskset is kept
        cores = plan_cores(lanes, host, usable) if pin else {}
        every = set(usable)
        self.cores = {lane: sorted(cores.get(lane, every)) for lane in lanes}
        self.lanes = {
            lane: _Lane(self, lane, set(self.cores[lane]), single_thread=lane != host)
            for lane in lanes
        }
        self._seq = itertools.count()

    def lane_of(self, step: Step) -> str:
        """The lane that runs ``step``."""
        if step.kind == "copy" and step.mode == "async":
            return dma_lane(step.device)
        return step.device

    def copy(self, index: int, step: Step, tensor: Any) -> Any:
        """Run copy step ``index``: ``tensor`` into a kept destination, or a new one."""
        dst = self.spares.take(index)
        if dst is None:
            return tensor.copyto(self.devices[step.dst_index])
        return tensor.copyto(dst)

    def dispatch(self, inference: Inference, index: int) -> None:
        """Queue step ``index`` of ``inference`` on its lane."""
        self.lanes[self.lane_of(self.graph.steps[index])].put(inference, index)

    def submit(self, args: Sequence[Any], profile: bool = False) -> Inference:
        """Start one inference on ``args`` (TVM tensors on the host); returns at once."""
        inference = Inference(self, next(self._seq), [*args, *self.weights], profile)
        ready: list[int] = []
        for i in self.starts:
            if self.graph.steps[i].kind == "alias":
                ready += inference.complete(i, [_alias(self.graph.steps[i], inference.values)])
            else:
                ready.append(i)
        if not self.graph.steps:
            inference.done.set()
        for i in ready:
            self.dispatch(inference, i)
        return inference

    def run(self, args: Sequence[Any], timeout: float | None = None) -> Any:
        """One inference: its result (TVM objects). See :meth:`Inference.result`."""
        return self.submit(args).result(timeout)

    def stream(
        self, batches: Iterable[Sequence[Any]], depth: int | None = None
    ) -> Iterator[Inference]:
        """Keep up to ``depth`` inferences in flight; yield each, done, in input order.

        ``depth`` defaults to the number of lanes (one inference per pipeline stage).
        """
        depth = max(1, depth or len(self.lanes))
        pending: deque[Inference] = deque()
        for args in batches:
            pending.append(self.submit(args))
            if len(pending) >= depth:
                first = pending.popleft()
                first.done.wait()
                yield first
        while pending:
            first = pending.popleft()
            first.done.wait()
            yield first


def _flat(output: Any) -> list[int]:
    if isinstance(output, list):
        return [v for o in output for v in _flat(o)]
    return [output]
