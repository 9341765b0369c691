"""``cnn``: a tiny convolutional network, the test workhorse of the zoo.

(1, 3, 16, 16) -> conv 3x3 (8) + bias -> relu -> conv 3x3 (8) + bias -> relu
-> add the first conv's activation (a residual) -> flatten (reshape) ->
dense 2048->10 + bias. Every operator class an accelerator is likely to claim
(conv2d, add, relu, matmul) appears, and it is small enough to compile quickly.
"""

from __future__ import annotations

import numpy as np
import tvm

from . import _init
from ._graph import build_main
from ._spec import ModelSpec, TensorSpec, Weights

CHANNELS, SIZE, WIDTH, CLASSES = 3, 16, 8, 10


def make_weights(rng: np.random.Generator) -> Weights:
    """``conv1``, ``conv2`` (OIHW with bias) and ``fc`` (10, 2048)."""
    return {
        **_init.conv(rng, "conv1", WIDTH, CHANNELS, 3),
        # Gain 1, not He's sqrt(2): the residual add below adds the two variances.
        **_init.conv(rng, "conv2", WIDTH, WIDTH, 3, gain=1.0),
        **_init.linear(rng, "fc", CLASSES, WIDTH * SIZE * SIZE),
    }


def build(weights: Weights) -> tvm.IRModule:
    """The Relax module: ``main(x: (1, 3, 16, 16)) -> (1, 10)``."""

    def body(g, x):
        h1 = g.relu(g.conv2d(x, "conv1", padding=1), "conv1.relu")
        h2 = g.relu(g.conv2d(h1, "conv2", padding=1), "conv2.relu")
        h = g.add(h2, h1, "residual")
        flat = g.reshape(h, (1, WIDTH * SIZE * SIZE), "flatten")
        return g.linear(flat, "fc")

    return build_main(weights, {"x": SPEC.inputs[0]}, body)


SPEC = ModelSpec(
    name="cnn",
    description="tiny CNN: two 3x3 convs (8 channels) with bias and relu, a residual add, "
    "flatten, dense 2048->10",
    inputs=(TensorSpec((1, CHANNELS, SIZE, SIZE)),),
    output=TensorSpec((1, CLASSES)),
    make_weights=make_weights,
    build=build,
)
