"""The ``umahub`` command: ``plugins``, ``compile``, ``run``, ``explain``.

Every error reaches the user as one line on stderr and exit status 2: a
mistake of the user's (:class:`umahub.errors.UmahubError`), a file that cannot
be read or written (``OSError``), and umahub's or a plugin's own bug alike (an
"internal error" line that asks for a report). ``-v`` or ``UMAHUB_DEBUG=1``
adds the traceback. A closed pipe (``umahub plugins | head``) ends the command
quietly; Ctrl-C ends it with status 130.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence

from umahub.cli.parser import build_parser
from umahub.errors import UmahubError

__all__ = ["build_parser", "main"]

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130
_TRUE = {"1", "true", "yes", "on"}


def _debug(args: object) -> bool:
    return bool(getattr(args, "verbose", False)) or (
        os.environ.get("UMAHUB_DEBUG", "").strip().lower() in _TRUE
    )


_VERBOSE = False  # -v: a warning's cause (a plugin's failure) with its traceback


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    text = str(message).removeprefix("umahub: ")
    print(f"umahub: warning: {text}", file=file or sys.stderr)
    cause = getattr(message, "cause", None)
    if _VERBOSE and cause is not None:
        shown = "".join(traceback.format_exception(cause)).rstrip()
        print("      " + shown.replace("\n", "\n      "), file=file or sys.stderr)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _describe(exc: BaseException) -> str:
    """The one line an exception becomes for the user."""
    if isinstance(exc, UmahubError):
        return f"umahub: error: {_one_line(str(exc))}"
    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename else ""
        return f"umahub: error: {where}{exc.strerror.lower()}"
    from umahub.errors import last_line

    return (
        f"umahub: internal error: {type(exc).__name__}: {_one_line(last_line(exc))} "
        "(this is a bug in umahub or a plugin: rerun with -v for the traceback, and report it)"
    )


def _closed_pipe() -> int:
    # Python flushes stdout at exit; with the reader gone that would fail again.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``umahub`` command; return its exit code."""
    import warnings

    warnings.showwarning = _show_warning
    args = build_parser().parse_args(argv)
    global _VERBOSE
    _VERBOSE = _debug(args)
    try:
        code = args.func(args)
        sys.stdout.flush()  # a block-buffered pipe fails here, not at exit (status 120)
        return code
    except BrokenPipeError:
        return _closed_pipe()
    except KeyboardInterrupt:
        print("umahub: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if _debug(args):
            traceback.print_exc()
        try:
            print(_describe(exc), file=sys.stderr)
        except BrokenPipeError:
            pass
        return EXIT_ERROR
