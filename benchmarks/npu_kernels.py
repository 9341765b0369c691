"""Benchmark of the umahub-npu schedules on the kernels of BERT and ResNet/MobileNet.

For every kernel: the PrimFunc that umahub hands to the npu schedule hook
(Relax function -> LegalizeOps, AnnotateTIROpPattern, FuseOps, FuseTIR), built
with ``tvm.tirx.build`` unscheduled ("default") and after
``umahub_npu.schedules.schedule`` ("npu"), against numpy (``np.matmul``; for
conv2d an im2col + ``np.matmul``) as reference.  Medians of repeated runs;
every scheduled result is checked against a float64 numpy result (rtol 1e-4).

    TVM_NUM_THREADS=2 python benchmarks/npu_kernels.py [--quick] [--repeat N]

Writes benchmarks/results/npu_kernels.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "2")
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, os.environ["TVM_NUM_THREADS"])

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import relax, s_tir  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins" / "umahub-npu" / "src"))
from umahub_npu import schedules  # noqa: E402

from umahub.plugin import host_target, vector_lanes  # noqa: E402

# ----------------------------------------------------------------- PrimFunc as umahub makes it


def primfunc_from_relax(mod: tvm.IRModule) -> tvm.IRModule:
    """LegalizeOps, AnnotateTIROpPattern, FuseOps, FuseTIR; the one fused PrimFunc as "main"."""
    seq = tvm.transform.Sequential(
        [
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
        ]
    )
    mod = seq(mod)
    prims = [f for _, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(prims) == 1, f"expected one fused PrimFunc, got {len(prims)}"
    return tvm.IRModule({"main": prims[0].with_attr("global_symbol", "main")})


def relax_function(inputs, body) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    params = [relax.Var(n, relax.TensorType(s, "float32")) for n, s in inputs]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *params))
        bb.emit_func_output(out)
    return bb.get()


def dense_mod(M, K, N, act=None):
    def body(bb, x, w, b):
        y = bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, w)), b))
        if act == "relu":
            y = bb.emit(relax.op.nn.relu(y))
        elif act == "gelu":
            y = bb.emit(relax.op.nn.gelu(y))
        return y

    return primfunc_from_relax(relax_function([("x", (M, K)), ("w", (K, N)), ("b", (N,))], body))


def bmm_mod(a_shape, b_shape):
    return primfunc_from_relax(
        relax_function([("a", a_shape), ("b", b_shape)], lambda bb, a, b: relax.op.matmul(a, b))
    )


def conv_mod(C, H, O, k, s, p, groups=1):
    def body(bb, x, w, b):
        y = bb.emit(relax.op.nn.conv2d(x, w, strides=s, padding=p, groups=groups))
        return bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(y, b))))

    return primfunc_from_relax(
        relax_function(
            [("x", (1, C, H, H)), ("w", (O, C // groups, k, k)), ("b", (1, O, 1, 1))], body
        )
    )


# ----------------------------------------------------------------- numpy references


def _gelu(x):
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def im2col_conv(x, w, s, p, groups):
    """Conv2d NCHW as im2col + np.matmul (float32 inputs -> float32; float64 -> float64)."""
    _, C, H, W = x.shape
    O, Cg, KH, KW = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    OH, OW = (H + 2 * p - KH) // s + 1, (W + 2 * p - KW) // s + 1
    og = O // groups
    outs = []
    for g in range(groups):
        xs = xp[0, g * Cg : (g + 1) * Cg]
        cols = np.stack(
            [
                xs[:, kh : kh + s * OH : s, kw : kw + s * OW : s]
                for kh in range(KH)
                for kw in range(KW)
            ],
            axis=1,
        ).reshape(Cg * KH * KW, OH * OW)
        outs.append(np.matmul(w[g * og : (g + 1) * og].reshape(og, -1), cols))
    return np.concatenate(outs, 0).reshape(1, O, OH, OW)


# ----------------------------------------------------------------- kernels


def kernels(quick: bool):
    rng = np.random.default_rng(0)
    f32 = lambda *s: rng.standard_normal(s, dtype=np.float32)  # noqa: E731
    out = []

    def dense(name, M, K, N, act):
        x, w, b = f32(M, K), f32(K, N) * (1 / math.sqrt(K)), f32(N)

        def ref():
            y = x.astype(np.float64) @ w.astype(np.float64) + b
            return np.maximum(y, 0) if act == "relu" else _gelu(y) if act == "gelu" else y

        def np_run():
            y = np.matmul(x, w) + b
            return np.maximum(y, 0) if act == "relu" else y  # gelu: matmul+bias only

        out.append(
            dict(
                name=name,
                mod=lambda: dense_mod(M, K, N, act),
                args=[x, w, b],
                out_shape=(M, N),
                flops=2 * M * N * K,
                ref=ref,
                np_run=np_run,
                expect="matmul",
            )
        )

    def bmm(name, a_shape, b_shape):
        a, b = f32(*a_shape), f32(*b_shape)
        shape = a_shape[:-1] + b_shape[-1:]
        out.append(
            dict(
                name=name,
                mod=lambda: bmm_mod(a_shape, b_shape),
                args=[a, b],
                out_shape=shape,
                flops=2 * math.prod(shape) * a_shape[-1],
                ref=lambda: a.astype(np.float64) @ b.astype(np.float64),
                np_run=lambda: np.matmul(a, b),
                expect="matmul",
            )
        )

    def conv(name, C, H, O, k, s, p, g=1):
        x, w, b = (
            f32(1, C, H, H),
            f32(O, C // g, k, k) * (1 / math.sqrt(C // g * k * k)),
            f32(1, O, 1, 1),
        )
        OH = (H + 2 * p - k) // s + 1

        def ref():
            return np.maximum(
                im2col_conv(x.astype(np.float64), w.astype(np.float64), s, p, g) + b, 0
            )

        out.append(
            dict(
                name=name,
                mod=lambda: conv_mod(C, H, O, k, s, p, g),
                args=[x, w, b],
                out_shape=(1, O, OH, OH),
                flops=2 * O * OH * OH * (C // g) * k * k,
                ref=ref,
                np_run=lambda: np.maximum(im2col_conv(x, w, s, p, g) + b, 0),
                expect=(
                    "depthwise"
                    if g == C and g > 1
                    else "pointwise"
                    if k == 1 and s == 1 and g == 1 and OH * OH % 16 == 0
                    else "conv2d"
                ),
            )
        )

    dense("dense 128x768 @ 768x768 +bias", 128, 768, 768, None)
    dense("dense 128x768 @ 768x3072 +bias+gelu", 128, 768, 3072, "gelu")
    dense("dense 128x3072 @ 3072x768 +bias", 128, 3072, 768, None)
    bmm("attn QK^T (1,12,128,64)@(1,12,64,128)", (1, 12, 128, 64), (1, 12, 64, 128))
    bmm("attn PV (1,12,128,128)@(1,12,128,64)", (1, 12, 128, 128), (1, 12, 128, 64))
    conv("conv3x3 (1,64,56,56) 64 +bias+relu", 64, 56, 64, 3, 1, 1)
    conv("conv3x3 (1,128,28,28) 128 +bias+relu", 128, 28, 128, 3, 1, 1)
    conv("conv3x3 (1,256,14,14) 256 +bias+relu", 256, 14, 256, 3, 1, 1)
    conv("conv3x3 (1,512,7,7) 512 +bias+relu", 512, 7, 512, 3, 1, 1)
    conv("conv7x7/2 stem (1,3,224,224) 64 +bias+relu", 3, 224, 64, 7, 2, 3)
    conv("depthwise3x3 (1,144,56,56) g=144 +bias+relu", 144, 56, 144, 3, 1, 1, 144)
    conv("conv1x1 (1,24,56,56) 144 +bias+relu", 24, 56, 144, 1, 1, 0)
    conv("conv1x1 (1,144,56,56) 24 +bias+relu", 144, 56, 24, 1, 1, 0)
    return out[:3] + out[5:6] + out[-3:] if quick else out


# ----------------------------------------------------------------- timing


def median_time(fn, repeat: int, min_time: float = 0.0) -> float:
    fn()  # warm-up
    ts = []
    t_start = time.perf_counter()
    while len(ts) < repeat or (time.perf_counter() - t_start < min_time and len(ts) < 10 * repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def build(mod, target):
    return tvm.tirx.build(mod, target=tvm.target.Target(target))["main"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a subset of the kernels")
    ap.add_argument(
        "--repeat", type=int, default=15, help="timed runs of the scheduled kernel and numpy"
    )
    ap.add_argument(
        "--default-repeat", type=int, default=3, help="timed runs of the unscheduled kernel"
    )
    ap.add_argument("--sram", type=int, default=256 * 1024)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "npu_kernels.json"))
    args = ap.parse_args()

    target = host_target()
    threads = int(os.environ["TVM_NUM_THREADS"])
    cpu = next(
        (l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
        "?",
    )
    meta = dict(
        tvm_version=tvm.__version__,
        TVM_NUM_THREADS=threads,
        OPENBLAS_NUM_THREADS=os.environ.get("OPENBLAS_NUM_THREADS"),
        cpu_model=cpu,
        llvm_cpu=str(tvm.target.codegen.llvm_get_system_cpu()),
        vector_lanes=vector_lanes(),
        target=target,
        sram_bytes=args.sram,
        numpy_version=np.__version__,
        python=platform.python_version(),
        repeat=args.repeat,
        note="medians; machine shared with other jobs, so absolute numbers are noisy",
    )
    dev = tvm.cpu()
    rows = []
    for k in kernels(args.quick):
        mod = k["mod"]()
        sch = s_tir.Schedule(mod)
        t0 = time.perf_counter()
        strategy = schedules.schedule(sch, sram_bytes=args.sram, threads=threads)
        t_sched = time.perf_counter() - t0
        f_npu = build(sch.mod, target)
        f_def = build(mod, target)
        targs = [tvm.runtime.tensor(a, dev) for a in k["args"]]
        out_npu = tvm.runtime.tensor(np.zeros(k["out_shape"], np.float32), dev)
        out_def = tvm.runtime.tensor(np.zeros(k["out_shape"], np.float32), dev)
        ref = k["ref"]()
        f_npu(*targs, out_npu)
        got = out_npu.numpy()
        ok = bool(np.allclose(got, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max())))
        err = float(np.abs(got - ref).max() / max(1e-30, float(np.abs(ref).max())))
        t_npu = median_time(lambda f=f_npu, a=targs, o=out_npu: f(*a, o), args.repeat, min_time=0.3)
        t_def = median_time(lambda f=f_def, a=targs, o=out_def: f(*a, o), args.default_repeat)
        t_np = median_time(k["np_run"], args.repeat, min_time=0.3)
        row = dict(
            kernel=k["name"],
            strategy=strategy,
            expected_strategy=k["expect"],
            gflop=k["flops"] / 1e9,
            default_ms=t_def * 1e3,
            npu_ms=t_npu * 1e3,
            numpy_ms=t_np * 1e3,
            default_gflops=k["flops"] / t_def / 1e9,
            npu_gflops=k["flops"] / t_npu / 1e9,
            numpy_gflops=k["flops"] / t_np / 1e9,
            speedup_vs_default=t_def / t_npu,
            npu_vs_numpy=t_np / t_npu,
            max_rel_err=err,
            allclose_rtol_1e_4=ok,
            schedule_seconds=t_sched,
        )
        rows.append(row)
        print(
            f"{row['kernel']:<46} {strategy:<9} default {row['default_ms']:9.2f} ms "
            f"({row['default_gflops']:5.1f} GF/s)  npu {row['npu_ms']:8.3f} ms "
            f"({row['npu_gflops']:5.1f} GF/s)  numpy {row['numpy_ms']:8.3f} ms "
            f"({row['numpy_gflops']:5.1f} GF/s)  x{row['speedup_vs_default']:.0f}  "
            f"{'ok' if ok else 'MISMATCH'}",
            flush=True,
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, kernels=rows), f, indent=2)
    print(
        f"\nTVM {meta['tvm_version']}, TVM_NUM_THREADS={threads}, CPU {cpu} ({meta['llvm_cpu']}), "
        f"target {json.dumps(target)}; wrote {args.out}"
    )
    tot = {c: sum(r[c] for r in rows) for c in ("default_ms", "npu_ms", "numpy_ms")}
    print(
        f"sum over kernels: default {tot['default_ms']:.1f} ms, npu {tot['npu_ms']:.2f} ms, "
        f"numpy {tot['numpy_ms']:.2f} ms"
    )
    return (
        0
        if all(r["allclose_rtol_1e_4"] and r["strategy"] == r["expected_strategy"] for r in rows)
        else 1
    )


if __name__ == "__main__":
    sys.exit(main())
