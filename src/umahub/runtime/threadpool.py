"""How long an idle worker of TVM's thread pool spins before it sleeps.

TVM's CPU kernels run on a thread pool whose workers, once a parallel loop is
done, spin (``sched_yield``) for ``TVM_THREAD_POOL_SPIN_COUNT`` turns before
they sleep, 300,000 by default: a few hundred milliseconds per worker. That is
right for one pool, whose next kernel follows within microseconds, but umahub
runs several: the concurrent executor has a pool per lane (host, each
accelerator instance, each copy engine), and a model timed by ``executor =
"auto"`` keeps its lanes for a while after it chose the VM. On two cores the
idle workers of those pools then take the cores from the kernels that run:
mobilenet_v3_small ran 3.20 ms in the 1.5 s after its first calls instead of
the VM's 2.96, its process burning 0.9 s of CPU after the last one, and a
placement with more lanes looked slower than one with fewer for no reason of
its own (``benchmarks/thread_spin.py``).

A few thousand turns still cover the gap between two kernels of one model
(microseconds), so the VM loses nothing (2.84 ms for that model, the zoo's
models unchanged within the noise), and an idle worker sleeps within about a
millisecond. The concurrent executor pays for it: a lane's first kernel after
a handoff wakes a sleeping worker (0-13% at two threads per kernel on the
zoo's models, where it is already twice the VM's time on two cores and
``executor = "auto"`` keeps the VM). The count is read once per process, when
TVM's first pool starts, so umahub sets it when it is imported, before any
kernel runs; a value the user set is left alone.
"""

from __future__ import annotations

import os

__all__ = ["SPIN_COUNT", "spin_briefly"]

#: The spin count umahub gives TVM's thread pool unless the user set one.
SPIN_COUNT = 3000


def spin_briefly() -> None:
    """Set ``TVM_THREAD_POOL_SPIN_COUNT`` to :data:`SPIN_COUNT` unless it is set."""
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", str(SPIN_COUNT))
