"""The zoo's int8 models: ``<name>_int8``, each its float model through :func:`quantize_static`.

``mlp_int8``, ``cnn_int8``, ``resnet18_int8``, ``mobilenetv2_int8``,
``bert_int8`` and ``bert2_int8`` are made the same way:

1. the float model ``<name>`` with its weights (same seed, same values);
2. a calibration set of its own (:func:`calibration_set`): 32 inputs for
   ``mlp`` and ``cnn``, 8 for the others (a run of the float model on the
   host takes seconds), drawn from one generator seeded with
   :data:`CALIBRATION_SEED`, shaped and distributed as
   :func:`umahub.models.inputs` draws them (standard normal; BERT's hidden
   states standard normal with the same padding mask), and independent of
   the inputs ``inputs(name, seed)`` gives for any small seed;
3. :func:`umahub.models.quantize.quantize_static` with its defaults:
   activations ``uint8`` asymmetric, weights int8 symmetric per output channel,
   biases int32 at ``x_scale * w_scale``, QDQ where ONNX Runtime's QDQ
   quantizer puts it.

``main`` takes and returns float32 as the float model's does: its input is
quantized first, its output is a dequantized tensor. Every weight of a
convolution or a dense layer is an int8 constant under ``R.dequantize``.
The calibration set is fixed, so the module is the same on every build.
"""

from __future__ import annotations

import numpy as np

from ._spec import ModelSpec, Weights
from .quantize import quantize_static

__all__ = ["CALIBRATION_SEED", "SUFFIX", "calibration_set", "spec"]

#: Seed of the generator every int8 model's calibration set is drawn from.
CALIBRATION_SEED = 20_251_030
#: The name of a model's int8 variant is its name and this suffix.
SUFFIX = "_int8"


def calibration_set(base: ModelSpec, samples: int) -> list[list[np.ndarray]]:
    """``samples`` inputs of ``base`` (lists of arrays), drawn from :data:`CALIBRATION_SEED`."""
    rng = np.random.default_rng(CALIBRATION_SEED)
    if base.make_inputs is not None:
        return [base.make_inputs(rng) for _ in range(samples)]
    return [
        [rng.standard_normal(t.shape).astype(t.dtype) for t in base.inputs] for _ in range(samples)
    ]


def spec(base: ModelSpec, samples: int) -> ModelSpec:
    """The zoo entry of ``base``'s int8 variant, calibrated on ``samples`` inputs."""

    def build(weights: Weights):
        return quantize_static(base.build(weights), calibration_set(base, samples))

    return ModelSpec(
        name=base.name + SUFFIX,
        description=f"{base.name} quantized to int8 (QDQ: uint8 activations, int8 weights per "
        f"output channel, int32 biases; calibrated on {samples} seeded inputs)",
        inputs=base.inputs,
        output=base.output,
        make_weights=base.make_weights,
        build=build,
        make_inputs=base.make_inputs,
        weight_seed=base.weight_seed,
    )
