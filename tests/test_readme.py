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
