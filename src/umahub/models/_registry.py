"""The zoo's table of models and the functions that look them up."""

from __future__ import annotations

import functools

import numpy as np
import tvm

from ..errors import UnknownModelError, did_you_mean
from . import bert, cnn, int8, mlp, mobilenet, resnet
from ._spec import ModelInfo, ModelSpec, Weights

_FLOAT = (
    mlp.SPEC,
    cnn.SPEC,
    resnet.SPEC,
    mobilenet.SPEC,
    bert.spec("bert", layers=1),
    bert.spec("bert2", layers=2),
)
#: Calibration samples of each int8 variant: more where a run of the float model is cheap.
_CALIBRATION_SAMPLES = {
    "mlp": 32,
    "cnn": 32,
    "resnet18": 8,
    "mobilenetv2": 8,
    "bert": 8,
    "bert2": 8,
}

_SPECS: dict[str, ModelSpec] = {
    s.name: s for s in (*_FLOAT, *(int8.spec(f, _CALIBRATION_SAMPLES[f.name]) for f in _FLOAT))
}


def names() -> list[str]:
    """The names of the zoo's models: the float models smallest first, then their int8 variants."""
    return list(_SPECS)


def spec(name: str) -> ModelSpec:
    """The :class:`ModelSpec` of ``name``; :class:`UnknownModelError` if there is none."""
    if not isinstance(name, str):
        raise TypeError(f"a model name is a str, not {type(name).__name__}")
    try:
        return _SPECS[name]
    except KeyError:
        known = ", ".join(sorted(_SPECS))
        raise UnknownModelError(
            f"unknown model {name!r}{did_you_mean(name, _SPECS)}; known: {known}"
        ) from None


def weights(name: str) -> Weights:
    """The weights of ``name`` as bound into :func:`get`'s module: the same values on every
    call (fixed seed), in a fresh dict of fresh arrays.

    Keys and layouts are PyTorch's (``fc.weight`` is (out, in), convs OIHW), as
    the models of :mod:`umahub.models.torch_zoo` name their parameters; batch
    norm is already folded into conv weight and bias. An int8 model's are the
    float weights it was quantized from (its module binds them quantized).
    """
    s = spec(name)
    return s.make_weights(np.random.default_rng(s.weight_seed))


def get(name: str) -> tvm.IRModule:
    """The Relax module of model ``name``: ``main`` takes the model's inputs, weights bound in.

    Built once per name and cached; each call returns a new ``IRModule`` over
    the same (immutable) functions, so that adding a function to the result
    does not change what later callers get.
    """
    spec(name)
    mod = _build(name)
    return tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs, global_infos=mod.global_infos)


@functools.cache
def _build(name: str) -> tvm.IRModule:
    return spec(name).build(weights(name))


def inputs(name: str, seed: int = 0) -> list[np.ndarray]:
    """Example inputs of ``name``, in the order ``main`` takes them, drawn with ``seed``.

    Tensors are standard normal, except BERT's attention mask: an additive
    mask with 0 for the first 100 positions and -10000 for the last 28.
    """
    s = spec(name)
    rng = np.random.default_rng(seed)
    if s.make_inputs is not None:
        return s.make_inputs(rng)
    return [rng.standard_normal(t.shape).astype(t.dtype) for t in s.inputs]


@functools.cache
def info(name: str) -> ModelInfo:
    """Name, description, input and output tensors and parameter count of ``name``."""
    s = spec(name)
    num_params = sum(int(w.size) for w in weights(name).values())
    return ModelInfo(s.name, s.description, s.inputs, s.output, num_params)
