"""The test module that ``pytest --umahub-conformance=NAME`` adds to the session.

It holds :class:`TestConformance`: :class:`ConformanceSuite` without a
marker, so its checks are parametrized by the accelerators that
``--umahub-conformance`` names and the models of ``--umahub-conformance-models``;
and :class:`TestCrossConformance`, the check of those accelerators together,
kept only with ``--umahub-conformance-cross``.
"""

from __future__ import annotations

from umahub.testing._cross import CrossConformanceSuite
from umahub.testing._suite import ConformanceSuite

__all__ = ["TestConformance", "TestCrossConformance"]


class TestConformance(ConformanceSuite):
    """The conformance checks for the accelerators named on the command line."""


class TestCrossConformance(CrossConformanceSuite):
    """The accelerators named on the command line, together (``--umahub-conformance-cross``)."""
