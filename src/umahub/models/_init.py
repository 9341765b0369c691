"""Random weights with He/Xavier scaling, and batch norm folded into convolutions.

The scaling keeps activations near unit variance through deep stacks, so a
random-weight model neither overflows nor collapses to zero; the biases are
small but non-zero, so that a dropped bias add shows up in a comparison.
"""

from __future__ import annotations

import numpy as np

from ._spec import Weights

BN_EPS = 1e-5


def linear(
    rng: np.random.Generator, prefix: str, n_out: int, n_in: int, gain: float = 1.0
) -> Weights:
    """Weights of a dense layer in PyTorch layout: ``weight`` (n_out, n_in), ``bias`` (n_out,)."""
    weight = rng.standard_normal((n_out, n_in)) * (gain / np.sqrt(n_in))
    bias = rng.standard_normal(n_out) * 0.1
    return {f"{prefix}.weight": _f32(weight), f"{prefix}.bias": _f32(bias)}


def conv(
    rng: np.random.Generator,
    prefix: str,
    c_out: int,
    c_in: int,
    kernel: int,
    groups: int = 1,
    gain: float = np.sqrt(2.0),
) -> Weights:
    """Weights of a conv2d with bias, OIHW, He-scaled for the fan-in of one group."""
    fan_in = (c_in // groups) * kernel * kernel
    weight = rng.standard_normal((c_out, c_in // groups, kernel, kernel)) * (gain / np.sqrt(fan_in))
    bias = rng.standard_normal(c_out) * 0.1
    return {f"{prefix}.weight": _f32(weight), f"{prefix}.bias": _f32(bias)}


def conv_bn(
    rng: np.random.Generator,
    prefix: str,
    c_out: int,
    c_in: int,
    kernel: int,
    groups: int = 1,
    gain: float = np.sqrt(2.0),
    bn_scale: float = 1.0,
) -> Weights:
    """A bias-free conv2d followed by inference batch norm, folded into one conv with bias.

    ``bn_scale`` scales the batch norm's gamma: a value below one on the last
    conv of a residual branch keeps the variance from doubling at every add.
    """
    fan_in = (c_in // groups) * kernel * kernel
    weight = rng.standard_normal((c_out, c_in // groups, kernel, kernel)) * (gain / np.sqrt(fan_in))
    gamma = rng.uniform(0.8, 1.2, c_out) * bn_scale
    beta = rng.standard_normal(c_out) * 0.1
    mean = rng.standard_normal(c_out) * 0.1
    var = rng.uniform(0.8, 1.2, c_out)
    scale = gamma / np.sqrt(var + BN_EPS)
    return {
        f"{prefix}.weight": _f32(weight * scale[:, None, None, None]),
        f"{prefix}.bias": _f32(beta - mean * scale),
    }


def layer_norm(rng: np.random.Generator, prefix: str, n: int) -> Weights:
    """Weights of a layer norm: ``weight`` near one, ``bias`` near zero."""
    return {
        f"{prefix}.weight": _f32(1.0 + rng.standard_normal(n) * 0.05),
        f"{prefix}.bias": _f32(rng.standard_normal(n) * 0.05),
    }


def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)
