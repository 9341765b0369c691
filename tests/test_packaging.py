"""The packages' metadata, as pyproject.toml declares it: umahub's and each bundled plugin's."""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

import pytest

import umahub
from umahub.cli.version import version_text

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PROJECTS = [ROOT, *sorted((ROOT / "plugins").glob("umahub-*"))]


def _project(root: Path) -> dict:
    return tomllib.loads((root / "pyproject.toml").read_text())["project"]


PLUGINS = PROJECTS[1:]


def _name(root: Path) -> str:
    """A project's name in test ids: umahub, or the plugin's directory."""
    return "umahub" if root == ROOT else root.name


#: Where umahub lives; every package's URLs point into it.
REPOSITORY = "https://github.com/umahub/umahub"
#: The plugins whose README is left to the simnpu's own work (issue 32): they still link
#: to files of the repository, which a package index cannot show.


@pytest.mark.parametrize("root", PROJECTS, ids=_name)
def test_license_is_an_spdx_expression_with_its_file(root):
    """The table form (license = {text = ...}) is deprecated by setuptools (PEP 639); the
    license's text ships in the distribution (``license-files``), the same in every package."""
    project = _project(root)
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    text = (root / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert text == (ROOT / "LICENSE").read_text()
    assert (root / project["readme"]).is_file()


@pytest.mark.parametrize("root", PROJECTS, ids=_name)
def test_every_package_links_to_its_source_and_issues(root):
    urls = _project(root)["urls"]
    assert urls["Issues"] == f"{REPOSITORY}/issues"
    where = REPOSITORY if root == ROOT else f"{REPOSITORY}/tree/main/plugins/{root.name}"
    assert urls["Source"] == where
    assert all(u.startswith(REPOSITORY) for u in urls.values())


@pytest.mark.parametrize("root", PLUGINS, ids=_name)
def test_a_plugin_s_readme_reads_on_its_own(root):
    """A package index shows the README alone: no link into the repository's files, how to
    install it, what it takes, where to read more."""
    text = (root / "README.md").read_text()
    targets = re.findall(r"\]\(([^)]+)\)", text)
    assert [t for t in targets if not t.startswith(("https://", "http://", "#"))] == []
    assert f"pip install {root.name}" in text
    assert "## What it takes" in text
    assert f"[umahub]({REPOSITORY})" in text
    assert f"{REPOSITORY}/tree/main/plugins/{root.name}" in text
    assert "Apache-2.0" in text


def test_the_version_is_written_in_one_place():
    """``umahub.__version__``: the build reads it (dynamic), so the installed metadata,
    ``umahub --version`` and the documentation say the same."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"]
    assert pyproject["project"]["dynamic"] == ["version"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "umahub.__version__"}
    assert metadata.version("umahub") == umahub.__version__
    assert version_text().splitlines()[0] == f"umahub {umahub.__version__}"
    assert "release = version = umahub.__version__" in (ROOT / "docs" / "conf.py").read_text()
    written = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "src").rglob("*.py")
        if re.search(r"^__version__\s*=", p.read_text(), re.M)
    ]
    assert written == ["src/umahub/__init__.py"]


def test_no_backport_where_the_standard_library_has_it():
    """Python >= 3.10: importlib.metadata has entry_points(group=...) and EntryPoint.dist."""
    for root in PROJECTS:
        project = _project(root)
        wanted = [*project.get("dependencies", ())]
        wanted += [r for extra in project.get("optional-dependencies", {}).values() for r in extra]
        assert not [d for d in wanted if re.match(r"importlib[-_]metadata", d)], root.name
    sources = [*(ROOT / "src").rglob("*.py"), *(ROOT / "plugins").glob("*/src/**/*.py")]
    assert not [
        p
        for p in sources
        if re.search(r"^\s*(import|from) importlib_metadata", p.read_text(), re.M)
    ]


def test_extras_name_tvm_s_own_rpc_extra_and_pin_no_exact_torch():
    extras = _project(ROOT)["optional-dependencies"]
    assert extras["rpc"] == ["apache-tvm[rpc]"]
    # the extra is apache-tvm's own (tornado, psutil, cloudpickle), not a list of our making
    assert "rpc" in (metadata.metadata("apache-tvm").get_all("Provides-Extra") or [])
    every = [r for extra in extras.values() for r in extra]
    assert not [r for r in every if re.match(r"(torch|torchvision)\s*(\[.*\])?\s*===?", r)]
