"""Models for the simnpu's tests: one quantized operator as a Relax module, and the hubs
that compile it with the simnpu and on the host alone."""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
import umahub_simnpu
from tvm import relax
from tvm.script import relax as R

import umahub
import umahub.plugin as up


def simnpu_hub(**config: Any) -> umahub.Hub:
    """A hub with the simnpu only, failures are errors (nothing quietly put back on the host)."""
    return umahub.Hub(
        config={"on-error": "error", **config}, autoload=False, plugins=[umahub_simnpu]
    )


def host_hub() -> umahub.Hub:
    """A hub with no plugin: the host's integer lowering, the reference."""
    return umahub.Hub(config={}, autoload=False, plugins=[])


def quantized_model(
    kind: str = "conv2d",
    *,
    x_dtype: str = "int8",
    y_dtype: str = "int8",
    x_shape: tuple[int, ...] = (1, 5, 9, 9),
    out_channels: int = 20,
    kernel: tuple[int, int] = (3, 3),
    strides: tuple[int, int] = (1, 1),
    padding: tuple[int, int, int, int] = (1, 1, 1, 1),
    dilation: tuple[int, int] = (1, 1),
    groups: int = 1,
    per_channel: bool = True,
    bias: str | None = "int32",
    activation: Any = None,
    residual: bool = False,
    weight_zero: int = 0,
    y_scale: float = 0.05,
    seed: int = 0,
) -> tuple[tvm.IRModule, list[np.ndarray]]:
    """One quantized operator (``dequantize -> conv2d/matmul (+ bias) (+ residual)
    (+ ReLU/clip) -> quantize``) as a Relax module, and inputs for it."""
    rng = np.random.default_rng(seed)
    x_zero = 128 + 9 if x_dtype == "uint8" else -7
    y_zero = 120 if y_dtype == "uint8" else 3
    sx, sy = np.float32(0.03), np.float32(y_scale)
    if kind == "conv2d":
        cin = x_shape[1] // groups
        w = rng.integers(-100, 101, (out_channels, cin, *kernel)).astype(np.int8)
        channels, axis = out_channels, 0
    else:
        w = rng.integers(-100, 101, (x_shape[-1], out_channels)).astype(np.int8)
        channels, axis = out_channels, 1
    sw = rng.uniform(0.002, 0.02, channels).astype(np.float32) if per_channel else np.float32(0.01)
    zw = np.full(channels if per_channel else (), weight_zero, np.int8)
    x = relax.Var("x", R.Tensor(x_shape, x_dtype))
    info = np.iinfo(x_dtype)
    inputs = [rng.integers(info.min, int(info.max) + 1, x_shape).astype(x_dtype)]
    bb = relax.BlockBuilder()
    r = None
    if residual:
        r = relax.Var(
            "r",
            R.Tensor(_out_shape(kind, x_shape, w, strides, padding, dilation), "int8"),
        )
    with bb.function("main", [x] + ([r] if r is not None else [])):
        with bb.dataflow():
            xd = bb.emit(R.dequantize(x, R.const(sx), R.const(x_zero, x_dtype), axis=1))
            wd = bb.emit(R.dequantize(R.const(w), R.const(sw), R.const(zw), axis=axis))
            if kind == "conv2d":
                y = bb.emit(
                    R.nn.conv2d(
                        xd, wd, strides=strides, padding=padding, dilation=dilation, groups=groups
                    )
                )
                bias_shape = (1, channels, 1, 1)
            else:
                y = bb.emit(R.matmul(xd, wd))
                bias_shape = (channels,)
            if bias == "int32":
                b = rng.integers(-30000, 30000, bias_shape).astype(np.int32)
                # one bias scale per weight scale (umahub 0.x refuses a per-tensor weight scale
                # with per-channel bias scales: it cannot compare them)
                units = (sx * sw).astype(np.float32)
                bd = bb.emit(
                    R.dequantize(
                        R.const(b),
                        R.const(units),
                        R.const(np.zeros(units.shape, np.int32)),
                        axis=1 if kind == "conv2d" else 0,
                    )
                )
                y = bb.emit(R.add(y, bd))
            elif bias == "float32":
                b = rng.uniform(-2, 2, bias_shape).astype(np.float32)
                y = bb.emit(R.add(y, R.const(b)))
            if r is not None:
                rd = bb.emit(R.dequantize(r, R.const(np.float32(0.04)), R.const(np.int8(-5))))
                y = bb.emit(R.add(y, rd))
            if activation == "relu":
                y = bb.emit(R.nn.relu(y))
            elif activation is not None:
                y = bb.emit(R.clip(y, *activation))
            q = bb.emit_output(
                R.quantize(y, R.const(sy), R.const(y_zero, y_dtype), out_dtype=y_dtype)
            )
        bb.emit_func_output(q)
    mod = bb.get()
    if r is not None:
        shape = tuple(int(d) for d in up.shape_of(r))
        inputs.append(rng.integers(-128, 128, shape).astype(np.int8))
    return mod, inputs


def _out_shape(kind, x_shape, w, strides, padding, dilation):
    if kind != "conv2d":
        return (*x_shape[:-1], w.shape[1])
    n, _, h, wd = x_shape
    o, _, kh, kw = w.shape
    oh = (h + padding[0] + padding[2] - dilation[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (wd + padding[1] + padding[3] - dilation[1] * (kw - 1) - 1) // strides[1] + 1
    return (n, o, oh, ow)
