"""The VM does not check, at every call, the weights umahub itself passes
(umahub.host.weight_checks); the model's inputs keep their checks."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tvm
from tvm import relax

import umahub
from umahub._tvm import TensorType, name_of
from umahub.host.weight_checks import CHECKS, without_weight_checks

RNG = np.random.default_rng(0)


def _checked(func: relax.Function) -> list[tuple[str, str]]:
    """(builtin, parameter) of each parameter check in ``func``."""
    found = []
    for block in func.body.blocks:
        for b in block.bindings:
            call = b.value
            if isinstance(call, relax.Call) and isinstance(call.op, relax.ExternFunc):
                name = str(call.op.global_symbol)
                if name in CHECKS:
                    found.append((name.split(".")[-1], name_of(call.args[0])))
    return found


def _lowered(weights: int) -> relax.Function:
    """main(x, w, v) through TVM's Relax pipeline and the pass; ``v`` has a
    symbolic dimension (its match_shape stores it, for later code to read)."""
    k = tvm.tirx.Var("k", "int64")
    x = relax.Var("x", TensorType((2, 3), "float32"))
    w = relax.Var("w", TensorType((2, 3), "float32"))
    v = relax.Var("v", TensorType((k, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w, v]):
        out = bb.emit(relax.op.add(x, w))
        bb.emit_func_output(out)
    pipeline = [relax.get_pipeline("default"), without_weight_checks(weights)]
    return tvm.transform.Sequential(pipeline)(bb.get())["main"]


def test_the_last_parameters_lose_their_checks_and_a_symbolic_dimension_keeps_its_match():
    assert _checked(_lowered(0)) == [
        ("check_tensor_info", "x"),
        ("check_tensor_info", "w"),
        ("check_tensor_info", "v"),
        ("match_shape", "x"),
        ("match_shape", "w"),
        ("match_shape", "v"),
    ]
    assert _checked(_lowered(2)) == [
        ("check_tensor_info", "x"),
        ("match_shape", "x"),
        ("match_shape", "v"),  # stores k
    ]


def _conv():
    w = RNG.standard_normal((8, 8, 3, 3)).astype("float32") * 0.1
    b = RNG.standard_normal((1, 8, 1, 1)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((1, 8, 9, 9), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(w), padding=1))
            out = bb.emit_output(relax.op.nn.relu(bb.emit(relax.op.add(y, relax.const(b)))))
        bb.emit_func_output(out)
    return bb.get()


def test_a_model_checks_its_input_at_every_call_and_not_the_weights_it_holds():
    mod = _conv()
    compiled = umahub.Hub(config={"plugins": ["npu"]}, project_config=False).compile(mod)
    runner = compiled._runner
    assert len(runner.weights) == 2  # the filter and the bias, on npu:0
    vm = relax.VirtualMachine(runner.library, runner.devices)
    x = RNG.standard_normal((1, 8, 9, 9)).astype("float32")
    args = [*runner.tensors([x]), *runner.weights]
    calls: collections.Counter = collections.Counter()

    def count(_func, name, before, _ret, *args):
        if before and name in CHECKS:  # what is checked: the error context's last words
            calls[name, str(args[-1]).split(", annotation")[0].rsplit(", ", 1)[-1]] += 1
        return 0

    vm.set_instrument(count)
    got = vm["main"](*args).numpy()
    assert calls == {
        ("vm.builtin.check_tensor_info", "param=x"): 1,
        ("vm.builtin.match_shape", "param=x"): 1,
        # the result, as in every model whose main types its tensors on a virtual device
        ("vm.builtin.match_shape", "loc=return"): 1,
    }
    plain = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    want = plain["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    wrong = tvm.runtime.tensor(np.zeros((1, 8, 9, 8), "float32"))
    with pytest.raises(Exception, match="param=x"):
        vm["main"](wrong, *runner.weights)
