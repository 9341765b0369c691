"""The report of a compilation, and its views.

:mod:`~umahub.report.data` is the data (where each operator runs and why,
what each hook did, copies, memory, time); :mod:`~umahub.report.text` writes
it as text and :mod:`~umahub.report.picture` draws it;
:class:`~umahub.report.report.Report` joins them.
"""

from __future__ import annotations

from umahub.report.report import PartitionReport, Report

__all__ = ["PartitionReport", "Report"]
