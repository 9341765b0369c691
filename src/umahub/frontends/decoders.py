"""Language models (decoders with a KV cache) exported as a prefill and a decode step.

A decoder from ``transformers`` (GPT-2, Llama, Qwen2, ...) is exported the way
ExecuTorch exports it: wrapped in ``transformers``' own
``TorchExportableModuleWithStaticCache``, whose static cache (keys and values
of ``max_context`` positions per layer) is a set of buffers the forward
writes. Two programs come of it:

- the *prefill*: ``(input_ids[1, n], cache_position[n])`` with a symbolic
  ``n`` from 1 to ``max_context``;
- the *decode step*: the same with ``n = 1``, shapes static.

umahub's import lifts the written buffers to inputs and outputs
(:func:`umahub.frontends.torch_rewrites.lift_mutated_buffers`): both compiled
functions take ``(input_ids, cache_position, *state)`` and return
``(logits, *state)``, the state being each layer's key cache, value cache and
length, in the wrapper's buffer order.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from umahub.errors import UmahubError

__all__ = ["DecoderPrograms", "bound_to_context", "export_decoder", "state_of"]


@dataclass
class DecoderPrograms:
    """A decoder's two exported programs and its cache.

    Attributes:
        prefill: ``torch.export`` program over a prompt of symbolic length.
        decode: the same over one token.
        state: the cache's buffers, by name, with their values before the
            first call (what :meth:`umahub.CompiledDecoder.generate` starts from).
        max_context: the positions the cache holds: prompt and new tokens together.
    """

    prefill: Any
    decode: Any
    state: dict[str, np.ndarray] = field(default_factory=dict)
    max_context: int = 0


@contextlib.contextmanager
def _static_cache_config(model: Any) -> Iterator[None]:
    """The model's generation config asking for a static cache, put back afterwards."""
    before = model.generation_config
    config = copy.deepcopy(before)
    config.use_cache = True
    config.cache_implementation = "static"
    model.generation_config = config
    try:
        yield
    finally:
        model.generation_config = before


def export_decoder(model: Any, *, max_context: int = 128) -> DecoderPrograms:
    """Export a ``transformers`` causal language model as a prefill and a decode step.

    Args:
        model: a ``transformers`` ``PreTrainedModel`` with a language-model
            head (``GPT2LMHeadModel``, ``LlamaForCausalLM``, ...), in eval mode.
        max_context: positions in the static cache (prompt plus new tokens).

    Raises:
        UmahubError: ``transformers`` or PyTorch is missing, ``max_context``
            is under 2, or the model cannot be exported with a static cache
            (the message gives PyTorch's or ``transformers``' reason).
    """
    if max_context < 2:
        raise UmahubError(
            f"max_context must be 2 or more (a prompt and a token), not {max_context}"
        )
    try:
        import torch
        from transformers.integrations.executorch import TorchExportableModuleWithStaticCache
    except ImportError as exc:
        raise UmahubError(
            f"exporting a language model needs PyTorch and transformers ({exc}): "
            "pip install 'umahub[transformers]'"
        ) from exc
    try:
        with _static_cache_config(model):
            wrapper = TorchExportableModuleWithStaticCache(
                model, batch_size=1, max_cache_len=max_context
            )
        state = {
            name: buffer.detach().numpy().copy()
            for name, buffer in wrapper.named_buffers()
            if "." not in name  # the wrapper's own: the cache, not the model's buffers
        }
        length = torch.export.Dim("tokens", min=1, max=max_context)
        prompt = min(8, max_context)
        with torch.no_grad():
            prefill = torch.export.export(
                wrapper,
                (),
                {
                    "input_ids": torch.zeros((1, prompt), dtype=torch.long),
                    "cache_position": torch.arange(prompt),
                },
                dynamic_shapes={"input_ids": {1: length}, "cache_position": {0: length}},
                strict=False,
            )
            decode = torch.export.export(
                wrapper,
                (),
                {
                    "input_ids": torch.zeros((1, 1), dtype=torch.long),
                    "cache_position": torch.arange(1),
                },
                strict=False,
            )
    except UmahubError:
        raise
    except Exception as exc:
        raise UmahubError(
            f"{type(model).__name__} could not be exported with a static KV cache: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    return DecoderPrograms(prefill, decode, state, max_context)


def state_of(mod: Any) -> list[str]:
    """The names of the buffers an imported ``main`` takes and returns as its state,
    in its order (after the user's inputs and outputs); none for a model without."""
    names = mod["main"].attrs.get("umahub_state") if mod["main"].attrs else None
    return [str(n) for n in names] if names is not None else []


def bound_to_context(mod: Any, max_context: int) -> Any:
    """``mod`` with each symbolic size of ``main``'s inputs that has no upper bound
    bounded by ``max_context`` (``tir_var_upper_bound``, TVM's own attribute, which
    TVM's PyTorch import sets from ``torch.export``'s ``Dim`` and umahub reads):
    a prompt is at most the context, so accelerators can take the prefill's
    operators and their memory is checked at that worst case."""
    import tvm

    from umahub._tvm import type_of
    from umahub.plugin.memory import size_bounds, symbolic_sizes

    main = mod["main"]
    bounds = size_bounds(main)
    sizes = set().union(*(symbolic_sizes(type_of(p)) for p in main.params)) - {"?"}
    missing = sorted(s for s in sizes if s not in bounds)
    if not missing:
        return mod
    bounds.update(dict.fromkeys(missing, max_context))
    updated = tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs)
    gv = mod.get_global_var("main")
    updated[gv] = main.with_attr("tir_var_upper_bound", bounds)
    return updated
