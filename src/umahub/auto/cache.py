"""Measured costs on disk, so that the second compile of a model costs little.

One JSON file, ``costs-1.json``, in ``$UMAHUB_CACHE_DIR``, else
``$XDG_CACHE_HOME/umahub``, else ``~/.cache/umahub``. An entry's key is a
:func:`digest` of what its cost depends on (made by
:class:`umahub.auto.costs.Costs`): the group's structure and shapes, the
accelerator and its backend options in effect (``[tool.umahub.options]``),
the plugin's distribution and version, umahub's and TVM's versions, the source
files of umahub and of every plugin (:func:`code_fingerprint`: an edited
plugin in a development install keeps its version), the target, the thread
count and this machine's CPU (LLVM's name for it and its model: a home
directory shared by an Intel and an AMD machine keeps the costs of each
apart). A plugin upgrade or edit, another option, another CPU or another
thread count measures again.

The file is rewritten whole (a temporary file renamed over it), merged with
what another process wrote meanwhile, so concurrent compiles lose at most a
measurement, never the file. A damaged file is set aside with a warning and
the cache starts empty; a directory that cannot be written leaves the cache in
memory, with one warning.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from umahub.errors import warn

__all__ = ["CostCache", "cache_dir", "code_fingerprint", "digest"]

#: The file's format; another format is ignored (and rewritten).
FORMAT = 1
FILE = f"costs-{FORMAT}.json"


def cache_dir() -> Path:
    """Where umahub keeps what it measured (see the module's documentation)."""
    explicit = os.environ.get("UMAHUB_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "umahub"


def digest(*parts: Any) -> str:
    """A key made of ``parts`` (their text): for the cache's entries and for equal groups."""
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()[:32]


def code_fingerprint(objects: Iterable[Any]) -> str:
    """A digest of the Python files of the packages that define ``objects`` (modules,
    or plugin objects of a class): their paths, sizes and modification times.

    Stat calls only: no file is read. An object
    whose package has no files on disk (defined in ``__main__``, a notebook)
    adds its module's name.
    """
    digest = hashlib.sha256()
    roots = set()
    for obj in objects:
        name = obj.__name__ if isinstance(obj, type(sys)) else type(obj).__module__
        module = sys.modules.get(name.split(".")[0])
        path = getattr(module, "__file__", None)
        if path is None or name == "__main__":
            digest.update(name.encode())
            continue
        root = Path(path).parent if Path(path).name == "__init__.py" else Path(path)
        roots.add(root)
    for root in sorted(roots):
        files = sorted(root.rglob("*.py")) if root.is_dir() else [root]
        for file in files:
            try:
                stat = file.stat()
            except OSError:
                continue
            digest.update(f"{file}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


class CostCache:
    """The measured costs, keyed by fingerprint; ``hits`` and ``misses`` count look-ups."""

    def __init__(self, directory: Path | None = None):
        self.path = (directory or cache_dir()) / FILE
        self.entries: dict[str, Any] = self._read()
        self.new: dict[str, Any] = {}
        self.hits = 0
        self.misses = 0

    def _read(self) -> dict[str, Any]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            warn(f"cost cache {self.path} cannot be read ({exc.strerror}); measuring again")
            return {}
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise ValueError("not a umahub cost cache of this version")
            entries = data["entries"]
            if not isinstance(entries, dict):
                raise ValueError("its entries are not a table")
            return entries
        except (ValueError, KeyError) as exc:
            aside = self.path.with_name(self.path.name + ".damaged")
            try:
                os.replace(self.path, aside)
                kept = f"set aside as {aside.name}"
            except OSError:
                kept = "left as it is"
            warn(f"cost cache {self.path} is damaged ({exc}): {kept}; measuring again")
            return {}

    def get(self, key: str) -> Any:
        """The entry of ``key``, or None (counted as a hit or a miss)."""
        value = self.new.get(key, self.entries.get(key))
        if value is None:
            self.misses += 1
        else:
            self.hits += 1
        return value

    def put(self, key: str, value: Any) -> None:
        """Keep ``value`` for ``key``; written by :meth:`save`."""
        self.new[key] = value

    def save(self) -> None:
        """Write the new entries, merged with the file as it is now."""
        if not self.new:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            current = self._read() if self.path.exists() else {}
            current.update(self.new)
            fd, tmp = tempfile.mkstemp(prefix=".costs-", dir=self.path.parent)
            with os.fdopen(fd, "w") as out:
                json.dump({"format": FORMAT, "entries": current}, out, indent=0)
            os.replace(tmp, self.path)
            self.entries = current
            self.new = {}
        except OSError as exc:
            warn(
                f"cost cache {self.path} cannot be written ({exc.strerror or exc}); the costs "
                "measured now are kept for this process only (set UMAHUB_CACHE_DIR to a "
                "writable directory)"
            )
