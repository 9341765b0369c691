"""The simnpu's integers are the host's, bit for bit, for every form of quantized operator
it claims; and the ones it refuses are refused saying why."""

from __future__ import annotations

import numpy as np
import pytest
from simnpu_models import host_hub, quantized_model, simnpu_hub

import umahub.plugin as up

CONV_CASES = {
    "int8, per channel, int32 bias": {},
    "uint8 in and out, relu": {"x_dtype": "uint8", "y_dtype": "uint8", "activation": "relu"},
    "per tensor, no bias": {"per_channel": False, "bias": None},
    "float bias, clip": {"bias": "float32", "activation": (-1.0, 2.5)},
    "stride 2, asymmetric padding": {"strides": (2, 2), "padding": (0, 1, 2, 1)},
    "dilation 2, 1x5 kernel": {"dilation": (2, 2), "kernel": (1, 5), "padding": (0, 4, 0, 4)},
    "residual and relu": {"residual": True, "activation": "relu"},
    "residual, uint8 input": {"residual": True, "x_dtype": "uint8", "bias": None},
    "weight zero point": {"weight_zero": 3},
    "batch 2, 33 in, 17 out channels": {"x_shape": (2, 33, 6, 7), "out_channels": 17},
    "wide row: several tiles": {
        "x_shape": (1, 3, 2, 300),
        "kernel": (1, 3),
        "padding": (0, 1, 0, 1),
    },
}

MATMUL_CASES = {
    "one row": {"x_shape": (1, 40), "out_channels": 24},
    "rows, uint8, relu": {"x_shape": (7, 19), "x_dtype": "uint8", "activation": "relu"},
    "3-D input, per tensor": {"x_shape": (2, 3, 32), "per_channel": False},
    "residual, clip": {"x_shape": (5, 16), "residual": True, "activation": (0.0, 1.0)},
    "long reduction (two chunks)": {
        "x_shape": (3, 4100),
        "out_channels": 5,
        "bias": None,
        "y_scale": 4.0,
    },
}


def _compare(kind: str, **form) -> dict:
    mod, inputs = quantized_model(kind, **form)
    want = host_hub().compile(mod).run(*inputs)
    compiled = simnpu_hub().compile(mod)
    on = {p.device for p in compiled.report.placement if p.op.startswith("relax.nn.conv2d")}
    on |= {p.device for p in compiled.report.placement if p.op == "relax.matmul"}
    assert on == {"simnpu:0"}, compiled.report.placement
    got = compiled.run(*inputs)
    assert got.dtype == want.dtype
    assert np.array_equal(got, want), np.abs(got.astype(int) - want.astype(int)).max()
    assert len(np.unique(got)) > 3  # not a degenerate output that anything would match
    (partition,) = compiled.report.partitions
    return partition.program


@pytest.mark.parametrize("form", CONV_CASES.values(), ids=CONV_CASES.keys())
def test_a_convolution_gives_the_hosts_integers(form):
    _compare("conv2d", **form)


@pytest.mark.parametrize("form", MATMUL_CASES.values(), ids=MATMUL_CASES.keys())
def test_a_matmul_gives_the_hosts_integers(form):
    _compare("matmul", **form)


def test_the_program_reports_its_format_and_sizes():
    program = _compare("conv2d")
    meta = program["metadata"]
    assert program["runtime"] == "simnpu"
    assert meta["format"] == "simnpu" and meta["version"] == 2
    assert meta["buffers"] == len(meta["buffer_bytes"]) and meta["instructions"] > 0
    assert set(program["busy"]) == {"load", "compute", "store"}
    assert program["serial_cycles"] == sum(program["busy"].values())
    # the modules overlap: fewer cycles than their busy cycles added
    assert max(program["busy"].values()) <= program["cycles"] < program["serial_cycles"]
    assert program["seconds"] == program["cycles"] / 1e9
    assert program["notes"][0].startswith("double-buffered: inp (x2, alternating per ")


def _constant(expr):
    """A Relax constant's value (``.data`` before TVM 0.27, ``.value`` in it)."""
    value = getattr(expr, "data", None)
    return (value if value is not None else expr.value).numpy()


def test_the_host_and_the_simnpu_agree_with_numpy_requantize():
    """The reference of umahub.plugin.quantization, on a plain convolution."""
    mod, (x,) = quantized_model("conv2d", bias=None, per_channel=False, padding=(0, 0, 0, 0))
    (w,) = [
        _constant(b.value.args[0]).astype(np.int64)
        for b in mod["main"].body.blocks[0].bindings
        if getattr(b.value.op, "name", "") == "relax.dequantize"
        and len(up.shape_of(b.value.args[0]) or ()) == 4
        and type(b.value.args[0]).__name__ != "Var"
    ]
    got = simnpu_hub().compile(mod).run(x)
    xs = x.astype(np.int64) + 7  # x - x_zp
    oh, ow = got.shape[2:]
    acc = np.zeros((1, w.shape[0], oh, ow), np.int64)
    for i in range(w.shape[2]):
        for j in range(w.shape[3]):
            acc += np.einsum("nchw,oc->nohw", xs[:, :, i : i + oh, j : j + ow], w[:, :, i, j])
    multiplier = (
        np.float64(np.float32(0.03)) * np.float64(np.float32(0.01)) / np.float64(np.float32(0.05))
    )
    assert np.array_equal(got, up.requantize(acc, multiplier, 3, -128, 127, "int8"))


@pytest.mark.parametrize(
    ("form", "reason"),
    [
        ({"x_shape": (1, 8, 6, 6), "groups": 8, "out_channels": 8}, "grouped convolution"),
        ({"weight_zero": 60}, "weights minus their zero point leave int8"),
    ],
)
def test_what_the_simnpu_does_not_compute_is_refused_saying_why(form, reason):
    mod, inputs = quantized_model("conv2d", **form)
    report = simnpu_hub().explain(mod)
    assert all(p.device == "host" for p in report.placement)
    assert reason in str(report)
