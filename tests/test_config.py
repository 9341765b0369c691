"""[tool.umahub]: where it is found, how it is checked, what its errors say."""

from __future__ import annotations

import pytest

from umahub.config import Config, Pin, load_config
from umahub.errors import ConfigError


def write_pyproject(path, body):
    path.mkdir(parents=True, exist_ok=True)
    (path / "pyproject.toml").write_text(body)


def test_defaults_when_no_file_is_found(isolated):
    cfg = load_config()
    assert cfg == Config()
    assert (cfg.on_error, cfg.scope_policy, cfg.priority) == ("fallback", "io", None)


def test_nearest_pyproject_with_a_umahub_table_is_read_upward(isolated, monkeypatch):
    write_pyproject(isolated, '[tool.umahub]\npriority = ["npu"]\n')
    # A nested project without [tool.umahub] does not hide its parent's table.
    write_pyproject(isolated / "sub", '[project]\nname = "x"\n')
    (isolated / "sub" / "deeper").mkdir()
    monkeypatch.chdir(isolated / "sub" / "deeper")
    cfg = load_config()
    assert cfg.priority == ("npu",)
    assert cfg.source == str(isolated / "pyproject.toml")


def test_a_relative_tuning_database_is_the_files_neighbour(isolated, monkeypatch):
    write_pyproject(isolated, '[tool.umahub]\ntuning-database = "tuning/"\n')
    (isolated / "models").mkdir()
    monkeypatch.chdir(isolated / "models")  # a compile from within the project
    assert load_config().tuning_database == str(isolated.resolve() / "tuning")
    # given directly (config=, --database): the working directory's
    given = load_config({"tuning-database": "mine/"})
    assert given.tuning_database == "mine/"


def test_umahub_config_names_another_file(isolated, monkeypatch):
    write_pyproject(isolated, '[tool.umahub]\npriority = ["npu"]\n')
    other = isolated / "other.toml"
    other.write_text('priority = ["dsp_cpu"]\non-error = "error"\n')
    monkeypatch.setenv("UMAHUB_CONFIG", str(other))
    cfg = load_config()
    assert (cfg.priority, cfg.on_error) == (("dsp_cpu",), "error")


def test_umahub_config_that_is_not_a_file_is_an_error(monkeypatch):
    monkeypatch.setenv("UMAHUB_CONFIG", "nowhere.toml")
    with pytest.raises(
        ConfigError, match=r"UMAHUB_CONFIG names 'nowhere\.toml', which is not a file"
    ):
        load_config()


def test_config_dict_overrides_the_file_key_by_key(isolated):
    write_pyproject(isolated, '[tool.umahub]\npriority = ["npu"]\non-error = "error"\n')
    cfg = load_config({"priority": ["dsp_cpu"]})
    assert cfg.priority == ("dsp_cpu",)
    assert cfg.on_error == "error"


def test_every_key_is_parsed():
    cfg = Config.from_mapping(
        {
            "plugins": ["a", "b"],
            "disable": ["c"],
            "priority": ["npu", "dsp_cpu"],
            "hook-order": {"umahub_schedule": ["b", "a"]},
            "lowering-order": ["npu", "host"],
            "placement": {"relax.nn.relu": "dsp_cpu:1", "conv*": "host", "npu.matmul": "npu"},
            "on-error": "error",
            "scope-policy": "outputs",
            "strict": True,
        }
    )
    assert cfg.plugins == ("a", "b")
    assert cfg.hook_order == {"umahub_schedule": ("b", "a")}
    assert cfg.placement == {
        "relax.nn.relu": Pin("dsp_cpu", 1),
        "conv*": Pin("host"),
        "npu.matmul": Pin("npu"),
    }
    assert (cfg.on_error, cfg.scope_policy, cfg.strict) == ("error", "outputs", True)


def test_snake_case_keys_are_accepted_in_python():
    assert Config.from_mapping({"on_error": "error"}).on_error == "error"


def test_unknown_key_suggests_the_closest():
    with pytest.raises(ConfigError) as info:
        Config.from_mapping({"priorty": ["npu"]}, "pyproject.toml")
    assert str(info.value).startswith(
        "pyproject.toml: unknown key 'priorty' in [tool.umahub] (did you mean 'priority'?); "
        "known keys: auto-finalists, cc, disable, executor, hook-order,"
    )


def test_wrong_type_names_the_key_and_what_it_expects():
    with pytest.raises(ConfigError) as info:
        Config.from_mapping({"priority": "npu"}, "pyproject.toml")
    assert str(info.value) == (
        'pyproject.toml: [tool.umahub] priority: expected a list of accelerators or "auto" '
        "(placement by cost), got 'npu'"
    )


def test_wrong_choice_suggests_the_closest():
    with pytest.raises(
        ConfigError,
        match=r"on-error: expected one of 'fallback', 'error', "
        r"got 'fallbak' \(did you mean 'fallback'\?\)",
    ):
        Config.from_mapping({"on-error": "fallbak"})


@pytest.mark.parametrize("value", ["npu:x", "host:1", ""])
def test_malformed_pin_is_an_error(value):
    with pytest.raises(ConfigError, match="placement"):
        Config.from_mapping({"placement": {"relu": value}})


def test_unknown_accelerator_in_priority_suggests_the_closest():
    cfg = Config.from_mapping({"priority": ["nPu"]}, "cfg")
    with pytest.raises(ConfigError) as info:
        cfg.check_accelerator_names({"npu": 1, "dsp_cpu": 2})
    assert str(info.value) == (
        "cfg: [tool.umahub] priority: unknown accelerator 'nPu' (did you mean 'npu'?); "
        "known accelerators: dsp_cpu, npu"
    )


def test_pin_to_a_missing_instance_is_an_error():
    cfg = Config.from_mapping({"placement": {"relu": "dsp_cpu:2"}}, "cfg")
    with pytest.raises(ConfigError) as info:
        cfg.check_accelerator_names({"dsp_cpu": 2})
    assert str(info.value) == (
        "cfg: [tool.umahub.placement] 'relu' = 'dsp_cpu:2': accelerator 'dsp_cpu' has "
        "2 instance(s), numbered 0..1"
    )


def test_unknown_hook_in_hook_order_suggests_the_closest():
    cfg = Config.from_mapping({"hook-order": {"umahub_schedul": ["a"]}}, "cfg")
    with pytest.raises(
        ConfigError,
        match=r"unknown hook 'umahub_schedul' \(did you mean "
        r"'umahub_schedule'\?\)",
    ):
        cfg.check_plugin_names(["a"], ["umahub_schedule", "umahub_patterns"])


def test_invalid_toml_names_the_file(isolated):
    write_pyproject(isolated, "[tool.umahub\n")
    with pytest.raises(ConfigError, match=r"pyproject\.toml: not valid TOML"):
        load_config()


def test_hub_can_ignore_the_project_config(isolated):
    import umahub

    write_pyproject(isolated, '[tool.umahub]\npriority = ["nope"]\n')
    hub = umahub.Hub(config={"on-error": "error"}, autoload=False, project_config=False)
    assert (hub.config.priority, hub.config.on_error, hub.config.source) == (
        None,
        "error",
        "<defaults> + config=",
    )
