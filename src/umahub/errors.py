"""The errors umahub raises: each names the culprit and says what to do.

Every error is a :class:`UmahubError`, so ``except umahub.errors.UmahubError``
catches all of them; the subclasses say which stage refused the input.
"""

from __future__ import annotations

import difflib
import re
import sys
import warnings
from collections.abc import Iterable, Sequence
from contextvars import ContextVar
from types import FrameType
from typing import Any

__all__ = [
    "USER_LINE",
    "CompileError",
    "ConfigError",
    "ExecutionError",
    "HookTimeoutError",
    "MemoryPoolError",
    "PatternCheckFailure",
    "PlacementError",
    "PluginConflictError",
    "PluginFailure",
    "PluginLoadError",
    "PluginOutputError",
    "QuantizationError",
    "UmahubError",
    "UmahubWarning",
    "UnknownModelError",
    "UnsupportedOperatorError",
    "VerificationError",
    "did_you_mean",
    "last_line",
    "message_line",
    "user_line",
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
    """A problem umahub worked around (a skipped plugin, a partition sent back to the host).

    Attributes:
        cause: the exception behind it (a plugin's failure), or None.
    """

    cause: BaseException | None = None


def last_line(exc: BaseException) -> str:
    """The last line of an exception's message ("" when it has none).

    TVM's errors carry a long C++ trace first; the last line says what went wrong.
    """
    text = str(exc).strip()
    return text.splitlines()[-1] if text else ""


_TRACE_LINE = re.compile(r'^(Traceback \(most recent call last\):|\s+File "|\s*\d+: |\s+at )')


def message_line(exc: BaseException) -> str:
    """The first meaningful line of an exception's message ("" when it has none).

    TVM 0.27 puts its message first and may follow it with printed IR; older
    TVMs put a C++ trace first: the first line that is not a trace's.
    """
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return next((line for line in lines if not _TRACE_LINE.match(line)), lines[-1] if lines else "")


#: The user's line that started the work of a worker thread (a hook under
#: ``hook-timeout``, :func:`umahub.hub.timelimit.within`): where a warning raised
#: on that thread points, since the thread's own stack starts in ``threading``.
USER_LINE: ContextVar[tuple[str, int, dict[str, Any]] | None] = ContextVar(
    "umahub_user_line", default=None
)


def _first_outside(frame: FrameType | None) -> tuple[FrameType | None, int]:
    """The first frame from ``frame`` outwards that is not umahub's, and how many
    frames out it is (0: ``frame`` itself)."""
    depth = 0
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith("umahub"):
        frame, depth = frame.f_back, depth + 1
    return frame, depth


def user_line() -> tuple[str, int, dict[str, Any]] | None:
    """(file, line, module globals) of the user's code that called into umahub on this
    thread, or the line a worker thread was started for (:data:`USER_LINE`)."""
    frame, _ = _first_outside(sys._getframe(1))
    if frame is None or frame.f_globals.get("__name__") == "threading":
        return USER_LINE.get()
    return frame.f_code.co_filename, frame.f_lineno, frame.f_globals


def warn(message: str, cause: BaseException | None = None) -> None:
    """Warn with an :class:`UmahubWarning` pointing at the user's line.

    The warning is attributed to the first frame outside umahub (the user's
    ``hub.compile(...)`` or ``Hub()``), whatever the depth it was raised at,
    also on a worker thread that runs a hook (its user's line is the one that
    started the work). ``cause``: the exception behind it, kept as the
    warning's ``cause`` (``umahub -v`` prints its traceback).
    """
    warning = UmahubWarning(f"umahub: {message}")
    warning.cause = cause
    frame, depth = _first_outside(sys._getframe(1))
    started = USER_LINE.get()
    if (frame is None or frame.f_globals.get("__name__") == "threading") and started:
        filename, lineno, module_globals = started
        warnings.warn_explicit(
            warning,
            UmahubWarning,
            filename,
            lineno,
            module=str(module_globals.get("__name__", "")),
            registry=module_globals.setdefault("__warningregistry__", {}),
            module_globals=module_globals,
        )
        return
    warnings.warn(warning, stacklevel=depth + 2)  # 1 is this function, 2 its caller


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


class QuantizationError(UmahubError, ValueError):
    """A model's quantization is malformed (a scale that is not a positive number, a zero
    point outside its type: the message names the node), or a model or calibration set
    that :func:`umahub.models.quantize.quantize_static` cannot quantize (it says why)."""


class UnknownModelError(UmahubError, LookupError):
    """A model name that the model zoo does not know."""


class PluginOutputError(CompileError):
    """A hook returned something its specification does not allow.

    See :mod:`umahub.hub.contract` for what each hook may return.
    """


class PluginFailure(CompileError):
    """A plugin's code failed: which plugin, in which hook, on which partition.

    Raised where umahub knows whose code failed: the traced call of a hook
    implementation (:mod:`umahub.hub.tracing`), the contract check of what a
    hook returned, a time limit that expired while a hook ran. The original
    exception is ``cause``, also chained as ``__cause__``. Like pluggy's
    ``PluginValidationError`` and its ``plugin``, the blame is a field of this
    exception, never set on another one. The stages catch it to name the
    plugin in their messages, and give ``cause`` as the cause of their own error.

    It wraps the original rather than being attached to it: the original may
    be TVM's or a plugin's own type, possibly re-raised by TVM's FFI (which
    keeps no attributes set on an exception), and one ``except PluginFailure``
    finds the culprit wherever the failure came from. It is a
    :class:`CompileError`, so ``except CompileError`` (and ``except
    UmahubError``) still catch a plugin's failure; the type that says what went
    wrong (:class:`PluginOutputError`, :class:`HookTimeoutError`, a plugin's
    ``ValueError``) is the type of ``cause``.

    Attributes:
        plugin: the name of the plugin at fault.
        hook: the hook whose implementation failed (or returned what failed its check).
        partition: the symbol of the partition the hook was called for; None
            where that is not known.
        cause: the original exception.
    """

    def __init__(
        self, plugin: str, hook: str, cause: BaseException, partition: str | None = None
    ) -> None:
        self.plugin = plugin
        self.hook = hook
        self.partition = partition
        self.cause = cause
        self.__cause__ = cause  # also when recorded rather than raised ``from`` it
        on = f" for partition {partition}" if partition else ""
        super().__init__(f"plugin '{plugin}' failed in {hook}{on}: {type(cause).__name__}: {cause}")

    @classmethod
    def of(cls, exc: BaseException, plugin: str, hook: str) -> PluginFailure:
        """``exc`` as a plugin failure: itself if it is one (its blame stands), else
        a failure of ``plugin``'s ``hook`` caused by ``exc``.

        For a stage that calls one hook: an exception that the traced call did
        not blame (umahub's own code around the call) is blamed on the plugin
        the stage asked.
        """
        return exc if isinstance(exc, PluginFailure) else cls(plugin, hook, exc)


class PatternCheckFailure(PluginFailure):
    """The check of a pattern (from ``umahub_patterns``) raised on a match.

    Recorded, not raised: the match is refused and its operators go on to the
    next claimant or the host (see :class:`umahub.compiler.placement.CheckFailures`).

    Attributes:
        pattern: the pattern's name.
        nodes: the node names of the operators in the match.
    """

    def __init__(
        self, plugin: str, pattern: str, nodes: Sequence[str], cause: BaseException
    ) -> None:
        self.pattern = pattern
        self.nodes = tuple(nodes)
        super().__init__(plugin, "umahub_patterns", cause)


class HookTimeoutError(CompileError):
    """A plugin's hooks took longer than ``hook-timeout`` for one partition or accelerator.

    When a traced hook was running, it is the cause of a :class:`PluginFailure` naming it.
    """


class ExecutionError(UmahubError):
    """A run failed: a step of the concurrent executor, or a device (its runtime's error,
    or no completion in time), named with its accelerator, instance and partition."""


class VerificationError(CompileError):
    """A partition's outputs differ from the host's lowering of the same operators."""
