"""Configuration robustness: files that are not ours, and valid-but-wrong settings.

A broken ``pyproject.toml`` on the way up that is not umahub's is skipped; one
that mentions ``tool.umahub`` is an error. Repeated names, empty ``plugins``
or ``priority`` lists, unclosed ``[`` in pin globs and two pins of one op are
warned about, naming the key, what is wrong and what to do.
``UMAHUB_DISABLE_PLUGIN_AUTOLOAD`` takes the usual spellings of true and false.
"""

from __future__ import annotations

import warnings

import pytest
from graphs import chain

import umahub
from umahub.config import Config, Pin, load_config
from umahub.errors import ConfigError, UmahubWarning
from umahub.hub.loading import env_flag


def write_pyproject(path, body):
    path.mkdir(parents=True, exist_ok=True)
    target = path / "pyproject.toml"
    if isinstance(body, bytes):
        target.write_bytes(body)
    else:
        target.write_text(body)


def messages(caught):
    return [str(w.message) for w in caught if issubclass(w.category, UmahubWarning)]


def no_warnings(call):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return call()


# ---------------------------------------------------------------- discovery


@pytest.mark.parametrize(
    "broken",
    [
        '[project\nname = "other"\n',  # not TOML
        b'[project]\nname = "\xff\xfe"\n',  # not UTF-8
        "tool = 3\n",  # valid TOML, but 'tool' is no table
    ],
)
def test_a_broken_pyproject_that_is_not_ours_is_skipped_on_the_way_up(
    isolated, monkeypatch, broken
):
    write_pyproject(isolated, '[tool.umahub]\npriority = ["npu"]\n')
    write_pyproject(isolated / "sub", broken)
    (isolated / "sub" / "deeper").mkdir()
    monkeypatch.chdir(isolated / "sub" / "deeper")
    cfg = no_warnings(load_config)
    assert (cfg.priority, cfg.source) == (("npu",), str(isolated / "pyproject.toml"))


def test_a_broken_pyproject_alone_leaves_the_defaults(isolated):
    write_pyproject(isolated, "[tool.black\nline-length = 100\n")
    assert no_warnings(load_config) == Config()


@pytest.mark.parametrize(
    "broken",
    [
        '[tool.umahub\npriority = ["npu"]\n',
        'tool.umahub.priority = ["npu"\n',
        "[tool . 'umahub']\nx=",
    ],
)
def test_a_broken_pyproject_that_mentions_tool_umahub_is_an_error(isolated, broken):
    write_pyproject(isolated / "sub", broken)
    with pytest.raises(ConfigError) as info:
        load_config(start=isolated / "sub")
    assert str(info.value).startswith(f"{isolated / 'sub' / 'pyproject.toml'}: not valid TOML: ")


# ---------------------------------------------------------------- warnings


def test_names_listed_twice_are_warned_about_per_key():
    with pytest.warns(UmahubWarning) as caught:
        cfg = Config.from_mapping(
            {
                "plugins": ["npu", "dsp", "npu"],
                "disable": ["vanilla", "vanilla", "vanilla"],
                "priority": ["npu", "dsp_cpu", "dsp_cpu"],
                "hook-order": {"umahub_schedule": ["dsp", "dsp"]},
            },
            "pyproject.toml",
        )
    assert messages(caught) == [
        "umahub: pyproject.toml: [tool.umahub] plugins: 'npu' is listed 2 times; only its "
        "first place counts, remove the repeats",
        "umahub: pyproject.toml: [tool.umahub] disable: 'vanilla' is listed 3 times; only its "
        "first place counts, remove the repeats",
        "umahub: pyproject.toml: [tool.umahub] priority: 'dsp_cpu' is listed 2 times; only its "
        "first place counts, remove the repeats",
        "umahub: pyproject.toml: [tool.umahub] hook-order.umahub_schedule: 'dsp' is listed 2 "
        "times; only its first place counts, remove the repeats",
    ]
    assert (cfg.plugins, cfg.priority) == (("npu", "dsp", "npu"), ("npu", "dsp_cpu", "dsp_cpu"))


def test_empty_plugins_and_priority_are_warned_about():
    with pytest.warns(UmahubWarning) as caught:
        cfg = Config.from_mapping({"plugins": [], "priority": []}, "p.toml")
    assert messages(caught) == [
        "umahub: p.toml: [tool.umahub] plugins is empty, so no installed plugin is loaded "
        "(only those given as Hub(plugins=[...])); list the plugins to load, or remove the "
        "key to load all of them",
        "umahub: p.toml: [tool.umahub] priority is empty, so no accelerator claims operators "
        "(only pins place them); list the accelerators that should claim, or remove the key "
        "to let all of them claim",
    ]
    assert (cfg.plugins, cfg.priority) == ((), ())


def test_an_unclosed_bracket_in_a_pin_is_warned_about():
    with pytest.warns(UmahubWarning) as caught:
        cfg = Config.from_mapping({"placement": {"fc[1": "host", "fc[12]": "host"}}, "p.toml")
    assert messages(caught) == [
        "umahub: p.toml: [tool.umahub] placement 'fc[1': the '[' at position 2 is never closed, "
        "so it is taken as a plain '[' and the pin selects only names with a '[' in them; "
        "close it ('fc[1]'), or write '[[]' for a plain '['"
    ]
    assert cfg.placement == {"fc[1": Pin("host"), "fc[12]": Pin("host")}


def test_two_pins_of_one_op_are_warned_about():
    with pytest.warns(UmahubWarning) as caught:
        Config.from_mapping({"placement": {"nn.relu": "host", "relax.nn.relu": "npu"}}, "p.toml")
    assert messages(caught) == [
        "umahub: p.toml: [tool.umahub] placement: 'nn.relu' and 'relax.nn.relu' name the same "
        "op; 'nn.relu' -> 'host' wins (it is written first), remove 'relax.nn.relu'"
    ]


def test_a_valid_config_warns_about_nothing():
    no_warnings(
        lambda: Config.from_mapping(
            {
                "plugins": ["npu", "dsp"],
                "disable": ["vanilla"],
                "priority": ["npu"],
                "placement": {"conv*": "host", "fc[0-9]": "npu", "x[[]1": "host"},
            }
        )
    )


def test_a_pin_given_to_compile_with_an_unclosed_bracket_is_warned_about():
    hub = umahub.Hub(autoload=False)
    with pytest.warns(UmahubWarning) as caught:
        hub.explain(chain(), placement={"n[1": "host"})
    assert messages(caught) == [
        "umahub: pin 'n[1': the '[' at position 1 is never closed, so it is taken as a plain "
        "'[' and the pin selects only names with a '[' in them; close it ('n[1]'), or write "
        "'[[]' for a plain '['"
    ]


def test_a_warning_from_the_file_points_at_the_users_line(isolated):
    write_pyproject(isolated, "[tool.umahub]\npriority = []\n")
    with pytest.warns(UmahubWarning) as caught:
        umahub.Hub(autoload=False)
    assert [w.filename for w in caught] == [__file__]
    assert messages(caught)[0].startswith(
        f"umahub: {isolated / 'pyproject.toml'}: [tool.umahub] priority is empty"
    )


# ---------------------------------------------------------------- UMAHUB_DISABLE_PLUGIN_AUTOLOAD


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "True", "yes", "Yes", "on", "ON", " on "])
def test_autoload_is_off_for_every_spelling_of_true(monkeypatch, value):
    monkeypatch.setenv("UMAHUB_DISABLE_PLUGIN_AUTOLOAD", value)
    assert no_warnings(lambda: env_flag("UMAHUB_DISABLE_PLUGIN_AUTOLOAD")) is True
    assert no_warnings(lambda: umahub.Hub().plugins) == []


@pytest.mark.parametrize("value", ["0", "false", "False", "no", "NO", "off", "Off", ""])
def test_autoload_is_on_for_every_spelling_of_false(monkeypatch, value):
    monkeypatch.setenv("UMAHUB_DISABLE_PLUGIN_AUTOLOAD", value)
    assert no_warnings(lambda: env_flag("UMAHUB_DISABLE_PLUGIN_AUTOLOAD")) is False
    hub = umahub.Hub(config={"plugins": ["alpha", "beta"]})
    assert [p.name for p in hub.plugins] == ["alpha", "beta"]


def test_another_value_of_the_autoload_switch_is_true_with_a_warning(monkeypatch):
    monkeypatch.setenv("UMAHUB_DISABLE_PLUGIN_AUTOLOAD", "please")
    with pytest.warns(UmahubWarning) as caught:
        hub = umahub.Hub()
    assert hub.plugins == []
    assert messages(caught) == [
        "umahub: UMAHUB_DISABLE_PLUGIN_AUTOLOAD='please' is neither true (1, true, yes, on) "
        "nor false (0, false, no, off or empty); taken as true, since it is set"
    ]
