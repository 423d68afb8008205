"""What docs/testing.md promises about the code, checked by the same command that runs the tests:
ruff's lint rules, ruff's formatting, and mypy --strict over the package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
        ["mypy", "relay_tasks"],
    ],
    ids=["ruff", "ruff-format", "mypy"],
)
def test_the_code_passes(command: list[str]) -> None:
    tool = Path(sys.executable).parent / command[0]
    found = subprocess.run([str(tool), *command[1:]], cwd=ROOT, capture_output=True, text=True)
    assert found.returncode == 0, found.stdout + found.stderr
