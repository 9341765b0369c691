"""``umahub new-plugin``: the names and directories it refuses, the files it writes, and
the generated packages passing their own tests (a compile against plain TVM and the
conformance kit, in a subprocess, as a vendor's CI runs them)."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import umahub
from umahub.cli import main

UMAHUB_SRC = Path(umahub.__file__).resolve().parents[1]


def _error(capsys, *argv):
    """The one line ``umahub new-plugin ...`` fails with (status 2, nothing on stdout)."""
    assert main(["new-plugin", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1, err
    return err.strip()


def _generate(tmp_path, *argv):
    assert main(["-q", "new-plugin", *argv, "--dir", str(tmp_path)]) == 0


# ------------------------------------------------------------------ refusals


def test_a_bad_name_is_refused_saying_what_a_name_is(capsys):
    assert _error(capsys, "My_Accel") == (
        "umahub: error: new-plugin My_Accel: not a package name umahub can use; give "
        "lower-case letters and digits, words joined by '-', starting with a letter "
        "(e.g. my-accel)"
    )
    for bad in ("2accel", "my--accel", "my-accel-", "my.accel", "-x"):
        assert "not a package name" in _error(capsys, "--", bad)
    assert not list(Path(".").iterdir())


def test_a_name_whose_package_would_shadow_a_module_is_refused(capsys):
    assert _error(capsys, "numpy") == (
        "umahub: error: new-plugin numpy: a module 'numpy' is already importable here, and "
        "the plugin's package would shadow it (or be shadowed); choose another name, "
        "e.g. numpy-accel"
    )
    assert "a module 'json' is already importable" in _error(capsys, "json")
    assert "a module 'umahub' is already importable" in _error(capsys, "umahub")


def test_accelerator_names_follow_the_accelerators_rule(capsys):
    assert _error(capsys, "host") == (
        "umahub: error: new-plugin host: the accelerator's name would be 'host', which is "
        "reserved for the host; give another with --accelerator NAME"
    )
    assert _error(capsys, "umahub-2x") == (
        "umahub: error: new-plugin umahub-2x: the accelerator's name would be '2x', but an "
        "accelerator's name starts with a lower-case letter and holds only lower-case "
        "letters, digits and '_'; give another with --accelerator NAME"
    )
    assert _error(capsys, "my-accel", "--accelerator", "My-Npu") == (
        "umahub: error: new-plugin my-accel: --accelerator My-Npu: an accelerator's name "
        "starts with a lower-case letter and holds only lower-case letters, digits and '_'; "
        "choose another"
    )
    assert _error(capsys, "my-accel", "--accelerator", "host") == (
        "umahub: error: new-plugin my-accel: --accelerator host: 'host' is reserved for the "
        "host; choose another"
    )
    assert not list(Path(".").iterdir())


def test_a_directory_in_use_is_refused_and_nothing_is_written(capsys, tmp_path):
    used = tmp_path / "my-accel"
    used.mkdir()
    (used / "notes.txt").write_text("mine")
    assert _error(capsys, "my-accel", "--dir", str(tmp_path)) == (
        f"umahub: error: new-plugin my-accel: {used} exists and is not empty; choose another "
        "--dir or name, or remove it"
    )
    assert [p.name for p in used.iterdir()] == ["notes.txt"]
    # --device: the runtime's directory is checked before anything is written
    (tmp_path / "other-runtime").mkdir()
    (tmp_path / "other-runtime" / "x").write_text("")
    assert "other-runtime exists and is not empty" in _error(
        capsys, "other", "--device", "--dir", str(tmp_path)
    )
    assert not (tmp_path / "other").exists()
    (tmp_path / "file").write_text("")
    assert _error(capsys, "my-accel", "--dir", str(tmp_path / "file")) == (
        f"umahub: error: new-plugin --dir {tmp_path / 'file'}: is not a directory"
    )


# ------------------------------------------------------------------ what it writes


def test_it_writes_the_package_in_a_directory_named_after_it(capsys, tmp_path):
    assert main(["new-plugin", "umahub-edge"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("wrote the plugin umahub_edge (accelerator edge) in umahub-edge\n")
    root = Path("umahub-edge")
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == [
        ".gitignore",
        "README.md",
        "conftest.py",
        "pyproject.toml",
        "src/umahub_edge/__init__.py",
        "tests/test_umahub_edge.py",
        "tox.ini",
    ]
    init = (root / "src/umahub_edge/__init__.py").read_text()
    assert 'NAME = "edge"' in init and "UMAHUB_API = 1" in init
    pyproject = (root / "pyproject.toml").read_text()
    assert '[project.entry-points."umahub.plugins"]\numahub_edge = "umahub_edge"' in pyproject
    assert 'dependencies = ["umahub"]' in pyproject
    assert "$" not in "".join(p.read_text() for p in root.rglob("*") if p.is_file())
    # an existing empty directory is used
    (tmp_path / "empty" / "b").mkdir(parents=True)
    _generate(tmp_path / "empty", "b", "--accelerator", "b_npu")
    assert 'NAME = "b_npu"' in (tmp_path / "empty/b/src/b/__init__.py").read_text()


def test_its_tox_matrix_is_umahubs(tmp_path):
    """The generated tox.ini has umahub's matrix and apache-tvm-ffi pins."""
    _generate(tmp_path, "my-accel", "--device")
    ours = (UMAHUB_SRC.parent / "tox.ini").read_text() if UMAHUB_SRC.name == "src" else None
    tox = (tmp_path / "my-accel/tox.ini").read_text()
    assert "matrix = py{310,311,312,313}-tvm{025,026,027}" in tox
    assert "env_list = py\n" in tox
    for line in (
        "tvm025: apache-tvm==0.25.*",
        "tvm026: apache-tvm==0.26.*",
        "tvm027: apache-tvm==0.27.*",
        "!tvm025: apache-tvm-ffi!=0.1.15.post2",
        "tvm025: apache-tvm-ffi==0.1.12",
    ):
        assert f"    {line}\n" in tox
        if ours is not None:
            assert f"    {line}\n" in ours
    assert "-e {toxinidir}/../my-accel-runtime\n" in tox


def test_the_pyprojects_are_valid(tmp_path):
    """setuptools reads them: the metadata, the SPDX license, the entry points."""
    pyprojecttoml = pytest.importorskip("setuptools.config.pyprojecttoml")
    _generate(tmp_path, "my-accel", "--device")
    plugin = pyprojecttoml.read_configuration(tmp_path / "my-accel/pyproject.toml")["project"]
    assert plugin["license"] == "Apache-2.0"
    assert plugin["entry-points"] == {"umahub.plugins": {"my_accel": "my_accel"}}
    assert plugin["urls"] == {
        "Homepage": "https://github.com/YOUR-ORG/my-accel",
        "Source": "https://github.com/YOUR-ORG/my-accel",
        "Issues": "https://github.com/YOUR-ORG/my-accel/issues",
    }
    runtime = pyprojecttoml.read_configuration(tmp_path / "my-accel-runtime/pyproject.toml")
    assert runtime["project"]["entry-points"] == {
        "umahub.runtimes": {"my_accel": "my_accel_runtime:Runtime"}
    }
    assert runtime["project"]["license"] == "Apache-2.0"
    assert runtime["project"]["urls"]["Source"] == "https://github.com/YOUR-ORG/my-accel-runtime"
    for package in ("my-accel", "my-accel-runtime"):
        # no LICENSE file is written (the license is the vendor's to choose), so none is
        # named; the comment says how to name one
        assert not (tmp_path / package / "LICENSE").exists()
        text = (tmp_path / package / "pyproject.toml").read_text()
        assert "\nlicense-files" not in text
        assert '# license-files = ["LICENSE"].' in text


def test_the_guides_are_linked_by_url_not_by_a_path_a_pip_user_lacks(tmp_path, capsys):
    from umahub.cli.scaffold_templates import DOCS

    assert DOCS == "https://github.com/umahub/umahub/blob/main/docs"
    for device in (False, True):
        name = f"linked{int(device)}"
        assert main(["new-plugin", name, "--dir", str(tmp_path), *(["--device"] * device)]) == 0
        out = capsys.readouterr().out
        guide = "device.md" if device else "writing.md"
        assert out.endswith(f"with the guide\n      '{_guide(device)}', {DOCS}/plugins/{guide}\n")
        texts = {
            p: p.read_text()
            for p in tmp_path.glob(f"{name}*/**/*")
            if p.is_file() and p.suffix in (".md", ".py")
        }
        for path, text in [*texts.items(), ("next steps", out)]:
            bare = text.replace(f"{DOCS}/", "")
            assert "docs/" not in bare, f"{path}: a guide by a repository path"
        readme = texts[tmp_path / name / "README.md"]
        assert f"[hook reference]({DOCS}/plugins/hooks.rst)" in readme
        assert f"{DOCS}/plugins/writing.md" in texts[tmp_path / name / f"src/{name}/__init__.py"]


def _guide(device):
    return "A device of its own" if device else "Writing a plugin"


def test_the_generated_plugin_declares_an_option_its_schedule_reads(tmp_path, monkeypatch):
    import umahub.models as zoo

    _generate(tmp_path, "optioned-accel")
    monkeypatch.syspath_prepend(str(tmp_path / "optioned-accel/src"))
    plugin = importlib.import_module("optioned_accel")
    try:
        said = {}
        for lanes in (1, 16):
            hub = umahub.Hub(
                config={
                    "on-error": "error",
                    "options": {"optioned_accel": {"vector_lanes": lanes}},
                },
                autoload=False,
                plugins=[plugin],
                project_config=False,
            )
            (option,) = hub.accelerator("optioned_accel").options
            assert (option.name, option.default, option.choices) == (
                "vector-lanes",
                1,
                (1, 4, 8, 16),
            )
            (partition,) = hub.compile(zoo.get("mlp")).report.partitions
            said[lanes] = partition.schedule
        assert said == {1: [], 16: ["vectorized 1 block(s) by 16 lanes"]}
    finally:
        sys.modules.pop("optioned_accel", None)


def test_the_generated_code_is_lint_clean(tmp_path):
    """By umahub's ruff rules, which the generated pyproject.toml repeats."""
    ruff = shutil.which("ruff") or shutil.which("ruff", path=os.path.dirname(sys.executable))
    if ruff is None:
        pytest.skip("ruff is not installed")
    _generate(tmp_path, "my-accel", "--device")
    for package in ("my-accel", "my-accel-runtime"):
        for command in (["check"], ["format", "--check"]):
            done = subprocess.run(
                [ruff, *command, "--no-cache", "."],
                cwd=tmp_path / package,
                capture_output=True,
                text=True,
                check=False,
            )
            assert done.returncode == 0, done.stdout + done.stderr


def test_the_stubs_leave_umahubs_defaults_in_place(tmp_path, monkeypatch):
    """Every hook is implemented; the stubs return None, and a compile that calls them
    all (placement by cost too) takes umahub's defaults without a warning."""
    import umahub.models as zoo
    from umahub.hub.dispatch import HOOK_NAMES

    _generate(tmp_path, "stubbed-accel")
    monkeypatch.syspath_prepend(str(tmp_path / "stubbed-accel/src"))
    plugin = importlib.import_module("stubbed_accel")
    try:
        hub = umahub.Hub(
            config={"on-error": "error"},
            autoload=False,
            plugins=[plugin],
            project_config=False,
        )
        (info,) = hub.plugins
        assert set(info.hooks) == set(HOOK_NAMES)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            compiled = hub.compile(zoo.get("mlp"), placement="auto")
            fixed = hub.compile(zoo.get("mlp"))
        assert not any(p.fallback for p in compiled.report.partitions)
        (partition,) = fixed.report.partitions
        assert not partition.fallback and list(partition.patterns) == ["stubbed_accel.relu"]
    finally:
        sys.modules.pop("stubbed_accel", None)


# ------------------------------------------------------------------ their own tests


def _fake_install(site: Path, package: Path) -> None:
    """The package's entry points, as ``pip install -e`` would make importlib.metadata
    see them (read from its pyproject.toml), its sources on the path."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib

    project = tomllib.loads((package / "pyproject.toml").read_text())["project"]
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    (info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in points.items())
            for group, points in project["entry-points"].items()
        )
    )


def _pytest(package: Path, *path: Path, args=()) -> str:
    """Run the package's own tests as its CI would (umahub's sources first on the path)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(UMAHUB_SRC), *map(str, path), env.get("PYTHONPATH", "")]
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=package,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    return done.stdout


def test_the_plugin_passes_its_own_tests_from_its_source_tree(tmp_path):
    """Not installed: conftest.py names it to umahub. The kit on mlp (cnn deselected to
    save time: the plugin's own CI runs both)."""
    _generate(tmp_path, "scaffolded-accel")
    out = _pytest(tmp_path / "scaffolded-accel", args=["-k", "not cnn"])
    assert "scaffolded_accel (plugin scaffolded_accel): passed" in out
    assert "failed" not in out
    # The counts add up: 18 collected = 10 run + 5 of the cnn + 3 checks of a device of
    # its own, which this accelerator does not have (deselected by the kit, and said).
    assert "3 device checks deselected: no accelerator under test has a device" in out
    assert "\n10 passed, 8 deselected in " in out


def test_the_device_plugin_and_its_runtime_pass_their_own_tests(tmp_path):
    """Installed (their entry points seen as pip would make them): the runtime's own tests,
    then the plugin's, whose kit runs the device's checks, a run with the runtime alone
    among them."""
    _generate(tmp_path, "scaffolded-npu", "--device")
    site = tmp_path / "site"
    plugin, runtime = tmp_path / "scaffolded-npu", tmp_path / "scaffolded-npu-runtime"
    _fake_install(site, plugin)
    _fake_install(site, runtime)
    out = _pytest(runtime, site, runtime / "src")
    assert "4 passed" in out
    out = _pytest(plugin, site, plugin / "src", runtime / "src", args=["-k", "not cnn"])
    assert "scaffolded_npu (plugin scaffolded_npu): passed" in out
    assert "failed" not in out and "skipped" not in out
