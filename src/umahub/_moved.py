"""Old import paths of modules that moved into subpackages, kept for one release.

Before umahub 0.2 the modules were one flat folder; from 0.2 on they are in
subpackages by subsystem (``umahub.hookspecs`` is :mod:`umahub.plugin.hookspecs`). Code
that imports an old name gets the very module of the new one (not a copy: a
patch of one is a patch of the other) and a :class:`DeprecationWarning` naming
the new path. ``python -m umahub.board`` still runs the board's server.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any

__all__ = ["MOVED", "install", "new_name"]

#: Old dotted name -> new one. A package's submodules move with it.
MOVED = {
    "umahub.markers": "umahub.plugin.markers",
    "umahub.hookspecs": "umahub.plugin.hookspecs",
    "umahub.accelerator": "umahub.plugin.accelerator",
    "umahub.context": "umahub.plugin.context",
    "umahub.patterns": "umahub.plugin.patterns",
    "umahub.compat": "umahub.plugin.compat",
    "umahub.memory": "umahub.plugin.memory",
    "umahub.loading": "umahub.hub.loading",
    "umahub.dispatch": "umahub.hub.dispatch",
    "umahub.contract": "umahub.hub.contract",
    "umahub.tracing": "umahub.hub.tracing",
    "umahub.timelimit": "umahub.hub.timelimit",
    "umahub.pipeline": "umahub.compiler.pipeline",
    "umahub.compilation": "umahub.compiler.compilation",
    "umahub.stages": "umahub.compiler.stages",
    "umahub.placement": "umahub.compiler.placement",
    "umahub.composites": "umahub.compiler.composites",
    "umahub.vdevice": "umahub.compiler.vdevice",
    "umahub.codegen": "umahub.compiler.codegen",
    "umahub.tir_phases": "umahub.compiler.tir_phases",
    "umahub.relax_pipeline": "umahub.compiler.relax_pipeline",
    "umahub.tvm_backend": "umahub.compiler.tvm_backend",
    "umahub.operators": "umahub.compiler.operators",
    "umahub.lowering": "umahub.compiler.lowering",
    "umahub.host_lowering": "umahub.host.lowering",
    "umahub.host_schedules": "umahub.host.schedules",
    "umahub.host_matmul": "umahub.host.matmul",
    "umahub.host_conv": "umahub.host.conv",
    "umahub.scratch": "umahub.host.scratch",
    "umahub.storage_plan": "umahub.host.storage_plan",
    "umahub.prepack": "umahub.host.prepack",
    "umahub.folding": "umahub.host.folding",
    "umahub.compiled": "umahub.runtime.compiled",
    "umahub.running": "umahub.runtime.running",
    "umahub.executor": "umahub.runtime.executor",
    "umahub.steps": "umahub.runtime.steps",
    "umahub.step_functions": "umahub.runtime.step_functions",
    "umahub.threadpool": "umahub.runtime.threadpool",
    "umahub.rpc": "umahub.boards.rpc",
    "umahub.board": "umahub.boards.board",
    "umahub.bench": "umahub.boards.bench",
    "umahub.picture": "umahub.report.picture",
    "umahub.auto.text": "umahub.report.text",
}


def new_name(old: str) -> str | None:
    """The new dotted name of the module ``old``, or None when it did not move."""
    head = old
    while head:
        if head in MOVED:
            return MOVED[head] + old[len(head) :]
        head = head.rpartition(".")[0]
    return None


def _warn(old: str, new: str) -> None:
    warnings.warn(
        f"{old} is now {new}; the old name goes away in the release after next",
        DeprecationWarning,
        stacklevel=4,
    )


class _Alias(importlib.abc.Loader):
    """Loads an old name as the module of its new one."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def create_module(self, spec: Any) -> ModuleType:
        _warn(self.old, self.new)
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system set the old name's spec on the shared module: give it its own back.
        module.__spec__ = self._spec

    def get_code(self, fullname: str) -> Any:
        """The new module's code, for ``python -m <old name>``."""
        _warn(self.old, self.new)
        spec = importlib.util.find_spec(self.new)
        return spec.loader.get_code(self.new)  # type: ignore[union-attr]

    def is_package(self, fullname: str) -> bool:
        spec = importlib.util.find_spec(self.new)
        return spec is not None and spec.submodule_search_locations is not None


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        new = new_name(fullname)
        if new is None:
            return None
        # the new module's file as the old name's origin: ``python -m <old name>`` sets
        # sys.argv[0] to it, and TVM's import reads sys.argv[0] (None would crash it)
        found = importlib.util.find_spec(new)
        origin = found.origin if found is not None else None
        return importlib.util.spec_from_loader(fullname, _Alias(fullname, new), origin=origin)


def install() -> None:
    """Put the finder of old names on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())  # before the path finder, which would load a copy
