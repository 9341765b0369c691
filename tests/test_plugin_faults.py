"""Trust what a plugin gives: one test plugin per fault, each caught at compile time.

Every fault ends the same way: with ``on-error = "fallback"`` the compile
finishes, the partition runs on the host (numbers right) and a note names
plugin, hook and partition; with ``"error"`` the compile stops with that
message. Wrong-but-valid kernels are caught by ``verify``.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import tvm
from graphs import chain, inputs_for, reference
from tvm import te

import umahub
from umahub.compiler.placement import CheckFailures, Pins, PlannedPattern
from umahub.compiler.stages.partition import partition
from umahub.errors import CompileError, HookTimeoutError, PatternCheckFailure, VerificationError

TOL = {"rtol": 1e-5, "atol": 1e-5}
SYMBOL = "faulty_0_relu"
WHERE = f"for partition {SYMBOL} (faulty.relu) on faulty:0"


@pytest.fixture(scope="module")
def model():
    mod = chain(ops=("relu", "sigmoid"))
    xs = inputs_for(mod)
    return mod, xs, reference(mod, xs)


def _relu_plus(symbol, shape=(4, 16), plus=1.0, name="faulty", times=1.0):
    """A PrimFunc (DPS) computing relu(x) * times + plus, named ``symbol``."""
    x = te.placeholder(shape, "float32", name="x")
    zero = tvm.tirx.const(0, "float32")
    y = te.compute(shape, lambda *i: te.max(x(*i), zero) * times + plus, name="y")
    return te.create_prim_func([x, y]).with_attr("global_symbol", symbol)


class Faulty:
    """An accelerator 'faulty' that claims relu; ``fault`` picks the one thing it does wrong."""

    UMAHUB_API = 1

    def __init__(self, fault):
        self.fault = fault

    @umahub.hookimpl
    def umahub_accelerators(self):
        return [umahub.Accelerator("faulty")]

    @umahub.hookimpl
    def umahub_patterns(self, accelerator):
        from tvm.relax.dpl import is_op, wildcard

        if accelerator.name != "faulty" or self.fault == "patterns-none":
            return None
        relu = is_op("relax.nn.relu")(wildcard())
        return {
            "patterns-not-a-list": "relax.nn.relu",
            "pattern-not-a-pattern": [("faulty.relu", "relax.nn.relu")],
            "check-not-callable": [("faulty.relu", relu, {}, "yes")],
            "check-raises": [("faulty.relu", relu, {}, lambda ctx: 1 / 0)],
        }.get(self.fault, [("faulty.relu", relu)])

    @umahub.hookimpl
    def umahub_relax_to_tir(self, accelerator, function, context):
        if self.fault == "lowering-garbage":
            return "PrimFunc, promise"
        if self.fault == "lowering-the-function":
            return function
        if self.fault == "lowering-raises-with-ir":  # as TVM 0.27: the message, then the IR
            raise ValueError(f"cannot lower this function:\n{function.script()}")
        if self.fault == "lowering-no-symbol":
            return tvm.IRModule({"other": _relu_plus("other")})
        if self.fault == "lowering-wrong-arity":
            x = te.placeholder((4, 16), "float32", name="x")
            return tvm.IRModule(
                {context.symbol: te.create_prim_func([x]).with_attr("global_symbol", "s")}
            )
        if self.fault == "lowering-wrong-shape":
            return tvm.IRModule({context.symbol: _relu_plus(context.symbol, shape=(8,))})
        if self.fault == "lowering-wrong-arithmetic":
            return tvm.IRModule({context.symbol: _relu_plus(context.symbol)})
        if self.fault == "lowering-zeros":  # relu(x) * 0: wrong, by less than 1e-4
            return tvm.IRModule({context.symbol: _relu_plus(context.symbol, plus=0.0, times=0.0)})
        return None

    @umahub.hookimpl
    def umahub_schedule(self, accelerator, schedule):
        if self.fault == "schedule-hangs":
            time.sleep(20)
        if self.fault == "schedule-number":
            return 42
        if self.fault == "schedule-on-a-copy":
            copy = tvm.s_tir.Schedule(schedule.mod)
            return copy.mod
        return None

    @umahub.hookimpl
    def umahub_tir_passes(self, accelerator, phase):
        if self.fault != "pass-wrong-arithmetic" or phase != 0:
            return None

        @tvm.tirx.transform.prim_func_pass(opt_level=0)
        def plus_one(func, mod, ctx):  # the same signature, another body: relu(x) + 1
            wrong = _relu_plus(str(func.attrs["global_symbol"]))
            for key, value in func.attrs.items():
                wrong = wrong.with_attr(key, value)
            return wrong

        return [plus_one]

    @umahub.hookimpl
    def umahub_codegen(self, accelerator, module, context):
        if self.fault == "codegen-garbage":
            return b"\x7fELF"
        if self.fault == "codegen-no-symbol":
            return tvm.tirx.build(tvm.IRModule({"other": _relu_plus("other")}), target="llvm")
        if self.fault == "codegen-wrong-arithmetic":
            return tvm.tirx.build(
                tvm.IRModule({context.symbol: _relu_plus(context.symbol)}), target="llvm"
            )
        return None


def _hub(fault, **config):
    return umahub.Hub(config=config, autoload=False, plugins=[Faulty(fault)], project_config=False)


def _on_host(compiled):
    return {o.name: o.device for o in compiled.report.placement} == {"n0": "host", "n1": "host"}


# ------------------------------------------------------------------ what hooks return

GARBAGE = {
    "patterns-not-a-list": (
        "plugin 'Faulty' failed in umahub_patterns for accelerator 'faulty': PluginOutputError: "
        "umahub_patterns returned str 'relax.nn.relu' for 'faulty': expected a list of "
        "patterns or None"
    ),
    "pattern-not-a-pattern": (
        "plugin 'Faulty' failed in umahub_patterns for accelerator 'faulty': PluginOutputError: "
        "umahub_patterns for 'faulty': pattern 'faulty.relu' is str 'relax.nn.relu', not a "
        "tvm.relax.dpl pattern (is_op(...), wildcard(), ...)"
    ),
    "check-not-callable": (
        "plugin 'Faulty' failed in umahub_patterns for accelerator 'faulty': PluginOutputError: "
        "umahub_patterns for 'faulty': the check of pattern 'faulty.relu' is str 'yes', not a "
        "function of a PatternCheckContext"
    ),
    "check-raises": (
        "plugin 'Faulty' failed in the check of pattern 'faulty.relu' (from umahub_patterns) "
        "on n0: ZeroDivisionError: division by zero"
    ),
    "patterns-none": (
        "plugin 'Faulty' failed in umahub_patterns for accelerator 'faulty': PluginOutputError: "
        "umahub_patterns returned None for 'faulty', the plugin's own accelerator: return its "
        "patterns, or [] to claim nothing"
    ),
    "lowering-the-function": (
        f"plugin 'Faulty' failed in umahub_relax_to_tir {WHERE}: PluginOutputError: "
        "umahub_relax_to_tir returned tvm.relax.expr.Function: expected a tvm.IRModule with a "
        f"PrimFunc named '{SYMBOL}', or None for the default lowering"
    ),
    "lowering-raises-with-ir": (
        f"plugin 'Faulty' failed in umahub_relax_to_tir {WHERE}: ValueError: "
        "cannot lower this function:"
    ),
    "lowering-garbage": (
        f"plugin 'Faulty' failed in umahub_relax_to_tir {WHERE}: PluginOutputError: "
        "umahub_relax_to_tir returned str 'PrimFunc, promise': expected a tvm.IRModule with a "
        f"PrimFunc named '{SYMBOL}', or None for the default lowering"
    ),
    "lowering-no-symbol": (
        f"plugin 'Faulty' failed in umahub_relax_to_tir {WHERE}: PluginOutputError: "
        f"umahub_relax_to_tir returned a module without a PrimFunc named '{SYMBOL}' (it "
        "holds: other)"
    ),
    "lowering-wrong-arity": (
        f"plugin 'Faulty' failed in umahub_relax_to_tir {WHERE}: PluginOutputError: "
        f"umahub_relax_to_tir: PrimFunc '{SYMBOL}' takes 1 parameter(s); the partition has 1 "
        "input(s) and 1 output(s), so it must take 2 (inputs, then outputs)"
    ),
    "lowering-wrong-shape": (
        f"plugin 'Faulty' failed in umahub_relax_to_tir {WHERE}: PluginOutputError: "
        f"umahub_relax_to_tir: parameter 0 of PrimFunc '{SYMBOL}' (input) is (8) float32, but "
        "the partition's input is (4, 16) float32"
    ),
    "schedule-number": (
        f"plugin 'Faulty' failed in umahub_schedule {WHERE}: PluginOutputError: "
        "umahub_schedule returned int 42: expected None or a short description of what it "
        "did (a str)"
    ),
    "schedule-on-a-copy": (
        f"plugin 'Faulty' failed in umahub_schedule {WHERE}: PluginOutputError: "
        "umahub_schedule returned a tvm IRModule: a schedule hook changes the schedule it is "
        "given, in place (what it returns is not used, so work done on a copy is lost); "
        "return None or a short description of what it did"
    ),
    "codegen-garbage": (
        f"plugin 'Faulty' failed in umahub_codegen {WHERE}: PluginOutputError: umahub_codegen "
        "returned bytes b'\\x7fELF': expected a tvm.runtime.Module (e.g. from tvm.tirx.build) "
        "or None for the default codegen"
    ),
    "codegen-no-symbol": (
        f"plugin 'Faulty' failed in umahub_codegen {WHERE}: PluginOutputError: umahub_codegen "
        f"returned a llvm module that defines no function '{SYMBOL}' (the partition's symbol, "
        "context.symbol)"
    ),
}


@pytest.mark.parametrize("fault", sorted(GARBAGE))
def test_garbage_from_a_hook_falls_back_with_a_note(model, fault):
    mod, xs, ref = model
    with pytest.warns(umahub.UmahubWarning):
        compiled = _hub(fault).compile(mod)
    assert _on_host(compiled)
    assert compiled.report.notes == [GARBAGE[fault]]
    np.testing.assert_allclose(compiled.run(*xs), ref, **TOL)


@pytest.mark.parametrize("fault", sorted(GARBAGE))
def test_garbage_from_a_hook_stops_the_compile_with_on_error_error(model, fault):
    mod, _, _ = model
    with pytest.raises(CompileError) as info:
        _hub(fault, **{"on-error": "error"}).compile(mod)
    assert str(info.value) == GARBAGE[fault]


def test_a_check_that_raises_is_recorded_as_a_plugin_failure(model):
    from tvm.relax.dpl import is_op, wildcard

    mod, _, _ = model
    acc = umahub.Accelerator("faulty")
    relu = is_op("relax.nn.relu")(wildcard())
    planned = [PlannedPattern(acc, "faulty.relu", relu, {}, lambda ctx: 1 / 0, True)]
    failures = CheckFailures(lambda accelerator: f"owner of {accelerator}")
    part = partition(mod, planned, Pins([]), {"faulty": acc}, failures)
    assert part.partitions == ()  # the match was refused
    (failure,) = failures.failures
    assert isinstance(failure, PatternCheckFailure)
    assert (failure.plugin, failure.hook, failure.partition) == (
        "owner of faulty",
        "umahub_patterns",
        None,
    )
    assert (failure.pattern, failure.nodes) == ("faulty.relu", ("n0",))
    assert isinstance(failure.cause, ZeroDivisionError) and failure.__cause__ is failure.cause
    assert failures.by_pattern() == {"faulty.relu": [failure]}


# ------------------------------------------------------------------ wrong but valid kernels

WRONG = {
    "codegen-wrong-arithmetic": "umahub_codegen: Faulty",
    "lowering-wrong-arithmetic": "umahub_relax_to_tir: Faulty",
    "pass-wrong-arithmetic": "umahub_tir_passes: Faulty",
}


@pytest.mark.parametrize("fault", sorted(WRONG))
def test_a_wrong_kernel_goes_unnoticed_without_verify(model, fault):
    mod, xs, ref = model
    compiled = _hub(fault).compile(mod)
    assert compiled.report.notes == []
    assert not np.allclose(compiled.run(*xs), ref, **TOL)  # why verify exists


@pytest.mark.parametrize("fault", sorted(WRONG))
def test_verify_sends_a_wrong_kernel_to_the_host(model, fault):
    mod, xs, ref = model
    with pytest.warns(umahub.UmahubWarning, match="computes wrong numbers"):
        compiled = _hub(fault).compile(mod, verify=True)
    assert _on_host(compiled)
    # The limit is verify-tolerance (1e-4) times the largest output of the host (1.96).
    assert compiled.report.notes == [
        f"plugin 'Faulty' computes wrong numbers in partition {SYMBOL} (faulty.relu) on "
        "faulty:0: largest error 1, beyond the limit 0.000196 against the host's lowering of "
        f"the same operators on the model's own values (hooks that acted: {WRONG[fault]})"
    ]
    (partition,) = compiled.report.partitions
    assert partition.max_error == pytest.approx(1.0)
    np.testing.assert_allclose(compiled.run(*xs), ref, **TOL)


def test_verify_stops_a_wrong_kernel_with_on_error_error(model):
    mod, _, _ = model
    hub = _hub("codegen-wrong-arithmetic", verify=True, **{"on-error": "error"})
    with pytest.raises(VerificationError, match=f"computes wrong numbers in partition {SYMBOL}"):
        hub.compile(mod)


def test_verify_passes_a_right_kernel_and_reports_its_error(model):
    mod, xs, ref = model
    compiled = _hub("none", verify=True).compile(mod)
    (partition,) = compiled.report.partitions
    assert partition.device == "faulty:0" and partition.fallback == ""
    assert partition.max_error == 0.0
    assert partition.verified == "largest error 0, within the limit 0.000196"
    np.testing.assert_allclose(compiled.run(*xs), ref, **TOL)


# ------------------------------------------------------------------ hooks that never return


def test_a_hanging_hook_falls_back_after_the_time_limit(model):
    mod, xs, ref = model
    start = time.perf_counter()
    with pytest.warns(umahub.UmahubWarning, match="hook-timeout"):
        compiled = _hub("schedule-hangs", **{"hook-timeout": 1}).compile(mod)
    assert time.perf_counter() - start < 15
    assert _on_host(compiled)
    assert compiled.report.notes == [
        f"plugin 'Faulty' failed in umahub_schedule {WHERE}: HookTimeoutError: did not finish "
        "within 1 s (hook-timeout); its thread cannot be stopped safely and is left running in "
        "the background"
    ]
    np.testing.assert_allclose(compiled.run(*xs), ref, **TOL)


def test_a_hanging_hook_stops_the_compile_with_on_error_error(model):
    mod, _, _ = model
    hub = _hub("schedule-hangs", **{"hook-timeout": 0.5, "on-error": "error"})
    with pytest.raises(CompileError, match=r"failed in umahub_schedule .* HookTimeoutError"):
        hub.compile(mod)
    assert issubclass(HookTimeoutError, CompileError)


def test_a_warning_points_at_the_users_call(model):
    mod, _, _ = model
    with pytest.warns(umahub.UmahubWarning) as warned:
        _hub("lowering-garbage").compile(mod)  # the line the warning must name
    assert {(Path(w.filename).name, w.lineno) for w in warned} == {
        (Path(__file__).name, _line_of("the line the warning must name"))
    }


def _line_of(text: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line and "_line_of" not in line)


class MissingKernel:
    """C that compiles but calls a vendor function no library defines: the load fails."""

    UMAHUB_API = 1

    @umahub.hookimpl
    def umahub_accelerators(self):
        return [umahub.Accelerator("linkless", codegen="c")]

    @umahub.hookimpl(accelerator="linkless")
    def umahub_patterns(self):
        from tvm.relax.dpl import is_op, wildcard

        return [("linkless.relu", is_op("relax.nn.relu")(wildcard()))]

    @umahub.hookimpl(accelerator="linkless")
    def umahub_codegen(self, context):
        source = (
            "#include <stdint.h>\n"
            "int32_t vendor_relu_not_linked(void);\n"
            f"int32_t __tvm_ffi_{context.symbol}(void* self, void* args, int32_t n, void* out) "
            "{ return vendor_relu_not_linked(); }\n"
        )
        create = tvm.get_global_func("runtime.CSourceModuleCreate")
        return create(source, "c", [f"__tvm_ffi_{context.symbol}"], [])


def test_a_model_that_cannot_be_loaded_is_built_again_on_the_host(model):
    mod, xs, ref = model
    hub = umahub.Hub(config={}, autoload=False, plugins=[MissingKernel()], project_config=False)
    with pytest.warns(umahub.UmahubWarning, match="every partition runs on the host"):
        compiled = hub.compile(mod)
    assert {o.name: o.device for o in compiled.report.placement} == {"n0": "host", "n1": "host"}
    (note,) = compiled.report.notes
    assert note.startswith("building the model with its partitions placed failed (CompileError: ")
    assert "vendor_relu_not_linked" in note
    np.testing.assert_allclose(compiled.run(*xs), ref, **TOL)
    strict = umahub.Hub(
        config={"on-error": "error"},
        autoload=False,
        plugins=[MissingKernel()],
        project_config=False,
    )
    with pytest.raises(CompileError, match="vendor_relu_not_linked"):
        strict.compile(mod)


def test_verify_of_a_model_with_a_shape_input_says_it_could_not_run():
    from tvm.script import ir as I
    from tvm.script import relax as R

    @I.ir_module
    class WithShape:
        @R.function
        def main(x: R.Tensor((4, 16), "float32"), s: R.Shape([4])):
            with R.dataflow():
                y = R.nn.relu(x)
                R.output(y)
            return y

    compiled = _hub("none", verify=True).compile(WithShape)
    (partition,) = compiled.report.partitions
    assert partition.device == "faulty:0" and partition.fallback == ""
    assert partition.max_error is None
    assert partition.verified == (
        "not verified: the model did not run on random inputs (UmahubError: input 1 is not a "
        "tensor: random inputs cannot be made for it; give the inputs (umahub run --inputs "
        "x.npz))"
    )


def test_verify_catches_a_zero_kernel_on_small_outputs():
    # relu of values ~1e-6: all zeros is wrong by ~1e-6, which an allowance of
    # 1e-4 x max(1, largest output) let through; relative to the outputs it is not.
    from tvm import relax

    from umahub._tvm import TensorType

    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((4, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            small = bb.emit(relax.op.multiply(x, relax.const(1e-6, "float32")))
            y = bb.emit(relax.op.nn.relu(small))
            z = bb.emit_output(relax.op.add(y, relax.const(0.0, "float32")))
        bb.emit_func_output(z)
    mod = bb.get()
    with pytest.warns(umahub.UmahubWarning, match="computes wrong numbers"):
        compiled = _hub("lowering-zeros", verify=True).compile(mod)
    [partition] = compiled.report.partitions
    assert partition.fallback.startswith(
        f"plugin 'Faulty' computes wrong numbers in partition {SYMBOL} (faulty.relu) on faulty:0"
    )
