"""Constants folded at compile time: the layout operators of weights with numpy,
the rest with Relax's FoldConstant, the result the same as FoldConstant's alone."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from umahub._tvm import TensorType
from umahub.folding import fold_constants, fold_layout_of_constants


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
