"""The code stays as a developer left it: ruff's lint and mypy's type check pass, run as the README says."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import require_tool

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("command", [["ruff", "check", "tpuwatch", "tests", "benchmarks"], ["mypy", "tpuwatch"]],
                         ids=["ruff", "mypy"])
def test_the_code_passes(command: list[str]) -> None:
    proc = subprocess.run([require_tool(command[0]), *command[1:]], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
