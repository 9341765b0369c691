"""umahub: accelerator backends for Apache TVM as installable plugins.

The public API (everything else is internal)::

    import umahub

    hub = umahub.Hub()                 # load plugins, read [tool.umahub]
    compiled = hub.compile(mod)        # a Relax IRModule with "main"
    outputs = compiled.run(*arrays)    # numpy in, numpy out
    compiled.export_library("model.so")
    umahub.load("model.so").run(*arrays)
    decoder = hub.compile_decoder(llm)  # a transformers decoder: prefill and decode step
    decoder.generate(ids, max_new_tokens=32)
    with umahub.remote(tracker="farm:9190", key="rk3588") as board:   # TVM's RPC
        board.load("model.so").run(*arrays)

For plugin authors: :data:`hookimpl` (``@umahub.hookimpl(accelerator="npu")``
for a hook of one accelerator), :class:`Accelerator`, :class:`MemoryPool`,
:class:`Refusal` (a pattern check's "no", with its reason), the hook contract
in :mod:`umahub.plugin.hookspecs`, and :data:`API_VERSION`. Everything a plugin
may use is in :mod:`umahub.plugin`, the one package a plugin imports.

``import umahub`` imports nothing else (neither TVM, nor a plugin, nor umahub's
own modules) and leaves the environment as it is: each name is resolved when
it is first used. ``import tvm`` imports it too, for umahub's ``tvm.backends``
entry point (:mod:`umahub.compiler.tvm_backend`), which registers the pipeline
name ``"umahub"`` and nothing else.
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from umahub import errors
    from umahub.boards.rpc import remote
    from umahub.compiler.placement import annotate
    from umahub.compiler.vdevice import VirtualDevice
    from umahub.errors import UmahubError, UmahubWarning
    from umahub.hub import Hub
    from umahub.plugin.accelerator import Accelerator, MemoryPool
    from umahub.plugin.context import CompileContext, CostContext
    from umahub.plugin.markers import API_VERSION, hookimpl, hookspec
    from umahub.plugin.patterns import Refusal
    from umahub.runtime.compiled import Compiled, load
    from umahub.runtime.generation import CompiledDecoder, load_decoder

__version__ = "0.1.0"

__all__ = [
    "API_VERSION",
    "Accelerator",
    "CompileContext",
    "Compiled",
    "CompiledDecoder",
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
    "load_decoder",
    "remote",
]

# Every name is resolved on first use: ``import tvm`` imports this package (umahub's
# ``tvm.backends`` entry point is in it), and should get nothing but that entry point.
_LAZY = {
    "errors": "umahub",
    "UmahubError": "umahub.errors",
    "UmahubWarning": "umahub.errors",
    "Hub": "umahub.hub.hub",
    "Accelerator": "umahub.plugin.accelerator",
    "MemoryPool": "umahub.plugin.accelerator",
    "API_VERSION": "umahub.plugin.markers",
    "hookimpl": "umahub.plugin.markers",
    "hookspec": "umahub.plugin.markers",
    "Refusal": "umahub.plugin.patterns",
    "Compiled": "umahub.runtime.compiled",
    "load": "umahub.runtime.compiled",
    "CompiledDecoder": "umahub.runtime.generation",
    "load_decoder": "umahub.runtime.generation",
    "CompileContext": "umahub.plugin.context",
    "CostContext": "umahub.plugin.context",
    "VirtualDevice": "umahub.compiler.vdevice",
    "annotate": "umahub.compiler.placement",
    "remote": "umahub.boards.rpc",
}


def __getattr__(name: str) -> Any:
    import importlib

    module = _LAZY.get(name)
    if module == "umahub":  # a submodule
        value = importlib.import_module(f"umahub.{name}")
    elif module is not None:
        value = getattr(importlib.import_module(module), name)
    elif _old_paths().new_name(f"umahub.{name}") is not None:
        value = importlib.import_module(f"umahub.{name}")  # an old path: warns where it moved
    else:
        raise AttributeError(f"module 'umahub' has no attribute {name!r}")
    globals()[name] = value
    return value


def _old_paths() -> Any:
    import importlib

    return importlib.import_module("umahub._moved")


class _OldNames(importlib.abc.MetaPathFinder):
    """Old module paths (:mod:`umahub._moved`), looked up only when no module has the name.

    Last on ``sys.meta_path``, so that importing umahub's own modules costs
    nothing; the first old name used installs :mod:`umahub._moved`'s finder.
    """

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith("umahub."):
            return None
        moved = _old_paths()
        if moved.new_name(fullname) is None:
            return None
        moved.install()
        return moved._Finder().find_spec(fullname, path, target)


if not any(type(f).__name__ == "_OldNames" for f in sys.meta_path):
    sys.meta_path.append(_OldNames())
