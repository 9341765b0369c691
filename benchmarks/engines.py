"""umahub against the engines people compare it with: PyTorch eager, ONNX Runtime, plain TVM.

For each model, in one run on one machine, each engine in a long-lived
process of its own, the same weights, the same input, the same thread count
(``--threads``, default 2), numpy in and numpy out:

* ``torch``: PyTorch eager, ``torch.no_grad()``;
* ``ort``: ONNX Runtime on the model exported by ``torch.onnx.export``
  (TorchScript exporter, opset 17), ``intra_op_num_threads`` = threads;
* ``tvm``: plain ``tvm.compile(mod, "llvm")`` of the same Relax module;
* ``umahub``: ``umahub.Hub`` with the three bundled plugins, priority
  npu, vanilla_accel, dsp_cpu.

Denormals: random weights make tiny values whose arithmetic is 10-100x slower
on x86 unless the CPU flushes them to zero; PyTorch does not by default, ONNX
Runtime and TVM's LLVM code neither. Every worker calls
``torch.set_flush_denormal(True)`` before its engine makes a thread (threads
inherit the setting), so all engines run with flush-to-zero, and ONNX Runtime
is also told ``session.set_denormal_as_zero``. Outputs are compared with
PyTorch's: the results keep each engine's largest absolute difference
(``max_error``), the scale of PyTorch's output (``reference_scale``, its
largest magnitude) and their ratio (``rel_error``); a row above 1e-3 is
marked ``INVALID`` (``valid``: false, with ``why``) and gets no ratio. The
torchvision models' random weights give outputs of order one
(``_models.random_torchvision``), so that the comparison checks something.

Models: the zoo's (``resnet18``, ``mobilenetv2``, ``bert``, ``bert2``; PyTorch
twins with the same weights from ``umahub.models.torch_zoo``) and torchvision
architectures with random weights (seed 0): ``resnet50``, ``efficientnet_b0``,
``mobilenet_v3_small``, ``vit_b_16``, ``squeezenet1_1``.

    python benchmarks/engines.py [MODEL ...] [--engines torch,ort,tvm,umahub] [--repeat N]
        [--baseline CHECKOUT] [--rounds N]

The engines take turns (``_common.interleave``): ``--rounds`` rounds, in each
every engine runs ``--repeat`` calls (plain TVM :data:`TVM_REPEAT` calls, in
its first :data:`TVM_ROUNDS` rounds only), the order rotating, with a pause
between turns (TVM's, PyTorch's and ONNX Runtime's thread pools keep spinning
after a run and would take the cores from the next). An engine's time
(``ms``) is the median of its rounds' medians (``round_ms``); the ratios
(``umahub_over_torch``, ``umahub_over_ort``) are the median of each round's
ratio, so a period in which the shared machine ran slow divides out, where
engines timed one after the other each had their own.

``compile_s`` is the engine's own compile (``hub.compile``, ``tvm.compile``,
the ONNX Runtime session), ``import_s`` what comes before it: the ONNX
export, or ``torch.export`` and the Relax import.

Needs torch, torchvision, onnx and onnxruntime (``tox -e bench``). Results:
``results/engines_<kind>.json``, one file per kind of machine (``intel``,
``amd``: kernels tuned on one kind are slower on the other, and both run this
project), with the CPU, the versions and the commit measured; the table is
printed.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from _common import cpu_kind, interleave, paired_ratio, worker_env, write
from _models import TORCHVISION, ZOO

ENGINES = ["torch", "ort", "tvm", "umahub"]

#: Calls and rounds of plain TVM, whose unscheduled kernels take up to a minute a
#: call (vit_b_16): its time is for information, in no ratio.
TVM_REPEAT = 2
TVM_ROUNDS = 1

# One engine on one model, in a process of its own, timed by _common.interleave.
_WORKER = r"""
import json, os, sys, time
from _common import serve
name, engine, workdir, label = sys.argv[1:5]
threads = int(os.environ["TVM_NUM_THREADS"])
import numpy as np
import torch
torch.set_flush_denormal(True)
torch.set_num_threads(threads)

from _models import random_torchvision

def model():
    from umahub.models import names
    if name in names():
        from umahub.models import torch_zoo
        module, inputs = torch_zoo.torch_module(name)
        return module.eval(), tuple(inputs)
    module, x = random_torchvision(name)
    return module, (x,)

module, inputs = model()
arrays = [x.numpy() for x in inputs]
import_s = 0.0  # the model into the engine's form: ONNX export, torch.export + Relax import
start = time.perf_counter()
if engine == "torch":
    def run():
        with torch.no_grad():
            return module(*inputs).numpy()
elif engine == "ort":
    import onnxruntime as ort
    path = os.path.join(workdir, name + ".onnx")
    if not os.path.exists(path):
        # nn.MultiheadAttention's fused fast path (aten::_native_multi_head_attention)
        # has no ONNX export; the plain path computes the same
        torch.backends.mha.set_fastpath_enabled(False)
        with torch.no_grad():
            torch.onnx.export(module, inputs, path, dynamo=False, opset_version=17)
    import_s, start = time.perf_counter() - start, time.perf_counter()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.set_denormal_as_zero", "1")
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feeds = {i.name: a for i, a in zip(session.get_inputs(), arrays)}
    def run():
        return session.run(None, feeds)[0]
else:
    import warnings
    warnings.simplefilter("ignore")
    import tvm
    import umahub
    from umahub.frontends import to_relax
    from umahub.models import names
    if name in names():
        import umahub.models as zoo
        mod = zoo.get(name)
    else:
        mod = to_relax(torch.export.export(module, inputs))
    import_s, start = time.perf_counter() - start, time.perf_counter()
    if engine == "tvm":
        vm = tvm.relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
        main = vm["main"]
        def run():
            return main(*[tvm.runtime.tensor(a) for a in arrays]).numpy()
    else:
        hub = umahub.Hub(
            config={"plugins": ["npu", "vanilla", "dsp"],
                    "priority": ["npu", "vanilla_accel", "dsp_cpu"]},
            project_config=False,
        )
        compiled = hub.compile(mod)
        try:  # the VM: the numbers of one inference on one thread of calls
            compiled.run(*arrays, executor="vm")
            def run():
                return compiled.run(*arrays, executor="vm")
        except TypeError:  # an umahub from before the concurrent executor (--baseline)
            def run():
                return compiled.run(*arrays)
compile_s = time.perf_counter() - start
np.save(os.path.join(workdir, f"{name}.{label}.npy"), np.asarray(run()))
serve(run, compile_s=compile_s, import_s=import_s)
"""


def worker(name: str, engine: str, workdir: str, env: dict) -> tuple[str, list[str], dict]:
    """One engine on one model, for :func:`_common.interleave`."""
    if engine == "before":  # umahub and its plugins from the baseline checkout, first on the path
        env = dict(env, PYTHONPATH=env["UMAHUB_BASELINE_PATH"] + os.pathsep + env["PYTHONPATH"])
    return _WORKER, [name, "umahub" if engine == "before" else engine, workdir, engine], env


#: Largest relative error against PyTorch's outputs (of the largest output in size) for
#: which an engine's time counts: above it, the engine computed something else.
VALID_REL_ERROR = 1e-3


def agreement(got, want) -> dict:
    """How far an engine's outputs are from PyTorch's: the largest absolute difference, the
    scale of the reference (its largest magnitude) and their ratio; ``valid`` when the
    ratio is at most :data:`VALID_REL_ERROR` and the reference is not all zeros (a
    comparison with zeros checks nothing)."""
    import numpy as np

    if got.shape != want.shape:
        return {"valid": False, "why": f"output shape {got.shape}, PyTorch's {want.shape}"}
    error = float(np.abs(got.astype(np.float64) - want).max())
    scale = float(np.abs(want).max())
    rel = error / scale if scale > 0 else float("inf")
    result = {"max_error": error, "reference_scale": scale, "rel_error": rel}
    result["valid"] = bool(np.isfinite(got).all()) and rel <= VALID_REL_ERROR
    if not result["valid"]:
        result["why"] = (
            "PyTorch's outputs are all zero: nothing to compare"
            if scale == 0
            else f"relative error {rel:.2g} against PyTorch, above {VALID_REL_ERROR:g}"
        )
    return result


def _cell(engine: str, result: dict) -> str:
    if "ms" not in result:
        return f"{engine} failed"
    mark = "" if result.get("valid", True) else " INVALID"
    return f"{engine} {result['ms']:8.1f} ms{mark}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=ZOO + TORCHVISION)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--repeat", type=int, default=5, help="calls per engine per round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--rounds", type=int, default=5, help="rounds: in each, every engine in turn"
    )
    parser.add_argument(
        "--baseline",
        metavar="CHECKOUT",
        help="also time umahub and its bundled plugins from this checkout (engine 'before'), "
        "e.g. a git worktree of the previous release",
    )
    args = parser.parse_args()
    import numpy as np

    env = worker_env(args.threads)
    engines = args.engines.split(",")
    if args.baseline:
        base = Path(args.baseline).resolve()
        roots = [base / "src", *sorted((base / "plugins").glob("*/src"))]
        env["UMAHUB_BASELINE_PATH"] = os.pathsep.join(str(r) for r in roots)
        if "before" not in engines:  # named in --engines too: timed once per round, not twice
            engines.append("before")
    elif "before" in engines:
        parser.error("engine 'before' times the checkout given by --baseline CHECKOUT")
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="umahub-engines-") as workdir:
        for name in args.models:
            repeat = {e: args.repeat if e != "tvm" else TVM_REPEAT for e in engines}
            workers = {e: worker(name, e, workdir, env) for e in engines}
            row = interleave(workers, args.rounds, repeat, workdir, {"tvm": TVM_ROUNDS})
            reference = Path(workdir) / f"{name}.torch.npy"
            for e, result in row.items():
                out = Path(workdir) / f"{name}.{e}.npy"
                if "error" not in result and reference.exists() and out.exists():
                    result.update(agreement(np.load(out), np.load(reference)))
            ours = row.get("umahub", {})
            for e in ("torch", "ort", "before"):
                # a time for other numbers is no comparison
                if e in row and ours.get("valid", True) and row[e].get("valid", True):
                    ratio = paired_ratio(ours, row[e])
                    if ratio is not None:
                        row[f"umahub_over_{e}"] = ratio
            rows[name] = row
            cells = "  ".join(_cell(e, row[e]) for e in engines)
            ratios = "  ".join(
                f"/{e} {row[f'umahub_over_{e}']:.2f}"
                for e in ("torch", "ort", "before")
                if f"umahub_over_{e}" in row
            )
            print(f"{name:20} {cells}  {ratios}", flush=True)
    path = write(
        f"engines_{cpu_kind()}",
        {
            "threads": args.threads,
            "repeat": args.repeat,
            "rounds": args.rounds,
            "denormals": "flushed to zero in every engine (torch.set_flush_denormal(True) "
            "in each worker before its threads start; ONNX Runtime also "
            "session.set_denormal_as_zero)",
            "models": rows,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
