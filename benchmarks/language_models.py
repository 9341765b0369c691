"""Language models with a KV cache: umahub against PyTorch eager and plain TVM.

GPT-2, Llama and Qwen2 from ``transformers``, built from small configurations
(4 layers, hidden size 256, 8 heads; Llama and Qwen2 with 4 key-value heads,
an MLP of 688; a vocabulary of 2048) with random weights (seed 0), each wrapped
in ``transformers``' ``TorchExportableModuleWithStaticCache`` (ExecuTorch's
static cache) of 160 positions. Each engine runs in a process of its own, with
the same thread count (``--threads``, default 2):

* ``torch``: PyTorch eager, the wrapper itself (the same static cache), ``torch.no_grad()``;
* ``tvm``: plain ``tvm.compile(mod, "llvm")`` of umahub's import of the same
  two exported programs (the prefill over a symbolic number of tokens, the
  decode step over one), the cache passed in and out as umahub does;
* ``umahub``: ``Hub.compile_decoder`` with the three bundled plugins (npu,
  vanilla, dsp), run by :meth:`umahub.CompiledDecoder` on the VM.

Each round: the prefill over a prompt of 128 random tokens, then 32 decode
steps, greedily; one round to warm up, then ``--repeat`` rounds. ``prefill_ms``
is the median prefill, ``decode_tokens_per_s`` one over the median decode
step. Every engine's 32 greedy tokens are compared with PyTorch's
(``tokens_equal``), and its prefill logits by their relative error
(``max|a - b| / max|b|``).

    python benchmarks/language_models.py [MODEL ...] [--engines torch,tvm,umahub] [--repeat N]
        [--rounds N]

On a machine shared with other work, ``--rounds N`` runs every engine N
times, round-robin (each round a new process), and keeps each engine's round
with the fastest decode: a round another job disturbed does not count against
one engine only. PyTorch's thread pool suffers most from a busy neighbour.

Needs torch and transformers. Results: ``results/language_models.json``; the
table is printed.
"""

from __future__ import annotations

import argparse
import tempfile

from _common import add_rounds_option, fastest, run_worker, worker_env, write

MODELS = ["gpt2", "llama", "qwen2"]
ENGINES = ["torch", "tvm", "umahub"]

#: What is recorded over every round (:func:`_common.fastest`): the fastest decode is kept.
ROUNDS_KEPT = {"decode_ms": "round_decode_ms", "prefill_ms": "round_prefill_ms"}
PROMPT, NEW_TOKENS, CONTEXT = 128, 32, 160

_WORKER = r"""
import json, os, statistics, sys, time, warnings
name, engine, repeat, workdir = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
PROMPT, NEW_TOKENS, CONTEXT = 128, 32, 160
threads = int(os.environ["TVM_NUM_THREADS"])
warnings.simplefilter("ignore")
import numpy as np
import torch
torch.set_flush_denormal(True)
torch.set_num_threads(threads)
import transformers

def build():
    torch.manual_seed(0)
    common = dict(vocab_size=2048, max_position_embeddings=512)
    if name == "gpt2":
        config = transformers.GPT2Config(n_layer=4, n_embd=256, n_head=8, n_positions=512,
                                         vocab_size=2048, initializer_range=0.3,
                                         bos_token_id=0, eos_token_id=0)
        return transformers.GPT2LMHeadModel(config).eval()
    small = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                 num_attention_heads=8, num_key_value_heads=4, **common)
    if name == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**small)).eval()
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**small)).eval()

model = build()
ids = np.random.default_rng(1).integers(0, 2048, (1, PROMPT)).astype("int64")
start = time.perf_counter()
if engine == "torch":
    from umahub.frontends.decoders import _static_cache_config
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache
    with _static_cache_config(model):
        wrapper = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=CONTEXT)
    def step(tokens, first, state):
        with torch.no_grad():
            out = wrapper(input_ids=torch.from_numpy(tokens),
                          cache_position=torch.arange(first, first + tokens.shape[1]))
        return out.numpy(), state
    prefill = decode = step
    def fresh():
        for key, buffer in wrapper.named_buffers():
            if "." not in key and buffer.dtype.is_floating_point:  # the cache, not rope's
                buffer.zero_()
        return None
    compile_s = 0.0
else:
    import umahub
    from umahub.frontends.decoders import export_decoder
    programs = export_decoder(model, max_context=CONTEXT)
    if engine == "tvm":
        import tvm
        from umahub.frontends import to_relax
        from umahub.frontends.decoders import state_of
        from umahub.runtime.running import host_tensor, to_numpy
        def function(program):
            mod = to_relax(program)
            vm = tvm.relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
            return vm["main"], state_of(mod)
        (prefill_main, names) = function(programs.prefill)
        (decode_main, _) = function(programs.decode)
        def wrap(main):
            def step(tokens, first, state):
                positions = np.arange(first, first + tokens.shape[1], dtype="int64")
                arrays = (tokens, positions, *state)
                out = to_numpy(main(*[host_tensor(a, tvm.cpu()) for a in arrays]))
                return out[0], out[1:]
            return step
        prefill, decode = wrap(prefill_main), wrap(decode_main)
        def fresh():
            return [programs.state[n].copy() for n in names]
    else:
        hub = umahub.Hub(config={"plugins": ["npu", "vanilla", "dsp"],
                                 "priority": ["npu", "vanilla_accel", "dsp_cpu"]},
                         project_config=False)
        decoder = hub.compile_decoder(programs)
        for function in (decoder.prefill, decoder.decode):
            function.executor = "vm"
        def wrap(function):
            def step(tokens, first, state):
                return decoder._step(function, tokens, first, state)
            return step
        prefill, decode = wrap(decoder.prefill), wrap(decoder.decode)
        fresh = decoder.start
    compile_s = time.perf_counter() - start

def one_round():
    t0 = time.perf_counter()
    logits, state = prefill(ids, 0, fresh())
    prefill_s = time.perf_counter() - t0
    first_logits = logits
    tokens, steps = [int(np.argmax(logits[0, -1]))], []
    for i in range(NEW_TOKENS - 1):
        t0 = time.perf_counter()
        logits, state = decode(np.asarray([[tokens[-1]]], "int64"), PROMPT + i, state)
        steps.append(time.perf_counter() - t0)
        tokens.append(int(np.argmax(logits[0, -1])))
    return prefill_s, steps, tokens, first_logits

_, _, tokens, logits = one_round()
prefills, steps = [], []
for _ in range(repeat):
    p, s, again, _ = one_round()
    assert again == tokens, "a round generated other tokens"
    prefills.append(p)
    steps.extend(s)
np.save(os.path.join(workdir, f"{name}.{engine}.npy"), logits)
print(json.dumps({
    "prefill_ms": statistics.median(prefills) * 1e3,
    "decode_ms": statistics.median(steps) * 1e3,
    "decode_tokens_per_s": 1.0 / statistics.median(steps),
    "compile_s": compile_s,
    "tokens": tokens,
}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=MODELS)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    add_rounds_option(parser)
    args = parser.parse_args()
    from pathlib import Path

    import numpy as np

    env = worker_env(args.threads)
    engines = args.engines.split(",")
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="umahub-llm-") as workdir:
        for name in args.models:
            rounds: dict[str, list[dict]] = {e: [] for e in engines}
            for _ in range(max(1, args.rounds)):
                for e in engines:
                    rounds[e].append(
                        run_worker(_WORKER, [name, e, str(args.repeat), workdir], env, cwd=workdir)
                    )
            row = {e: fastest(r, "decode_ms", ROUNDS_KEPT) for e, r in rounds.items()}
            reference = row.get("torch", {})
            want_path = Path(workdir) / f"{name}.torch.npy"
            for e, result in row.items():
                if "error" in result or "tokens" not in reference:
                    continue
                result["tokens_equal"] = result["tokens"] == reference["tokens"]
                got_path = Path(workdir) / f"{name}.{e}.npy"
                if want_path.exists() and got_path.exists():
                    got, want = np.load(got_path), np.load(want_path)
                    result["relative_error"] = float(np.abs(got - want).max() / np.abs(want).max())
            for e in ("torch", "tvm"):
                ours, theirs = row.get("umahub", {}), row.get(e, {})
                if "prefill_ms" in ours and "prefill_ms" in theirs:
                    row[f"prefill_umahub_over_{e}"] = ours["prefill_ms"] / theirs["prefill_ms"]
                    row[f"decode_umahub_over_{e}"] = (
                        ours["decode_tokens_per_s"] / theirs["decode_tokens_per_s"]
                    )
            rows[name] = row
            cells = "  ".join(
                f"{e} prefill {row[e]['prefill_ms']:7.1f} ms decode "
                f"{row[e]['decode_tokens_per_s']:7.1f} tok/s"
                if "prefill_ms" in row[e]
                else f"{e} failed ({row[e].get('error')})"
                for e in engines
            )
            print(f"{name:8} {cells}", flush=True)
    path = write(
        "language_models",
        {
            "threads": args.threads,
            "repeat": args.repeat,
            "rounds": args.rounds,
            "prompt_tokens": PROMPT,
            "new_tokens": NEW_TOKENS,
            "max_context": CONTEXT,
            "models": rows,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
