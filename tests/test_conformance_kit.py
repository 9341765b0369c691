"""The conformance kit (``umahub.testing``), run the way a vendor runs it: pytest in pytest.

Each test starts an inner pytest session with ``pytester`` (in this process,
so TVM is imported once) and checks its outcomes and its JSON report. Kept
small: the test plugin ``alpha`` (accelerator ``alpha_accel``: LLVM, two
instances, claims relu and add), the mlp only, two or three random graphs.
"""

from __future__ import annotations

import json
import textwrap

import pytest

pytest_plugins = ["pytester"]


@pytest.fixture(scope="module", autouse=True)
def warm(tmp_path_factory):
    """Import now, outside pytester's snapshot of ``sys.modules``, every module a run needs.

    An inline run removes the modules it imported when it ends; numpy and TVM's
    FFI registrations cannot be imported twice in a process, so they must be
    there before the first inline run.
    """
    import hypothesis  # noqa: F401
    from tvm import te  # noqa: F401

    import umahub
    import umahub.models as zoo
    from umahub.testing import _graphs  # noqa: F401

    hub = umahub.Hub(config={"plugins": ["alpha"], "priority": ["alpha_accel"]})
    compiled = hub.compile(zoo.get("mlp"))
    path = compiled.export_library(tmp_path_factory.mktemp("warm") / "mlp.so")
    umahub.load(path).run(*zoo.inputs("mlp"))


#: An accelerator that computes relu(x) as x + 1: it partitions and compiles
#: fine, and every numeric check must catch it.
WRONG_PLUGIN = """
    import umahub

    UMAHUB_API = 1


    @umahub.hookimpl
    def umahub_accelerators():
        return [umahub.Accelerator("wrong_accel", codegen="llvm")]


    @umahub.hookimpl
    def umahub_patterns(accelerator):
        if accelerator.name != "wrong_accel":
            return None
        from tvm.relax.dpl import is_op, wildcard

        return [("wrong_accel.relu", is_op("relax.nn.relu")(wildcard()))]


    @umahub.hookimpl
    def umahub_relax_to_tir(accelerator, function, context):
        if accelerator.name != "wrong_accel":
            return None
        import tvm
        from tvm import te

        from umahub._tvm import type_of

        shape = [int(d) for d in type_of(function.params[0]).shape.values]
        x = te.placeholder(shape, "float32", "x")
        y = te.compute(shape, lambda *i: x(*i) + 1.0, "y")
        prim = te.create_prim_func([x, y]).with_attr("global_symbol", context.symbol)
        return tvm.IRModule({context.symbol: prim})
"""


def test_option_runs_the_suite_for_a_plugin_and_writes_the_report(pytester):
    """--umahub-conformance=alpha: eight checks pass; the report has the numbers."""
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--umahub-conformance=alpha",
        "--umahub-conformance-models=mlp",
        "--umahub-conformance-examples=3",
        "-v",
    )
    result.assert_outcomes(passed=8)
    result.stdout.fnmatch_lines(
        [
            "umahub-conformance::TestConformance::test_partition[[]alpha_accel-mlp[]] PASSED*",
            "umahub-conformance::TestConformance::test_pin_instance[[]alpha_accel-mlp-1[]] PASSED*",
            "umahub-conformance::TestConformance::test_random_graphs[[]alpha_accel[]] PASSED*",
            "alpha_accel (plugin alpha): passed",
        ]
    )
    report = json.loads((pytester.path / "umahub-conformance.json").read_text())
    assert report["passed"] is True
    assert report["tolerance"]["rtol"] == 1e-4
    assert report["umahub"] and report["tvm"] and report["python"]
    assert report["options"] == {"conformance": ["alpha"], "models": ["mlp"], "examples": 3}
    alpha = report["accelerators"]["alpha_accel"]
    assert (alpha["plugin"], alpha["instances"], alpha["codegen"]) == ("alpha", 2, "llvm")
    mlp = alpha["models"]["mlp"]
    # mlp: matmul, add, relu, matmul, add -> alpha takes the two adds and the relu.
    assert (mlp["operators_total"], mlp["operators_taken"], mlp["partitions"]) == (5, 3, 2)
    assert mlp["passed"] is True and mlp["failures"] == []
    assert 0 <= mlp["largest_error"] < 1e-4
    assert mlp["checks"] == dict.fromkeys(
        [
            "partition",
            "compile",
            "matches_host",
            "export_and_reload",
            "pin_instance:0",
            "pin_instance:1",
        ],
        "passed",
    )
    assert alpha["all_models"]["checks"] == {"takes_operators": "passed"}
    graphs = alpha["random_graphs"]
    assert graphs["vocabulary"] == ["relax.add", "relax.nn.relu"]
    assert graphs["examples"] == 3 and graphs["passed"] is True
    assert 0 < graphs["operators_taken"] <= graphs["operators_total"]


def test_selection_and_report_path(pytester):
    """-k selects among the added tests; the report goes where it is told."""
    target = pytester.path / "out" / "conformance.json"
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--umahub-conformance=alpha_accel",
        "--umahub-conformance-models=mlp",
        f"--umahub-conformance-report={target}",
        "-k",
        "partition",
    )
    result.assert_outcomes(passed=1, deselected=7)
    report = json.loads(target.read_text())
    assert report["accelerators"]["alpha_accel"]["models"]["mlp"]["checks"] == {
        "partition": "passed"
    }
    assert not (pytester.path / "umahub-conformance.json").exists()


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        (
            "--umahub-conformance=nope",
            [
                "ERROR: --umahub-conformance=nope: no umahub plugin or accelerator is named 'nope';"
                " plugins: *alpha*; accelerators: *alpha_accel*"
            ],
        ),
        ("--umahub-conformance=alpah", ["ERROR: *named 'alpah' (did you mean 'alpha'?)*"]),
        (
            "--umahub-conformance=zz_broken_import",
            ["ERROR: *plugin 'zz_broken_import' did not load: *"],
        ),
    ],
)
def test_unknown_names_are_usage_errors(pytester, option, expected):
    """An unknown or broken name stops pytest before collection, naming what is known."""
    result = pytester.runpytest("-p", "no:cacheprovider", option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(expected)


def test_cross_option_checks_the_accelerators_together(pytester):
    """--umahub-conformance-cross: one more check, alpha and beta in one hub, random pins."""
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--umahub-conformance=alpha,beta",
        "--umahub-conformance-cross",
        "--umahub-conformance-models=mlp",
        "--umahub-conformance-examples=4",
        "-k",
        "cross",
        "-v",
    )
    # alpha: 6 model checks + takes_operators + random graphs; beta (one instance): 5 + 2.
    result.assert_outcomes(passed=1, deselected=15)
    result.stdout.fnmatch_lines(
        [
            "umahub-conformance::TestCrossConformance::test_random_placement"
            "[[]alpha_accel+beta_accel[]] PASSED*",
            "alpha_accel+beta_accel together: 4 random graph(s), took *, largest error *, passed",
        ]
    )
    report = json.loads((pytester.path / "umahub-conformance.json").read_text())
    assert report["passed"] is True
    assert report["options"]["cross"] is True
    cross = report["cross"]["alpha_accel+beta_accel"]
    assert cross["accelerators"] == ["alpha_accel", "beta_accel"]
    assert cross["vocabulary"] == ["relax.add", "relax.nn.relu"]
    assert cross["examples"] == 4 and cross["passed"] is True
    assert cross["checks"] == {"random_placement": "passed"}
    assert 0 < cross["operators_taken"] <= cross["operators_total"]
    assert cross["pins"] > 0 and cross["pin_conflicts"] == 0
    assert 0 <= cross["largest_error"] < 1e-4


def test_without_the_cross_option_there_is_no_cross_check(pytester):
    """The cross check is not collected, not even as skipped, without the option."""
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--umahub-conformance=alpha,beta",
        "--collect-only",
        "-q",
    )
    assert "TestCrossConformance" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*test_random_graphs[[]beta_accel[]]"])
    lone = pytester.runpytest("-p", "no:cacheprovider", "--umahub-conformance-cross")
    assert lone.ret == pytest.ExitCode.USAGE_ERROR
    lone.stderr.fnmatch_lines(["ERROR: --umahub-conformance-cross needs the accelerators*"])


def test_cross_suite_subclass_catches_a_wrong_accelerator(pytester, monkeypatch):
    """A CrossConformanceSuite subclass: alpha with an accelerator computing relu as x + 1."""
    pytester.makepyfile(wrong_plugin=textwrap.dedent(WRONG_PLUGIN))
    pytester.syspathinsert()
    monkeypatch.setenv("UMAHUB_PLUGINS", "wrong_plugin")
    pytester.makepyfile(
        test_vendor="""
        import pytest

        from umahub.testing import CrossConformanceSuite


        @pytest.mark.umahub_conformance(accelerator=["alpha", "wrong_accel"], examples=6)
        class TestTogether(CrossConformanceSuite):
            pass
    """
    )
    target = pytester.path / "report.json"
    result = pytester.runpytest("-p", "no:cacheprovider", f"--umahub-conformance-report={target}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["alpha_accel+wrong_accel together: * FAILED: *"])
    cross = json.loads(target.read_text())["cross"]["alpha_accel+wrong_accel"]
    assert cross["passed"] is False
    failure = cross["failures"][0]
    assert "GraphSpec(" in failure and "pins=" in failure and "priority=" in failure
    assert "differ from the host" in failure


def test_unknown_model_is_a_usage_error(pytester):
    """A model the zoo does not know is a usage error with the closest name."""
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--umahub-conformance=alpha",
        "--umahub-conformance-models=mlp,cnnn",
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: *unknown model 'cnnn' (did you mean 'cnn'?)*"])


def test_nothing_heavy_is_imported_without_the_option(pytester):
    """The plugin is loaded in every session, but imports neither TVM nor the zoo."""
    pytester.makepyfile(
        test_light="""
        import sys

        def test_light():
            assert "umahub.testing" in sys.modules
            assert "tvm" not in sys.modules
            assert "umahub.models" not in sys.modules
    """
    )
    # In a fresh interpreter: this one has imported TVM long ago.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_suite_subclass_and_fixtures_catch_a_wrong_accelerator(pytester, monkeypatch):
    """A vendor's own test module: a ConformanceSuite subclass and the fixtures, no option."""
    pytester.makepyfile(wrong_plugin=textwrap.dedent(WRONG_PLUGIN))
    pytester.syspathinsert()
    monkeypatch.setenv("UMAHUB_PLUGINS", "wrong_plugin")
    pytester.makepyfile(
        test_vendor="""
        import pytest

        import umahub.models as zoo
        from umahub.testing import ConformanceSuite, assert_matches_host

        pytestmark = pytest.mark.umahub_conformance(accelerator="wrong_plugin")


        @pytest.mark.umahub_conformance(accelerator="wrong_accel", models="mlp", examples=2)
        class TestWrong(ConformanceSuite):
            pass


        def test_fixtures(umahub_conformance_accelerator, umahub_conformance_hub,
                          umahub_host_reference):
            assert umahub_conformance_accelerator == "wrong_accel"
            hub = umahub_conformance_hub()
            assert [a.name for a in hub.claimants] == ["wrong_accel"]
            assert hub.config.on_error == "error"
            compiled = hub.compile(zoo.get("mlp"))
            with pytest.raises(AssertionError, match="differ from the host"):
                assert_matches_host(compiled.run(*zoo.inputs("mlp")), umahub_host_reference("mlp"))
    """
    )
    target = pytester.path / "report.json"
    result = pytester.runpytest("-p", "no:cacheprovider", f"--umahub-conformance-report={target}")
    # partition, compile and takes_operators pass; host match, reload, the pin and random
    # graphs fail. The checks of a device of its own do not apply: deselected, and said so
    # (not collected, then missing from the counts).
    result.assert_outcomes(passed=4, failed=4, deselected=3)
    result.stdout.fnmatch_lines(
        [
            "wrong_accel (plugin wrong_plugin): FAILED",
            "*",
            "3 device checks deselected: no accelerator under test has a device of its own "
            "(Accelerator(runtime=...))",
        ]
    )
    wrong = json.loads(target.read_text())["accelerators"]["wrong_accel"]
    mlp = wrong["models"]["mlp"]
    assert mlp["passed"] is False and mlp["operators_taken"] == 1
    assert mlp["largest_error"] > 0.1
    assert [f.split(":")[0] for f in mlp["failures"]] == [
        "matches_host",
        "export_and_reload",
        "pin_instance",
    ]
    assert "differ from the host" in mlp["failures"][0]
    assert wrong["random_graphs"]["passed"] is False
    assert "GraphSpec(" in wrong["random_graphs"]["failures"][0]


def test_suite_without_an_accelerator_is_a_collection_error(pytester):
    """A ConformanceSuite subclass with no marker and no option says what it needs."""
    pytester.makepyfile(
        test_vendor="""
        from umahub.testing import ConformanceSuite

        class TestNothing(ConformanceSuite):
            pass
    """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*no accelerator to check: run pytest with --umahub-conformance=NAME*"]
    )


#: An accelerator that takes the dequantize of a (1, 10) uint8 tensor (the int8 mlp's
#: output) and computes it {off} quantization step(s) high at element (0, 3).
DEQUANTIZE_PLUGIN = """
    import umahub

    UMAHUB_API = 1


    @umahub.hookimpl
    def umahub_accelerators():
        return [umahub.Accelerator("{name}", codegen="llvm")]


    @umahub.hookimpl
    def umahub_patterns(accelerator):
        if accelerator.name != "{name}":
            return None
        from tvm.relax.dpl import is_op, wildcard

        dq = is_op("relax.dequantize")(wildcard().has_dtype("uint8"), wildcard(), wildcard())
        return [("{name}.dequantize", dq.has_shape([1, 10]))]


    @umahub.hookimpl
    def umahub_relax_to_tir(accelerator, function, context):
        if accelerator.name != "{name}":
            return None
        import tvm
        from tvm import te

        x = te.placeholder((1, 10), "uint8", "x")
        scale = te.placeholder((), "float32", "scale")
        zero = te.placeholder((), "uint8", "zero")
        y = te.compute(
            (1, 10),
            lambda i, j: (
                x[i, j].astype("int32") - zero[()].astype("int32")
                + te.if_then_else(j == 3, {off}, 0)
            ).astype("float32") * scale[()],
            "y",
        )
        prim = te.create_prim_func([x, scale, zero, y]).with_attr("global_symbol", context.symbol)
        return tvm.IRModule({{context.symbol: prim}})
"""


def _dequantize_plugin(pytester, monkeypatch, name: str, off: int) -> None:
    pytester.makepyfile(
        **{f"{name}_plugin": textwrap.dedent(DEQUANTIZE_PLUGIN.format(name=name, off=off))}
    )
    pytester.syspathinsert()
    monkeypatch.setenv("UMAHUB_PLUGINS", f"{name}_plugin")


def test_a_quantizing_accelerator_is_checked_on_int8_models_in_units(pytester, monkeypatch):
    """Its patterns take R.dequantize: mlp_int8 joins mlp; one element one step off fails."""
    import numpy as np

    import umahub.models as zoo
    from umahub.testing import output_steps
    from umahub.testing._session import host_outputs

    _dequantize_plugin(pytester, monkeypatch, "off_accel", 1)
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--umahub-conformance=off_accel",
        "--umahub-conformance-models=mlp",
        "-k",
        "matches_host",
        "-v",
    )
    result.assert_outcomes(passed=1, failed=1, deselected=10)
    result.stdout.fnmatch_lines(
        [
            "umahub-conformance::TestConformance::test_matches_host[[]off_accel-mlp[]] PASSED*",
            "umahub-conformance::TestConformance::test_matches_host[[]off_accel-mlp_int8[]] "
            "FAILED*",
            "  mlp_int8         took ?/? ops, largest error * (1 unit), FAILED: matches_host: *",
        ]
    )
    reference = host_outputs(zoo.get("mlp_int8"), zoo.inputs("mlp_int8"))
    step = np.float32(output_steps(zoo.get("mlp_int8"))[0])
    host = reference[0, 3]
    got = np.float32(np.rint(host / step) + 1) * step
    report = json.loads((pytester.path / "umahub-conformance.json").read_text())
    assert report["steps"]["units"] == 0
    entry = report["accelerators"]["off_accel"]["models"]["mlp_int8"]
    assert entry["largest_units"] == 1
    assert entry["failures"] == [
        "matches_host: output: 1 element differs by 1 unit of its quantization step from "
        f"the host (0 units allowed); the largest at (0, 3): got {got:.6g}, host {host:.6g}"
    ]
    assert "largest_units" not in report["accelerators"]["off_accel"]["models"]["mlp"]


def test_an_exact_quantized_kernel_passes_in_units(pytester, monkeypatch):
    """The same accelerator computing the dequantize exactly: 0 units, every check passes."""
    _dequantize_plugin(pytester, monkeypatch, "exact_accel", 0)
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--umahub-conformance=exact_accel",
        "--umahub-conformance-models=mlp",
        "-k",
        "int8",
    )
    # partition, compile, matches_host, export_and_reload, pin_instance:0 on mlp_int8.
    result.assert_outcomes(passed=5, deselected=7)
    report = json.loads((pytester.path / "umahub-conformance.json").read_text())
    entry = report["accelerators"]["exact_accel"]["models"]["mlp_int8"]
    assert (entry["operators_taken"], entry["largest_units"], entry["passed"]) == (1, 0, True)


#: An accelerator whose patterns match nothing, declaring ``{operators}``.
IDLE_PLUGIN = """
    import umahub

    UMAHUB_API = 1


    @umahub.hookimpl
    def umahub_accelerators():
        return [umahub.Accelerator("{name}", codegen="llvm", operators={operators})]


    @umahub.hookimpl
    def umahub_patterns(accelerator):
        return [] if accelerator.name == "{name}" else None
"""


def _idle_plugin(pytester, monkeypatch, name: str, operators: tuple[str, ...]) -> None:
    source = IDLE_PLUGIN.format(name=name, operators=operators)
    pytester.makepyfile(**{f"{name}_plugin": textwrap.dedent(source)})
    pytester.syspathinsert()
    monkeypatch.setenv("UMAHUB_PLUGINS", f"{name}_plugin")


def test_a_run_in_which_the_accelerator_takes_nothing_fails(pytester, monkeypatch):
    """Patterns that match nothing, no declaration: the kit run fails, saying what to do."""
    _idle_plugin(pytester, monkeypatch, "idle_accel", ())
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--umahub-conformance=idle_accel",
        "--umahub-conformance-models=mlp,cnn",
    )  # fmt: skip
    # partition, compile, matches_host, export_and_reload pass on each model; the pins
    # (nothing to pin) and the random graphs (no operator) are skipped.
    result.assert_outcomes(passed=8, failed=1, skipped=3)
    message = (
        "idle_accel took no operator of the models it was given (mlp, cnn): nothing of it "
        "was checked. Make its patterns match these models' operators (`umahub explain MODEL` "
        "shows the placement), give models that have its operators "
        "(--umahub-conformance-models=..., or the marker's models=), or declare the operators "
        "it takes, umahub.Accelerator('idle_accel', operators=('relax.nn.conv2d', ...)), so "
        "that the kit can tell models without them from patterns that match nothing"
    )
    result.stdout.fnmatch_lines(
        ["idle_accel (plugin idle_accel_plugin): FAILED", f"  all models       FAILED: *{message}"]
    )
    report = json.loads((pytester.path / "umahub-conformance.json").read_text())
    assert report["passed"] is False
    whole = report["accelerators"]["idle_accel"]["all_models"]
    assert whole["failures"] == [f"takes_operators: {message}"]
    assert whole["checks"] == {"takes_operators": "failed"}


def test_declared_operators_none_of_the_models_has_are_said_not_failed(pytester, monkeypatch):
    """It declares softmax, which neither mlp nor cnn has: skipped with that message."""
    _idle_plugin(pytester, monkeypatch, "soft_accel", ("relax.nn.softmax",))
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--umahub-conformance=soft_accel",
        "--umahub-conformance-models=mlp,cnn", "-k", "takes_operators", "-rs",
    )  # fmt: skip
    result.assert_outcomes(skipped=1, deselected=11)
    message = (
        "none of the models it was given (mlp, cnn) has an operator soft_accel declares "
        "(relax.nn.softmax): nothing of it was checked on them; give models that have them "
        "(--umahub-conformance-models=all tries every model of the zoo)"
    )
    result.stdout.fnmatch_lines(
        [
            "soft_accel (plugin *): passed",
            f"  all models       takes_operators skipped: {message}",
            f"SKIPPED *{message}",
        ]
    )
    report = json.loads((pytester.path / "umahub-conformance.json").read_text())
    whole = report["accelerators"]["soft_accel"]["all_models"]
    assert whole["passed"] is True
    assert whole["notes"] == [f"takes_operators skipped: {message}"]


def test_declared_operators_the_models_have_but_it_does_not_take_fail(pytester, monkeypatch):
    """It declares matmul, which mlp has, and takes nothing: a failure naming them."""
    _idle_plugin(pytester, monkeypatch, "lazy_accel", ("relax.matmul", "relax.nn.softmax"))
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--umahub-conformance=lazy_accel",
        "--umahub-conformance-models=mlp", "-k", "takes_operators",
    )  # fmt: skip
    result.assert_outcomes(failed=1, deselected=6)
    whole = json.loads((pytester.path / "umahub-conformance.json").read_text())["accelerators"][
        "lazy_accel"
    ]["all_models"]
    assert whole["failures"] == [
        "takes_operators: lazy_accel took no operator of the models it was given (mlp), though "
        "they have operators it declares: relax.matmul (in mlp). Its patterns (or their "
        "checks) refuse them: `umahub explain MODEL` shows the placement, and the partition "
        "check which operators it took"
    ]


def test_a_declared_name_that_is_no_relax_operator_fails_the_kit(pytester, monkeypatch):
    """A typo in the declaration: the kit fails with the closest registered operator."""
    _idle_plugin(pytester, monkeypatch, "typo_accel", ("relax.nn.softmaxx",))
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--umahub-conformance=typo_accel",
        "--umahub-conformance-models=mlp", "-k", "takes_operators",
    )  # fmt: skip
    result.assert_outcomes(failed=1, deselected=6)
    result.stdout.fnmatch_lines(
        [
            "*Accelerator 'typo_accel': operators names 'relax.nn.softmaxx', which is not a "
            "registered Relax operator (did you mean 'relax.nn.softmax'?)"
        ]
    )


#: An accelerator that takes the (1, 10) add (the mlp's last) and computes zeros.
ZEROS_PLUGIN = """
    import umahub

    UMAHUB_API = 1


    @umahub.hookimpl
    def umahub_accelerators():
        return [umahub.Accelerator("zeros_accel", codegen="llvm")]


    @umahub.hookimpl
    def umahub_patterns(accelerator):
        if accelerator.name != "zeros_accel":
            return None
        from tvm.relax.dpl import is_op, wildcard

        add = is_op("relax.add")(wildcard(), wildcard()).has_shape([1, 10])
        return [("zeros_accel.add", add)]


    @umahub.hookimpl
    def umahub_relax_to_tir(accelerator, function, context):
        if accelerator.name != "zeros_accel":
            return None
        import tvm
        from tvm import te

        a = te.placeholder((1, 10), "float32", "a")
        b = te.placeholder((10,), "float32", "b")
        y = te.compute((1, 10), lambda i, j: a[i, j] * 0.0, "y")
        prim = te.create_prim_func([a, b, y]).with_attr("global_symbol", context.symbol)
        return tvm.IRModule({context.symbol: prim})
"""


def test_zeros_for_small_outputs_fail_the_kit(pytester, monkeypatch):
    """The mlp with its last layer scaled to outputs near 1e-6: a kernel of zeros fails.

    The tolerance follows the reference's scale with no floor of one; with a floor
    (1e-4 * max(1, largest output)) zeros would pass.
    """
    import dataclasses

    import numpy as np

    import umahub.models as zoo
    from umahub.models import _registry, mlp

    def tiny_weights(rng):
        weights = mlp.make_weights(rng)
        return {k: v * 1e-6 if k.startswith("fc2") else v for k, v in weights.items()}

    monkeypatch.setitem(
        _registry._SPECS, "mlp_tiny", dataclasses.replace(mlp.SPEC, name="mlp_tiny",
                                                          make_weights=tiny_weights),
    )  # fmt: skip
    from umahub.testing._session import host_outputs

    reference = host_outputs(zoo.get("mlp_tiny"), zoo.inputs("mlp_tiny"))
    assert 1e-7 < np.abs(reference).max() < 1e-5
    pytester.makepyfile(zeros_plugin=textwrap.dedent(ZEROS_PLUGIN))
    pytester.syspathinsert()
    monkeypatch.setenv("UMAHUB_PLUGINS", "zeros_plugin")
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--umahub-conformance=zeros_accel",
        "--umahub-conformance-models=mlp_tiny", "-k", "matches_host or takes_operators", "-rs",
    )  # fmt: skip
    result.assert_outcomes(passed=1, failed=1, deselected=5)
    entry = json.loads((pytester.path / "umahub-conformance.json").read_text())["accelerators"][
        "zeros_accel"
    ]["models"]["mlp_tiny"]
    assert entry["failures"][0].startswith(
        "matches_host: output: 10 of 10 element(s) differ from the host beyond rtol=0.0001, atol="
    )
    assert entry["largest_error"] == pytest.approx(np.abs(reference).max())
