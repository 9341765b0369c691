"""umahub-vanilla: the conv2d -> T.call_extern pass and the C kernel library.

Fast: a few tiny convolutions; each numeric case compiles one small C file
(about 1-2 s with g++).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

try:
    import umahub_vanilla  # noqa: F401
except ImportError:  # running from the source tree without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.script import relax as R
from umahub_vanilla import passes

# ------------------------------------------------------------------ helpers


def _relax_conv(xs, ws, *, bias=False, relu=False, act=None, dtype="float32", **conv_kw):
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor(xs, dtype))
    w = relax.Var("w", R.Tensor(ws, dtype))
    args = [x, w]
    if bias:
        b = relax.Var("b", R.Tensor((1, ws[0], 1, 1), dtype))
        args.append(b)
    with bb.function("main", args):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, **conv_kw))
            if bias:
                y = bb.emit(relax.op.add(y, b))
            if relu:
                y = bb.emit(relax.op.nn.relu(y))
            if act is not None:
                y = bb.emit(act(y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _lower(mod):
    """What umahub's default relax->TIR step does to a partition: one PrimFunc."""
    seq = tvm.transform.Sequential(
        [
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
        ]
    )
    return seq(mod)


def _primfunc_module(relax_mod, symbol="vanilla_0"):
    mod = _lower(relax_mod)
    funcs = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    assert len(funcs) == 1
    return tvm.IRModule({symbol: funcs[0].with_attr("global_symbol", symbol)})


def _ref_conv(x, w, pads, strides):
    pt, pl, pb, pr = pads
    sh, sw = strides
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    k, _, r, s = w.shape
    oh = (xp.shape[2] - r) // sh + 1
    ow = (xp.shape[3] - s) // sw + 1
    out = np.zeros((x.shape[0], k, oh, ow))
    for i in range(r):
        for j in range(s):
            patch = xp[:, :, i : i + sh * (oh - 1) + 1 : sh, j : j + sw * (ow - 1) + 1 : sw]
            out += np.einsum("nchw,kc->nkhw", patch, w[:, :, i, j].astype(np.float64))
    return out.astype(np.float32)


def _export(tir_mod, path):
    """C codegen, include prefix, and export with the kernel library linked in."""
    rt = tvm.tirx.build(tir_mod, target="c")
    names = [n for n in ("__tvm_ffi_vanilla_0", "__tvm_ffi_main") if rt.implements_function(n)]
    create = tvm_ffi.get_global_func("runtime.CSourceModuleCreate")
    c_mod = create(passes.C_INCLUDES + rt.inspect_source(), "c", names, [])
    options = ["-O2"] + ["-I" + d for d in passes.INCLUDE_DIRS] + list(passes.C_SOURCES)
    c_mod.export_library(str(path), options=options)
    return tvm.runtime.load_module(str(path))


def _pointer_arg(name, ndim=4):
    """How the pass's pointer argument for buffer ``name`` prints: ``name.data`` where a
    buffer's data is an expression of the element pointer type (apache-tvm 0.26, 0.27),
    ``T.address_of(name[0, ...])`` where it is a handle variable that the C codegen
    declares ``void*`` (0.25)."""
    if not isinstance(tirx.decl_buffer((1,), "float32").data, tirx.Var):
        return f"{name}.data"
    zeros = ", ".join(["T.int64(0)"] * ndim)
    return f"T.address_of({name}[{zeros}])"


def _sblock_names(func):
    return [line.split('"')[1] for line in func.script().splitlines() if "T.sblock(" in line]


# ------------------------------------------------------------------ the pass


def test_constants_point_at_the_kernel_library():
    assert passes.EXTERN_NAME == "vanilla_conv2d_nchw"
    for src in passes.C_SOURCES:
        assert Path(src).is_file()
    assert (Path(passes.INCLUDE_DIRS[0]) / "vanilla_conv2d.h").is_file()
    assert passes.KERNEL_DIR == Path(passes.INCLUDE_DIRS[0])
    assert passes.C_INCLUDES == '#include "vanilla_conv2d.h"\n'


def test_pass_rewrites_conv2d():
    mod = _primfunc_module(_relax_conv((1, 3, 16, 16), (8, 3, 3, 3), padding=1))
    before = _sblock_names(mod["vanilla_0"])
    assert "pad_temp" in before and "conv2d_nchw" in before
    out = passes.conv2d_to_extern()(mod)
    func = out["vanilla_0"]
    text = func.script()
    ptrs = f"{_pointer_arg('x')}, {_pointer_arg('w')}"
    assert f'T.call_extern("int32", "vanilla_conv2d_nchw", {ptrs}' in text
    assert "1, 3, 16, 16, 8, 3, 3, 1, 1, 1, 1, 1, 1)" in text
    names = _sblock_names(func)
    assert "conv2d_nchw" not in names and "pad_temp" not in names
    assert "vanilla_conv2d_nchw" in names
    assert "T.sblock_alloc_buffer" not in text  # pad_temp's allocation is gone too
    assert "for " not in text  # no loop nest left for a lone conv2d
    assert func.attrs["global_symbol"] == "vanilla_0"
    # idempotent: the rewritten function is left alone
    again = passes.conv2d_to_extern()(out)
    assert again["vanilla_0"].same_as(func)


def _clip(lo, hi):
    return lambda y: relax.op.clip(y, lo, hi)


@pytest.mark.parametrize(
    "act, extern, bounds, rest",
    [
        # a ReLU, a ReLU6, a clip with one bound: the kernel bounds what it stores
        (relax.op.nn.relu, "vanilla_conv2d_nchw_bias_clamp", (0.0, 0.0, 1), []),
        (_clip(0.0, 6.0), "vanilla_conv2d_nchw_bias_clamp", (0.0, 6.0, 3), []),
        (_clip(float("-inf"), 2.5), "vanilla_conv2d_nchw_bias_clamp", (0.0, 2.5, 2), []),
        # anything else stays TIR and reads the call's output
        (relax.op.sigmoid, "vanilla_conv2d_nchw_bias", None, ["compute"]),
    ],
    ids=["relu", "relu6", "upper_only", "sigmoid"],
)
def test_the_bias_add_and_a_bounding_activation_go_into_the_call(act, extern, bounds, rest):
    mod = _primfunc_module(_relax_conv((1, 3, 8, 8), (4, 3, 3, 3), bias=True, act=act, padding=1))
    (m,) = passes.match_conv2d(mod["vanilla_0"])
    assert (m.extern_name, m.bounds) == (extern, bounds)
    func = passes.conv2d_to_extern()(mod)["vanilla_0"]
    assert _sblock_names(func) == ["root", extern, *rest]
    out = "compute_intermediate" if bounds else "T_add_intermediate"
    args = ", ".join(_pointer_arg(b) for b in ("x", "w", "b", out))
    if bounds:
        args += ", T.float32({!r}), T.float32({!r}), {}".format(*bounds)
    assert f'T.call_extern("int32", "{extern}", {args}, 1, 3, 8, 8' in func.script()
    # the convolution's own output, and the bias add's, are gone with their loop nests
    assert "conv2d_nchw_intermediate" not in func.script()
    assert ("T_add_intermediate" in func.script()) == (bounds is None)


def test_a_convolution_the_partition_also_returns_keeps_its_bias_add():
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((1, 3, 8, 8), "float32"))
    w = relax.Var("w", R.Tensor((4, 3, 3, 3), "float32"))
    b = relax.Var("b", R.Tensor((1, 4, 1, 1), "float32"))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, w, padding=1))
            out = bb.emit_output(relax.Tuple([bb.emit(relax.op.add(conv, b)), conv]))
        bb.emit_func_output(out)
    from umahub.compiler.lowering import default_relax_to_tir

    mod = default_relax_to_tir(bb.get()["main"], "vanilla_0", "vanilla_accel")
    func = passes.conv2d_to_extern()(mod)["vanilla_0"]
    names = _sblock_names(func)
    assert "vanilla_conv2d_nchw" in names and "T_add" in names  # the add reads the output


@pytest.mark.parametrize(
    "kw, expect",
    [
        (dict(padding=0), (0, 0, 0, 0, 1, 1)),
        (dict(padding=(1, 0, 2, 1), strides=2), (1, 0, 2, 1, 2, 2)),
        (dict(padding=(0, 2), strides=(1, 3)), (0, 2, 0, 2, 1, 3)),
    ],
)
def test_match_numbers(kw, expect):
    mod = _primfunc_module(_relax_conv((2, 3, 10, 12), (5, 3, 3, 2), **kw))
    (m,) = passes.match_conv2d(mod["vanilla_0"])
    assert (m.n, m.c, m.h, m.w, m.k, m.r, m.s) == (2, 3, 10, 12, 5, 3, 2)
    assert (m.pad_top, m.pad_left, m.pad_bottom, m.pad_right, m.stride_h, m.stride_w) == expect


@pytest.mark.parametrize(
    "xs, ws, kw",
    [
        ((1, 4, 8, 8), (4, 4, 3, 3), dict(padding=1, dilation=2)),
        ((1, 4, 8, 8), (4, 2, 3, 3), dict(padding=1, groups=2)),
        ((1, 4, 8, 8), (4, 1, 3, 3), dict(padding=1, groups=4)),  # depthwise
        ((1, 8, 8, 4), (4, 3, 3, 4), dict(padding=1, data_layout="NHWC", kernel_layout="OHWI")),
        ((1, 4, 8, 8), (4, 4, 3, 3), dict(padding=1, dtype="float16")),
    ],
    ids=["dilation2", "groups2", "depthwise", "nhwc", "float16"],
)
def test_pass_refuses_unsupported(xs, ws, kw):
    dtype = kw.pop("dtype", "float32")
    mod = _primfunc_module(_relax_conv(xs, ws, dtype=dtype, **kw))
    assert passes.match_conv2d(mod["vanilla_0"]) == []
    out = passes.conv2d_to_extern()(mod)
    assert out["vanilla_0"].same_as(mod["vanilla_0"])


def test_pass_leaves_other_functions_unchanged():
    conv = _primfunc_module(_relax_conv((1, 3, 8, 8), (4, 3, 3, 3), padding=1))
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((1, 4, 8, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.relu(relax.op.add(x, x)))
        bb.emit_func_output(y)
    other = next(f for f in _lower(bb.get()).functions.values() if isinstance(f, tirx.PrimFunc))
    mod = tvm.IRModule({"vanilla_0": conv["vanilla_0"], "host_0": other})
    out = passes.conv2d_to_extern()(mod)
    assert out["host_0"].same_as(other)
    assert passes.match_conv2d(other) == []
    assert "vanilla_conv2d_nchw" in out["vanilla_0"].script()


# ------------------------------------------------------------------ numbers


@pytest.mark.parametrize(
    "xs, ws, kw, bias",
    [
        ((1, 3, 16, 16), (8, 3, 3, 3), dict(padding=1), False),
        ((2, 5, 9, 7), (6, 5, 3, 3), dict(padding=0), False),
        ((1, 3, 16, 15), (7, 3, 3, 3), dict(padding=(1, 0, 2, 1), strides=2), True),
        ((1, 2, 11, 10), (5, 2, 5, 3), dict(padding=(2, 1, 0, 3), strides=(3, 1)), False),
        # a stem: 16-channel tiles and a partial one, rows shared among threads
        ((2, 3, 40, 37), (40, 3, 7, 7), dict(padding=3, strides=2), True),
        # columns read in phases: stride 2 with padding on the left, stride 3
        ((1, 3, 17, 23), (16, 3, 3, 3), dict(padding=1, strides=2), True),
        ((1, 4, 9, 20), (5, 4, 3, 5), dict(padding=(1, 2, 0, 3), strides=(2, 3)), False),
        # input rows kept from one output row to the next: a thread's rows run from one
        # image into the next, below rows of padding (H a multiple of R)
        ((3, 3, 9, 8), (6, 3, 3, 3), dict(padding=(1, 1, 2, 1)), True),
        # one output position: a matrix-vector product, the weights read unpacked
        ((2, 28, 1, 1), (672, 28, 1, 1), dict(), True),
        ((1, 3, 2, 3), (20, 3, 3, 3), dict(padding=(1, 0, 0, 1), strides=3), False),
        # the activation taken into the call: a ReLU6 on tiles of 16 channels and a
        # partial one, an upper bound alone, a ReLU on one output position
        ((2, 3, 40, 37), (40, 3, 7, 7), dict(padding=3, strides=2, act=(0.0, 6.0)), True),
        ((1, 3, 17, 23), (16, 3, 3, 3), dict(padding=1, act=(float("-inf"), 0.5)), True),
        ((2, 28, 1, 1), (672, 28, 1, 1), dict(act=(0.0, float("inf"))), True),
    ],
    ids=[
        "s1p1",
        "p0_batch2",
        "s2_asym_bias",
        "s31_asym_5x3",
        "stem_7x7_k40",
        "s2p1_odd_width",
        "s23_asym_5wide",
        "batch3_padded_below",
        "one_position_se_batch2",
        "one_position_padded",
        "stem_7x7_k40_relu6",
        "s1p1_upper_bound",
        "one_position_relu",
    ],
)
def test_exported_module_matches_numpy(tmp_path, xs, ws, kw, bias):
    kw = dict(kw)
    bounds = kw.pop("act", None)
    act = _clip(*bounds) if bounds else None
    mod = passes.conv2d_to_extern()(_primfunc_module(_relax_conv(xs, ws, bias=bias, act=act, **kw)))
    (call,) = [b for b in _sblock_names(mod["vanilla_0"]) if b.startswith("vanilla_conv2d")]
    assert call.endswith("_clamp") == (bounds is not None)
    lib = _export(mod, tmp_path / "vanilla_0.so")

    rng = np.random.default_rng(42)
    x = rng.standard_normal(xs).astype("float32")
    w = rng.standard_normal(ws).astype("float32")
    pad = kw.get("padding", 0)
    pad = (pad,) * 4 if isinstance(pad, int) else (tuple(pad) * 2 if len(pad) == 2 else tuple(pad))
    stride = kw.get("strides", 1)
    stride = (stride, stride) if isinstance(stride, int) else tuple(stride)
    expected = _ref_conv(x, w, pad, stride)
    args = [tvm.runtime.tensor(x), tvm.runtime.tensor(w)]
    if bias:
        b = rng.standard_normal((1, ws[0], 1, 1)).astype("float32")
        args.append(tvm.runtime.tensor(b))
        expected = expected + b
    if bounds:
        expected = np.clip(expected, *bounds)
    out = tvm.runtime.tensor(np.full(expected.shape, np.nan, "float32"))
    lib["vanilla_0"](*args, out)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-4)


def test_a_convolution_feeding_only_another_is_a_call_where_its_output_stays_whole(tmp_path):
    # conv -> conv in one partition (a residual block's): the intermediate is touched by
    # extern calls only. TVM 0.26 and 0.27 pass its data pointer and keep it whole: both
    # convolutions are calls. TVM 0.25 reaches it through its first element's address
    # and sizes it to that one element: there the first convolution stays TIR.
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((1, 4, 6, 6), "float32"))
    w1 = relax.Var("w1", R.Tensor((8, 4, 3, 3), "float32"))
    w2 = relax.Var("w2", R.Tensor((4, 8, 3, 3), "float32"))
    with bb.function("main", [x, w1, w2]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w1, padding=1))
            out = bb.emit_output(bb.emit(relax.op.nn.conv2d(y, w2, padding=1)))
        bb.emit_func_output(out)
    from umahub.compiler.lowering import default_relax_to_tir

    # one PrimFunc for the whole partition, as umahub's default lowering makes it
    mod = default_relax_to_tir(bb.get()["main"], "vanilla_0", "vanilla_accel")
    mod = passes.conv2d_to_extern()(mod)
    calls = mod["vanilla_0"].script().count('T.call_extern("int32", "vanilla_conv2d_nchw"')
    assert calls == (1 if tvm.__version__.startswith("0.25") else 2)
    lib = _export(mod, tmp_path / "vanilla_0.so")
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((1, 4, 6, 6)).astype("float32")
    a = rng.standard_normal((8, 4, 3, 3)).astype("float32")
    b = rng.standard_normal((4, 8, 3, 3)).astype("float32")
    expected = _ref_conv(_ref_conv(xs, a, (1,) * 4, (1, 1)), b, (1,) * 4, (1, 1))
    out = tvm.runtime.tensor(np.full(expected.shape, np.nan, "float32"))
    lib["vanilla_0"](*[tvm.runtime.tensor(v) for v in (xs, a, b)], out)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-3)
