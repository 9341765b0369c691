"""Finding and reading the file that holds ``[tool.umahub]``.

:func:`find_config_file` gives ``$UMAHUB_CONFIG``, else the nearest
``pyproject.toml`` with a ``[tool.umahub]`` table from a directory upward
(:mod:`umahub.config` has the whole order). On the way up, a
``pyproject.toml`` that cannot be read or parsed is another tool's and is
skipped without a word, unless its text mentions ``tool.umahub``: then it is
ours, and a :class:`~umahub.errors.ConfigError` (going on without it would
compile with another configuration). Skipping quietly is deliberate: umahub
cannot fix another project's file, and a warning at every ``Hub()`` would be
noise about a file the user did not write for umahub.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from umahub.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = ["find_config_file", "read_toml"]


def find_config_file(start: Path | None = None) -> Path | None:
    """Return ``$UMAHUB_CONFIG``, else the nearest pyproject.toml with [tool.umahub], else None."""
    env = os.environ.get("UMAHUB_CONFIG")
    if env:
        path = Path(env)
        if not path.is_file():
            raise ConfigError(f"UMAHUB_CONFIG names {env!r}, which is not a file")
        return path
    directory = (start or Path.cwd()).resolve()
    for folder in (directory, *directory.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file() and _has_umahub_table(candidate):
            return candidate
    return None


#: Text that a ``[tool.umahub]`` table (or a ``tool.umahub`` dotted key) is written with.
_MENTIONS_UMAHUB = re.compile(r"""\btool\s*\.\s*["']?umahub\b""")


def _has_umahub_table(path: Path) -> bool:
    """Whether a pyproject.toml met on the way up holds ``[tool.umahub]``.

    A file that cannot be read or parsed is skipped (it is another tool's),
    unless its text mentions ``tool.umahub``: then it is an error.
    """
    try:
        raw = path.read_bytes()
    except OSError:
        return False
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        if _MENTIONS_UMAHUB.search(raw.decode("utf-8", errors="replace")):
            raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
        return False
    tool = data.get("tool")
    return isinstance(tool, Mapping) and "umahub" in tool


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}") from exc
