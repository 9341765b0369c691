"""What the README promises a new user is what CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _blocks_after(text: str, heading: str) -> list[str]:
    after = text[text.index(heading) :]
    return re.findall(r"```\n(.*?)\n```", after, re.S)


def test_ci_runs_the_readmes_test_command():
    command = _blocks_after((ROOT / "README.md").read_text(), "The tests (what CI runs")[0]
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == command


def test_the_test_command_makes_its_own_environment():
    command = _blocks_after((ROOT / "README.md").read_text(), "The tests (what CI runs")[0]
    assert command.startswith("python3 -m venv ")  # no pip install into the system Python
    assert "--break-system-packages" not in command


def _code_blocks(text: str) -> list[str]:
    """Every fenced code block's content, fences paired line by line (a tag may follow)."""
    blocks, current = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def test_the_readme_draws_the_source_tree():
    """The README's tree of ``src/umahub`` names every subpackage and top-level module."""
    text = (ROOT / "README.md").read_text()
    tree = next(b for b in _code_blocks(text) if b.startswith("src/umahub/"))
    src = ROOT / "src" / "umahub"
    packages = {f"{p.name}/" for p in src.iterdir() if (p / "__init__.py").is_file()}
    modules = {p.name for p in src.glob("*.py")} - {"__init__.py", "__main__.py"}
    words = set(tree.split())
    assert sorted(packages - words) == []
    assert sorted(modules - words) == []
