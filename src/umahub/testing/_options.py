"""The kit's options as a test sees them: the session of the run, the marker, the targets.

Shared by the per-accelerator suite (:mod:`umahub.testing._suite`), the
cross-accelerator suite (:mod:`umahub.testing._cross`) and the pytest hooks
(:mod:`umahub.testing._plugin`), which import it; it imports neither.
"""

from __future__ import annotations

from typing import Any

import pytest

from umahub.testing._session import ConformanceSession, Target, UsageProblem

__all__ = ["MARKER", "SESSION_KEY", "session_of", "suite_options"]

#: Where the :class:`ConformanceSession` of a run lives: ``config.stash[SESSION_KEY]``.
SESSION_KEY = pytest.StashKey[ConformanceSession]()

MARKER = "umahub_conformance"


def session_of(config: pytest.Config) -> ConformanceSession:
    """The kit's :class:`ConformanceSession` of this pytest run."""
    return config.stash[SESSION_KEY]


def _names(value: Any) -> list[str]:
    if isinstance(value, str):
        return [n.strip() for n in value.split(",") if n.strip()]
    return [str(v) for v in value]


def suite_options(node: Any, config: pytest.Config) -> tuple[list[Target], list[str], int]:
    """``(accelerators, models, examples)`` for a test: its marker's, else the options'.

    Raises:
        UsageProblem: no accelerator named anywhere, or a name that does not resolve.
    """
    session = session_of(config)
    marker = node.get_closest_marker(MARKER)
    if marker is not None:
        names = marker.kwargs.get("accelerator", marker.args[0] if marker.args else None)
        if not names:
            raise UsageProblem(
                f"@pytest.mark.{MARKER}(...) needs accelerator='name' (an accelerator or a plugin)"
            )
        targets = session.resolve(_names(names), f"@pytest.mark.{MARKER}(accelerator)")
        models = marker.kwargs.get("models")
        models = session.models(
            None if models is None else _names(models), f"@pytest.mark.{MARKER}(models)"
        )
        examples = int(marker.kwargs.get("examples", session.examples))
        return targets, models, examples
    if not session.names:
        raise UsageProblem(
            f"no accelerator to check: run pytest with --umahub-conformance=NAME "
            f"or mark the test class with @pytest.mark.{MARKER}(accelerator=...)"
        )
    return session.targets, session.models(), session.examples
