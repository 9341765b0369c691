"""The umahub model zoo: small and standard models as Relax modules, with random weights.

Every model is built here with ``relax.BlockBuilder`` (no download, no PyTorch):
weights are drawn from a fixed seed with He/Xavier scaling, batch norm is
folded into the convolutions, and the weights are bound into the module as
constants, so ``main`` takes only the model's inputs (batch 1, float32, NCHW).

>>> import umahub.models
>>> umahub.models.names()
['mlp', 'cnn', 'resnet18', 'mobilenetv2', 'bert', 'bert2']
>>> mod = umahub.models.get("cnn")
>>> [a.shape for a in umahub.models.inputs("cnn")]
[(1, 3, 16, 16)]

``umahub.models.torch_zoo`` has the same models, with the same weights, in
PyTorch (an optional dependency), for cross-checks.
"""

from ..errors import UnknownModelError
from ._registry import get, info, inputs, names, weights
from ._spec import ModelInfo, TensorSpec

__all__ = [
    "ModelInfo",
    "TensorSpec",
    "UnknownModelError",
    "get",
    "info",
    "inputs",
    "names",
    "weights",
]
