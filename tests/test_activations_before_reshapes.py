"""Activations moved before a reshape, so that a product's pattern takes them.

The graphs are what ``torch.export`` writes for ``Linear -> GELU -> Linear`` on a
``[batch, tokens, features]`` input (ViT's MLP): each ``Linear`` a reshape to 2-D,
the product with its bias, and a reshape back.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax

import umahub
from umahub._tvm import TensorType
from umahub.compiler.reshapes import activations_before_reshapes
from umahub.ir import op_calls

RNG = np.random.default_rng(7)
W1 = RNG.standard_normal((32, 64)).astype("float32") / 6
B1 = RNG.standard_normal(64).astype("float32")
W2 = RNG.standard_normal((64, 32)).astype("float32") / 8
X = RNG.standard_normal((1, 16, 32)).astype("float32")


def _mlp(activation=relax.op.nn.gelu, output_activation=False):
    """``reshape -> matmul -> add -> reshape -> activation -> reshape -> matmul -> reshape``;
    ``output_activation``: the activation's result is also an output of the block."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((1, 16, 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            rows = bb.emit(relax.op.reshape(x, [16, 32]))
            product = bb.emit(relax.op.matmul(rows, relax.const(W1)))
            y = bb.emit(relax.op.add(product, relax.const(B1)))
            back = bb.emit(relax.op.reshape(y, [1, 16, 64]))
            act = activation(back)
            hidden = bb.emit_output(act) if output_activation else bb.emit(act, name_hint="act")
            rows = bb.emit(relax.op.reshape(hidden, [16, 64]))
            z = bb.emit(relax.op.matmul(rows, relax.const(W2)))
            out = bb.emit_output(relax.op.reshape(z, [1, 16, 32]))
        bb.emit_func_output(relax.Tuple([out, hidden]) if output_activation else out)
    return bb.get()


def _gelu(v):
    return 0.5 * v * (1 + np.vectorize(math.erf)(v / np.sqrt(2)))


def _reference():
    hidden = _gelu(X[0].astype(np.float64) @ W1 + B1)
    return (hidden @ W2)[None]


def _run(mod):
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(X))


def test_the_activation_meets_its_product_and_the_reshapes_between_the_products_go():
    moved = activations_before_reshapes(_mlp())
    assert [op for _, op in op_calls(moved["main"])] == [
        "relax.reshape",
        "relax.matmul",
        "relax.add",
        "relax.nn.gelu",
        "relax.matmul",
        "relax.reshape",
    ]
    assert [node for node, op in op_calls(moved["main"]) if op == "relax.nn.gelu"] == ["act"]
    np.testing.assert_allclose(_run(moved).numpy(), _reference(), rtol=1e-5, atol=1e-5)


def test_a_module_with_no_activation_after_a_reshape_is_returned_as_it_is():
    mod = _mlp(activation=lambda v: relax.op.add(v, v))
    assert activations_before_reshapes(mod) is mod


def test_an_activation_that_is_an_output_of_its_block_stays_where_it_is():
    mod = _mlp(output_activation=True)
    assert activations_before_reshapes(mod) is mod


def test_through_umahub_the_npu_takes_matmul_add_gelu_as_one_pattern():
    compiled = umahub.Hub(config={"plugins": ["npu"]}, project_config=False).compile(_mlp())
    placed = {(p.name, p.op): (p.device, p.pattern) for p in compiled.report.placement}
    assert placed[("act", "relax.nn.gelu")] == ("npu:0", "npu.matmul_bias_act")
    partitions = [p.symbol for p in compiled.report.partitions]
    assert partitions == ["npu_0_matmul_add_gelu", "npu_1_matmul"]
    copies = [(c.src, c.dst) for c in compiled.report.copies if c.when == "inference"]
    assert copies == [("host", "npu:0"), ("npu:0", "host")]
    np.testing.assert_allclose(compiled.run(X, executor="vm"), _reference(), rtol=1e-5, atol=1e-5)


def test_a_reshape_read_by_the_activation_and_by_another_operator_gives_the_same_values():
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((4, 6), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            r = bb.emit(relax.op.reshape(x, [2, 12]))
            both = bb.emit(relax.op.add(bb.emit(relax.op.nn.relu(r)), r))
            out = bb.emit_output(both)
        bb.emit_func_output(out)
    mod = bb.get()
    moved = activations_before_reshapes(mod)
    assert [op for _, op in op_calls(moved["main"])] == [
        "relax.reshape",
        "relax.nn.relu",
        "relax.reshape",
        "relax.add",
    ]
    x_value = np.linspace(-1, 1, 24, dtype="float32").reshape(4, 6)
    vm = relax.VirtualMachine(tvm.compile(moved, "llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x_value)).numpy()
    flat = x_value.reshape(2, 12)
    np.testing.assert_array_equal(got, np.maximum(flat, 0) + flat)
