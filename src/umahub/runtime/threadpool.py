"""TVM's thread pool as umahub runs models on it: how long an idle worker spins
before it sleeps, and how many threads the VM runs a model's kernels on.

TVM's CPU kernels run on a thread pool whose workers, once a parallel loop is
done, spin (``sched_yield``) for ``TVM_THREAD_POOL_SPIN_COUNT`` turns before
they sleep, 300,000 by default. That is right for one pool, whose next kernel
follows at once, but umahub runs several: the concurrent executor has a pool
per lane (host, each accelerator instance, each copy engine), and a model
timed by ``executor = "auto"`` keeps its lanes for a while after it chose the
VM. On a machine with few cores the spinning workers of the idle pools then
take the cores from the kernels that run: the model runs slower for a while
after its first calls, its process burns CPU after the last one, and a
placement with more lanes looks slower than one with fewer for no reason of
its own (``benchmarks/thread_spin.py`` measures it).

:data:`SPIN_COUNT` turns still cover the gap between two kernels of one
model, so the VM loses nothing, and an idle worker soon sleeps. The
concurrent executor pays for it: a lane's first kernel after a handoff wakes
a sleeping worker. Where that shows, on few cores, the concurrent executor is
slower than the VM anyway, and ``executor = "auto"`` keeps the VM. The count
is read once per process, when TVM's first pool starts. umahub sets it for
the models it compiles and runs, not for every TVM program: when a compile
starts (it runs kernels: constants folded, weights packed, a kernel's
constant stages; a pool started there at TVM's count kept the lanes'
workers spinning for whole seconds, and the VM ran resnet18's int8 model
1.9 times slower after the concurrent executor's calls) and when it first
loads a model to run it (:class:`umahub.runtime.running.Runner`:
``umahub.load``, ``verify``), never at ``import umahub`` or ``import tvm``.
A value the user set is left alone, and in a process whose TVM already ran
a parallel kernel before umahub loaded a model the pool keeps the count it
started with (set ``TVM_THREAD_POOL_SPIN_COUNT`` yourself to choose one for
the whole process).

How many threads: TVM starts a pool with one thread per core on most machines
but half the logical CPUs on x86, taking every pair for a core's two
hyperthreads. A cloud VM often reports its vCPUs as cores of their own
(a 2-vCPU AMD EPYC here, one thread per core in sysfs: a 3x3 convolution of
the npu 0.56 ms on TVM's one thread, 0.32 ms on two), and a container limited
to 2 cores of a 64-core machine gets 32 threads for them. So umahub starts
the pool of each thread that runs a model with one thread per physical core
the process may use, at most its cgroup's CPU quota
(:func:`default_threads`), unless the user chose (``TVM_NUM_THREADS`` or
``OMP_NUM_THREADS`` set): the count ONNX Runtime and PyTorch use by default.
The hypervisor may still put two vCPUs on one physical core for a while (on
that VM, in 2 of 17 runs of an FMA loop two threads were no faster than one):
``executor = "auto"`` times the VM on one thread too, and keeps what is faster.
It sets ``TVM_NUM_THREADS`` only while TVM creates that pool
(:func:`start_pool`), so neither the environment nor other TVM programs'
pools change.

TVM splits every parallel loop into equal chunks, one per
thread of the pool, and waits for the last. Beside a busy process, the thread
whose core the neighbour holds finishes a scheduler quantum late, kernel
after kernel: a model of many small kernels then runs several times slower on
two threads than on one (the int8 MobileNetV2 of the zoo: 158-172 against
32-40 ms on a 2-core Intel Xeon). So ``executor = "auto"`` times the VM on all
the threads of its pool and on one (:func:`vm_threads`) and runs the VM on the
count it chose (:func:`use_threads`), unless the user set ``TVM_NUM_THREADS``:
that count is kept.

Which cores: TVM pins the threads of a pool, the calling thread included, one
to a core, counting from the machine's first core, whatever cores the process
was given. A model run on one thread then runs on core 0 even under
``taskset -c 1``, and cannot leave it when another process is busy there
(the int8 ResNet-18 of the zoo, on a 2-core Intel Xeon beside a compile:
14.0 ms pinned against 11.9 ms free to move, medians of five processes each).
So the pool of every thread that runs a model's VM shares the cores the
process may use (:func:`share_cores`), unless the user set
``TVM_BIND_THREADS`` to choose TVM's binding.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Collection

__all__ = [
    "SPIN_COUNT",
    "default_threads",
    "process_cores",
    "share_cores",
    "spin_briefly",
    "start_pool",
    "usable_cores",
    "use_threads",
    "user_chose_threads",
    "vm_threads",
]

#: The spin count umahub gives TVM's thread pool unless the user set one.
SPIN_COUNT = 3000

# The cores of the importing thread, before TVM pinned any thread (not on every system).
_STARTED_ON: set[int] = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()


def spin_briefly() -> None:
    """Set ``TVM_THREAD_POOL_SPIN_COUNT`` to :data:`SPIN_COUNT` unless it is set."""
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", str(SPIN_COUNT))


# Where Linux describes the CPUs and the process's cgroup (tests point them elsewhere).
SYSFS_CPUS = "/sys/devices/system/cpu"
CGROUP = "/sys/fs/cgroup"


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def process_cores() -> list[int]:
    """The cores this process may use (its container's; not the calling thread's, which
    TVM may have pinned to one core)."""
    cores: set[int] = set()
    try:
        for part in (_read(f"{CGROUP}/cpuset.cpus.effective") or "").split(","):
            lo, _, hi = part.partition("-")
            cores |= set(range(int(lo), int(hi or lo) + 1))
    except ValueError:  # unreadable or empty: every core
        pass
    return sorted(cores) or list(range(os.cpu_count() or 1))


def usable_cores() -> list[int]:
    """The cores umahub's threads may run on: the process's (:func:`process_cores`) that
    it was started on too (``taskset``, a job scheduler's affinity), before TVM pinned
    any thread; all the process's where that is unknown or shares none of them."""
    every = process_cores()
    return [c for c in every if c in _STARTED_ON] or every


def _cpu_quota() -> float | None:
    """The CPUs' worth of time the process's cgroup allows per period, or None."""
    limit = _read(f"{CGROUP}/cpu.max")  # cgroup v2: "<quota> <period>" or "max <period>"
    if limit is not None:
        quota, _, period = limit.partition(" ")
    else:  # cgroup v1
        quota = _read(f"{CGROUP}/cpu/cpu.cfs_quota_us") or "-1"
        period = _read(f"{CGROUP}/cpu/cpu.cfs_period_us") or ""
    try:
        value, per = int(quota), int(period)
    except ValueError:
        return None
    return value / per if value > 0 and per > 0 else None


def default_threads(cores: Collection[int] = ()) -> int | None:
    """How many threads umahub starts a TVM pool with where the user chose none: one
    per physical core of ``cores`` (default :func:`usable_cores`; the hyperthreads of
    one core count once), at most the process's cgroup CPU quota rounded up; None
    where Linux does not say which CPUs share a core (TVM's own count then)."""
    physical = set()
    for core in cores or usable_cores():
        topology = f"{SYSFS_CPUS}/cpu{core}/topology"
        siblings = _read(f"{topology}/core_cpus_list") or _read(f"{topology}/thread_siblings_list")
        if not siblings:
            return None
        physical.add(siblings)
    if not physical:
        return None
    quota = _cpu_quota()
    return max(1, min(len(physical), math.ceil(quota))) if quota else len(physical)


def user_chose_threads() -> bool:
    """Whether the user chose TVM's thread count (``TVM_NUM_THREADS``, or
    ``OMP_NUM_THREADS``, which TVM reads when the other is not set)."""
    return bool(os.environ.get("TVM_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS"))


_pool = threading.local()  # per calling thread, as TVM's pools are: the count it started with
_environ_lock = threading.Lock()


def start_pool() -> None:
    """Start the calling thread's TVM pool with :func:`default_threads` threads (once
    per thread), unless the user chose a count (:func:`user_chose_threads`) or TVM's
    binding (``TVM_BIND_THREADS``), or a TVM kernel already started this thread's
    pool (it keeps its count then)."""
    if getattr(_pool, "started", False) or "TVM_BIND_THREADS" in os.environ:
        return
    _pool.started = True
    threads = None if user_chose_threads() else default_threads()
    if threads is None:
        return
    import tvm

    count = tvm.get_global_func("runtime.NumThreads")
    with _environ_lock:  # TVM reads the count from the environment as it makes the pool
        os.environ["TVM_NUM_THREADS"] = str(threads)
        try:
            count()
        finally:
            del os.environ["TVM_NUM_THREADS"]


def vm_threads() -> tuple[list[int], str]:
    """The thread counts "auto" may run the VM on, most first, and why not more: all
    the threads of the calling thread's TVM pool (one per physical core where umahub
    started it: :func:`start_pool`) and one; ``[]``
    (the pool as it is) when the user set ``TVM_NUM_THREADS``."""
    if os.environ.get("TVM_NUM_THREADS"):
        threads = os.environ["TVM_NUM_THREADS"]
        return [], f"TVM_NUM_THREADS={threads} is set: the VM keeps its thread pool"
    most = _original()
    if most == 1:
        return [1], "TVM's thread pool has one thread here (set TVM_NUM_THREADS for more)"
    return [most, 1], ""


def _original() -> int:
    """The size of the calling thread's TVM pool before umahub changed it."""
    import tvm

    if not hasattr(_pool, "original"):
        start_pool()
        _pool.original = int(tvm.get_global_func("runtime.NumThreads")())
    return int(_pool.original)


def share_cores(cores: Collection[int] = ()) -> None:
    """Let the calling thread's TVM pool, this thread included, run on any of
    ``cores`` (default: :func:`usable_cores`), not one core each from the machine's
    first (once per thread; a no-op where the user set ``TVM_BIND_THREADS``). Starts
    the pool first (:func:`start_pool`)."""
    start_pool()
    if getattr(_pool, "shared", False) or "TVM_BIND_THREADS" in os.environ:
        return
    import tvm

    now = int(tvm.get_global_func("runtime.NumThreads")())
    _configure(now, cores)


def _configure(threads: int, on: Collection[int] = ()) -> None:
    import tvm

    _pool.shared = True
    cores = [str(c) for c in sorted(on or usable_cores())]
    # -3: TVM's kSpecifyThreadShareAllCore, every thread may run on every core given
    tvm.get_global_func("runtime.config_threadpool")(-3, threads, cores)


def use_threads(threads: int | None) -> None:
    """Make the calling thread's TVM pool ``threads`` threads (at most its size), not
    pinned to cores (so that the system can move them away from a busy one); ``None``:
    the count it had before umahub changed it. A no-op when it has that many already."""
    import tvm

    original = _original()
    now = int(tvm.get_global_func("runtime.NumThreads")())
    threads = original if threads is None else threads
    if threads != now:
        _configure(threads)
