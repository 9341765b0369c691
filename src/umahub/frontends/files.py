"""Model files and names: what ``umahub compile MODEL`` and ``umahub explain MODEL`` take."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from umahub.errors import UmahubError, UnknownModelError
from umahub.frontends.onnx_import import from_onnx
from umahub.frontends.torch_import import from_exported_program, quiet_logger, quiet_torch

__all__ = ["load_model"]


def _from_python(path: Path) -> Any:
    import tvm

    name = f"umahub_model_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UmahubError(f"{path}: Python cannot load this file as a module")
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


def _from_onnx_file(path: Path) -> Any:
    try:
        import onnx
    except ImportError:
        raise UmahubError(
            f"{path}: reading ONNX needs the 'onnx' package: pip install 'umahub[onnx]'"
        ) from None
    _check_external_data(onnx, path)
    try:
        model = onnx.load(str(path))
    except Exception as exc:
        raise UmahubError(
            f"{path}: not a readable ONNX model ({type(exc).__name__}: {exc})"
        ) from exc
    if not model.graph.node and not model.graph.output:
        raise UmahubError(f"{path}: not a readable ONNX model (no graph in it)")
    try:
        return from_onnx(model)
    except UmahubError as exc:
        raise UmahubError(f"{path}: {exc}") from exc.__cause__


def _check_external_data(onnx: Any, path: Path) -> None:
    """Refuse a model whose external weights files are missing, naming them."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:
        return  # not readable at all: onnx.load says why
    missing: dict[str, list[str]] = {}
    for tensor in model.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        if not (path.parent / location).is_file():
            missing.setdefault(location, []).append(tensor.name)
    if missing:
        location, tensors = next(iter(missing.items()))
        raise UmahubError(
            f"{path}: its weights are in a separate file, {path.parent / location}, which "
            f"does not exist ({len(tensors)} tensor(s), e.g. '{tensors[0]}'); copy it next "
            "to the model, as torch.onnx.export or onnx.save_model wrote it"
        )


def _from_pt2(path: Path) -> Any:
    try:
        import torch
    except ImportError:
        raise UmahubError(
            f"{path}: reading a torch.export program needs PyTorch: pip install 'umahub[torch]'"
        ) from None
    try:
        with quiet_torch(), quiet_logger("torch.export"):
            program = torch.export.load(str(path))
    except Exception as exc:
        raise UmahubError(
            f"{path}: not a readable torch.export program, as torch.export.save writes "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    try:
        return from_exported_program(program)
    except UmahubError as exc:
        raise UmahubError(f"{path}: {exc}") from exc.__cause__


def load_model(spec: str) -> Any:
    """The Relax IRModule named by ``spec``: zoo name, ``.py``, ``.onnx`` or ``.pt2`` path.

    Raises:
        UmahubError: a missing, unreadable or unimportable file, or a missing
            optional package (the message says which extra to install).
        UnknownModelError: neither a file nor a zoo name.
    """
    path = Path(spec)
    loaders = {".py": _from_python, ".onnx": _from_onnx_file, ".pt2": _from_pt2}
    if path.suffix in loaders:
        if not path.is_file():
            raise UmahubError(f"{spec}: no such file")
        return loaders[path.suffix](path)
    import umahub.models as zoo

    try:
        return zoo.get(spec)
    except UnknownModelError as exc:
        raise UnknownModelError(
            f"{exc}; or give a .py (TVMScript), .onnx or .pt2 (torch.export) file"
        ) from None
