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
in :mod:`umahub.hookspecs`, :data:`API_VERSION`, and :mod:`umahub.compat`: the
TVM names that differ between apache-tvm 0.25, 0.26 and 0.27.

``import umahub`` does not import TVM nor any plugin: both happen when they are
first needed (a :class:`Hub` is made, a model compiled).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from umahub import compat, errors
from umahub.accelerator import Accelerator, MemoryPool
from umahub.errors import UmahubWarning
from umahub.hub import Hub
from umahub.markers import API_VERSION, hookimpl, hookspec
from umahub.patterns import Refusal
from umahub.threadpool import spin_briefly

spin_briefly()  # before TVM's first thread pool starts (none of the above imports TVM)

if TYPE_CHECKING:
    from umahub.compiled import Compiled, load
    from umahub.context import CompileContext, CostContext
    from umahub.placement import annotate
    from umahub.rpc import remote
    from umahub.vdevice import VirtualDevice

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
    "UmahubWarning",
    "VirtualDevice",
    "__version__",
    "annotate",
    "compat",
    "errors",
    "hookimpl",
    "hookspec",
    "load",
    "remote",
]

# Names whose modules import TVM: resolved on first use.
_LAZY = {
    "Compiled": "umahub.compiled",
    "load": "umahub.compiled",
    "CompileContext": "umahub.context",
    "CostContext": "umahub.context",
    "VirtualDevice": "umahub.vdevice",
    "annotate": "umahub.placement",
    "remote": "umahub.rpc",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'umahub' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
