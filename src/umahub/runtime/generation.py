"""A language model's prefill and decode step, compiled, and the loop that generates with them.

:class:`CompiledDecoder` holds two compiled functions of one decoder (see
:mod:`umahub.frontends.decoders`): the *prefill* over a prompt of any length
up to the cache's, and the *decode step* over one token. Both take
``(input_ids, cache_position, *state)`` and return ``(logits, *state)``: the
KV cache goes in and comes back, so that the loop owns it and one compiled
decoder can generate for several prompts one after the other.
:meth:`CompiledDecoder.generate` is greedy decoding (the most likely token at
each step), what ``transformers``' ``generate(do_sample=False)`` does.

:meth:`CompiledDecoder.export_library` writes a directory (``prefill.so``,
``decode.so`` and ``decoder.json`` with the cache's starting values):
:func:`load_decoder` runs it without the plugins; ``umahub bench`` times it
(:func:`time_decoder`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from umahub.errors import UmahubError

__all__ = ["CompiledDecoder", "DecoderReport", "load_decoder", "time_decoder"]

_FILES = ("prefill.so", "decode.so")
_META = "decoder.json"


class DecoderReport:
    """The reports of a decoder's two compiled functions, shown one after the other.

    Attributes:
        prefill: the prefill's :class:`umahub.report.report.Report`.
        decode: the decode step's.
    """

    def __init__(self, prefill: Any, decode: Any):
        self.prefill = prefill
        self.decode = decode

    def __str__(self) -> str:
        return f"== prefill ==\n{self.prefill}\n\n== decode ==\n{self.decode}"

    def to_dict(self) -> dict[str, Any]:
        """Both reports, JSON-ready: ``{"prefill": ..., "decode": ...}``."""
        return {"prefill": self.prefill.to_dict(), "decode": self.decode.to_dict()}

    def to_json(self, indent: int = 2) -> str:
        """:meth:`to_dict` as JSON text."""
        return json.dumps(self.to_dict(), indent=indent)


class CompiledDecoder:
    """A decoder's prefill and decode step, compiled (:meth:`umahub.Hub.compile_decoder`)
    or loaded (:func:`load_decoder`).

    Attributes:
        prefill: the prefill (a :class:`umahub.Compiled` or :class:`umahub.LoadedModel`).
        decode: the decode step.
        state: the names of the cache's tensors, in the functions' order.
        initial: each one's value before the first token.
        max_context: positions the cache holds (prompt and new tokens together).
        report: both compiled functions' reports (None when loaded).
    """

    def __init__(
        self,
        prefill: Any,
        decode: Any,
        state: Sequence[str],
        initial: Mapping[str, np.ndarray],
        max_context: int,
        report: DecoderReport | None = None,
    ):
        missing = [name for name in state if name not in initial]
        if missing:
            raise UmahubError(
                f"the decoder's state {missing} has no starting value; export it with "
                "umahub.frontends.decoders.export_decoder"
            )
        self.prefill = prefill
        self.decode = decode
        self.state = list(state)
        self.initial = {name: np.asarray(initial[name]) for name in self.state}
        self.max_context = max_context
        self.report = report

    def start(self) -> list[np.ndarray]:
        """A fresh cache: the state's starting values (copies)."""
        return [self.initial[name].copy() for name in self.state]

    def generate(self, ids: Any, max_new_tokens: int = 32) -> np.ndarray:
        """Greedy decoding: ``ids`` (``[1, n]`` or ``[n]`` token ids) and up to
        ``max_new_tokens`` new ones, as a ``[1, n + max_new_tokens]`` int64 array.

        Raises:
            UmahubError: not one sequence of ids, an empty prompt, or a prompt and
                new tokens that do not fit the cache (``max_context``).
        """
        prompt = np.asarray(ids, dtype="int64")
        if prompt.ndim == 1:
            prompt = prompt[None]
        if prompt.ndim != 2 or prompt.shape[0] != 1 or prompt.shape[1] == 0:
            raise UmahubError(
                f"generate takes one sequence of token ids ([1, n] or [n], n >= 1), "
                f"not an array of shape {list(np.shape(ids))}"
            )
        length = prompt.shape[1]
        if length + max_new_tokens > self.max_context:
            raise UmahubError(
                f"a prompt of {length} tokens and {max_new_tokens} new ones need "
                f"{length + max_new_tokens} positions, but the cache holds "
                f"{self.max_context}; compile with a larger max_context"
            )
        tokens = list(prompt[0])
        if max_new_tokens <= 0:
            return prompt
        logits, state = self._step(self.prefill, prompt, 0, self.start())
        for _ in range(max_new_tokens - 1):
            tokens.append(int(np.argmax(logits[0, -1])))
            step = np.asarray([[tokens[-1]]], dtype="int64")
            logits, state = self._step(self.decode, step, len(tokens) - 1, state)
        tokens.append(int(np.argmax(logits[0, -1])))
        return np.asarray([tokens], dtype="int64")

    @staticmethod
    def _step(
        function: Any, ids: np.ndarray, start: int, state: list[np.ndarray]
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        positions = np.arange(start, start + ids.shape[1], dtype="int64")
        outputs = function.run(ids, positions, *state)
        return outputs[0], list(outputs[1:])

    def export_library(self, directory: str | os.PathLike) -> Path:
        """Write ``directory`` (made if missing): ``prefill.so``, ``decode.so``
        and ``decoder.json``, which :func:`load_decoder` reads."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.prefill.export_library(directory / _FILES[0])
        self.decode.export_library(directory / _FILES[1])
        meta = {
            "umahub_decoder": 1,
            "max_context": self.max_context,
            "state": [
                {
                    "name": name,
                    "shape": list(self.initial[name].shape),
                    "dtype": str(self.initial[name].dtype),
                    "values": self.initial[name].ravel().tolist()
                    if np.any(self.initial[name])
                    else None,
                }
                for name in self.state
            ],
        }
        (directory / _META).write_text(json.dumps(meta))
        return directory


def is_decoder_library(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory written by :meth:`CompiledDecoder.export_library`."""
    return (Path(path) / _META).is_file()


def load_decoder(path: str | os.PathLike) -> CompiledDecoder:
    """Load a decoder written by :meth:`CompiledDecoder.export_library` (no plugins needed).

    Raises:
        UmahubError: not such a directory, or a damaged one.
    """
    from umahub.runtime.compiled import load

    path = Path(path)
    if not is_decoder_library(path):
        raise UmahubError(
            f"{path} is not a decoder written by CompiledDecoder.export_library (no {_META} in it)"
        )
    try:
        meta = json.loads((path / _META).read_text())
        initial = {
            s["name"]: (
                np.zeros(s["shape"], s["dtype"])
                if s["values"] is None
                else np.asarray(s["values"], s["dtype"]).reshape(s["shape"])
            )
            for s in meta["state"]
        }
        names = [s["name"] for s in meta["state"]]
        max_context = int(meta["max_context"])
    except (ValueError, KeyError, TypeError) as exc:
        raise UmahubError(f"{path / _META} is damaged ({exc}); export the decoder again") from exc
    return CompiledDecoder(
        load(path / _FILES[0]), load(path / _FILES[1]), names, initial, max_context
    )


def time_decoder(
    decoder: CompiledDecoder, prompt_tokens: int = 128, new_tokens: int = 32, repeat: int = 5
) -> dict[str, Any]:
    """The prefill's time over a prompt and the decode step's tokens per second.

    The prompt is ``prompt_tokens`` random ids (fewer when the cache would not
    hold them and the new tokens); each of ``repeat`` rounds runs the prefill
    once, then ``new_tokens`` decode steps, after one round to warm up.

    Returns:
        JSON-ready: ``prompt_tokens``, ``new_tokens``, ``prefill_ms`` (median),
        ``prefill_tokens_per_s``, ``decode_ms`` (median per token) and
        ``decode_tokens_per_s``.
    """
    prompt_tokens = max(1, min(prompt_tokens, decoder.max_context - new_tokens))
    vocabulary = int(decoder.prefill.run(*_probe(decoder))[0].shape[-1])
    ids = np.random.default_rng(0).integers(0, vocabulary, (1, prompt_tokens)).astype("int64")
    prefill, decode = [], []
    for round_ in range(repeat + 1):
        start = time.perf_counter()
        logits, state = decoder._step(decoder.prefill, ids, 0, decoder.start())
        took = time.perf_counter() - start
        steps = []
        token = int(np.argmax(logits[0, -1]))
        for i in range(new_tokens):
            start = time.perf_counter()
            step = np.asarray([[token]], dtype="int64")
            logits, state = decoder._step(decoder.decode, step, prompt_tokens + i, state)
            steps.append(time.perf_counter() - start)
            token = int(np.argmax(logits[0, -1]))
        if round_:  # the first warms up
            prefill.append(took)
            decode.extend(steps)
    prefill_s, decode_s = float(np.median(prefill)), float(np.median(decode))
    return {
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "prefill_ms": prefill_s * 1e3,
        "prefill_tokens_per_s": prompt_tokens / prefill_s,
        "decode_ms": decode_s * 1e3,
        "decode_tokens_per_s": 1.0 / decode_s,
    }


def _probe(decoder: CompiledDecoder) -> list[np.ndarray]:
    """One token through the prefill: its logits give the vocabulary's size."""
    return [np.zeros((1, 1), "int64"), np.zeros(1, "int64"), *decoder.start()]
