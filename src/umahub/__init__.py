"""umahub: accelerator backends for Apache TVM as installable plugins.

The public API (everything else is internal)::

    import umahub

    hub = umahub.Hub()                 # load plugins, read [tool.umahub]
    compiled = hub.compile(mod)        # a Relax IRModule with "main"
    outputs = compiled.run(*arrays)    # numpy in, numpy out
    compiled.export_library("model.so")
    umahub.load("model.so").run(*arrays)
    with umahub.remote(tracker="farm:9190", key="rk3588") as board:   # TVM's RPC
        board.load("model.so").run(*arrays)

For plugin authors: :data:`hookimpl` (``@umahub.hookimpl(accelerator="npu")``
for a hook of one accelerator), :class:`Accelerator`, :class:`MemoryPool`,
:class:`Refusal` (a pattern check's "no", with its reason), the hook contract
in :mod:`umahub.plugin.hookspecs`, and :data:`API_VERSION`. Everything a plugin
may use is in :mod:`umahub.plugin`, the one package a plugin imports.

``import umahub`` does not import TVM nor any plugin: both happen when they are
first needed (a :class:`Hub` is made, a model compiled).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from umahub import _moved, errors
from umahub.errors import UmahubError, UmahubWarning
from umahub.hub import Hub
from umahub.plugin.accelerator import Accelerator, MemoryPool
from umahub.plugin.markers import API_VERSION, hookimpl, hookspec
from umahub.plugin.patterns import Refusal
from umahub.runtime.threadpool import spin_briefly

spin_briefly()  # before TVM's first thread pool starts (none of the above imports TVM)
_moved.install()

if TYPE_CHECKING:
    from umahub.boards.rpc import remote
    from umahub.compiler.placement import annotate
    from umahub.compiler.vdevice import VirtualDevice
    from umahub.plugin.context import CompileContext, CostContext
    from umahub.runtime.compiled import Compiled, load

__version__ = "0.1.0"

__all__ = [
    "API_VERSION",
    "Accelerator",
    "CompileContext",
    "Compiled",
    "CostContext",
    "Hub",
    "MemoryPool",
    "Refusal",
    "UmahubError",
    "UmahubWarning",
    "VirtualDevice",
    "__version__",
    "annotate",
    "errors",
    "hookimpl",
    "hookspec",
    "load",
    "remote",
]

# Names whose modules import TVM: resolved on first use.
_LAZY = {
    "Compiled": "umahub.runtime.compiled",
    "load": "umahub.runtime.compiled",
    "CompileContext": "umahub.plugin.context",
    "CostContext": "umahub.plugin.context",
    "VirtualDevice": "umahub.compiler.vdevice",
    "annotate": "umahub.compiler.placement",
    "remote": "umahub.boards.rpc",
}


def __getattr__(name: str) -> Any:
    import importlib

    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    elif _moved.new_name(f"umahub.{name}") is not None:
        value = importlib.import_module(f"umahub.{name}")  # an old path: warns where it moved
    else:
        raise AttributeError(f"module 'umahub' has no attribute {name!r}")
    globals()[name] = value
    return value
