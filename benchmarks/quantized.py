"""Quantized models: ONNX Runtime int8 vs umahub int8 vs umahub float32, one run.

For each model (the zoo's resnet18, mobilenetv2 and bert, exported from their
PyTorch twins, and torchvision's resnet50 and efficientnet_b0 with random
weights): the float ONNX model, and its QDQ form from ONNX Runtime's
``quantize_static`` (a fixed, seeded calibration set of 8 inputs, per-channel,
QUInt8 activations, QInt8 weights). Each engine runs in a long-lived process
of its own with 2 threads (``TVM_NUM_THREADS``, ORT's intra-op threads), numpy
in and out, and the three take turns (``_common.interleave``): ``--rounds``
rounds, in each every engine runs ``--repeat`` calls, the order rotating. An
engine's time is the median of its rounds' medians; the ratios
(``int8_over_ort``, ``fp32_over_int8``) are the median of each round's
ratio, so a period in which the machine ran slow (it is shared: this one's
speed moved by up to 1.7x between processes) divides out, where engines timed
one after the other each had their own periods. umahub is timed after
``warm_up``, once its default executor has chosen (the choice is recorded):

* ``ort_int8``: ONNX Runtime on the QDQ model (all graph optimizations);
* ``umahub_int8``: umahub, the bundled plugins (npu, vanilla, dsp, in that priority:
  not whatever else the environment has installed), on the QDQ model;
* ``umahub_fp32``: umahub, the bundled plugins, on the float model.

The machine's load average (1 and 5 minutes) before and after is recorded:
on a shared machine the engines' times move together with it.

Agreement: umahub's int8 output against ORT's in output quantization units
(the final DequantizeLinear's scale): how many elements differ by 1, by more;
and each int8 output's relative error against umahub's float32 one. Results:
``results/quantized_<kind>.json``, one file per kind of machine (``intel``,
``amd``), as ``engines.py`` writes them.

    python benchmarks/quantized.py [MODEL ...] [--repeat N] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
from _common import cpu_kind, interleave, paired_ratio, worker_env, write

MODELS = ("resnet18", "mobilenetv2", "bert", "resnet50", "efficientnet_b0")
TORCHVISION = ("resnet50", "efficientnet_b0", "mobilenet_v3_large")
THREADS = 2


def _torch_model(name: str):
    if name in TORCHVISION:
        # random weights with outputs of order one, as engines.py's (efficientnet_b0's
        # were about 1e-14 as torchvision starts it: an int8 output scale of 3e-16)
        from _models import random_torchvision

        module, x = random_torchvision(name)
        return module, (x,)
    from umahub.models.torch_zoo import torch_module

    return torch_module(name)


def _inputs(example, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for t in example:
        a = t.numpy()
        if a.ndim == 4 and a.shape[1] == 1 and a.shape[2] == 1:  # an attention mask: kept
            out.append(a.copy())
        else:
            out.append(rng.standard_normal(a.shape).astype(a.dtype))
    return out


def prepare(name: str, folder: Path) -> dict:
    """The float and QDQ ONNX files of ``name``, its inputs, the output's scale."""
    import onnx
    import torch
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    module, example = _torch_model(name)
    fp32, int8 = folder / f"{name}.onnx", folder / f"{name}.int8.onnx"
    names = [f"input{i}" for i in range(len(example))]
    torch.onnx.export(module, example, str(fp32), input_names=names, opset_version=17, dynamo=False)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter(
                [dict(zip(names, _inputs(example, seed), strict=True)) for seed in range(8)]
            )

        def get_next(self):
            return next(self.batches, None)

    quantize_static(
        str(fp32), str(int8), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
    )  # fmt: skip
    model = onnx.load(str(int8))
    out = model.graph.output[0].name
    producer = next(n for n in model.graph.node if out in n.output)
    scale = None
    if producer.op_type == "DequantizeLinear":
        inits = {i.name: i for i in model.graph.initializer}
        scale = float(onnx.numpy_helper.to_array(inits[producer.input[1]]).reshape(-1)[0])
    xs = _inputs(example, 100)
    np.savez(folder / f"{name}.inputs.npz", *xs)
    return {"fp32": str(fp32), "int8": str(int8), "names": names, "scale": scale}


WORKER = r"""
import json, sys, time, numpy as np
from _common import ready, serve
engine, path, names, inputs, out_path = sys.argv[1:6]
names = json.loads(names)
data = np.load(inputs)
xs = [data[f"arr_{i}"] for i in range(len(names))]
start = time.perf_counter()
if engine == "ort":
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    feed = dict(zip(names, xs))
    run = lambda: sess.run(None, feed)[0]
else:
    import umahub
    hub = umahub.Hub(
        config={"plugins": ["npu", "vanilla", "dsp"],
                "priority": ["npu", "vanilla_accel", "dsp_cpu"]},
        project_config=False,
    )
    import onnx
    compiled = hub.compile(onnx.load(path))
compile_s = time.perf_counter() - start
if engine != "ort":
    run = ready(compiled, *xs)
np.save(out_path, np.asarray(run()))
for _ in range(3):
    run()
extra = {}
if engine != "ort":
    extra["host_schedules"] = compiled.report.host_schedules
    extra["executor"] = compiled.executor_in_use
    extra["executor_why"] = compiled.executor_why()  # "auto"'s ways and threads, as timed
    extra["partition_schedules"] = sorted(
        {s for p in compiled.report.partitions for s in p.schedule}
    )
# after each round, how "auto" runs it (a slow round can have it check its other ways)
state = None if engine == "ort" else compiled.executor_why
serve(run, state=state, compile_s=compile_s, **extra)
"""


def measure(name: str, repeat: int, folder: Path, rounds: int) -> dict:
    """The three engines on ``name``, each in a long-lived process of its own, timed
    in turns (:func:`_common.interleave`): ``rounds`` rounds of ``repeat`` calls each.
    ``int8_over_ort`` and ``fp32_over_int8`` are paired ratios, round by round."""
    files = prepare(name, folder)
    inputs = str(folder / f"{name}.inputs.npz")
    env = worker_env(THREADS)
    engines = (
        ("ort_int8", "ort", files["int8"]),
        ("umahub_int8", "umahub", files["int8"]),
        ("umahub_fp32", "umahub", files["fp32"]),
    )
    workers = {
        engine: (
            WORKER,
            [kind, path, json.dumps(files["names"]), inputs, str(folder / f"{name}.{engine}.npy")],
            env,
        )
        for engine, kind, path in engines
    }
    result: dict = {"output_scale": files["scale"], **interleave(workers, rounds, repeat)}
    for engine in workers:
        print(name, engine, result[engine].get("round_ms", result[engine]), flush=True)
    for key, a, b in (
        ("int8_over_ort", "umahub_int8", "ort_int8"),
        ("fp32_over_int8", "umahub_fp32", "umahub_int8"),
    ):
        ratio = paired_ratio(result[a], result[b])
        if ratio is not None:
            result[key] = ratio
    outs = {
        engine: np.load(folder / f"{name}.{engine}.npy")
        for engine in workers
        if "error" not in result[engine]
    }
    if "ort_int8" in outs and "umahub_int8" in outs and files["scale"]:
        steps = np.rint((outs["umahub_int8"] - outs["ort_int8"]) / files["scale"]).astype(int)
        result["int8_agreement"] = {
            "elements": int(steps.size),
            "equal": int((steps == 0).sum()),
            "differ_by_1": int((np.abs(steps) == 1).sum()),
            "differ_by_more": int((np.abs(steps) > 1).sum()),
        }
    if "umahub_fp32" in outs:
        ref = outs["umahub_fp32"]
        for engine in ("ort_int8", "umahub_int8"):
            if engine in outs:
                err = np.linalg.norm(outs[engine] - ref) / max(np.linalg.norm(ref), 1e-12)
                result[engine]["rel_error_vs_fp32"] = float(err)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(MODELS))
    parser.add_argument("--repeat", type=int, default=10, help="calls per engine per round")
    parser.add_argument(
        "--rounds", type=int, default=7, help="rounds: in each, every engine in turn"
    )
    parser.add_argument(
        "--results",
        default=f"quantized_{cpu_kind()}",
        help="results/<name>.json (default: quantized_intel or quantized_amd, by this CPU)",
    )
    args = parser.parse_args()
    results = {}
    load_before = os.getloadavg()  # the machine is shared: how busy it was
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            results[name] = measure(name, args.repeat, Path(tmp), args.rounds)
    load_after = os.getloadavg()
    import tvm

    cpu = str(tvm.target.codegen.llvm_get_system_cpu())  # /proc/cpuinfo may not name it
    path = write(
        args.results,
        {
            "llvm_cpu": cpu,
            "threads": THREADS,
            "repeat": args.repeat,
            "rounds": args.rounds,
            "load_average": {"before": load_before[:2], "after": load_after[:2]},
            "models": results,
        },
    )
    print(path)


if __name__ == "__main__":
    sys.exit(main())
