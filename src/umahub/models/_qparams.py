"""Scales and zero points as ONNX Runtime computes them (see :mod:`umahub.models.quantize`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import QuantizationError

ACTIVATION_DTYPES = ("uint8", "int8")

_QRANGE = {"uint8": (0, 255), "int8": (-128, 127)}
WEIGHT_QMAX = 127  # int8 symmetric weights use -127..127, as ONNX Runtime does
TINY = float(np.finfo(np.float32).tiny)


@dataclass(frozen=True)
class QParams:
    """Scale and zero point of one quantized tensor.

    Attributes:
        scale: float32, a scalar (per tensor) or one per channel of ``axis``.
        zero_point: of the quantized dtype, shaped as ``scale``.
        axis: the channel axis of a per-channel ``scale``; -1 for a scalar.
    """

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int = -1

    @property
    def dtype(self) -> str:
        """The quantized dtype (``uint8``, ``int8`` or ``int32``)."""
        return str(self.zero_point.dtype)


def activation_params(low: float, high: float, dtype: str = "uint8") -> QParams:
    """Asymmetric per-tensor scale and zero point of an activation with range [low, high].

    The range is widened to include 0 (so that 0 is exact, as padding needs);
    a range too narrow for a float32 scale (an all-zero tensor) gives scale 1
    and zero point 0 (ONNX Runtime's rule).

    Raises:
        QuantizationError: a non-finite bound, or a dtype not in :data:`ACTIVATION_DTYPES`.
    """
    if dtype not in _QRANGE:
        raise QuantizationError(
            f"activation dtype {dtype!r} is not supported: use one of {', '.join(_QRANGE)}"
        )
    if not (np.isfinite(low) and np.isfinite(high)):
        raise QuantizationError(
            f"range [{low}, {high}] is not finite: calibrate on inputs the float model "
            "computes finite values for"
        )
    qmin, qmax = _QRANGE[dtype]
    low, high = min(float(low), 0.0), max(float(high), 0.0)
    scale = np.float32((high - low) / (qmax - qmin))
    if not scale >= TINY:
        return QParams(np.float32(1.0), np.array(0, dtype=dtype))
    zero_point = np.clip(np.round(qmin - low / float(scale)), qmin, qmax)
    return QParams(scale, np.array(zero_point, dtype=dtype))


def weight_params(weight: np.ndarray, axis: int | None) -> QParams:
    """Symmetric int8 scale (zero point 0) of a weight: per channel of ``axis``, or per tensor.

    ``scale = max|w| / 127`` over the channel (or the tensor); an all-zero
    channel gets scale 1.
    """
    w = np.abs(np.asarray(weight, dtype=np.float64))
    if axis is None:
        peak = np.array(w.max() if w.size else 0.0)
    else:
        peak = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1).max(axis=1)
    scale = (peak / WEIGHT_QMAX).astype(np.float32)
    scale = np.where(scale >= TINY, scale, np.float32(1.0)).astype(np.float32)
    return QParams(scale, np.zeros(scale.shape, np.int8), -1 if axis is None else axis)


def quantize_array(value: np.ndarray, params: QParams, qmin: int, qmax: int, dtype: str):
    """ONNX QuantizeLinear of a constant, in float32 as the host computes it."""
    scale = params.scale
    if scale.ndim:
        shape = [1] * value.ndim
        shape[params.axis] = -1
        scale = scale.reshape(shape)
    q = np.rint(value.astype(np.float32) / scale) + params.zero_point.reshape(np.shape(scale))
    return np.clip(q, qmin, qmax).astype(dtype)
