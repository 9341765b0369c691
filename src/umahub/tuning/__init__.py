"""Tuning the host's kernels with TVM's MetaSchedule, and using what measured faster.

``umahub tune MODEL`` (:meth:`umahub.Hub.tune`) takes the kernels a compile of
the model schedules on the host (the very PrimFuncs: :mod:`umahub.tuning.tasks`
runs the compile and collects them), searches MetaSchedule's design space of
each (:mod:`umahub.tuning.search`), measures the candidates and the schedule
the compile would otherwise give (the ``umahub_host_schedule`` hook's or
umahub's own) on this machine or on the boards of a tracker
(:mod:`umahub.tuning.runners`), and writes a verdict per kernel into a
database (:mod:`umahub.tuning.database`). ``compile`` with ``[tool.umahub]
tuning-database = "..."`` then uses a tuned kernel only where it measured
faster (:mod:`umahub.tuning.lookup`).
"""

from __future__ import annotations

from umahub.tuning.database import TuningDatabase, TuningError
from umahub.tuning.tune import TuningResult, tune

__all__ = ["TuningDatabase", "TuningError", "TuningResult", "tune"]
