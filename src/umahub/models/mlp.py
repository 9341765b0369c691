"""``mlp``: a two-layer perceptron, the smallest model of the zoo.

(1, 64) -> dense 128 + bias -> relu -> dense 10 + bias. The quickest to
compile; for tests that need a matmul, a bias add and an activation.
"""

from __future__ import annotations

import numpy as np
import tvm

from . import _init
from ._graph import build_main
from ._spec import ModelSpec, TensorSpec, Weights

IN_FEATURES, HIDDEN, CLASSES = 64, 128, 10


def make_weights(rng: np.random.Generator) -> Weights:
    """``fc1`` (128, 64) and ``fc2`` (10, 128), PyTorch layout."""
    return {
        **_init.linear(rng, "fc1", HIDDEN, IN_FEATURES, gain=np.sqrt(2.0)),
        **_init.linear(rng, "fc2", CLASSES, HIDDEN),
    }


def build(weights: Weights) -> tvm.IRModule:
    """The Relax module: ``main(x: (1, 64)) -> (1, 10)``."""

    def body(g, x):
        h = g.relu(g.linear(x, "fc1"), "fc1.relu")
        return g.linear(h, "fc2")

    return build_main(weights, {"x": SPEC.inputs[0]}, body)


SPEC = ModelSpec(
    name="mlp",
    description="two-layer perceptron: dense 64->128, relu, dense 128->10",
    inputs=(TensorSpec((1, IN_FEATURES)),),
    output=TensorSpec((1, CLASSES)),
    make_weights=make_weights,
    build=build,
)
