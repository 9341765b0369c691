"""Static post-training quantization of a Relax model into QDQ form, as ONNX Runtime writes it.

:func:`quantize_static` is ONNX Runtime's ``quantize_static`` (QDQ format,
MinMax calibration) for Relax modules whose weights are bound as constants,
as the zoo and umahub's frontends bind them, without ONNX Runtime:

- the float model runs on every calibration sample (``tvm.compile`` for the
  host, Relax VM); the smallest and largest value of each tensor to be
  quantized over all samples is its range;
- a quantized tensor ``t`` is followed by ``R.quantize(t, scale, zp)`` and
  ``R.dequantize`` of that, and every reader of ``t`` reads the dequantized
  tensor (one pair per tensor, shared by its readers);
- ``R.nn.conv2d`` with a constant weight and ``R.matmul``, each with the bias
  add and the ReLU or clip that follow it (when nothing else reads the
  intermediate tensors), are one quantized operator: its activation inputs
  and its output (after the activation, as ONNX Runtime quantizes a Conv's
  fused Relu) are quantized, the weight is an int8 constant under
  ``R.dequantize(w, w_scale, 0, axis=<output channel>)`` and the bias an
  int32 constant under ``R.dequantize(b, x_scale * w_scale, 0)``;
- an ``R.add`` of two quantized tensors (a residual), with a ReLU or clip
  after it, has its output quantized; so have ``R.mean`` and the average
  pools and ``R.nn.softmax`` of a quantized tensor (ONNX Runtime's
  GlobalAveragePool, AveragePool, Softmax);
- ``R.reshape``, ``R.permute_dims`` and ``R.nn.max_pool2d`` of a quantized
  tensor give a tensor quantized with the same scale and zero point as their
  input (ONNX Runtime's Reshape, Transpose, MaxPool);
- every other operator computes in float on dequantized inputs (layer norm,
  GELU, a division, an add with a tensor that is not quantized).

Scales and zero points follow ONNX Runtime: the range is widened to include
0; activations asymmetric (``uint8``, ONNX Runtime's default, zero point in
0..255; or ``int8``, -128..127); weights int8 symmetric in -127..127 (zero
point 0), per output channel by default; a scale below float32's smallest
normal number (a tensor that is zero on every sample) becomes 1 with zero
point 0, so that every scale is positive and finite. Quantization is ONNX
QuantizeLinear's: ``saturate(round_half_to_even(x / scale) + zero_point)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tvm
from tvm import relax

from umahub._tvm import Constant, name_of

from ._qdq import Emitter, calibrated_ranges, const_value, main_bindings, op_name, plan_of, rebuild
from ._qparams import (
    ACTIVATION_DTYPES,
    QParams,
    QuantizationError,
    activation_params,
    weight_params,
)

__all__ = [
    "ACTIVATION_DTYPES",
    "QParams",
    "QuantizationError",
    "activation_params",
    "calibrate",
    "quantization_params",
    "quantize_static",
    "weight_params",
]


def calibrate(
    mod: tvm.IRModule, samples: Sequence[Sequence[np.ndarray]]
) -> dict[str, tuple[float, float]]:
    """The range (min, max over all samples) of every tensor :func:`quantize_static` calibrates.

    Keyed by the name of the tensor's binding (a model input by its parameter name).

    Raises:
        QuantizationError: no sample, or a model :func:`quantize_static` cannot take.
    """
    plan = plan_of(mod)
    found = calibrated_ranges(plan, samples)
    return {name_of(v): r for v, r in found.items()}


def quantize_static(
    mod: tvm.IRModule,
    calibration: Sequence[Sequence[np.ndarray]],
    *,
    activation_dtype: str = "uint8",
    per_channel: bool = True,
) -> tvm.IRModule:
    """``mod`` with QDQ inserted as ONNX Runtime's static quantizer writes it (see the module).

    Args:
        mod: a Relax module whose ``main`` is one dataflow block with the
            weights bound as constants (a zoo model, an imported ONNX or
            PyTorch model).
        calibration: the calibration set: samples, each the list of ``main``'s
            inputs in order. The float model runs on every one (compiled for
            the host); ranges are min and max over all of them.
        activation_dtype: ``"uint8"`` (ONNX Runtime's default) or ``"int8"``,
            asymmetric either way.
        per_channel: weights get one scale per output channel (axis 0 of a
            conv's OIHW weight, axis 1 of a matmul's (in, out) weight); False
            for one scale per weight.

    Returns:
        A new module; ``main`` takes and returns what ``mod``'s does (float
        inputs, the output dequantized when it is a quantized tensor).

    Raises:
        QuantizationError: a module of another shape, no sample, a tensor with
            non-finite values on the calibration set, an unknown dtype.
    """
    if activation_dtype not in ACTIVATION_DTYPES:
        raise QuantizationError(
            f"activation_dtype={activation_dtype!r}: use one of {', '.join(ACTIVATION_DTYPES)}"
        )
    plan = plan_of(mod)
    ranges = calibrated_ranges(plan, calibration)
    qparams: dict[relax.Var, QParams] = {}
    for var, same in plan.tensors.items():
        if same is None:
            low, high = ranges[var]
            try:
                qparams[var] = activation_params(low, high, activation_dtype)
            except QuantizationError as exc:
                raise QuantizationError(f"tensor {name_of(var)!r}: {exc}") from None
        else:
            qparams[var] = qparams[same]
    return rebuild(plan, Emitter(plan, qparams, per_channel))


def quantization_params(mod: tvm.IRModule) -> dict[str, QParams]:
    """The scale and zero point of every ``R.quantize`` and ``R.dequantize`` of ``main``.

    Keyed by the name of the binding; for the zoo's int8 models ``"<t>_q"``
    quantizes tensor ``t``, ``"<op>_weight"`` and ``"<op>_bias"`` dequantize
    the weight and bias of operator ``op``. Only constant scales and zero
    points are read.
    """
    _, bindings = main_bindings(mod)
    found: dict[str, QParams] = {}
    for b in bindings:
        if op_name(b.value) in ("relax.quantize", "relax.dequantize"):
            _, scale, zp = b.value.args
            if isinstance(scale, Constant) and isinstance(zp, Constant):
                found[name_of(b.var)] = QParams(
                    const_value(scale), const_value(zp), int(b.value.attrs.axis)
                )
    return found
