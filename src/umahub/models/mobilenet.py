"""``mobilenetv2``: MobileNetV2 (Sandler et al. 2018, width 1.0) in inference form.

Batch norm is folded into each convolution at construction; depthwise convs
are ``R.nn.conv2d`` with ``groups`` equal to the channels; ReLU6 is
``R.clip(x, 0, 6)``. Input (1, 3, 224, 224), output (1, 1000) logits.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from . import _init
from ._graph import Graph, build_main
from ._spec import ModelSpec, TensorSpec, Weights

# (expansion t, output channels c, repeats n, stride of the first repeat s), from the paper.
SETTINGS: tuple[tuple[int, int, int, int], ...] = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
)
SETTINGS += ((6, 160, 3, 2), (6, 320, 1, 1))
STEM, LAST, CLASSES = 32, 1280, 1000
LAST_INDEX = 1 + sum(n for _, _, n, _ in SETTINGS)  # 18, as in torchvision's ``features``
BRANCH_BN_SCALE = 0.5  # see resnet.BRANCH_BN_SCALE


def _blocks():
    """(prefix, c_in, hidden, c_out, stride) of every inverted residual block, in order."""
    c_in, index = STEM, 1
    for t, c_out, n, s in SETTINGS:
        for i in range(n):
            yield f"features.{index}", c_in, c_in * t, c_out, s if i == 0 else 1
            c_in, index = c_out, index + 1


def make_weights(rng: np.random.Generator) -> Weights:
    """Folded conv weights: ``features.0`` stem, ``features.i.{expand,dw,project}``,
    ``features.18`` last 1x1 conv, ``classifier``."""
    w = _init.conv_bn(rng, "features.0", STEM, 3, 3)
    for prefix, c_in, hidden, c_out, stride in _blocks():
        if hidden != c_in:
            w |= _init.conv_bn(rng, f"{prefix}.expand", hidden, c_in, 1)
        w |= _init.conv_bn(rng, f"{prefix}.dw", hidden, hidden, 3, groups=hidden)
        residual = stride == 1 and c_in == c_out
        scale = BRANCH_BN_SCALE if residual else 1.0
        w |= _init.conv_bn(rng, f"{prefix}.project", c_out, hidden, 1, gain=1.0, bn_scale=scale)
    w |= _init.conv_bn(rng, f"features.{LAST_INDEX}", LAST, 320, 1)
    w |= _init.linear(rng, "classifier", CLASSES, LAST)
    return w


def _inverted_residual(g: Graph, x, prefix: str, c_in: int, hidden: int, c_out: int, stride: int):
    h = x
    if hidden != c_in:
        h = g.relu6(g.conv2d(h, f"{prefix}.expand"), f"{prefix}.expand.relu6")
    h = g.conv2d(h, f"{prefix}.dw", stride=stride, padding=1, groups=hidden)
    h = g.relu6(h, f"{prefix}.dw.relu6")
    h = g.conv2d(h, f"{prefix}.project")
    if stride == 1 and c_in == c_out:
        h = g.add(h, x, f"{prefix}.add")
    return h


def build(weights: Weights) -> tvm.IRModule:
    """The Relax module: ``main(x: (1, 3, 224, 224)) -> (1, 1000)``."""

    def body(g, x):
        h = g.relu6(g.conv2d(x, "features.0", stride=2, padding=1), "features.0.relu6")
        for block in _blocks():
            h = _inverted_residual(g, h, *block)
        last = f"features.{LAST_INDEX}"
        h = g.relu6(g.conv2d(h, last), f"{last}.relu6")
        h = g.emit(relax.op.mean(h, axis=[2, 3]), "avgpool")
        return g.linear(h, "classifier")

    return build_main(weights, {"x": SPEC.inputs[0]}, body)


SPEC = ModelSpec(
    name="mobilenetv2",
    description="MobileNetV2 1.0, batch norm folded, depthwise convs as grouped conv2d, "
    "relu6 as clip(0, 6), 1000 classes",
    inputs=(TensorSpec((1, 3, 224, 224)),),
    output=TensorSpec((1, CLASSES)),
    make_weights=make_weights,
    build=build,
)
