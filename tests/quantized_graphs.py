"""Random small quantized models for the tests: float graphs of convolutions (with bias,
activation, residual sums) and a final matmul, quantized as ONNX Runtime's static
quantizer does it (:func:`umahub.models.quantize.quantize_static`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from tvm import relax

from umahub._tvm import TensorType, type_of
from umahub.models.quantize import quantize_static


@dataclass(frozen=True)
class Layer:
    """One convolution: output channels, kernel, stride, padding, bias, activation
    ("relu", "clip" or ""), and whether its input is added to its output (same shape)."""

    channels: int
    kernel: int = 3
    stride: int = 1
    padding: int = 1
    bias: bool = True
    activation: str = "relu"
    residual: bool = False


@dataclass(frozen=True)
class QuantizedGraph:
    """A random quantized model's recipe: input shape, layers, a final matmul's width
    (0: none), activation dtype, per-channel weights, the seed of its weights."""

    shape: tuple[int, int, int, int]
    layers: tuple[Layer, ...]
    dense: int = 0
    activation_dtype: str = "uint8"
    per_channel: bool = True
    seed: int = 0


def float_model(g: QuantizedGraph):
    """The float model of ``g`` (weights bound as constants)."""
    rng = np.random.default_rng(g.seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType(g.shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            v, channels, size = x, g.shape[1], min(g.shape[2:])
            for layer in g.layers:
                if (size + 2 * layer.padding - layer.kernel) // layer.stride + 1 < 2:
                    # too small for it: the same layer, keeping the size
                    layer = replace(layer, stride=1, padding=(layer.kernel - 1) // 2)
                size = (size + 2 * layer.padding - layer.kernel) // layer.stride + 1
                scale = 1.0 / np.sqrt(channels * layer.kernel**2)
                w = rng.standard_normal((layer.channels, channels, layer.kernel, layer.kernel))
                out = bb.emit(
                    relax.op.nn.conv2d(
                        v,
                        relax.const((w * scale).astype("float32")),
                        strides=layer.stride,
                        padding=layer.padding,
                    )
                )
                if layer.bias:
                    b = rng.standard_normal((1, layer.channels, 1, 1)) * 0.1
                    out = bb.emit(relax.op.add(out, relax.const(b.astype("float32"))))
                same = layer.channels == channels and layer.stride == 1
                if layer.residual and same and 2 * layer.padding == layer.kernel - 1:
                    out = bb.emit(relax.op.add(out, v))
                if layer.activation == "relu":
                    out = bb.emit(relax.op.nn.relu(out))
                elif layer.activation == "clip":
                    out = bb.emit(relax.op.clip(out, 0.0, 6.0))
                v, channels = out, layer.channels
            if g.dense:
                flat = bb.emit(relax.op.reshape(v, (g.shape[0], -1)))
                width = int(np.prod([int(d) for d in type_of(flat).shape.values][1:]))
                w = rng.standard_normal((width, g.dense)) / np.sqrt(width)
                v = bb.emit(relax.op.matmul(flat, relax.const(w.astype("float32"))))
            out = bb.emit_output(v)
        bb.emit_func_output(out)
    return bb.get()


def inputs(g: QuantizedGraph, count: int = 1, seed: int = 1) -> list[list[np.ndarray]]:
    """``count`` samples of the model's input."""
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(g.shape).astype("float32")] for _ in range(count)]


def quantized_model(g: QuantizedGraph):
    """``g`` quantized (QDQ), calibrated on four samples."""
    return quantize_static(
        float_model(g),
        inputs(g, 4, seed=g.seed + 100),
        activation_dtype=g.activation_dtype,
        per_channel=g.per_channel,
    )
