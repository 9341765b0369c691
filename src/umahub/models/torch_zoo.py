"""The zoo's models in PyTorch, with the same weights: for cross-checks.

PyTorch is an optional dependency (``pip install 'umahub[torch]'``); this
module imports it only when one of its functions is called.

- :func:`torch_module` gives the PyTorch model and example inputs, so a test
  can compare ``umahub.models.get(name)`` compiled by TVM against PyTorch;
- :func:`from_torch` imports that PyTorch model through TVM's own frontend
  (``torch.export`` + ``from_exported_program``): a second Relax module of the
  same function, as a user with a PyTorch model would get it.
"""

from __future__ import annotations

import warnings
from types import ModuleType
from typing import TYPE_CHECKING, Any

import tvm

from ..errors import UnknownModelError
from ._registry import inputs, spec, weights
from .int8 import SUFFIX

if TYPE_CHECKING:
    import torch

__all__ = ["from_torch", "torch_module"]


def _torch() -> ModuleType:
    try:
        import torch
    except ImportError as e:
        raise ImportError(
            "umahub.models.torch_zoo needs PyTorch: pip install 'umahub[torch]'"
        ) from e
    return torch


def torch_module(name: str, seed: int = 0) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Model ``name`` in PyTorch, in eval mode, with the zoo's weights, and example inputs.

    The inputs are ``umahub.models.inputs(name, seed)`` as CPU tensors.
    Raises ``ImportError`` when PyTorch is not installed, and
    :class:`~umahub.errors.UnknownModelError` for an int8 model (it has no
    PyTorch twin; its float model has).
    """
    spec(name)
    if name.endswith(SUFFIX):
        raise UnknownModelError(
            f"{name} is quantized and has no PyTorch twin: use its float model "
            f"{name.removesuffix(SUFFIX)!r}"
        )
    torch = _torch()
    from . import _torch_nets

    module: Any = _torch_nets.CONSTRUCTORS[name]()
    module.load_state_dict({k: torch.from_numpy(v) for k, v in weights(name).items()})
    module.eval()
    return module, tuple(torch.from_numpy(a) for a in inputs(name, seed))


def from_torch(name: str) -> tvm.IRModule:
    """Model ``name`` as imported from PyTorch by TVM's ``from_exported_program``.

    Weights are bound as constants and the single output is returned as a
    tensor, not a 1-tuple, so ``main`` has the signature of
    ``umahub.models.get(name)``'s. Raises ``ImportError`` without PyTorch.
    """
    module, example = torch_module(name)
    torch = _torch()
    from tvm.relax.frontend.torch import from_exported_program

    with torch.no_grad():
        program = torch.export.export(module, example)
    with warnings.catch_warnings():
        # torch's own run_decompositions (called by TVM) deep-copies a deprecated pytree class.
        warnings.filterwarnings(
            "ignore", message=r".*LeafSpec.* is deprecated", category=FutureWarning
        )
        return from_exported_program(
            program, keep_params_as_input=False, unwrap_unit_return_tuple=True
        )
