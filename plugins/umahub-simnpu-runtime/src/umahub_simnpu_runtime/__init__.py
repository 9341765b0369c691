"""umahub-simnpu-runtime: the runtime of the simnpu, a simulated NPU with memory of its own.

What a board installs next to umahub to run libraries compiled for the
``simnpu`` accelerator (compiler plugin ``umahub-simnpu``). It declares the
runtime ``simnpu`` (entry point group ``umahub.runtimes``) and imports numpy
and :mod:`umahub.plugin.device` only: no TVM, no compiler.

* :mod:`.isa`: the program format and instruction set (shared with the compiler plugin);
* :mod:`.native`: the simulator's C core (``sim.c``), loaded with ctypes,
  built at install or compiled on first use;
* :mod:`.memory`: the DRAM allocator (buffers are offsets);
* :mod:`.device`: :class:`SimNpuDevice` and :class:`SimNpuRuntime`;
* :mod:`.timing`: a program's timeline without running it (:func:`timing`, :class:`Timing`).
"""

from __future__ import annotations

from umahub_simnpu_runtime.device import (
    FAULT_ENV,
    LoadedProgram,
    SimNpuDevice,
    SimNpuRuntime,
)
from umahub_simnpu_runtime.timing import Timing, timing

__version__ = "0.1.0"

__all__ = [
    "FAULT_ENV",
    "LoadedProgram",
    "SimNpuDevice",
    "SimNpuRuntime",
    "Timing",
    "__version__",
    "timing",
]
