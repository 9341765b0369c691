"""``@umahub.hookimpl(accelerator=...)``: hook implementations for one accelerator.

No TVM here: the hooks return plain values, and ``hub.hook`` / ``hub.traced_hook``
are called directly, as pluggy calls them in the pipeline.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import umahub
from umahub.errors import CompileError, PluginFailure, PluginLoadError
from umahub.hub.tracing import recording

TWO_ACCELERATORS = """
import umahub

UMAHUB_API = 1
CALLS = []

@umahub.hookimpl
def umahub_accelerators():
    CALLS.append("accelerators")
    return [umahub.Accelerator("left"), umahub.Accelerator("right", instances=2)]

@umahub.hookimpl(accelerator="left", specname="umahub_patterns")
def patterns_left():
    return ["left.relu"]

@umahub.hookimpl(accelerator="right", specname="umahub_patterns")
def patterns_right(accelerator):
    return [accelerator.name + ".add"]

@umahub.hookimpl(accelerator="right")
def umahub_schedule(schedule, context):
    return f"right scheduled {schedule} in {context}"

@umahub.hookimpl(accelerator=["left", "right"])
def umahub_tir_passes(phase):
    return [f"pass{phase}"]
"""

OLD_STYLE = """
import umahub

UMAHUB_API = 1

@umahub.hookimpl
def umahub_accelerators():
    return [umahub.Accelerator("old")]

@umahub.hookimpl
def umahub_patterns(accelerator):
    if accelerator.name != "old":
        return None
    return ["old.relu"]

@umahub.hookimpl
def umahub_schedule(accelerator, schedule):
    if accelerator.name != "old":
        return None
    return "old scheduled"
"""


@pytest.fixture
def two(install):
    install(
        "vendor-two-accels",
        "2.0",
        {"two": "vendor_two_accels", "old": "vendor_old_style"},
        {"vendor_two_accels": TWO_ACCELERATORS, "vendor_old_style": OLD_STYLE},
    )
    return umahub.Hub(config={"plugins": ["two", "old"]}, strict=True)


def patterns(hook, hub, name):
    return hook.umahub_patterns(accelerator=hub.accelerator(name))


def test_one_plugin_gives_one_implementation_per_accelerator(two):
    assert [(p.name, p.accelerators) for p in two.plugins] == [
        ("two", ("left", "right")),
        ("old", ("old",)),
    ]
    assert two.plugins[0].hooks == ("umahub_accelerators", "umahub_patterns", "umahub_schedule",
                                    "umahub_tir_passes")  # fmt: skip
    for hook in (two.hook, two.traced_hook):
        assert patterns(hook, two, "left") == [["left.relu"]]
        assert patterns(hook, two, "right") == [["right.add"]]
        assert patterns(hook, two, "old") == [["old.relu"]]


def test_an_implementation_takes_only_the_arguments_it_needs(two):
    right, left, old = (two.accelerator(n) for n in ("right", "left", "old"))
    for hook in (two.hook, two.traced_hook):
        run = hook.umahub_schedule
        assert run(accelerator=right, schedule="s", context="c") == ["right scheduled s in c"]
        assert run(accelerator=left, schedule="s", context="c") == []
        assert run(accelerator=old, schedule="s", context="c") == ["old scheduled"]
        passes = hook.umahub_tir_passes
        assert passes(accelerator=left, phase=1, context=None) == [["pass1"]]
        assert passes(accelerator=right, phase=2, context=None) == [["pass2"]]
        assert passes(accelerator=old, phase=2, context=None) == []


def test_the_routed_implementations_are_one_implementation_in_the_hook_order(two):
    assert two.call_order("umahub_patterns") == ["two", "old"]


def test_the_accelerators_hook_is_still_called_once_per_hub(two):
    calls = sys.modules["vendor_two_accels"].CALLS
    before = len(calls)
    umahub.Hub(config={"plugins": ["two"]}, strict=True)
    assert len(calls) == before + 1


def test_the_traced_hook_logs_the_calls_made_not_those_skipped(two):
    with recording() as calls:
        patterns(two.traced_hook, two, "left")
    assert [(c.plugin, c.hook, c.returned) for c in calls] == [
        ("two", "umahub_patterns", True),
        ("old", "umahub_patterns", False),  # an old-style check is a call that returns None
    ]


def test_a_traced_implementation_that_raises_is_a_plugin_failure_caused_by_the_original():
    error = ValueError("no such unit")

    class Raising:
        @umahub.hookimpl
        def umahub_accelerators(self):
            return [umahub.Accelerator("r1")]

        @umahub.hookimpl(accelerator="r1")
        def umahub_patterns(self):
            raise error

    hub = umahub.Hub(autoload=False, plugins=[Raising()], strict=True)
    acc = hub.accelerator("r1")
    with pytest.raises(PluginFailure) as traced:
        hub.traced_hook.umahub_patterns(accelerator=acc)
    failure = traced.value
    assert (failure.plugin, failure.hook, failure.partition) == ("Raising", "umahub_patterns", None)
    assert failure.cause is error and failure.__cause__ is error
    assert isinstance(failure, CompileError)
    assert str(failure) == "plugin 'Raising' failed in umahub_patterns: ValueError: no such unit"
    assert PluginFailure.of(failure, "other", "umahub_schedule") is failure  # its blame stands
    with pytest.raises(ValueError) as untraced:  # hub.hook is plain pluggy: the original
        hub.hook.umahub_patterns(accelerator=acc)
    assert untraced.value is error


def test_an_old_style_plugin_works_unchanged_next_to_marked_ones(two):
    old = two.accelerator("old")
    assert two.hook.umahub_patterns(accelerator=old) == [["old.relu"]]
    assert two.hook.umahub_schedule(accelerator=old, schedule="s", context=None) == [
        "old scheduled"
    ]


def test_the_decorated_function_is_left_as_written(two):
    module = sys.modules["vendor_two_accels"]
    assert module.patterns_left() == ["left.relu"]
    assert module.umahub_schedule("s", "c") == "right scheduled s in c"


def test_a_marker_naming_an_undeclared_accelerator_is_a_load_error(install):
    install(
        "vendor-typo",
        "1.0",
        {"typo": "vendor_typo"},
        {
            "vendor_typo": """
        import umahub
        @umahub.hookimpl
        def umahub_accelerators():
            return [umahub.Accelerator("my_accel")]
        @umahub.hookimpl(accelerator="my_acel")
        def umahub_patterns():
            return []
    """
        },
    )
    with pytest.raises(PluginLoadError) as info:
        umahub.Hub(config={"plugins": ["typo"]}, strict=True)
    assert info.value.plugin == "typo"
    assert str(info.value) == (
        "plugin 'typo' (distribution vendor-typo): hook implementation 'umahub_patterns' is "
        "marked accelerator='my_acel', which this plugin does not declare (did you mean "
        "'my_accel'?); it declares: my_accel (a hook for another plugin's accelerator checks "
        "accelerator.name itself)"
    )
    with pytest.warns(umahub.UmahubWarning, match="my_acel"):
        hub = umahub.Hub(config={"plugins": ["typo", "alpha"]})
    assert [p.name for p in hub.plugins if p.loaded] == ["alpha"]


def test_a_marker_in_a_plugin_that_declares_no_accelerator_is_a_load_error():
    class Extension:
        @umahub.hookimpl(accelerator="npu")
        def umahub_schedule(self, schedule):
            return "mine"

    with pytest.raises(PluginLoadError, match="accelerator='npu', which this plugin does not "
                       "declare; it declares: no accelerator"):  # fmt: skip
        umahub.Hub(autoload=False, plugins=[Extension()], strict=True)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            """
            @umahub.hookimpl(accelerator="a")
            def umahub_accelerators():
                return [umahub.Accelerator("a")]
            """,
            "hook implementation 'umahub_accelerators' is marked accelerator='a', but "
            "umahub_accelerators is not called per accelerator; the hooks that are: "
            "umahub_patterns, umahub_cost, umahub_relax_to_tir, umahub_schedule, "
            "umahub_tir_passes, umahub_codegen",
        ),
        (
            """
            @umahub.hookimpl(accelerator="a", specname="umahub_patterns")
            def one():
                return []
            @umahub.hookimpl(accelerator=["b", "a"], specname="umahub_patterns")
            def two():
                return []
            """,
            "two implementations of umahub_patterns are for accelerator 'a': 'one' and 'two'",
        ),
        (
            """
            @umahub.hookimpl
            def umahub_patterns(accelerator):
                return []
            @umahub.hookimpl(accelerator="a", specname="umahub_patterns")
            def more():
                return []
            """,
            "2 implementations of umahub_patterns ('more', 'umahub_patterns'): umahub calls one "
            "per plugin and hook, unless each is for its own accelerators: mark them "
            "@umahub.hookimpl(accelerator=...)",
        ),
        (
            """
            @umahub.hookimpl(accelerator="a", specname="umahub_schedule", tryfirst=True)
            def one():
                return None
            @umahub.hookimpl(accelerator="b", specname="umahub_schedule")
            def two():
                return None
            """,
            "the implementations of umahub_schedule ('one', 'two') differ in their options",
        ),
    ],
    ids=["not-per-accelerator", "same-accelerator-twice", "unmarked-twin", "options-differ"],
)
def test_markers_that_cannot_be_honoured_are_load_errors(install, request, source, message):
    accelerators = (
        ""
        if "def umahub_accelerators" in source
        else """
            @umahub.hookimpl
            def umahub_accelerators():
                return [umahub.Accelerator("a"), umahub.Accelerator("b")]
            """
    )
    module = "vendor_odd_" + request.node.callspec.id.replace("-", "_")
    install(
        "vendor-odd",
        "1.0",
        {"odd": module},
        {module: "import umahub\n" + _dedent(accelerators) + _dedent(source)},
    )
    with pytest.raises(PluginLoadError) as info:
        umahub.Hub(config={"plugins": ["odd"]}, strict=True)
    assert message in str(info.value)


def _dedent(text: str) -> str:
    import textwrap

    return textwrap.dedent(text)


def test_the_marker_refuses_what_is_not_an_accelerator_name():
    with pytest.raises(TypeError, match="takes an accelerator name or a list of names"):
        umahub.hookimpl(accelerator=3)
    with pytest.raises(TypeError):
        umahub.hookimpl(accelerator=[])


def test_an_accelerators_hook_that_raises_is_still_reported_by_the_hub(install):
    install(
        "vendor-raising",
        "1.0",
        {"raising": "vendor_raising"},
        {
            "vendor_raising": """
        import umahub
        @umahub.hookimpl
        def umahub_accelerators():
            raise RuntimeError("no licence")
        @umahub.hookimpl(accelerator="a")
        def umahub_patterns():
            return []
    """
        },
    )
    with pytest.raises(
        PluginLoadError, match="umahub_accelerators failed: RuntimeError: no licence"
    ):
        umahub.Hub(config={"plugins": ["raising"]}, strict=True)


def test_a_marked_wrapper_wraps_its_accelerator_only():
    seen = []

    class Patterns:
        @umahub.hookimpl
        def umahub_accelerators(self):
            return [umahub.Accelerator("w1")]

        @umahub.hookimpl
        def umahub_patterns(self, accelerator):
            return [accelerator.name + ".p"]

    class Wrapper:
        @umahub.hookimpl
        def umahub_accelerators(self):
            return [umahub.Accelerator("w2")]

        @umahub.hookimpl(accelerator="w2", wrapper=True)
        def umahub_patterns(self):
            result = yield
            seen.append(result)
            return [*result, "wrapped"]

    hub = umahub.Hub(autoload=False, plugins=[Patterns(), Wrapper()], strict=True)
    for hook in (hub.hook, hub.traced_hook):
        assert hook.umahub_patterns(accelerator=hub.accelerator("w1")) == [["w1.p"]]
        assert hook.umahub_patterns(accelerator=hub.accelerator("w2")) == [["w2.p"], "wrapped"]
    assert seen == [[["w2.p"]]] * 2


def test_the_bundled_plugins_and_the_compat_module_load_without_tvm():
    code = (
        "import sys, umahub.plugin.compat, umahub_npu, umahub_vanilla, umahub_dsp, umahub\n"
        "hub = umahub.Hub(autoload=False, plugins=[umahub_npu, umahub_vanilla, umahub_dsp],"
        " project_config=False, strict=True)\n"
        "assert [a.name for a in hub.accelerators] == ['npu', 'vanilla_accel', 'dsp_cpu']\n"
        "assert 'tvm' not in sys.modules, 'tvm imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
