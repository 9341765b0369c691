"""How long an idle worker of TVM's thread pool spins before it sleeps.

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
the models it runs, not for every TVM program: when it first loads a model
to run it (:class:`umahub.runtime.running.Runner`: ``Hub.compile``,
``umahub.load``, ``verify``), never at ``import umahub`` or ``import tvm``.
A value the user set is left alone, and in a process whose TVM already ran
a parallel kernel before umahub loaded a model the pool keeps the count it
started with (set ``TVM_THREAD_POOL_SPIN_COUNT`` yourself to choose one for
the whole process).
"""

from __future__ import annotations

import os

__all__ = ["SPIN_COUNT", "spin_briefly"]

#: The spin count umahub gives TVM's thread pool unless the user set one.
SPIN_COUNT = 3000


def spin_briefly() -> None:
    """Set ``TVM_THREAD_POOL_SPIN_COUNT`` to :data:`SPIN_COUNT` unless it is set."""
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", str(SPIN_COUNT))
