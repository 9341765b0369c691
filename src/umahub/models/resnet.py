"""``resnet18``: ResNet-18 (He et al. 2015, torchvision layout) in inference form.

Batch norm is folded into each convolution at construction, so a block is
conv2d + bias add + relu; the shortcut of a strided block is a 1x1 conv with
bias. Input (1, 3, 224, 224), output (1, 1000) logits.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from . import _init
from ._graph import Graph, build_main
from ._spec import ModelSpec, TensorSpec, Weights

STAGES = ((64, 1), (128, 2), (256, 2), (512, 2))  # (channels, stride of the first block)
BLOCKS_PER_STAGE = 2
CLASSES = 1000
# gamma of the last batch norm in a residual branch: keeps the variance from
# doubling at each of the eight residual adds.
BRANCH_BN_SCALE = 0.5


def _blocks():
    """(prefix, c_in, c_out, stride) of every basic block, in order."""
    c_in = 64
    for stage, (c_out, stride) in enumerate(STAGES, start=1):
        for i in range(BLOCKS_PER_STAGE):
            yield f"layer{stage}.{i}", c_in, c_out, stride if i == 0 else 1
            c_in = c_out


def make_weights(rng: np.random.Generator) -> Weights:
    """Folded conv weights named as torchvision's ``resnet18`` (``downsample`` is one conv)."""
    w = _init.conv_bn(rng, "conv1", 64, 3, 7)
    for prefix, c_in, c_out, stride in _blocks():
        w |= _init.conv_bn(rng, f"{prefix}.conv1", c_out, c_in, 3)
        w |= _init.conv_bn(rng, f"{prefix}.conv2", c_out, c_out, 3, bn_scale=BRANCH_BN_SCALE)
        if stride != 1 or c_in != c_out:
            w |= _init.conv_bn(rng, f"{prefix}.downsample", c_out, c_in, 1, gain=1.0)
    w |= _init.linear(rng, "fc", CLASSES, 512)
    return w


def _basic_block(g: Graph, x: relax.Expr, prefix: str, has_downsample: bool, stride: int):
    h = g.relu(g.conv2d(x, f"{prefix}.conv1", stride=stride, padding=1), f"{prefix}.relu1")
    h = g.conv2d(h, f"{prefix}.conv2", padding=1)
    shortcut = g.conv2d(x, f"{prefix}.downsample", stride=stride) if has_downsample else x
    return g.relu(g.add(h, shortcut, f"{prefix}.add"), f"{prefix}.relu2")


def build(weights: Weights) -> tvm.IRModule:
    """The Relax module: ``main(x: (1, 3, 224, 224)) -> (1, 1000)``."""

    def body(g, x):
        h = g.relu(g.conv2d(x, "conv1", stride=2, padding=3), "relu")
        h = g.emit(relax.op.nn.max_pool2d(h, 3, strides=2, padding=1), "maxpool")
        for prefix, _, _, stride in _blocks():
            h = _basic_block(g, h, prefix, f"{prefix}.downsample.weight" in weights, stride)
        h = g.emit(relax.op.mean(h, axis=[2, 3]), "avgpool")
        return g.linear(h, "fc")

    return build_main(weights, {"x": SPEC.inputs[0]}, body)


SPEC = ModelSpec(
    name="resnet18",
    description="ResNet-18, batch norm folded into conv + bias, 1000 classes",
    inputs=(TensorSpec((1, 3, 224, 224)),),
    output=TensorSpec((1, CLASSES)),
    make_weights=make_weights,
    build=build,
)
