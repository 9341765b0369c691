"""The test module that ``pytest --umahub-conformance=NAME`` adds to the session.

It holds one class, :class:`TestConformance`: :class:`ConformanceSuite`
without a marker, so its checks are parametrized by the accelerators that
``--umahub-conformance`` names and the models of ``--umahub-conformance-models``.
"""

from __future__ import annotations

from umahub.testing._suite import ConformanceSuite

__all__ = ["TestConformance"]


class TestConformance(ConformanceSuite):
    """The conformance checks for the accelerators named on the command line."""
