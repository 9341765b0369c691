"""Constants folded at compile time: the layout operators of weights with numpy,
the rest with Relax's FoldConstant, the result the same as FoldConstant's alone."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from umahub._tvm import TensorType, constant_value
from umahub.host.folding import fold_constants, fold_layout_of_constants


def _model(chain, rows=2):
    """``x @ chain(W)`` with ``W`` a 4x6 constant; ``chain(bb, w)`` emits the operators."""
    w = np.arange(24, dtype="float32").reshape(4, 6) / 7
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((rows, 6), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, chain(bb, relax.const(w))))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _transposed_reshaped_cast(bb, w):
    t = bb.emit(relax.op.permute_dims(w))  # 6x4
    r = bb.emit(relax.op.reshape(t, (6, 1, 4)))
    s = bb.emit(relax.op.squeeze(r, [1]))
    e = bb.emit(relax.op.expand_dims(s, [0]))
    h = bb.emit(relax.op.astype(bb.emit(relax.op.squeeze(e, [0])), "float16"))
    return bb.emit(relax.op.astype(h, "float32"))


def _run(mod, x):
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def test_layout_operators_of_a_weight_are_folded_with_numpy_as_foldconstant_would():
    mod = _model(_transposed_reshaped_cast)
    layout, folded = fold_layout_of_constants(mod)
    assert folded == 7
    calls = [b.value.op.name for b in layout["main"].body.blocks[0].bindings
             if isinstance(b.value, relax.Call)]  # fmt: skip
    assert calls == ["relax.matmul"]
    tvm.ir.assert_structural_equal(
        fold_constants(mod), relax.transform.FoldConstant()(mod), map_free_vars=True
    )
    x = np.linspace(-1, 1, 12, dtype="float32").reshape(2, 6)
    np.testing.assert_allclose(_run(fold_constants(mod), x), _run(mod, x), rtol=1e-6)


def test_what_numpy_does_not_fold_is_left_to_foldconstant():
    def added(bb, w):  # arithmetic of constants: FoldConstant's
        return bb.emit(relax.op.permute_dims(bb.emit(relax.op.add(w, w))))

    mod = _model(added)
    assert fold_layout_of_constants(mod) == (mod, 0)
    folded = fold_constants(mod)
    calls = [b.value.op.name for b in folded["main"].body.blocks[0].bindings
             if isinstance(b.value, relax.Call)]  # fmt: skip
    assert calls == ["relax.matmul"]


def test_an_operator_of_a_run_time_value_is_not_folded():
    w = np.arange(24, dtype="float32").reshape(4, 6)
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((6, 2), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            xt = bb.emit(relax.op.permute_dims(x))
            wt = bb.emit(relax.op.permute_dims(relax.const(w)))
            out = bb.emit_output(bb.emit(relax.op.matmul(xt, wt)))
        bb.emit_func_output(out)
    mod = bb.get()
    layout, folded = fold_layout_of_constants(mod)
    assert folded == 1  # the weight's transpose, not the input's
    calls = [b.value.op.name for b in layout["main"].body.blocks[0].bindings
             if isinstance(b.value, relax.Call)]  # fmt: skip
    assert calls == ["relax.permute_dims", "relax.matmul"]
    x = np.linspace(-1, 1, 12, dtype="float32").reshape(6, 2)
    np.testing.assert_allclose(_run(layout, x), _run(mod, x), rtol=1e-6)


def _conv_norm(groups=1, training=False, conv_read_twice=False, mean_as_input=False):
    """conv2d(x, W) -> batch_norm -> item 0, 8 channels (``groups`` of them),
    statistics far from 0 and 1 so that a wrong fold shows in the numbers."""
    rng = np.random.default_rng(0)
    c = 8
    w = rng.standard_normal((c, c // groups, 3, 3)).astype("float32")
    stats = [
        rng.uniform(0.5, 2.0, c),  # gamma
        rng.uniform(-1.0, 1.0, c),  # beta
        rng.uniform(-3.0, 3.0, c),  # mean
        rng.uniform(0.1, 4.0, c),  # var
    ]
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((1, c, 6, 6), "float32"))
    params = [x]
    if mean_as_input:
        params.append(relax.Var("mean", TensorType((c,), "float32")))
    with bb.function("main", params):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, relax.const(w), padding=1, groups=groups))
            args = [relax.const(s.astype("float32")) for s in stats]
            if mean_as_input:
                args[2] = params[1]
            norm = bb.emit(relax.op.nn.batch_norm(conv, *args, axis=1, epsilon=1e-3,
                                                  training=training))  # fmt: skip
            y = bb.emit(relax.TupleGetItem(norm, 0))
            if conv_read_twice:
                y = bb.emit(relax.op.add(y, conv))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get(), w, stats


def _calls(mod):
    return [b.value.op.name for b in mod["main"].body.blocks[0].bindings
            if isinstance(b.value, relax.Call)]  # fmt: skip


def test_an_inference_batch_norm_is_folded_into_the_convolution_before_it():
    from umahub.host.folding import fold_batch_norms

    for groups in (1, 8):  # a convolution and a depthwise one
        mod, w, (gamma, beta, mean, var) = _conv_norm(groups)
        folded, count = fold_batch_norms(mod)
        assert count == 1
        assert _calls(folded) == ["relax.nn.conv2d", "relax.add"]
        x = np.random.default_rng(1).standard_normal((1, 8, 6, 6)).astype("float32")
        np.testing.assert_allclose(_run(folded, x), _run(mod, x), rtol=1e-5, atol=1e-5)
        # the folded weight and bias, against the definition in float64
        scale = gamma / np.sqrt(var + 1e-3)
        weight, bias = [constant_value(b.value.args[1]).numpy()
                        for b in folded["main"].body.blocks[0].bindings
                        if isinstance(b.value, relax.Call)]  # fmt: skip
        np.testing.assert_allclose(weight, w * scale.reshape(-1, 1, 1, 1), rtol=1e-6)
        np.testing.assert_allclose(bias.ravel(), beta - mean * scale, rtol=1e-6, atol=1e-7)
        assert _calls(fold_constants(mod)) == ["relax.nn.conv2d", "relax.add"]


def test_a_batch_norm_is_not_folded_in_training_or_when_its_inputs_are_read_elsewhere():
    from umahub.host.folding import fold_batch_norms

    for case in ({"training": True}, {"conv_read_twice": True}, {"mean_as_input": True}):
        mod, _, _ = _conv_norm(**case)
        assert fold_batch_norms(mod) == (mod, 0), case
        assert "relax.nn.batch_norm" in _calls(fold_constants(mod)), case
