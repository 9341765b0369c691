"""Language models from ``transformers`` (GPT-2, Llama, Qwen2) with a KV cache, through umahub.

Small configurations with random weights (seeded; nothing is downloaded).
With the static cache (ExecuTorch's export): compiled by a hub with the
bundled plugins into a prefill and a decode step, 32 greedy tokens must equal
PyTorch's own ``generate``. With the dynamic cache (``transformers``' default):
the prefill (an empty cache, concatenated) and a decode step (a cache of
symbolic length given) must import and give PyTorch's logits and cache.

Slow (``-m slow``, ``tox -e slow``): needs PyTorch and transformers; about
a minute per model.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch", reason="needs PyTorch: pip install 'umahub[transformers]'")
transformers = pytest.importorskip(
    "transformers", reason="needs transformers: pip install 'umahub[transformers]'"
)

VOCABULARY = 256
PROMPT = 8
NEW_TOKENS = 32


def _config(kind: str):
    small = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCABULARY,
        max_position_embeddings=256,
    )
    if kind == "gpt2":
        return transformers.GPT2LMHeadModel(
            transformers.GPT2Config(
                n_layer=2,
                n_embd=64,
                n_head=4,
                vocab_size=VOCABULARY,
                n_positions=256,
                bos_token_id=0,
                eos_token_id=0,
                initializer_range=0.3,
            )
        )
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**small))
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**small))


def build(kind: str):
    """The model, its random weights fixed by the seed."""
    torch.manual_seed(0)
    return _config(kind).eval()


def prompt() -> np.ndarray:
    return np.random.default_rng(1).integers(0, VOCABULARY, (1, PROMPT)).astype("int64")


@pytest.fixture(scope="module")
def hub():
    import umahub

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return umahub.Hub(config={"plugins": ["npu", "vanilla", "dsp"]}, project_config=False)


@pytest.fixture(scope="module")
def decoders(hub):
    """Each model compiled once: (model, CompiledDecoder)."""
    made = {}

    def get(kind):
        if kind not in made:
            model = build(kind)
            made[kind] = model, hub.compile_decoder(model, max_context=64)
        return made[kind]

    return get


def pytorch_greedy(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out = model.generate(
            torch.from_numpy(ids),
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
        )
    return out.numpy()


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen2"])
def test_greedy_tokens_equal_pytorchs_for_32_steps(kind, decoders):
    model, decoder = decoders(kind)
    ids = prompt()
    expected = pytorch_greedy(model, ids)
    assert expected.shape == (1, PROMPT + NEW_TOKENS)
    assert len(set(expected[0, PROMPT:].tolist())) > 1, "PyTorch repeats one token: no test"
    np.testing.assert_array_equal(decoder.generate(ids, max_new_tokens=NEW_TOKENS), expected)
    # the decode step's matrix-vector products on the npu (the prefill's symbolic
    # length keeps them on the host: the npu takes static shapes only)
    assert any(
        o.op == "relax.matmul" and o.device.startswith("npu")
        for o in decoder.decode.report.placement
    )
    assert decoder.prefill.input_info[0][0][1] == decoder.prefill.input_info[1][0][0]
    assert isinstance(decoder.prefill.input_info[0][0][1], str)  # the symbolic length
    assert decoder.decode.input_info[0][0] == (1, 1)


def test_the_report_shows_prefill_and_decode(decoders):
    _, decoder = decoders("llama")
    text = str(decoder.report)
    assert text.index("== prefill ==") < text.index("== decode ==")
    assert set(decoder.report.to_dict()) == {"prefill", "decode"}


def test_a_prompt_that_does_not_fit_the_cache_is_refused(decoders):
    from umahub.errors import UmahubError

    _, decoder = decoders("llama")
    with pytest.raises(UmahubError) as caught:
        decoder.generate(np.zeros((1, 40), "int64"), max_new_tokens=30)
    assert str(caught.value) == (
        "a prompt of 40 tokens and 30 new ones need 70 positions, but the cache holds 64; "
        "compile with a larger max_context"
    )


def test_an_exported_decoder_generates_the_same_tokens_and_benches(decoders, tmp_path, capsys):
    import json

    import umahub
    from umahub.cli import main

    model, decoder = decoders("gpt2")
    decoder.export_library(tmp_path / "gpt2")
    loaded = umahub.load_decoder(tmp_path / "gpt2")
    ids = prompt()
    np.testing.assert_array_equal(loaded.generate(ids, 16), decoder.generate(ids, 16))
    capsys.readouterr()
    argv = ["bench", str(tmp_path / "gpt2"), "--json", "-", "--repeat", "2"]
    assert main([*argv, "--prompt-tokens", "40", "--new-tokens", "4"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["prompt_tokens"], result["new_tokens"], result["repeat"]) == (40, 4, 2)
    assert result["decode_tokens_per_s"] == pytest.approx(1e3 / result["decode_ms"])
    assert result["prefill_tokens_per_s"] == pytest.approx(40e3 / result["prefill_ms"])


def _plain_tvm(mod, *arrays):
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(np.require(a, requirements="C")) for a in arrays])
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen2"])
def test_the_dynamic_cache_imports_for_prefill_and_decode(kind):
    """transformers' default cache: its first step concatenates an empty 1-D tensor with the
    keys (TVM's concat refused it); the decode step's export keeps guards on the cache's
    sizes that PyTorch's decomposition could not run."""
    from transformers.integrations.executorch import register_dynamic_cache_export_support

    from umahub.frontends.torch_import import from_exported_program

    register_dynamic_cache_export_support()
    model = build(kind)
    ids = torch.from_numpy(prompt())
    length = torch.export.Dim("length", min=1, max=64)
    with torch.no_grad():
        first = model(ids, use_cache=True)
        prefill = torch.export.export(
            model, (ids,), {"use_cache": True}, dynamic_shapes=({1: length}, None), strict=False
        )
        cache = first.past_key_values
        flat = [t.numpy().copy() for t in torch.utils._pytree.tree_leaves(cache)]
        past = torch.export.Dim("past", min=1, max=63)
        decode = torch.export.export(
            model,
            (ids[:, :1],),
            {"past_key_values": cache, "use_cache": True},
            dynamic_shapes={
                "input_ids": None,
                "past_key_values": [[{2: past}] * 2, [{2: past}] * 2],
                "use_cache": None,
            },
            strict=False,
        )
        step = model(ids[:, :1], past_key_values=cache, use_cache=True)
    logits, *keys_values = _plain_tvm(from_exported_program(prefill), ids.numpy())
    np.testing.assert_allclose(logits, first.logits.numpy(), rtol=1e-4, atol=1e-5)
    assert len(keys_values) == 4 and keys_values[0].shape[2] == PROMPT
    logits, *grown = _plain_tvm(from_exported_program(decode), ids[:, :1].numpy(), *flat)
    np.testing.assert_allclose(logits, step.logits.numpy(), rtol=1e-4, atol=1e-5)
    assert [g.shape[2] for g in grown] == [PROMPT + 1] * 4
