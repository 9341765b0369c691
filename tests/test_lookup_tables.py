"""Elementwise chains of one 8-bit tensor become tables of 256 entries
(umahub.host.lookup_tables)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import umahub
from umahub._tvm import TensorType
from umahub.host.lookup_tables import has_vbmi, tabulate
from umahub.targets import host_target


def _const(value, dtype):
    return relax.const(np.asarray(value, dtype=dtype))


def _chain_graph(dtype, body, extra_input=False):
    """``body(bb, x[, y])`` between ``x`` (8-bit) and the output, in one function."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((2, 3, 8, 8), dtype))
    params = [x]
    if extra_input:
        params.append(relax.Var("y", TensorType((2, 3, 8, 8), dtype)))
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *params))
        bb.emit_func_output(out)
    return bb.get()


def _dq(bb, x, scale, zp):
    return bb.emit(relax.op.dequantize(x, _const(scale, "float32"), _const(zp, x_dtype(x))))


def x_dtype(x):
    from umahub.plugin.patterns import dtype_of

    return dtype_of(x)


def _q(bb, v, scale, zp, dtype):
    return bb.emit(
        relax.op.quantize(v, _const(scale, "float32"), _const(zp, dtype), out_dtype=dtype)
    )


def _silu(dtype):
    """A SiLU as ONNX Runtime's QDQ form writes it: the sigmoid quantized on its own."""

    def body(bb, x):
        d = _dq(bb, x, 0.05, 3)
        s = _q(bb, bb.emit(relax.op.sigmoid(d)), 1 / 255, 0, dtype)
        product = bb.emit(relax.op.multiply(d, _dq(bb, s, 1 / 255, 0)))
        return _q(bb, product, 0.04, 5, dtype)

    return body


def _gelu(dtype):
    """A GELU as ONNX writes it: x * 0.5 * (1 + erf(x / sqrt(2)))."""

    def body(bb, x):
        d = _dq(bb, x, 0.05, 3)
        e = bb.emit(relax.op.erf(bb.emit(relax.op.divide(d, _const(1.4142135, "float32")))))
        one = bb.emit(relax.op.add(e, _const(1.0, "float32")))
        half = bb.emit(
            relax.op.multiply(bb.emit(relax.op.multiply(d, one)), _const(0.5, "float32"))
        )
        return _q(bb, half, 0.03, 7, dtype)

    return body


def _plain(mod, *inputs):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in inputs]).numpy()


def _ops(mod):
    return [
        b.value.op.name
        for block in mod["main"].body.blocks
        for b in block.bindings
        if isinstance(b.value, relax.Call)
    ]


def _every_value(dtype):
    info = np.iinfo(dtype)
    values = np.arange(info.min, info.max + 1).astype(dtype)
    return np.resize(values, (2, 3, 8, 8))  # 384 elements: every value at least once


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("chain", [_silu, _gelu], ids=["silu", "gelu"])
def test_a_chain_of_one_8_bit_tensor_is_read_from_its_table_and_computes_the_same(chain, dtype):
    mod = _chain_graph(dtype, chain(dtype))
    tabulated, count = tabulate(mod)
    assert count == 1
    expected = ["relax.take"] if dtype == "uint8" else ["relax.astype", "relax.take"]
    assert _ops(tabulated) == expected
    x = _every_value(dtype)
    np.testing.assert_array_equal(_plain(tabulated, x), _plain(mod, x))


def test_a_requantization_alone_is_a_table():
    def body(bb, x):
        return _q(bb, _dq(bb, x, 0.05, 3), 0.07, 9, "uint8")

    tabulated, count = tabulate(_chain_graph("uint8", body))
    assert count == 1 and _ops(tabulated) == ["relax.take"]


def test_chains_of_two_tensors_or_of_per_channel_constants_are_left_alone():
    def residual(bb, x, y):
        total = bb.emit(relax.op.add(_dq(bb, x, 0.05, 3), _dq(bb, y, 0.05, 3)))
        return _q(bb, total, 0.1, 0, "uint8")

    def per_channel(bb, x):
        scaled = bb.emit(
            relax.op.multiply(_dq(bb, x, 0.05, 3), _const(np.ones((3, 1, 1)), "float32"))
        )
        return _q(bb, scaled, 0.1, 0, "uint8")

    def single(bb, x):  # one operator: nothing to gain
        return bb.emit(relax.op.astype(x, "int32"))

    for mod in (
        _chain_graph("uint8", residual, extra_input=True),
        _chain_graph("uint8", per_channel),
        _chain_graph("uint8", single),
    ):
        assert tabulate(mod) == (mod, 0)


NO_VBMI = {"kind": "llvm", "mcpu": "skylake-avx512"}  # AVX-512 without VBMI


@pytest.mark.parametrize(
    ("target", "rule"),
    [
        pytest.param(
            host_target(),
            "table read",
            marks=pytest.mark.skipif(not has_vbmi(), reason="this CPU has no AVX-512 VBMI"),
        ),
        (NO_VBMI, "elementwise"),
    ],
    ids=["vbmi", "no vbmi"],
)
def test_a_model_with_an_8_bit_activation_compiles_to_a_table_on_the_host(target, rule):
    """The lookup alone is read 64 entries a step (``vpermi2b``) where the CPU has
    VBMI; elsewhere the elementwise rule leaves it to LLVM, a byte at a time."""
    mod = _chain_graph("uint8", _silu("uint8"))
    compiled = umahub.Hub(autoload=False).compile(mod, target=target)
    x = _every_value("uint8")
    np.testing.assert_array_equal(compiled.run(x), _plain(mod, x))
    assert compiled.report.host_schedules == {rule: 1}
