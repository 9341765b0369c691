"""Sphinx configuration of umahub's documentation (built by ``tox -e docs``)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(HERE / "_ext"))

import umahub  # noqa: E402

project = "umahub"
author = "the umahub maintainers"
copyright = "the umahub maintainers"
release = version = umahub.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "umahub_docs",  # _ext/: the generated tables, checks and links
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "_ext"]
root_doc = "index"

html_theme = "furo"
html_title = f"umahub {release}"

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
