"""The lanes one inference runs on: their names, the lane a copy takes, when each is free.

A lane does one thing at a time. The concurrent executor
(:mod:`umahub.runtime.executor`) has a worker per lane: one per device
(``"host"``, ``"npu:0"``) and one DMA lane per device whose pool is filled by
DMA (``"npu:0 DMA"``). It names its lanes and its copies, and puts each copy
on its lane, with this module; two estimates schedule one inference on the
same lanes with it, so that the three model one run: the timeline of the
report's picture (:mod:`umahub.report.picture.timeline`) and the search of
placement by cost (:mod:`umahub.auto.search`). A foundation module, so that
the runtime may use it as well as the compiler and the report.

* A copy's *accelerator end* (:func:`accelerator_end`) is its destination, or
  its source when it goes to the host: a copy between two accelerators belongs
  to the one it goes to, whose pool says how it is filled.
* An async copy is done by DMA, an engine beside the processor: it takes the DMA
  lane of its accelerator end, and compute goes on meanwhile.
* A sync copy is done by a processor ("synchronous copy by the CPU", against
  "asynchronous copy by DMA"): the one of its accelerator end, which copies
  into its own memory, or out of it, as the executor runs it, on that device's
  worker. So it takes that device's lane, and only that one: the other end (the
  host, or the accelerator it comes from) goes on with its own work. This is
  what the measured timeline shows and what an estimate must follow, since the
  executor is what runs.

:class:`Lanes` books a task on its lanes: it starts once its inputs are ready
and every lane it takes is free, and holds them until it ends.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from umahub.config import HOST

__all__ = [
    "DMA",
    "Lanes",
    "accelerator_end",
    "copy_label",
    "copy_lane",
    "device_of",
    "dma_lane",
    "is_dma",
    "ordered",
]

#: What a DMA lane's name adds to its device's: ``"npu:0 DMA"``.
DMA = " DMA"


def dma_lane(device: str) -> str:
    """The DMA lane of ``device``: ``"npu:0"`` -> ``"npu:0 DMA"``."""
    return f"{device}{DMA}"


def is_dma(lane: str) -> bool:
    """Whether ``lane`` is a DMA lane."""
    return lane.endswith(DMA)


def device_of(lane: str) -> str:
    """The device a lane belongs to: itself, or the device of a DMA lane."""
    return lane.removesuffix(DMA)


def accelerator_end(src: str, dst: str) -> str:
    """The end of a copy from ``src`` to ``dst`` whose pool is filled (see the module)."""
    return dst if dst != HOST else src


def copy_lane(src: str, dst: str, kind: str) -> str:
    """The lane a copy from ``src`` to ``dst`` takes: the DMA lane of its accelerator
    end when ``kind`` is ``"async"``, else (``"sync"``) that end's own lane."""
    end = accelerator_end(src, dst)
    return dma_lane(end) if kind == "async" else end


def copy_label(tensor: str, src: str, dst: str) -> str:
    """A copy's label on its lane, the same in the estimates and in a measured run:
    ``"copy lv1 npu:0->dsp:0"``."""
    return f"copy {tensor} {src}->{dst}"


def ordered(lanes: Iterable[str], devices: Iterable[str] = ()) -> list[str]:
    """``lanes`` as a timeline shows them: each device's lane followed by its DMA lane,
    devices in the order of ``devices``, then of ``lanes``; each lane once.

    The measured timeline of the report's picture and the Chrome trace
    (:mod:`umahub.runtime.trace`) order their lanes by it.
    """
    lanes = list(dict.fromkeys(lanes))
    out: list[str] = []
    for device in dict.fromkeys([*devices, *(device_of(lane) for lane in lanes)]):
        out += [lane for lane in (device, dma_lane(device)) if lane in lanes]
    return out


class Lanes:
    """When each lane is next free (seconds from the start of the inference)."""

    def __init__(self) -> None:
        self.free: dict[str, float] = defaultdict(float)

    def book(self, lanes: Iterable[str], ready: float, seconds: float) -> float:
        """Take ``lanes`` for ``seconds`` from the first moment every one of them is free
        and ``ready`` has come; returns the start."""
        lanes = tuple(lanes)
        start = max([ready, *(self.free[lane] for lane in lanes)])
        for lane in lanes:
            self.free[lane] = start + seconds
        return start

    @property
    def end(self) -> float:
        """When the last lane is free: the end of everything booked (0 when nothing is)."""
        return max(self.free.values(), default=0.0)
