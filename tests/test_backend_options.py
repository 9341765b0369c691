"""Backend options: declared by a plugin (``Option``), set by the user, read by the hooks.

A plugin installed as pip would install it (``install``) declares an option of
each type; the user sets them in ``[tool.umahub.options.tunable]``, with
``Hub(config=...)`` or with ``--option``; its hooks say what they saw.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from graphs import chain

import umahub
from umahub.errors import ConfigError
from umahub.plugin import Accelerator, Option

TUNABLE = """
import umahub.plugin as up

UMAHUB_API = 1

OPTIONS = (
    up.Option("double-buffering", True, help="overlap the copies with compute"),
    up.Option("tile_rows", 16, help="rows of a tile", choices=(8, 16, 32)),
    up.Option("clock-ghz", 1.5, help="the clock, for the cost model"),
    up.Option("mode", "fast", choices=("fast", "exact")),
)

@up.hookimpl
def umahub_accelerators():
    return [up.Accelerator("tunable", options=OPTIONS), up.Accelerator("plain")]

@up.hookimpl(accelerator="tunable")
def umahub_patterns():
    return [("tunable.relu", up.op("relax.nn.relu"))]

@up.hookimpl(accelerator="tunable")
def umahub_schedule(context):
    return "saw " + ", ".join(f"{k}={v!r}" for k, v in context.options.items())

@up.hookimpl(accelerator="tunable")
def umahub_cost(context):
    return context.options["tile_rows"] / (context.options["clock-ghz"] * 1e9)
"""

DEFAULTS = {"double-buffering": True, "tile_rows": 16, "clock-ghz": 1.5, "mode": "fast"}


@pytest.fixture
def tunable(install, isolated):
    """The plugin installed; returns a function writing the project's pyproject.toml
    (``plugins = ["tunable"]`` and the lines given) and the environment of a command."""
    site = install(
        "umahub-tunable", "1.0", {"tunable": "tunable_vendor"}, {"tunable_vendor": TUNABLE}
    )

    def project(*lines: str) -> dict[str, str]:
        body = "\n".join(["[tool.umahub]", 'plugins = ["tunable"]', *lines])
        (isolated / "pyproject.toml").write_text(body + "\n")
        path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
        return {**os.environ, "PYTHONPATH": path}

    return project


def command(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "umahub", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


# --------------------------------------------------------------------------- declaring


def test_an_options_type_is_its_defaults_and_values_are_checked_by_it():
    options = (Option("a", True), Option("b", 1), Option("c", 0.5), Option("d", ""))
    assert [o.type for o in options] == [bool, int, float, str]
    assert Option("clock", 1.5).check(2) == 2.0  # an int is a number too
    assert Option("rows", 16, choices=[8, 16]).choices == (8, 16)
    flag = Option("double-buffering", True)
    assert [flag.parse(t) for t in ("true", "False", "1", "0", "yes", "NO", "on", "off")] == [
        True, False, True, False, True, False, True, False,
    ]  # fmt: skip
    assert Option("rows", 16).parse("32") == 32
    assert Option("clock", 1.5).parse("2.25") == 2.25
    assert Option("mode", "fast").parse("exact") == "exact"


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: Option("Tile", 1),
            "Option name 'Tile' must start with a lower-case letter and hold only lower-case "
            "letters, digits, '-' and '_' (users write it as a key of "
            "[tool.umahub.options.<accelerator>])",
        ),
        (
            lambda: Option("rows", None),
            "Option 'rows': default must be a bool, int, float or str (the option's type is its "
            "default's), got NoneType None",
        ),
        (
            lambda: Option("rows", [8]),
            "Option 'rows': default must be a bool, int, float or str (the option's type is its "
            "default's), got list [8]",
        ),
        (
            lambda: Option("rows", 16, choices=()),
            "Option 'rows': choices is empty; list the values allowed, or leave it out "
            "(None: any value)",
        ),
        (
            lambda: Option("rows", 16, choices=(8, "16")),
            "Option 'rows': choices holds str '16', not an int like the default 16",
        ),
        (
            lambda: Option("mac-array", "16", choices=(8, 16, 32)),
            "Option 'mac-array': the default str '16' is not of the choices' type int; the "
            "option's type is its default's: write default=16",
        ),
        (
            lambda: Option("mode", 1, choices=("a", "b")),
            "Option 'mode': the default int 1 is not of the choices' type str; the option's "
            "type is its default's: write the default as one of 'a', 'b'",
        ),
        (
            lambda: Option("rows", 16, choices=(8, 32)),
            "Option 'rows': the default 16 is not one of the choices 8, 32",
        ),
        (
            lambda: Option("mode", "fast", choices="fast"),
            "Option 'mode': choices must be a sequence of values, got str 'fast'",
        ),
        (
            lambda: Accelerator("npu", options=(Option("tile-rows", 8), Option("tile_rows", 16))),
            "Accelerator 'npu': option 'tile_rows' is declared as 'tile-rows' and 'tile_rows' "
            "('-' and '_' are the same in a name); give each option one name",
        ),
        (
            lambda: Accelerator("npu", options=(Option("rows", 8), Option("rows", 16))),
            "Accelerator 'npu': option 'rows' is declared twice ('-' and '_' are the same in a "
            "name); give each option one name",
        ),
        (
            lambda: Accelerator("npu", options=({"rows": 8},)),
            "Accelerator 'npu': options holds {'rows': 8}, not a umahub.plugin.Option",
        ),
        (
            lambda: Accelerator("npu", options=Option("rows", 8)),
            "Accelerator 'npu': options must be a sequence of umahub.plugin.Option, got "
            "Option(name='rows', default=8, help='', choices=None)",
        ),
    ],
)
def test_a_malformed_declaration_names_the_option(make, message):
    with pytest.raises(ValueError) as info:
        make()
    assert str(info.value) == message


# --------------------------------------------------------------------------- setting


def test_options_from_pyproject_reach_the_hooks_and_the_report(tunable):
    tunable(
        "[tool.umahub.options.tunable]",
        "double-buffering = false",
        "tile-rows = 8",  # '-' for the declared '_'
        "clock-ghz = 2",  # an int for a float
        'mode = "exact"',
    )
    hub = umahub.Hub()
    assert dict(hub.options_of("tunable")) == {
        "double-buffering": False,
        "tile_rows": 8,
        "clock-ghz": 2.0,
        "mode": "exact",
    }
    assert dict(hub.options_of("plain")) == {}
    with pytest.raises(TypeError):
        hub.options_of("tunable")["mode"] = "fast"  # read-only
    report = hub.compile(chain(ops=("relu", "sigmoid"))).report
    (partition,) = report.partitions
    assert partition.schedule == [
        "saw double-buffering=False, tile_rows=8, clock-ghz=2.0, mode='exact'"
    ]
    expected = {"double-buffering": False, "tile_rows": 8, "clock-ghz": 2.0, "mode": "exact"}
    assert report.options == {"tunable": expected}
    assert json.loads(report.to_json())["options"] == {"tunable": expected}
    assert (
        "options of tunable: double-buffering = false, tile_rows = 8, clock-ghz = 2.0, "
        'mode = "exact"' in str(report).splitlines()
    )


def test_options_left_unset_are_the_defaults_and_the_report_shows_none(tunable):
    tunable()
    hub = umahub.Hub()
    assert dict(hub.options_of("tunable")) == DEFAULTS
    report = hub.compile(chain(ops=("relu",))).report
    assert report.partitions[0].schedule == [
        "saw double-buffering=True, tile_rows=16, clock-ghz=1.5, mode='fast'"
    ]
    assert report.options == {}
    assert "options of" not in str(report)


def test_hub_config_sets_options_one_by_one_over_the_files(tunable):
    tunable("[tool.umahub.options.tunable]", "tile_rows = 32", 'mode = "exact"')
    hub = umahub.Hub(config={"options": {"tunable": {"mode": "fast", "clock_ghz": 3.0}}})
    assert dict(hub.options_of("tunable")) == {**DEFAULTS, "tile_rows": 32, "clock-ghz": 3.0}
    assert hub.changed_options() == {"tunable": {"tile_rows": 32, "clock-ghz": 3.0}}
    alone = umahub.Hub(
        config={"plugins": ["tunable"], "options": {"tunable": {"double-buffering": False}}},
        project_config=False,
    )
    assert dict(alone.options_of("tunable")) == {**DEFAULTS, "double-buffering": False}


def test_the_cost_hook_reads_the_options(tunable):
    tunable("[tool.umahub.options.tunable]", "tile-rows = 32", "clock-ghz = 2.0")
    auto = umahub.Hub().explain(chain(ops=("relu", "sigmoid")), placement="auto").auto
    (group,) = auto["groups"]
    assert group["costs"]["tunable"] == {"seconds": 32 / 2e9, "source": "plugin tunable"}


# --------------------------------------------------------------------------- mistakes


@pytest.mark.parametrize(
    "lines, message",
    [
        (
            ["[tool.umahub.options.tunabel]", "tile-rows = 8"],
            "[tool.umahub.options.tunabel]: unknown accelerator 'tunabel' (did you mean "
            "'tunable'?); known accelerators: plain, tunable",
        ),
        (
            ["[tool.umahub.options.tunable]", "tile-row = 8"],
            "[tool.umahub.options.tunable] tile-row: accelerator 'tunable' has no option "
            "'tile-row' (did you mean 'tile-rows'?); its options: double-buffering, tile_rows, "
            "clock-ghz, mode",
        ),
        (
            ["[tool.umahub.options.plain]", "tile-rows = 8"],
            "[tool.umahub.options.plain] tile-rows: accelerator 'plain' has no option "
            "'tile-rows'; it declares none",
        ),
        (
            ["[tool.umahub.options.tunable]", 'tile-rows = "8"'],
            "[tool.umahub.options.tunable] tile-rows: expected a whole number, got str '8'",
        ),
        (
            ["[tool.umahub.options.tunable]", "double-buffering = 0"],
            "[tool.umahub.options.tunable] double-buffering: expected true or false, got int 0",
        ),
        (
            ["[tool.umahub.options.tunable]", "tile-rows = 12"],
            "[tool.umahub.options.tunable] tile-rows: expected one of 8, 16, 32, got 12",
        ),
        (
            ["[tool.umahub.options.tunable]", 'mode = "fats"'],
            "[tool.umahub.options.tunable] mode: expected one of 'fast', 'exact', got 'fats' "
            "(did you mean 'fast'?)",
        ),
    ],
)
def test_a_wrong_option_in_pyproject_is_an_error_naming_it(tunable, isolated, lines, message):
    tunable(*lines)
    with pytest.raises(ConfigError) as info:
        umahub.Hub()
    assert str(info.value) == f"{isolated / 'pyproject.toml'}: {message}"


@pytest.mark.parametrize(
    "value, message",
    [
        ([8], "[tool.umahub] options: expected tables of option = value, one per accelerator "
              "([tool.umahub.options.<accelerator>]), got list [8]"),
        ({"tinynpu": 8},
         "[tool.umahub] options: tinynpu = 8 is not a table: write the accelerator's options "
         "under [tool.umahub.options.tinynpu], one option = value a line"),
        ({"tunable": {"tile-rows": [8]}},
         "[tool.umahub] options.tunable.tile-rows: expected true or false, a number or a "
         "string, got list [8]"),
    ],
)  # fmt: skip
def test_options_that_are_no_tables_of_values_are_an_error(value, message):
    with pytest.raises(ConfigError) as info:
        umahub.config.Config.from_mapping({"options": value}, "cfg")
    assert str(info.value) == f"cfg: {message}"


# --------------------------------------------------------------------------- the command line


def test_option_on_the_command_line_is_read_by_the_declared_type(tunable):
    env = tunable("[tool.umahub.options.tunable]", "tile-rows = 32", 'mode = "exact"')
    result = command(
        "explain", "mlp", "--json", "-", "--option", "tunable.double-buffering=no",
        "--option", "tunable.clock_ghz=0.5", "--option", "tunable.mode=fast", env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["options"] == {
        "tunable": {"double-buffering": False, "tile_rows": 32, "clock-ghz": 0.5}
    }


@pytest.mark.parametrize(
    "given, message",
    [
        ("tunable.tile-rows=many", "--option tunable.tile-rows=many: expected a whole number, "
                                   "got 'many'"),
        ("tunable.tile-rows=12", "--option tunable.tile-rows=12: expected one of 8, 16, 32, "
                                 "got 12"),
        ("tunable.double-buffering=maybe", "--option tunable.double-buffering=maybe: expected true "
                                           "or false (or 1/0, yes/no, on/off), got 'maybe'"),
        ("tunable.clock=2", "--option tunable.clock=2: accelerator 'tunable' has no option 'clock' "
                            "(did you mean 'clock-ghz'?); its options: double-buffering, "
                            "tile_rows, clock-ghz, mode"),
        ("tunabl.mode=fast", "--option tunabl.mode=fast: unknown accelerator 'tunabl' (did you "
                             "mean 'tunable'?); known accelerators: plain, tunable"),
    ],
)  # fmt: skip
def test_a_wrong_option_on_the_command_line_is_one_line(tunable, given, message):
    env = tunable()
    result = command("explain", "mlp", "--option", given, env=env)
    assert result.returncode == 2
    assert result.stderr == f"umahub: error: {message}\n"


def test_a_malformed_option_argument_is_a_usage_error(tunable):
    result = command("compile", "mlp", "--option", "tunable", env=tunable())
    assert result.returncode == 2
    assert result.stderr == (
        "umahub compile: error: argument --option: expected ACC.KEY=VALUE, an accelerator's "
        "option and its value (e.g. --option npu.tile-rows=16) (see umahub compile --help)\n"
    )


def test_plugins_lists_each_accelerators_options(tunable):
    env = tunable("[tool.umahub.options.tunable]", "tile-rows = 8")
    result = command("plugins", "--option", "tunable.mode=exact", env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    row = lines.index("      options ([tool.umahub.options.tunable], --option):")
    assert lines[row + 1 : row + 5] == [
        "        double-buffering  bool   default true    overlap the copies with compute",
        "        tile_rows         int    default 16      rows of a tile; one of 8, 16, 32; "
        "set to 8",
        "        clock-ghz         float  default 1.5     the clock, for the cost model",
        '        mode              str    default "fast"  one of "fast", "exact"; set to "exact"',
    ]
    data = json.loads(command("plugins", "--json", env=env).stdout)
    accelerators = {a["name"]: a for a in data["accelerators"]}
    assert accelerators["plain"]["options"] == []
    assert accelerators["tunable"]["options"][1] == {
        "name": "tile_rows",
        "type": "int",
        "default": 16,
        "value": 8,
        "help": "rows of a tile",
        "choices": [8, 16, 32],
    }


# --------------------------------------------------------------------------- the cost cache


def _measured_plugin(unroll: int):
    """An accelerator taking relu, with an option and no cost model: its costs are measured."""

    class Measured:
        UMAHUB_API = 1

        @umahub.hookimpl
        def umahub_accelerators(self):
            return [umahub.Accelerator("measured", options=[Option("unroll", 1)])]

        @umahub.hookimpl(accelerator="measured")
        def umahub_patterns(self):
            return [("measured.relu", umahub.plugin.op("relax.nn.relu"))]

    return umahub.Hub(
        autoload=False,
        plugins=[Measured()],
        project_config=False,
        config={"options": {"measured": {"unroll": unroll}}},
    )


def test_another_option_value_measures_the_accelerators_costs_again():
    mod = chain(ops=("relu", "sigmoid"))
    first = _measured_plugin(1).explain(mod, placement="auto").auto
    assert first["costs"] == {"plugin": 0, "measured": 2, "cached": 0, "none": 0}
    same = _measured_plugin(1).explain(mod, placement="auto").auto
    assert same["costs"] == {"plugin": 0, "measured": 0, "cached": 2, "none": 0}
    other = _measured_plugin(4).explain(mod, placement="auto").auto
    # the accelerator's group is measured again; the host's side does not depend on it
    assert other["costs"] == {"plugin": 0, "measured": 1, "cached": 1, "none": 0}
    (group,) = other["groups"]
    assert group["costs"]["measured"]["source"] == "measured"
    assert group["costs"]["host"]["source"] == "cached"
