"""``umahub --version``: umahub, TVM, Python and every installed plugin, without importing TVM."""

from __future__ import annotations

import platform
from importlib import metadata as importlib_metadata

__all__ = ["version_text"]


def _version(distribution: str) -> str:
    try:
        return importlib_metadata.version(distribution)
    except importlib_metadata.PackageNotFoundError:
        return "not installed"


def version_text() -> str:
    """The versions, one per line; plugins as their entry points name them (none imported)."""
    from umahub import __version__
    from umahub.hub.loading import ENTRY_POINT_GROUP

    lines = [
        f"umahub {__version__}",
        f"apache-tvm {_version('apache-tvm')} (apache-tvm-ffi {_version('apache-tvm-ffi')})",
        f"Python {platform.python_version()} ({platform.python_implementation()}, "
        f"{platform.machine()})",
    ]
    plugins = sorted(importlib_metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
    lines.append(f"plugins ({ENTRY_POINT_GROUP}):" + ("" if plugins else " none installed"))
    for ep in plugins:
        dist = ep.dist
        where = f"{dist.name} {dist.version}" if dist is not None else ep.value
        lines.append(f"  {ep.name:<16} {where}")
    return "\n".join(lines)
