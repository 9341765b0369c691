"""The packages' metadata, as pyproject.toml declares it: umahub's and each bundled plugin's."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PROJECTS = [ROOT, *sorted((ROOT / "plugins").glob("umahub-*"))]


def _project(root: Path) -> dict:
    return tomllib.loads((root / "pyproject.toml").read_text())["project"]


@pytest.mark.parametrize("root", PROJECTS, ids=lambda p: p.name)
def test_license_is_an_spdx_expression_and_a_readme_is_there(root):
    """The table form (license = {text = ...}) is deprecated by setuptools (PEP 639)."""
    project = _project(root)
    assert project["license"] == "Apache-2.0"
    assert (root / project["readme"]).is_file()


def test_no_backport_where_the_standard_library_has_it():
    """Python >= 3.10: importlib.metadata has entry_points(group=...) and EntryPoint.dist."""
    assert not any(d.startswith("importlib-metadata") for d in _project(ROOT)["dependencies"])
    sources = (ROOT / "src").rglob("*.py")
    assert not [
        p for p in sources if re.search(r"^\s*import importlib_metadata", p.read_text(), re.M)
    ]


def test_extras_name_tvm_s_own_rpc_extra_and_pin_no_exact_torch():
    extras = _project(ROOT)["optional-dependencies"]
    assert extras["rpc"] == ["apache-tvm[rpc]"]
    assert not [r for r in extras["torch"] if "==" in r]
