"""Plugin discovery, loading, ordering and the errors of broken plugins.

The plugins come from real distributions: the packages under tests/packages
(installed into the test environment by tox) and distributions that the
``install`` fixture lays out on sys.path as pip would.
"""

from __future__ import annotations

import pytest

import umahub
from umahub.errors import ConfigError, PluginConflictError, PluginLoadError

GOOD = ["alpha", "beta"]
BROKEN = ["zz_bad_argument", "zz_broken_import", "zz_old_api", "zz_typo_hook"]


def loaded(hub):
    return [p.name for p in hub.plugins if p.loaded]


def installed(hub):
    """The plugins this test file is about (the environment may hold more)."""
    return [p.name for p in hub.plugins if p.name in GOOD + BROKEN]


def test_installed_plugins_are_found_sorted_by_entry_point_name():
    with pytest.warns(umahub.UmahubWarning):
        hub = umahub.Hub()
    names = [p.name for p in hub.plugins]
    assert names == sorted(names)
    assert installed(hub) == GOOD + BROKEN
    alpha = hub.plugins[0]
    assert (alpha.distribution, alpha.version, alpha.api_version) == (
        "umahub-test-alpha",
        "1.0.0",
        1,
    )
    assert alpha.accelerators == ("alpha_accel",)
    assert alpha.hooks == ("umahub_accelerators", "umahub_patterns", "umahub_schedule")


def test_each_broken_plugin_is_skipped_with_its_cause_and_the_rest_work():
    with pytest.warns(umahub.UmahubWarning) as warned:
        hub = umahub.Hub()
    assert [n for n in loaded(hub) if n in GOOD + BROKEN] == GOOD
    assert [a.name for a in hub.accelerators][:2] == ["alpha_accel", "beta_accel"]
    errors = {p.name: p.error for p in hub.plugins if not p.loaded}
    assert errors == {
        "zz_bad_argument": "umahub_patterns(accelerator, flavour) takes 'flavour', which umahub "
        "does not pass to umahub_patterns; it passes: accelerator",
        "zz_broken_import": "failed to import umahub_test_broken.raises_on_import: ImportError: "
        "libvendor.so: cannot open shared object file",
        "zz_old_api": "written for hook contract UMAHUB_API = 0, but this umahub speaks 1; "
        "upgrade the plugin (or umahub) so that they agree",
        "zz_typo_hook": "hook implementation 'umahub_patern' matches no umahub hook (did you "
        "mean 'umahub_patterns'?); umahub (API 1) has: umahub_accelerators, umahub_codegen, "
        "umahub_cost, umahub_host_schedule, umahub_patterns, umahub_relax_to_tir, umahub_schedule, "
        "umahub_tir_passes, umahub_tuning_space",
    }
    messages = [str(w.message) for w in warned]
    assert any(
        m.startswith(
            "umahub: skipped plugin 'zz_broken_import' (distribution "
            "umahub-test-broken 0.0.1): failed to import"
        )
        for m in messages
    )
    broken = next(p for p in hub.plugins if p.name == "zz_broken_import")
    assert "raise ImportError" in broken.traceback


def test_strict_mode_makes_a_load_failure_fatal():
    with pytest.raises(PluginLoadError) as info:
        umahub.Hub(config={"strict": True})
    assert str(info.value).startswith(
        "plugin 'zz_bad_argument' (distribution umahub-test-broken): umahub_patterns("
    )


def test_allowlist_selects_and_orders_plugins():
    hub = umahub.Hub(config={"plugins": ["beta", "alpha"]})
    assert loaded(hub) == ["beta", "alpha"]
    # The first-named plugin's implementation runs first.
    assert hub.call_order("umahub_patterns") == ["beta", "alpha"]


def test_disable_removes_plugins():
    hub = umahub.Hub(config={"plugins": GOOD, "disable": ["beta"]})
    assert loaded(hub) == ["alpha"]


def test_unknown_plugin_name_in_config_suggests_the_closest():
    with pytest.raises(ConfigError, match=r"unknown plugin 'alpah' \(did you mean 'alpha'\?\)"):
        umahub.Hub(config={"plugins": ["alpah"]})


def test_unknown_accelerator_in_priority_is_an_error():
    with pytest.raises(
        ConfigError,
        match=r"unknown accelerator 'alpha' \(did you mean "
        r"'alpha_accel'\?\)",
    ):
        umahub.Hub(config={"plugins": GOOD, "priority": ["alpha"]})


def test_author_tryfirst_is_respected_without_hook_order():
    hub = umahub.Hub(config={"plugins": ["beta", "alpha"]})
    # alpha's umahub_schedule is tryfirst: it runs before beta's despite the plugin order.
    assert hub.call_order("umahub_schedule") == ["alpha", "beta"]


def test_hook_order_reorders_one_hook_and_overrides_tryfirst():
    hub = umahub.Hub(config={"plugins": GOOD, "hook-order": {"umahub_schedule": ["beta", "alpha"]}})
    assert hub.call_order("umahub_schedule") == ["beta", "alpha"]
    assert hub.call_order("umahub_patterns") == ["alpha", "beta"]


def test_hook_order_is_the_real_call_order():
    import umahub_test_alpha
    import umahub_test_beta

    umahub_test_alpha.CALLS.clear()
    umahub_test_beta.CALLS.clear()
    calls = []
    umahub_test_alpha.CALLS = umahub_test_beta.CALLS = calls
    hub = umahub.Hub(config={"plugins": GOOD, "hook-order": {"umahub_schedule": ["beta", "alpha"]}})
    acc = hub.accelerator("alpha_accel")
    hub.hook.umahub_schedule(accelerator=acc, schedule=None, context=None)
    assert calls == [("beta", "alpha_accel"), ("alpha", "alpha_accel")]


def test_priority_orders_accelerators_and_limits_claimants():
    hub = umahub.Hub(config={"plugins": GOOD, "priority": ["beta_accel"]})
    assert [a.name for a in hub.accelerators] == ["beta_accel", "alpha_accel"]
    assert [a.name for a in hub.claimants] == ["beta_accel"]


def test_autoload_off_loads_no_entry_points(monkeypatch):
    monkeypatch.setenv("UMAHUB_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert umahub.Hub().plugins == []
    assert umahub.Hub(autoload=False).plugins == []


def test_umahub_plugins_loads_entry_points_and_modules_even_without_autoload(monkeypatch):
    monkeypatch.setenv("UMAHUB_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("UMAHUB_PLUGINS", "beta,umahub_test_alpha")
    hub = umahub.Hub()
    assert [(p.name, p.origin, p.distribution) for p in hub.plugins] == [
        ("beta", "UMAHUB_PLUGINS", "umahub-test-beta"),
        ("umahub_test_alpha", "UMAHUB_PLUGINS", None),
    ]


def test_objects_given_in_code_are_plugins():
    class Plugin:
        UMAHUB_API = 1

        @umahub.hookimpl
        def umahub_accelerators(self):
            return [umahub.Accelerator("obj_accel")]

    hub = umahub.Hub(autoload=False, plugins=[Plugin()])
    assert [(p.name, p.accelerators) for p in hub.plugins] == [("Plugin", ("obj_accel",))]


def test_plugin_modules_are_imported_only_when_a_hub_is_made(install):
    install(
        "lazy-plugin", "1.0", {"lazy": "lazy_mod"}, {"lazy_mod": "import umahub\nIMPORTED = True\n"}
    )
    import sys

    import umahub.hub.loading

    candidates = umahub.hub.loading.find()
    assert "lazy" in [c.name for c in candidates]
    assert "lazy_mod" not in sys.modules
    umahub.Hub(config={"plugins": ["lazy"]})
    assert sys.modules["lazy_mod"].IMPORTED


def test_two_distributions_with_one_plugin_name_is_an_error_naming_both(install):
    install("vendor-one", "1.0", {"alpha": "vendor_one"}, {"vendor_one": ""})
    with pytest.raises(PluginConflictError) as info:
        umahub.Hub(config={"plugins": ["alpha"]})
    message = str(info.value)
    assert message.startswith("two plugins are named 'alpha': distribution ")
    assert "vendor-one 1.0 (vendor_one)" in message
    assert "umahub-test-alpha 1.0.0 (umahub_test_alpha)" in message
    assert "uninstall one, or disable one by its distribution: [tool.umahub] disable = [" in message


def test_disable_names_a_distribution_to_choose_between_two_of_one_plugin_name(install):
    install("vendor-one", "1.0", {"alpha": "vendor_one"}, {"vendor_one": ""})
    hub = umahub.Hub(config={"plugins": ["alpha"], "disable": ["vendor-one"]})
    assert [(p.name, p.distribution) for p in hub.plugins] == [("alpha", "umahub-test-alpha")]
    hub = umahub.Hub(config={"plugins": ["alpha"], "disable": ["umahub-test-alpha"]})
    assert [(p.name, p.distribution) for p in hub.plugins] == [("alpha", "vendor-one")]


def test_disable_of_an_unknown_name_suggests_a_plugin_or_distribution():
    with pytest.raises(ConfigError) as info:
        umahub.Hub(config={"plugins": GOOD, "disable": ["umahub-test-alpah"]})
    assert "[tool.umahub] disable: unknown plugin or distribution 'umahub-test-alpah'" in str(
        info.value
    )


def test_a_plugin_redeclaring_an_accelerator_is_skipped_naming_both(install):
    install(
        "vendor-two",
        "3.1",
        {"alpha_clone": "vendor_two"},
        {
            "vendor_two": """
        import umahub
        UMAHUB_API = 1
        @umahub.hookimpl
        def umahub_accelerators():
            return [umahub.Accelerator("alpha_accel")]
    """
        },
    )
    reason = (
        "declares accelerator 'alpha_accel', which plugin 'alpha' (distribution "
        "umahub-test-alpha 1.0.0) already declares; uninstall one, or disable one: "
        '[tool.umahub] disable = ["alpha_clone"]'
    )
    with pytest.warns(umahub.UmahubWarning) as caught:
        hub = umahub.Hub(config={"plugins": ["alpha", "alpha_clone"]})
    assert [str(w.message) for w in caught] == [
        f"umahub: skipped plugin 'alpha_clone' (distribution vendor-two 3.1): {reason}"
    ]
    assert [(p.name, p.loaded, p.error) for p in hub.plugins] == [
        ("alpha", True, None),
        ("alpha_clone", False, reason),
    ]
    assert [a.name for a in hub.accelerators] == ["alpha_accel"]
    assert hub.owner("alpha_accel") == "alpha"
    with pytest.raises(PluginLoadError, match="already declares"):
        umahub.Hub(config={"plugins": ["alpha", "alpha_clone"]}, strict=True)
    hub = umahub.Hub(config={"plugins": ["alpha", "alpha_clone"], "disable": ["alpha_clone"]})
    assert loaded(hub) == ["alpha"]


def test_a_plugin_whose_accelerators_hook_raises_is_skipped(install):
    install(
        "vendor-three",
        "1.0",
        {"raising": "vendor_three"},
        {
            "vendor_three": """
        import umahub
        @umahub.hookimpl
        def umahub_accelerators():
            raise RuntimeError("no licence")
    """
        },
    )
    with pytest.warns(umahub.UmahubWarning, match="no licence"):
        hub = umahub.Hub(config={"plugins": ["raising", "alpha"]})
    assert loaded(hub) == ["alpha"]
    assert hub.plugins[0].error == "umahub_accelerators failed: RuntimeError: no licence"


def test_accelerator_lookup_suggests_the_closest():
    hub = umahub.Hub(config={"plugins": GOOD})
    with pytest.raises(KeyError, match=r"no accelerator 'alpha' \(did you mean 'alpha_accel'"):
        hub.accelerator("alpha")


def test_accelerators_hook_returning_none_is_a_named_plugin_failure(install):
    install(
        "vendor-none",
        "1.0",
        {"nothing": "vendor_none"},
        {
            "vendor_none": """
        import umahub
        UMAHUB_API = 1
        @umahub.hookimpl
        def umahub_accelerators():
            return None
    """
        },
    )
    with pytest.warns(umahub.UmahubWarning, match="umahub_accelerators returned None"):
        hub = umahub.Hub(config={"plugins": ["nothing", "alpha"]})
    assert loaded(hub) == ["alpha"]
    assert hub.plugins[0].error == (
        "umahub_accelerators returned None: expected a list of umahub.Accelerator "
        "([] for a plugin that declares none)"
    )


def test_a_plugin_without_umahub_api_is_warned_about_naming_what_to_add(install):
    install(
        "vendor-quiet",
        "1.0",
        {"quiet": "vendor_quiet"},
        {
            "vendor_quiet": """
        import umahub
        @umahub.hookimpl
        def umahub_accelerators():
            return [umahub.Accelerator("quiet_accel")]
    """
        },
    )
    with pytest.warns(umahub.UmahubWarning) as caught:
        hub = umahub.Hub(config={"plugins": ["quiet"]})
    assert loaded(hub) == ["quiet"]
    assert [str(w.message) for w in caught] == [
        "umahub: plugin 'quiet' does not say which hook contract it was written for: "
        "add UMAHUB_API = 1 to vendor_quiet"
    ]


def test_priority_naming_the_accelerator_of_a_plugin_that_failed_says_both(install):
    install(
        "vendor-gone",
        "1.0",
        {"gone": "vendor_gone"},
        {"vendor_gone": 'raise ImportError("libgone.so: cannot open shared object file")\n'},
    )
    with pytest.warns(umahub.UmahubWarning), pytest.raises(umahub.errors.ConfigError) as info:
        umahub.Hub(config={"plugins": ["gone", "alpha"], "priority": ["gone_accel"]})
    assert str(info.value) == (
        "<defaults> + config=: [tool.umahub] priority: unknown accelerator 'gone_accel'; "
        "known accelerators: "
        "alpha_accel; a plugin that failed to load may declare it: plugin 'gone' "
        "(distribution vendor-gone 1.0): failed to import vendor_gone: ImportError: "
        "libgone.so: cannot open shared object file"
    )
