"""The errors umahub raises: each names the culprit and says what to do.

Every error is a :class:`UmahubError`, so ``except umahub.errors.UmahubError``
catches all of them; the subclasses say which stage refused the input.
"""

from __future__ import annotations

import difflib
import sys
import warnings
from collections.abc import Iterable
from types import FrameType

__all__ = [
    "CompileError",
    "ConfigError",
    "HookTimeoutError",
    "MemoryPoolError",
    "PlacementError",
    "PluginConflictError",
    "PluginLoadError",
    "PluginOutputError",
    "UmahubError",
    "UmahubWarning",
    "UnknownModelError",
    "UnsupportedOperatorError",
    "VerificationError",
    "did_you_mean",
    "last_line",
    "warn",
]


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """Return ``" (did you mean 'x'?)"`` for the closest candidate, or ``""``.

    Used by every "unknown name" message so that a typo is answered with its fix.
    A candidate that starts with the word (``beta`` -> ``beta_accel``) is the
    closest; otherwise the most similar spelling, if it is similar enough.
    """
    options = sorted(set(candidates))
    prefixed = [c for c in options if c.startswith(word) and c != word] if word else []
    matches = prefixed[:1] or difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f" (did you mean '{matches[0]}'?)" if matches else ""


class UmahubWarning(UserWarning):
    """A problem umahub worked around (a skipped plugin, a partition sent back to the host)."""


def last_line(exc: BaseException) -> str:
    """The last line of an exception's message ("" when it has none).

    TVM's errors carry a long C++ trace first; the last line says what went wrong.
    """
    text = str(exc).strip()
    return text.splitlines()[-1] if text else ""


def warn(message: str) -> None:
    """Warn with an :class:`UmahubWarning` pointing at the user's line.

    The warning is attributed to the first frame outside umahub (the user's
    ``hub.compile(...)`` or ``Hub()``), whatever the depth it was raised at.
    """
    frame: FrameType | None = sys._getframe(1)
    level = 2  # stacklevel 1 is this function, 2 its caller
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith("umahub"):
        frame, level = frame.f_back, level + 1
    warnings.warn(f"umahub: {message}", UmahubWarning, stacklevel=level)


class UmahubError(Exception):
    """Base class of every error umahub raises on purpose."""


class ConfigError(UmahubError):
    """``[tool.umahub]`` (or a ``config=`` dict) has an unknown key, name or a wrong type."""


class PluginLoadError(UmahubError):
    """A plugin could not be loaded: import failure, bad hook, unsupported API.

    Attributes name the plugin and its distribution; ``__cause__`` holds the
    original exception where there was one.
    """

    def __init__(self, plugin: str, distribution: str | None, reason: str):
        self.plugin = plugin
        self.distribution = distribution
        self.reason = reason
        where = f" (distribution {distribution})" if distribution else ""
        super().__init__(f"plugin '{plugin}'{where}: {reason}")


class PluginConflictError(UmahubError):
    """Two plugins claim the same plugin name or the same accelerator name."""


class CompileError(UmahubError):
    """A stage of the compile pipeline failed; the message names stage, plugin and hook."""


class UnsupportedOperatorError(CompileError):
    """An accelerator claimed an operator that its lowering cannot handle."""


class PlacementError(CompileError):
    """A pin or a placement constraint cannot be honoured (e.g. conflicting memory scopes)."""


class MemoryPoolError(CompileError):
    """A partition does not fit the memory pool of the accelerator it was placed on."""


class UnknownModelError(UmahubError, LookupError):
    """A model name that the model zoo does not know."""


class PluginOutputError(CompileError):
    """A hook returned something its specification does not allow.

    See :mod:`umahub.hub.contract` for what each hook may return.
    """


class HookTimeoutError(CompileError):
    """A plugin's hooks took longer than ``hook-timeout`` for one partition or accelerator."""


class VerificationError(CompileError):
    """A partition's outputs differ from the host's lowering of the same operators."""
