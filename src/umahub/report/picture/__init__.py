"""The report as a picture: the placement graph and a timeline estimate of one inference.

``save_picture(report, "model.svg")`` writes one SVG: on top the model's
operators in model order, grouped into partition boxes and coloured by the
device they run on, with every copy drawn as a labelled marker (bytes, sync or
async) in front of the group that receives it; below, one inference as a
timeline, one lane per device and one DMA lane per accelerator whose pools are
filled asynchronously; last, a bar per memory pool.
``save_picture(report, "model.html")`` writes the same SVG inside a page, with
a legend and the report's text table.

The modules, each importing only those above it:

* :mod:`~umahub.report.picture.svg`: SVG primitives (escaping, text, numbers, colours);
* :mod:`~umahub.report.picture.groups`: groups of operators and which copy feeds which;
* :mod:`~umahub.report.picture.timeline`: the cost model and the schedule (no drawing);
* :mod:`~umahub.report.picture.layout`: where the graph's boxes go;
* :mod:`~umahub.report.picture.graph`: drawing the placement graph;
* :mod:`~umahub.report.picture.charts`: drawing the timeline, memory bars, legend;
* :mod:`~umahub.report.picture.render`: the whole SVG or HTML page, and the file.

This package never imports :mod:`umahub.report.report` (it takes a report and reads it).
"""

from __future__ import annotations

from umahub.report.picture.render import SUFFIXES, render_html, render_svg, save_picture
from umahub.report.picture.svg import device_colours
from umahub.report.picture.timeline import (
    ACCELERATOR_FLOPS,
    BANDWIDTH,
    DEFAULT_FLOPS,
    HOST_FLOPS,
    OTHER_FLOPS,
    Span,
    estimate_flops,
    timeline,
)

__all__ = [
    "ACCELERATOR_FLOPS",
    "BANDWIDTH",
    "DEFAULT_FLOPS",
    "HOST_FLOPS",
    "OTHER_FLOPS",
    "SUFFIXES",
    "Span",
    "device_colours",
    "estimate_flops",
    "render_html",
    "render_svg",
    "save_picture",
    "timeline",
]
