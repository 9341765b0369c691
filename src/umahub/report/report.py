"""The report of a compilation: its data, with its two views at hand.

``str(report)`` is the table a person reads (:mod:`umahub.report.text`);
``report.to_json()`` is the same as data (:mod:`umahub.report.data`);
``report.save_picture(path)`` draws the graph and a timeline
(:mod:`umahub.report.picture`). The data never imports a view: this class is
where they meet.
"""

from __future__ import annotations

from umahub.report.data import PartitionReport, ReportData, hooks_that_acted

__all__ = ["PartitionReport", "Report", "hooks_that_acted"]


class Report(ReportData):
    """Everything a compile decided, for people (``str``, a picture) and programs (``to_json``)."""

    def __str__(self) -> str:
        from umahub.report.text import render

        return render(self)

    def save_picture(self, path: str) -> str:
        """Draw the placement graph and the timeline to ``path`` (.svg or .html)."""
        from umahub.report.picture import save_picture

        return save_picture(self, path)
