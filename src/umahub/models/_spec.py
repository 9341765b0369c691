"""What the model zoo knows about a model: its tensors, weights and builder."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tvm

Weights = dict[str, np.ndarray]
"""Weights by PyTorch ``state_dict`` name, in PyTorch layout (Linear: (out, in))."""


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one model input or output."""

    shape: tuple[int, ...]
    dtype: str = "float32"


@dataclass(frozen=True)
class ModelInfo:
    """A summary of a zoo model, returned by :func:`umahub.models.info`.

    ``num_params`` counts the weights as bound into the module, i.e. after
    batch norm was folded into the convolutions.
    """

    name: str
    description: str
    inputs: tuple[TensorSpec, ...]
    output: TensorSpec
    num_params: int


@dataclass(frozen=True)
class ModelSpec:
    """How to make one zoo model (internal to the zoo).

    ``make_weights`` draws the weights from the generator it is given;
    ``build`` turns them into a Relax module whose ``main`` takes ``inputs``;
    ``make_inputs`` draws example inputs (default: standard normal for each).
    """

    name: str
    description: str
    inputs: tuple[TensorSpec, ...]
    output: TensorSpec
    make_weights: Callable[[np.random.Generator], Weights]
    build: Callable[[Weights], tvm.IRModule]
    make_inputs: Callable[[np.random.Generator], list[np.ndarray]] | None = None
    weight_seed: int = 0
