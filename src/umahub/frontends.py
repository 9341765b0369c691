"""Where a model comes from: the zoo, a TVMScript file, or an ONNX file.

``load_model(spec)`` is what ``umahub compile MODEL`` and ``umahub explain
MODEL`` call:

* a model-zoo name (``"resnet18"``, see ``umahub.models.names()``);
* a ``.py`` file holding a TVMScript ``IRModule`` (the module-level object that
  is a ``tvm.IRModule`` with a ``main``; if there are several, the one named
  ``Module``, ``mod`` or ``model``);
* an ``.onnx`` file, through TVM's ONNX frontend (the ``onnx`` package is the
  optional extra ``umahub[onnx]``), weights bound as constants.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from umahub.errors import UmahubError, UnknownModelError

__all__ = ["load_model"]


def _from_python(path: Path) -> Any:
    import tvm

    name = f"umahub_model_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # TVMScript reads the source through the module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise UmahubError(
            f"{path}: executing the file failed: {type(exc).__name__}: {exc}"
        ) from exc
    found = {
        name: value
        for name, value in vars(module).items()
        if isinstance(value, tvm.IRModule)
        and "main" in [gv.name_hint for gv in value.get_global_vars()]
    }
    if not found:
        raise UmahubError(
            f"{path}: no tvm.IRModule with a 'main' function at module level "
            "(write one with @tvm.script.ir_module)"
        )
    for preferred in ("Module", "mod", "model"):
        if preferred in found:
            return found[preferred]
    if len(found) > 1:
        raise UmahubError(
            f"{path}: several IRModules ({', '.join(sorted(found))}); name the one "
            "to compile 'Module', 'mod' or 'model'"
        )
    return next(iter(found.values()))


def _from_onnx(path: Path) -> Any:
    try:
        import onnx
    except ImportError:
        raise UmahubError(
            f"{path}: reading ONNX needs the 'onnx' package: pip install 'umahub[onnx]'"
        ) from None
    from tvm.relax.frontend.onnx import from_onnx

    model = onnx.load(str(path))
    return from_onnx(model, keep_params_in_input=False)


def load_model(spec: str) -> Any:
    """The Relax IRModule named by ``spec`` (zoo name, ``.py`` or ``.onnx`` path)."""
    path = Path(spec)
    if path.suffix == ".py":
        if not path.is_file():
            raise UmahubError(f"{spec}: no such file")
        return _from_python(path)
    if path.suffix == ".onnx":
        if not path.is_file():
            raise UmahubError(f"{spec}: no such file")
        return _from_onnx(path)
    import umahub.models as zoo

    try:
        return zoo.get(spec)
    except UnknownModelError as exc:
        raise UnknownModelError(f"{exc}; or give a .py (TVMScript) or .onnx file") from None
