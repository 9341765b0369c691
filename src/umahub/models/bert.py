"""``bert`` and ``bert2``: BERT-base encoder layers (Devlin et al. 2018), post-norm.

Hidden 768, 12 heads of 64, sequence 128, intermediate 3072, erf GELU, layer
norm with epsilon 1e-12. ``main(hidden_states, attention_mask)``:

- ``hidden_states`` (1, 128, 768) float32: the embeddings (no embedding layer);
- ``attention_mask`` (1, 1, 1, 128) float32, *additive*: 0 where a token may be
  attended to, -10000 at padding, as BERT implementations feed it to softmax.

The mask is an input rather than a constant because masked softmax is where
TVM's C codegen has been seen to return NaN: :func:`umahub.models.inputs`
gives a realistic mask (the last 28 positions padding), not random values.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from . import _init
from ._graph import Graph, build_main
from ._spec import ModelSpec, TensorSpec, Weights

SEQ, HIDDEN, HEADS, INTERMEDIATE = 128, 768, 12, 3072
HEAD_DIM = HIDDEN // HEADS
LN_EPS = 1e-12
VALID_TOKENS = 100  # positions 100..127 of the example mask are padding
MASKED = -10000.0

INPUTS = (TensorSpec((1, SEQ, HIDDEN)), TensorSpec((1, 1, 1, SEQ)))


def make_weights(rng: np.random.Generator, layers: int) -> Weights:
    """Per layer ``layer.{i}.``: ``query``, ``key``, ``value``, ``attn_out``, ``attn_norm``,
    ``ffn_in``, ``ffn_out``, ``ffn_norm`` (PyTorch layout)."""
    w: Weights = {}
    for i in range(layers):
        p = f"layer.{i}"
        for name in ("query", "key", "value", "attn_out"):
            w |= _init.linear(rng, f"{p}.{name}", HIDDEN, HIDDEN)
        w |= _init.layer_norm(rng, f"{p}.attn_norm", HIDDEN)
        w |= _init.linear(rng, f"{p}.ffn_in", INTERMEDIATE, HIDDEN, gain=np.sqrt(2.0))
        w |= _init.linear(rng, f"{p}.ffn_out", HIDDEN, INTERMEDIATE)
        w |= _init.layer_norm(rng, f"{p}.ffn_norm", HIDDEN)
    return w


def make_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    """Hidden states drawn from N(0, 1) and the additive padding mask."""
    hidden = rng.standard_normal(INPUTS[0].shape).astype(np.float32)
    mask = np.zeros(INPUTS[1].shape, dtype=np.float32)
    mask[..., VALID_TOKENS:] = MASKED
    return [hidden, mask]


def _heads(g: Graph, x, name: str, key: bool = False):
    """(1, S, 768) -> (1, 12, S, 64), or (1, 12, 64, S) for the keys."""
    x = g.reshape(x, (1, SEQ, HEADS, HEAD_DIM), f"{name}.split")
    axes = [0, 2, 3, 1] if key else [0, 2, 1, 3]
    return g.emit(relax.op.permute_dims(x, axes), f"{name}.heads")


def _encoder_layer(g: Graph, x, mask, p: str):
    q = _heads(g, g.linear(x, f"{p}.query"), f"{p}.query")
    k = _heads(g, g.linear(x, f"{p}.key"), f"{p}.key", key=True)
    v = _heads(g, g.linear(x, f"{p}.value"), f"{p}.value")
    scores = g.emit(relax.op.matmul(q, k), f"{p}.scores")
    scale = relax.const(np.sqrt(HEAD_DIM), "float32")
    scores = g.emit(relax.op.divide(scores, scale), f"{p}.scale")
    scores = g.add(scores, mask, f"{p}.mask")
    probs = g.emit(relax.op.nn.softmax(scores, axis=-1), f"{p}.softmax")
    ctx = g.emit(relax.op.matmul(probs, v), f"{p}.context")
    ctx = g.emit(relax.op.permute_dims(ctx, [0, 2, 1, 3]), f"{p}.context.merge")
    ctx = g.reshape(ctx, (1, SEQ, HIDDEN), f"{p}.context.flat")
    h = g.add(g.linear(ctx, f"{p}.attn_out"), x, f"{p}.attn_residual")
    h = g.layer_norm(h, f"{p}.attn_norm", LN_EPS)
    f = g.emit(relax.op.nn.gelu(g.linear(h, f"{p}.ffn_in")), f"{p}.gelu")
    out = g.add(g.linear(f, f"{p}.ffn_out"), h, f"{p}.ffn_residual")
    return g.layer_norm(out, f"{p}.ffn_norm", LN_EPS)


def build(weights: Weights, layers: int) -> tvm.IRModule:
    """``main(hidden_states: (1, 128, 768), attention_mask: (1, 1, 1, 128)) -> (1, 128, 768)``."""

    def body(g, hidden, mask):
        for i in range(layers):
            hidden = _encoder_layer(g, hidden, mask, f"layer.{i}")
        return hidden

    return build_main(weights, {"hidden_states": INPUTS[0], "attention_mask": INPUTS[1]}, body)


def spec(name: str, layers: int) -> ModelSpec:
    """The zoo entry of a ``layers``-layer encoder."""
    return ModelSpec(
        name=name,
        description=f"BERT-base encoder, {layers} layer{'s' if layers > 1 else ''}: hidden 768, "
        "12 heads, seq 128, intermediate 3072, GELU; additive attention mask input",
        inputs=INPUTS,
        output=TensorSpec((1, SEQ, HIDDEN)),
        make_weights=lambda rng: make_weights(rng, layers),
        build=lambda weights: build(weights, layers),
        make_inputs=make_inputs,
    )
