"""The report of a compilation, and its views.

:mod:`~umahub.report.report` is the data (where each operator runs and why,
what each hook did, copies, memory, time); :mod:`~umahub.report.picture` draws
it. :mod:`~umahub.report.lanes` is the model of the lanes one inference runs
on, which the picture's timeline and placement by cost's search both schedule
with.
"""

from __future__ import annotations

from umahub.report.report import PartitionReport, Report

__all__ = ["PartitionReport", "Report"]
