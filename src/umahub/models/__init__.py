"""The umahub model zoo: small and standard models as Relax modules, with random weights.

Every model is built here with ``relax.BlockBuilder`` (no download, no PyTorch):
weights are drawn from a fixed seed with He/Xavier scaling, batch norm is
folded into the convolutions, and the weights are bound into the module as
constants, so ``main`` takes only the model's inputs (batch 1, float32, NCHW).

>>> import umahub.models
>>> umahub.models.names()  # doctest: +NORMALIZE_WHITESPACE
['mlp', 'cnn', 'resnet18', 'mobilenetv2', 'bert', 'bert2',
 'mlp_int8', 'cnn_int8', 'resnet18_int8', 'mobilenetv2_int8', 'bert_int8', 'bert2_int8']
>>> mod = umahub.models.get("cnn")
>>> [a.shape for a in umahub.models.inputs("cnn")]
[(1, 3, 16, 16)]

Each float model has an int8 variant, ``<name>_int8``: the float model
quantized statically into QDQ form (``R.quantize`` / ``R.dequantize``, as ONNX
Runtime's ``quantize_static`` writes it) by
:func:`umahub.models.quantize.quantize_static` on a fixed, seeded calibration
set; :mod:`umahub.models.int8` says how.

``umahub.models.torch_zoo`` has the float models, with the same weights, in
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
