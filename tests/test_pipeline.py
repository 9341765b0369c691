"""hub.compile end to end: numbers against plain tvm.compile, exact placements, exact errors.

Accelerators come from the installed test plugins (alpha_accel: LLVM, two
instances, claims relu and add; beta_accel: C, claims relu) and from plugin
objects defined here for behaviours the installed ones do not have.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from graphs import chain, inputs_for, reference

import umahub
from umahub.errors import (
    CompileError,
    MemoryPoolError,
    PlacementError,
    UnsupportedOperatorError,
)

TOL = {"rtol": 1e-5, "atol": 1e-5}
BOTH = {"plugins": ["alpha", "beta"]}


def placement(compiled_or_report):
    report = getattr(compiled_or_report, "report", compiled_or_report)
    return [(o.name, o.op.removeprefix("relax."), o.device) for o in report.placement]


@pytest.fixture(scope="module")
def model():
    mod = chain()
    xs = inputs_for(mod)
    return mod, xs, reference(mod, xs)


# ---------------------------------------------------------------- numbers and placement


def test_no_plugins_compiles_like_plain_tvm(model):
    mod, xs, ref = model
    compiled = umahub.Hub(autoload=False).compile(mod)
    assert {d for _, _, d in placement(compiled)} == {"host"}
    np.testing.assert_allclose(compiled.run(*xs), ref, **TOL)


def test_c_and_llvm_partitions_match_the_host(model):
    mod, xs, ref = model
    hub = umahub.Hub(config={**BOTH, "priority": ["beta_accel", "alpha_accel"]})
    compiled = hub.compile(mod)
    # beta (C) takes the relus first; alpha (LLVM) the adds, round robin over its instances.
    assert placement(compiled) == [
        ("n0", "nn.relu", "beta_accel:0"),
        ("n1", "add", "alpha_accel:0"),
        ("n2", "nn.relu", "beta_accel:0"),
        ("n3", "add", "alpha_accel:1"),
        ("n4", "sigmoid", "host"),
    ]
    np.testing.assert_allclose(compiled.run(*xs), ref, **TOL)


def test_priority_decides_the_claimant(model):
    mod, _, _ = model
    hub = umahub.Hub(config={**BOTH, "priority": ["alpha_accel", "beta_accel"]})
    report = hub.explain(mod)
    # alpha claims relu and add: neighbouring claims merge into one partition.
    assert placement(report)[:4] == [
        ("n0", "nn.relu", "alpha_accel:0"),
        ("n1", "add", "alpha_accel:0"),
        ("n2", "nn.relu", "alpha_accel:0"),
        ("n3", "add", "alpha_accel:0"),
    ]
    assert [p.patterns for p in report.partitions] == [("alpha_accel.relu", "alpha_accel.add")]


def test_an_accelerator_not_in_priority_claims_nothing(model):
    mod, _, _ = model
    report = umahub.Hub(config={**BOTH, "priority": ["beta_accel"]}).explain(mod)
    assert [d for _, _, d in placement(report)] == [
        "beta_accel:0",
        "host",
        "beta_accel:0",
        "host",
        "host",
    ]


def test_four_operators_pinned_to_four_virtual_devices(model):
    """The seed question: C on cpu1, D on accelerator1, E on cpu2 ..."""
    mod, xs, ref = model
    hub = umahub.Hub(
        config={
            **BOTH,
            "placement": {
                "n0": "alpha_accel:1",
                "n1": "alpha_accel:0",
                "n2": "beta_accel",
                "n3": "host",
            },
        }
    )
    compiled = hub.compile(mod)
    assert placement(compiled) == [
        ("n0", "nn.relu", "alpha_accel:1"),
        ("n1", "add", "alpha_accel:0"),
        ("n2", "nn.relu", "beta_accel:0"),
        ("n3", "add", "host"),
        ("n4", "sigmoid", "host"),
    ]
    assert compiled.devices == ["host", "alpha_accel:0", "alpha_accel:1", "beta_accel:0"]
    edges = [(e["src"], e["dst"], e["count"]) for e in compiled.report.copy_edges()]
    assert edges == [
        ("host", "alpha_accel:1", 1),  # x
        ("alpha_accel:1", "alpha_accel:0", 1),  # n0
        ("alpha_accel:0", "beta_accel:0", 1),  # n1
        ("beta_accel:0", "host", 1),  # n2
    ]
    # n1's constant operand is a weight: copied to alpha_accel:0 once, at load.
    assert [(e["src"], e["dst"], e["count"]) for e in compiled.report.copy_edges("load")] == [
        ("host", "alpha_accel:0", 1)
    ]
    assert sum(c.bytes for c in compiled.report.copies) == 5 * 4 * 16 * 4
    np.testing.assert_allclose(compiled.run(*xs), ref, **TOL)


def test_pins_by_op_glob_and_pattern(model):
    mod, _, _ = model
    hub = umahub.Hub(config={**BOTH, "placement": {"nn.relu": "beta_accel", "*add": "host"}})
    assert [d for _, _, d in placement(hub.explain(mod))] == [
        "beta_accel:0",
        "host",
        "beta_accel:0",
        "host",
        "host",
    ]
    # A pattern pinned to an instance; the unpinned relus go round robin (0, then 1).
    hub = umahub.Hub(config={**BOTH, "placement": {"alpha_accel.add": "alpha_accel:1"}})
    assert [d for _, _, d in placement(hub.explain(mod))] == [
        "alpha_accel:0",
        "alpha_accel:1",
        "alpha_accel:1",
        "alpha_accel:1",
        "host",
    ]


def test_pins_written_into_a_model_keep_their_attribute_name(model):
    """Models annotated by any umahub version carry their pins in this attribute."""
    mod, _, _ = model
    annotated = umahub.annotate(mod, {"n0": "host"})
    assert dict(annotated["main"].attrs["umahub.placement"]) == {"n0": "host"}


def test_api_pins_override_config_pins_override_model_pins(model):
    mod, _, _ = model
    annotated = umahub.annotate(mod, {"n0": "host", "n2": "host"})
    hub = umahub.Hub(
        config={**BOTH, "priority": ["alpha_accel"], "placement": {"n2": "beta_accel"}}
    )
    report = hub.explain(annotated, placement={"n1": "host"})
    assert [d for _, _, d in placement(report)] == [
        "host",
        "host",
        "beta_accel:0",
        "alpha_accel:0",
        "host",
    ]
    assert [o.pinned for o in report.placement] == ["n0", "n1", "n2", "", ""]


def test_partitions_are_spread_over_instances_round_robin():
    mod = chain(ops=("relu", "sigmoid", "relu", "sigmoid", "relu"))
    report = umahub.Hub(config={"plugins": ["alpha"]}).explain(mod)
    assert [d for _, _, d in placement(report)] == [
        "alpha_accel:0",
        "host",
        "alpha_accel:1",
        "host",
        "alpha_accel:0",
    ]


def test_pin_the_accelerator_cannot_take_is_an_error_or_falls_back(model):
    mod, _, _ = model
    hub = umahub.Hub(config={**BOTH, "on-error": "error", "placement": {"n4": "beta_accel"}})
    with pytest.raises(PlacementError) as info:
        hub.explain(mod)
    assert str(info.value) == (
        "pin 'n4' -> 'beta_accel': operator 'n4' (relax.sigmoid) runs on host, because none "
        "of the patterns of 'beta_accel' (beta_accel.relu) matches it; pin it elsewhere or "
        "extend the plugin's patterns"
    )
    hub = umahub.Hub(config={**BOTH, "placement": {"n4": "beta_accel"}})
    with pytest.warns(umahub.UmahubWarning, match="pin 'n4' -> 'beta_accel'"):
        report = hub.explain(mod)
    assert report.notes[0].startswith("pin 'n4' -> 'beta_accel': operator 'n4'")


def test_pin_that_selects_nothing_warns_and_suggests_a_name(model):
    mod, _, _ = model
    message = r"pin 'n00' selects no operator of the model \(did you mean 'n0'\?\)"
    with pytest.raises(PlacementError, match=message):
        umahub.Hub(config={**BOTH, "on-error": "error", "placement": {"n00": "host"}}).explain(mod)
    # A project's config may pin nodes of other models: by default a warning, not an error.
    with pytest.warns(umahub.UmahubWarning, match=message):
        umahub.Hub(config={**BOTH, "placement": {"n00": "host"}}).explain(mod)


def test_api_pin_to_unknown_accelerator_suggests_the_closest(model):
    mod, _, _ = model
    with pytest.raises(
        umahub.errors.ConfigError,
        match=r"unknown accelerator 'beta' "
        r"\(did you mean 'beta_accel'\?\)",
    ):
        umahub.Hub(config=BOTH).explain(mod, placement={"n0": "beta"})


# ---------------------------------------------------------------- failures


class _Base:
    """An accelerator 'flaky' that claims relu; subclasses break one hook."""

    UMAHUB_API = 1

    def __init__(self, pool_bytes=1 << 20):
        self.pool_bytes = pool_bytes

    @umahub.hookimpl
    def umahub_accelerators(self):
        return [
            umahub.Accelerator("flaky", memory=[umahub.MemoryPool("flaky.mem", self.pool_bytes)])
        ]

    @umahub.hookimpl
    def umahub_patterns(self, accelerator):
        from tvm.relax.dpl import is_op, wildcard

        if accelerator.name == "flaky":
            return [("flaky.relu", is_op("relax.nn.relu")(wildcard()))]
        return None


class ScheduleRaises(_Base):
    @umahub.hookimpl
    def umahub_schedule(self, accelerator, schedule):
        if accelerator.name == "flaky":
            raise RuntimeError("tile size 0")


def test_failing_hook_falls_back_to_the_host_with_a_warning(model):
    mod, xs, ref = model
    hub = umahub.Hub(autoload=False, plugins=[ScheduleRaises()])
    with pytest.warns(umahub.UmahubWarning) as warned:
        compiled = hub.compile(mod)
    assert {d for _, _, d in placement(compiled)} == {"host"}
    message = (
        "plugin 'ScheduleRaises' failed in umahub_schedule for partition "
        "flaky_0_relu (flaky.relu) on flaky:0: RuntimeError: tile size 0"
    )
    assert str(warned[0].message) == f"umahub: {message}; its partition runs on the host"
    assert compiled.report.partitions[0].fallback == message
    assert message in str(compiled.report)
    np.testing.assert_allclose(compiled.run(*xs), ref, **TOL)


def test_failing_hook_stops_the_compile_with_on_error_error(model):
    mod, _, _ = model
    hub = umahub.Hub(config={"on-error": "error"}, autoload=False, plugins=[ScheduleRaises()])
    with pytest.raises(
        CompileError,
        match="plugin 'ScheduleRaises' failed in umahub_schedule for partition flaky_0_relu",
    ):
        hub.compile(mod)


class ClaimsFma(_Base):
    @umahub.hookimpl
    def umahub_patterns(self, accelerator):
        from tvm.relax.dpl import is_op, wildcard

        if accelerator.name == "flaky":
            return [("flaky.fma", is_op("relax.ewise_fma")(wildcard(), wildcard(), wildcard()))]
        return None


def test_claimed_operator_without_a_lowering_is_named():
    from tvm import relax

    from umahub._tvm import TensorType

    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((4,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.ewise_fma(x, x, x), name_hint="fma")
        bb.emit_func_output(out)
    hub = umahub.Hub(config={"on-error": "error"}, autoload=False, plugins=[ClaimsFma()])
    with pytest.raises(UnsupportedOperatorError) as info:
        hub.compile(bb.get())
    assert (
        "accelerator 'flaky' claimed operators that the default lowering cannot turn into "
        "TIR: fma (relax.ewise_fma)" in str(info.value)
    )


def test_partition_that_does_not_fit_its_pool(model):
    mod, xs, ref = model
    hub = umahub.Hub(config={"on-error": "error"}, autoload=False, plugins=[_Base(pool_bytes=300)])
    with pytest.raises(MemoryPoolError) as info:
        hub.compile(mod)
    assert str(info.value) == (
        "partition flaky_0_relu (flaky.relu) needs 512 B of pool "
        "'flaky.mem' on flaky:0 (0 B resident + 512 B working), but only 300 B of 300 B are free"
    )
    # no other accelerator to take it: placed again, on the host, saying why
    with pytest.warns(
        umahub.UmahubWarning, match="are free; its operators were placed again: on the host"
    ):
        compiled = umahub.Hub(autoload=False, plugins=[_Base(pool_bytes=300)]).compile(mod)
    assert {d for _, _, d in placement(compiled)} == {"host"}
    refused = {op.name: op.refused.get("flaky", "") for op in compiled.report.placement}
    assert refused["n0"].startswith("partition flaky_0_relu (flaky.relu) needs 512 B of pool")
    assert refused["n2"].startswith("partition flaky_1_relu (flaky.relu) needs 512 B of pool")
    assert refused["n1"] == refused["n3"] == refused["n4"] == ""
    # explain plans what compile builds
    with pytest.warns(umahub.UmahubWarning, match="placed again: on the host"):
        report = umahub.Hub(autoload=False, plugins=[_Base(pool_bytes=300)]).explain(mod)
    assert report.partitions == [] and {op.device for op in report.placement} == {"host"}
    np.testing.assert_allclose(compiled.run(*xs), ref, **TOL)


def test_scope_policy_outputs_counts_only_outputs(model):
    mod, _, _ = model
    io = umahub.Hub(config={"plugins": ["alpha"]}).explain(mod)
    outputs = umahub.Hub(config={"plugins": ["alpha"], "scope-policy": "outputs"}).explain(mod)
    pool = io.memory.pool("alpha_accel:0", "alpha.mem")
    assert (pool.resident, pool.peak_transient) == (2 * 256, 256 + 4 * 256)
    pool = outputs.memory.pool("alpha_accel:0", "alpha.mem")
    assert (pool.resident, pool.peak_transient) == (0, 4 * 256)


# ---------------------------------------------------------------- hooks see the context


class Recorder(_Base):
    def __init__(self):
        super().__init__()
        self.seen = []

    @umahub.hookimpl
    def umahub_relax_to_tir(self, accelerator, function, context):
        self.seen.append(
            (
                "relax_to_tir",
                context.device,
                context.symbol,
                [o.name for o in context.operators],
                context.pool_free,
            )
        )

    @umahub.hookimpl
    def umahub_tir_passes(self, accelerator, phase, context):
        import tvm

        seen = self.seen

        @tvm.tirx.transform.prim_func_pass(opt_level=0)
        def look(func, mod, ctx):
            script = func.script()
            seen.append((f"phase{phase}", "T.sblock(" in script, len(func.params)))
            return func

        return [look]


def test_hooks_get_the_context_and_phases_sit_where_documented(model):
    mod, xs, ref = model
    plugin = Recorder()
    compiled = umahub.Hub(autoload=False, plugins=[plugin]).compile(mod)
    first, second = [s for s in plugin.seen if s[0] == "relax_to_tir"]
    assert first[:4] == ("relax_to_tir", "flaky:0", "flaky_0_relu", ["n0"])
    assert second[:4] == ("relax_to_tir", "flaky:0", "flaky_1_relu", ["n2"])
    # The memory plan so far: the second partition sees what the first left.
    assert first[4] == (1 << 20) and second[4] == (1 << 20) - 512
    phases = [s for s in plugin.seen if s[0].startswith("phase")][:4]
    # phase 0 still has blocks; from phase 1 on they are lowered; the packed API
    # (3 params instead of input + output) is made after phase 3.
    assert phases == [
        ("phase0", True, 2),
        ("phase1", False, 2),
        ("phase2", False, 2),
        ("phase3", False, 2),
    ]
    np.testing.assert_allclose(compiled.run(*xs), ref, **TOL)


class OwnLowering(_Base):
    """Replaces the default lowering and codegen, to show both hooks take over."""

    @umahub.hookimpl
    def umahub_relax_to_tir(self, accelerator, function, context):
        from umahub.compiler.lowering import default_relax_to_tir

        if accelerator.name == "flaky":
            return default_relax_to_tir(function, context.symbol, "flaky")
        return None

    @umahub.hookimpl
    def umahub_codegen(self, accelerator, module, context):
        import tvm

        if accelerator.name == "flaky":
            return tvm.tirx.build(module, target="llvm", pipeline=context.tir_pipeline)
        return None


def test_relax_to_tir_and_codegen_hooks_take_over(model):
    mod, xs, ref = model
    compiled = umahub.Hub(autoload=False, plugins=[OwnLowering()]).compile(mod)
    hooks = compiled.report.partitions[0].hooks
    assert hooks == {"umahub_relax_to_tir": ["OwnLowering"], "umahub_codegen": ["OwnLowering"]}
    np.testing.assert_allclose(compiled.run(*xs), ref, **TOL)


def test_lowering_order_orders_the_hooks(model):
    mod, _, _ = model
    plugin = Recorder()

    class Second(_Base):
        @umahub.hookimpl
        def umahub_accelerators(self):
            return [umahub.Accelerator("second")]

        @umahub.hookimpl
        def umahub_patterns(self, accelerator):
            from tvm.relax.dpl import is_op, wildcard

            if accelerator.name == "second":
                return [("second.add", is_op("relax.add")(wildcard(), wildcard()))]
            return None

    hub = umahub.Hub(
        autoload=False, plugins=[plugin, Second()], config={"lowering-order": ["second", "flaky"]}
    )
    hub.compile(mod)
    # The recorder's relax_to_tir hook is called for every partition, in lowering order.
    order = [s[1] for s in plugin.seen if s[0] == "relax_to_tir"]
    assert order == ["second:0", "second:0", "flaky:0", "flaky:0"]


# ---------------------------------------------------------------- export, report, CLI


def test_export_and_load_in_a_new_process(model, tmp_path):
    mod, xs, ref = model
    compiled = umahub.Hub(config={**BOTH, "priority": ["beta_accel", "alpha_accel"]}).compile(mod)
    path = compiled.export_library(tmp_path / "model.so")
    np.save(tmp_path / "x.npy", xs[0])
    code = (
        "import sys, numpy as np, umahub\n"
        "m = umahub.load(sys.argv[1])\n"
        "np.save(sys.argv[3], m.run(np.load(sys.argv[2])))\n"
        "print(m.devices)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(path), str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
        capture_output=True,
        text=True,
        env={"UMAHUB_DISABLE_PLUGIN_AUTOLOAD": "1", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    # Devices follow the accelerators' priority order.
    assert result.stdout.strip() == "['host', 'beta_accel:0', 'alpha_accel:0', 'alpha_accel:1']"
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), ref, **TOL)


def test_load_refuses_a_file_umahub_did_not_write(tmp_path):
    path = tmp_path / "other.so"
    path.write_bytes(b"\x7fELF not ours")
    with pytest.raises(umahub.errors.UmahubError, match="was not written by umahub"):
        umahub.load(path)


def test_run_checks_input_shapes(model):
    mod, _, _ = model
    compiled = umahub.Hub(autoload=False).compile(mod)
    with pytest.raises(
        umahub.errors.UmahubError,
        match=r"input 0: expected shape \(4, 16\) float32, got \(2, 2\) float32",
    ):
        compiled.run(np.zeros((2, 2), "float32"))


def test_report_json_has_the_same_facts(model):
    import json

    mod, _, _ = model
    report = umahub.Hub(config={**BOTH, "priority": ["beta_accel", "alpha_accel"]}).explain(mod)
    data = json.loads(report.to_json())
    assert [(o["name"], o["device"]) for o in data["placement"]] == [
        (o.name, o.device) for o in report.placement
    ]
    assert data["copy_edges"] == report.copy_edges()
    assert data["built"] is False
    assert "\n  n0    relax.nn.relu  beta_accel:0   beta_accel.relu\n" in str(report)


def test_same_size_tensors_alternating_between_host_and_accelerators():
    """Host and accelerator tensors of one size, alternating, with two instances.

    (The storage-reuse-across-devices failure this guards against showed on the
    BERT layer; ``test_zoo_models.py`` compiles it with the plugins, marked slow.)"""
    mod = chain(shape=(64, 64), ops=("sigmoid", "tanh", "relu", "tanh", "relu", "sigmoid"))
    xs = inputs_for(mod)
    compiled = umahub.Hub(config={"plugins": ["alpha"]}).compile(mod)
    assert [d for _, _, d in placement(compiled)] == [
        "host",
        "host",
        "alpha_accel:0",
        "host",
        "alpha_accel:1",
        "host",
    ]
    np.testing.assert_allclose(compiled.run(*xs), reference(mod, xs), **TOL)


def test_one_match_pinned_to_two_instances_names_both_pins():
    mod = chain(ops=("relu", "sigmoid"))

    class Fused(_Base):
        @umahub.hookimpl
        def umahub_accelerators(self):
            return [umahub.Accelerator("fused", instances=2)]

        @umahub.hookimpl
        def umahub_patterns(self, accelerator):
            from tvm.relax.dpl import is_op, wildcard

            if accelerator.name == "fused":
                relu = is_op("relax.nn.relu")(wildcard())
                return [("fused.relu_sigmoid", is_op("relax.sigmoid")(relu))]
            return None

    hub = umahub.Hub(
        autoload=False, plugins=[Fused()], config={"placement": {"n0": "fused:0", "n1": "fused:1"}}
    )
    with pytest.raises(PlacementError) as info:
        hub.explain(mod)
    assert str(info.value) == (
        "one match of pattern 'fused.relu_sigmoid' holds operators pinned to two instances: "
        "'n0' -> 'fused:0' and 'n1' -> 'fused:1' (virtual_device_id 0 vs 1); pin them to "
        "one instance"
    )


def test_an_accelerator_that_does_not_merge_keeps_one_match_per_partition(model):
    mod, _, _ = model

    class Single(_Base):
        @umahub.hookimpl
        def umahub_accelerators(self):
            return [umahub.Accelerator("single", merge=False)]

        @umahub.hookimpl
        def umahub_patterns(self, accelerator):
            from tvm.relax.dpl import is_op, wildcard

            if accelerator.name == "single":
                return [
                    ("single.relu", is_op("relax.nn.relu")(wildcard())),
                    ("single.add", is_op("relax.add")(wildcard(), wildcard())),
                ]
            return None

    report = umahub.Hub(autoload=False, plugins=[Single()]).explain(mod)
    assert [p.patterns for p in report.partitions] == [
        ("single.relu",),
        ("single.add",),
        ("single.relu",),
        ("single.add",),
    ]
    merged = umahub.Hub(config={"plugins": ["alpha"], "priority": ["alpha_accel"]}).explain(mod)
    assert len(merged.partitions) == 1
