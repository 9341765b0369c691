"""Finding and loading plugins: entry points, ``UMAHUB_PLUGINS``, objects given in code.

A plugin is found in one of three ways, in this order:

* an entry point of the group ``umahub.plugins`` (sorted by entry-point name,
  never by the order in which the file system lists distributions), unless
  ``UMAHUB_DISABLE_PLUGIN_AUTOLOAD`` is true (``1``, ``true``, ``yes``, ``on``,
  in any case; ``0``, ``false``, ``no``, ``off`` and empty are false, and any
  other value is taken as true, with a warning: the variable was set to
  disable) or ``Hub(autoload=False)``;
* a name in ``UMAHUB_PLUGINS=a,b``: an entry-point name, else a module to import
  (loaded even when autoload is off);
* an object or module passed as ``Hub(plugins=[...])``.

Finding is cheap: a plugin's module is imported only by :func:`load`, when a
:class:`umahub.Hub` is made. A plugin that fails to load is recorded with its
error in a :class:`PluginInfo` and skipped (or stops the hub in strict mode).
"""

from __future__ import annotations

import functools
import importlib
import os
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from importlib import metadata as importlib_metadata
from typing import Any

from umahub.config import Config
from umahub.errors import PluginConflictError, did_you_mean, warn
from umahub.plugin.markers import API_VERSION, SUPPORTED_API_VERSIONS

__all__ = [
    "AUTOLOAD_VARIABLE",
    "ENTRY_POINT_GROUP",
    "Candidate",
    "PluginInfo",
    "env_flag",
    "find",
    "load",
    "select",
]

ENTRY_POINT_GROUP = "umahub.plugins"


class Distribution:
    """The installed distribution a plugin came from; its metadata is read when first asked.

    Reading METADATA parses an e-mail style header block, which costs more
    than the rest of discovery, and it is only needed for display.
    """

    def __init__(self, dist: Any):
        self._dist = dist

    @functools.cached_property
    def name(self) -> str:
        """The distribution's name."""
        return str(self._dist.name)

    @functools.cached_property
    def version(self) -> str:
        """The distribution's version."""
        return str(self._dist.version)


class _FromDistribution:
    """``distribution`` and ``version`` properties over a lazily read :class:`Distribution`."""

    dist: Distribution | None

    @property
    def distribution(self) -> str | None:
        """The distribution's name, or None for a plugin not installed as one."""
        return self.dist.name if self.dist is not None else None

    @property
    def version(self) -> str | None:
        """The distribution's version, or None."""
        return self.dist.version if self.dist is not None else None


@dataclass(frozen=True)
class Candidate(_FromDistribution):
    """A plugin found but not yet imported."""

    name: str
    origin: str  # "entry point", "UMAHUB_PLUGINS" or "Hub(plugins=...)"
    load: Callable[[], Any] = field(repr=False, compare=False)
    dist: Distribution | None = field(default=None, repr=False, compare=False)
    target: str = ""  # "module:attr" for messages


@dataclass(frozen=True)
class PluginInfo(_FromDistribution):
    """What ``hub.plugins`` and ``umahub plugins`` show of one plugin.

    Attributes:
        name: the plugin's name (its entry-point name, or module name).
        distribution, version: the installed package it came from, if any.
        origin: how it was found.
        api_version: its ``UMAHUB_API``; None when it does not say.
        accelerators: names of the accelerators it declares.
        hooks: names of the hooks it implements.
        error: why it was not loaded; None when it was.
        traceback: the cause's traceback, for ``umahub plugins``.
        obj: the loaded module or object.
    """

    name: str
    origin: str
    dist: Distribution | None = field(default=None, repr=False, compare=False)
    target: str = ""
    api_version: int | None = None
    accelerators: tuple[str, ...] = ()
    hooks: tuple[str, ...] = ()
    error: str | None = None
    traceback: str | None = field(default=None, repr=False)
    obj: Any = field(default=None, repr=False, compare=False)

    @property
    def loaded(self) -> bool:
        """True when the plugin is in use."""
        return self.error is None

    def failed(self, error: str, exc: BaseException | None = None) -> PluginInfo:
        """Return a copy marked as not loaded, because of ``error``."""
        tb = "".join(traceback.format_exception(exc)) if exc is not None else None
        return replace(self, error=error, traceback=tb)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``umahub plugins --json``)."""
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "origin": self.origin,
            "target": self.target,
            "api_version": self.api_version,
            "accelerators": list(self.accelerators),
            "hooks": list(self.hooks),
            "loaded": self.loaded,
            "error": self.error,
            "traceback": self.traceback,
        }


AUTOLOAD_VARIABLE = "UMAHUB_DISABLE_PLUGIN_AUTOLOAD"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def env_flag(name: str) -> bool:
    """The environment variable ``name`` as a yes/no switch (see the module docs)."""
    value = os.environ.get(name, "")
    spelled = value.strip().lower()
    if spelled in _TRUE:
        return True
    if spelled not in _FALSE:
        warn(
            f"{name}={value!r} is neither true ({', '.join(_TRUE)}) nor false "
            f"({', '.join(_FALSE[:-1])} or empty); taken as true, since it is set"
        )
    return spelled not in _FALSE


def _autoload_enabled(autoload: bool) -> bool:
    return autoload and not env_flag(AUTOLOAD_VARIABLE)


def _entry_point_candidates() -> dict[str, list[Candidate]]:
    found: dict[str, list[Candidate]] = {}
    for ep in importlib_metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist
        found.setdefault(ep.name, []).append(
            Candidate(
                name=ep.name,
                origin="entry point",
                load=ep.load,
                dist=Distribution(dist) if dist is not None else None,
                target=ep.value,
            )
        )
    return found


def _object_name(obj: Any) -> str:
    name = getattr(obj, "UMAHUB_NAME", None) or getattr(obj, "__name__", None)
    return name or type(obj).__name__


def _given(obj: Any) -> Any:
    """A plugin object given in code: loading it is having it."""
    return obj


def find(autoload: bool = True, objects: Sequence[Any] = ()) -> list[Candidate]:
    """Find every plugin candidate (see module docs), entry points sorted by name.

    Entry points that share a name are all returned; :func:`select` reports the
    conflict if both survive the configuration.
    """
    entry_points = _entry_point_candidates()
    candidates: list[Candidate] = []
    if _autoload_enabled(autoload):
        for name in sorted(entry_points):
            candidates.extend(entry_points[name])
    listed = [n.strip() for n in os.environ.get("UMAHUB_PLUGINS", "").split(",") if n.strip()]
    for name in listed:
        if any(c.name == name for c in candidates):
            continue
        if name in entry_points:
            candidates.extend(replace(c, origin="UMAHUB_PLUGINS") for c in entry_points[name])
        else:
            candidates.append(
                Candidate(
                    name,
                    "UMAHUB_PLUGINS",
                    functools.partial(importlib.import_module, name),
                    target=name,
                )
            )
    for obj in objects:
        candidates.append(
            Candidate(_object_name(obj), "Hub(plugins=...)", functools.partial(_given, obj))
        )
    return candidates


def select(candidates: Iterable[Candidate], config: Config) -> list[Candidate]:
    """Apply ``plugins`` (allowlist and order) and ``disable``; refuse name clashes.

    ``disable`` names plugins or distributions (``"umahub-dsp"``): the latter
    chooses between two distributions that install one plugin name.
    Objects given in code are kept even when the allowlist does not name them
    (the code asked for them), after the allowlisted ones.
    """
    candidates = list(candidates)
    disabled = set(config.disable)
    # Distribution names are read (from metadata) only if disable names something else.
    by_distribution = disabled - {c.name for c in candidates}
    candidates = [
        c
        for c in candidates
        if c.name not in disabled
        and not (by_distribution and c.dist is not None and c.distribution in by_distribution)
    ]
    if config.plugins is not None:
        rank = {name: i for i, name in enumerate(config.plugins)}
        kept = [c for c in candidates if c.name in rank or c.origin == "Hub(plugins=...)"]
        candidates = sorted(kept, key=lambda c: rank.get(c.name, len(rank)))
    by_name: dict[str, Candidate] = {}
    for c in candidates:
        if c.name in by_name:
            other = by_name[c.name]
            raise PluginConflictError(
                f"two plugins are named '{c.name}': {_describe(other)} and {_describe(c)}; "
                f"uninstall one, or disable one by its distribution: [tool.umahub] "
                f"disable = [{_disable_hint(c, other)}]"
            )
        by_name[c.name] = c
    return candidates


def _disable_hint(c: Candidate, other: Candidate) -> str:
    """What to write in ``disable`` to keep one of two same-named plugins: a distribution."""
    names = [x.distribution for x in (c, other) if x.distribution]
    return f'"{names[0]}"' if names else "..."


def _describe(c: Candidate) -> str:
    if c.distribution:
        return f"distribution {c.distribution} {c.version} ({c.target})"
    return f"{c.origin} {c.target or c.name}"


def load(candidate: Candidate) -> PluginInfo:
    """Import one plugin and check the contract version it states.

    Never raises for a broken plugin: the returned :class:`PluginInfo` carries
    the error instead (``info.loaded`` is False).
    """
    info = PluginInfo(
        name=candidate.name,
        origin=candidate.origin,
        dist=candidate.dist,
        target=candidate.target,
    )
    try:
        obj = candidate.load()
    except Exception as exc:  # any failure of third-party import code is the plugin's
        return info.failed(
            f"failed to import {candidate.target or candidate.name}: {type(exc).__name__}: {exc}",
            exc,
        )
    api = getattr(obj, "UMAHUB_API", None)
    info = replace(info, obj=obj, api_version=api)
    if api is None:
        where = candidate.target or f"the class of {_object_name(obj)}"
        warn(
            f"plugin '{info.name}' does not say which hook contract it was written for: "
            f"add UMAHUB_API = {API_VERSION} to {where}"
        )
    if api is not None and api not in SUPPORTED_API_VERSIONS:
        return info.failed(
            f"written for hook contract UMAHUB_API = {api!r}, but this umahub speaks "
            f"{', '.join(map(str, sorted(SUPPORTED_API_VERSIONS)))}; upgrade the plugin "
            f"(or umahub) so that they agree"
        )
    return info


def unknown_hook_message(attr: str, known: Iterable[str]) -> str:
    """The error for a hookimpl whose name matches no hook specification."""
    return (
        f"hook implementation '{attr}' matches no umahub hook{did_you_mean(attr, known)}; "
        f"umahub (API {API_VERSION}) has: {', '.join(sorted(known))}"
    )
