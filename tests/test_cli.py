"""The ``umahub`` command line, run as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys


def run(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "umahub", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def test_plugins_lists_every_plugin_in_order_with_errors():
    result = run("plugins")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "config: <defaults>"
    assert lines[1] == " 1. alpha            ok     umahub-test-alpha 1.0.0  (API 1)"
    assert "      accelerators: alpha_accel" in lines
    assert "      hooks:        accelerators, patterns, schedule" in lines
    assert any(
        line.endswith(". zz_broken_import FAILED umahub-test-broken 0.0.1  (API -)")
        for line in lines
    )


def test_plugins_json_has_names_versions_hooks_and_errors():
    result = run("plugins", "--json")
    data = json.loads(result.stdout)
    by_name = {p["name"]: p for p in data["plugins"]}
    assert by_name["beta"]["distribution"] == "umahub-test-beta"
    assert by_name["beta"]["hooks"] == ["umahub_accelerators", "umahub_patterns", "umahub_schedule"]
    assert by_name["zz_old_api"]["loaded"] is False
    assert by_name["zz_old_api"]["api_version"] == 0
    assert data["hook_order"]["umahub_schedule"][:2] == ["alpha", "beta"]
    assert [a["name"] for a in data["accelerators"]][:2] == ["alpha_accel", "beta_accel"]


def test_strict_flag_fails_on_a_broken_plugin():
    result = run("--strict", "plugins")
    assert result.returncode == 2
    assert result.stderr.startswith("umahub: error: plugin 'zz_bad_argument'")


def test_config_error_is_one_clear_line(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.umahub]\ndisabel = ["x"]\n')
    result = run("plugins")
    assert result.returncode == 2
    assert "unknown key 'disabel' in [tool.umahub] (did you mean 'disable'?)" in result.stderr


def test_plugins_lists_the_installed_plugins_when_the_project_config_is_wrong(tmp_path):
    # what is installed is what a user with a wrong config needs to see to fix it
    (tmp_path / "pyproject.toml").write_text('[tool.umahub]\nplugins = ["npu", "nosuch"]\n')
    result = run("plugins")
    assert result.returncode == 2
    wrong = (
        f"{tmp_path / 'pyproject.toml'}: [tool.umahub] plugins: unknown plugin 'nosuch'; "
        "known plugins: "
    )
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"config: not used, it is wrong: {wrong}")
    assert lines[1] == " 1. alpha            ok     umahub-test-alpha 1.0.0  (API 1)"
    assert result.stderr.startswith(f"umahub: error: {wrong}")
    data = json.loads(run("plugins", "--json").stdout)
    assert data["config"].startswith(f"not used, it is wrong: {wrong}")
    assert "npu" in [p["name"] for p in data["plugins"]]


def test_plugins_lists_tvm_backends_entry_points_too():
    # TVM calls these at `import tvm`; umahub's own registers relax_pipeline="umahub"
    result = run("plugins")
    lines = result.stdout.splitlines()
    assert "TVM backends (group tvm.backends, called by TVM itself at 'import tvm'):" in lines
    ours = "  umahub           umahub.compiler.tvm_backend:register  (umahub "
    assert any(line.startswith(ours) for line in lines)
    data = json.loads(run("plugins", "--json").stdout)
    assert {"name": "umahub", "value": "umahub.compiler.tvm_backend:register"}.items() <= next(
        b for b in data["tvm_backends"] if b["name"] == "umahub"
    ).items()


def test_plugins_shows_each_accelerators_description():
    dsp = "two-core DSP, elementwise operators, 64 KiB TCM per core"
    lines = run("plugins").stdout.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("  dsp_cpu "))
    assert lines[row + 1] == f"      {dsp}"
    data = json.loads(run("plugins", "--json").stdout)
    assert {a["name"]: a["description"] for a in data["accelerators"]}["dsp_cpu"] == dsp


def test_plugins_shows_the_operators_an_accelerator_declares():
    ops = "relax.nn.conv2d, relax.add, relax.nn.relu, relax.clip"
    lines = run("plugins").stdout.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("  vanilla_accel "))
    assert lines[row + 2] == f"      operators: {ops}"
    accelerators = json.loads(run("plugins", "--json").stdout)["accelerators"]
    by_name = {a["name"]: a for a in accelerators}
    assert by_name["vanilla_accel"]["operators"] == ops.split(", ")
    assert by_name["alpha_accel"]["operators"] == []


def test_plugins_shows_an_accelerators_memory_on_chip_buffers_and_clock():
    lines = run("plugins").stdout.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("  simnpu "))
    assert lines[row].startswith("  simnpu           device x2  from simnpu")
    assert lines[row + 3 : row + 9] == [
        "      memory pool: simnpu.dram 256 MiB (async copies)",
        "      on-chip buffers:",
        "        local.simnpu.inp    64 KiB  input tiles, int8",
        "        local.simnpu.wgt    64 KiB  weight tiles, int8",
        "        local.simnpu.acc    64 KiB  accumulators and tables, int32",
        "      clock: 1 GHz",
    ]
    accelerators = json.loads(run("plugins", "--json").stdout)["accelerators"]
    simnpu = {a["name"]: a for a in accelerators}["simnpu"]
    assert simnpu["clock_hz"] == 1e9
    assert simnpu["buffers"][0] == {
        "scope": "local.simnpu.inp",
        "size_bytes": 65536,
        "description": "input tiles, int8",
    }
