"""The code stays as a developer left it: ruff's lint and mypy's type check pass, run as the README says."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("command", [["ruff", "check", "tpuwatch", "tests", "benchmarks"],
                                     ["mypy", "tpuwatch", "benchmarks"]], ids=["ruff", "mypy"])
def test_the_code_passes(command: list[str]) -> None:
    # From this Python's own environment (the test extra installs both), which need not be on PATH.
    if importlib.util.find_spec(command[0]) is None:
        if os.environ.get("TPUWATCH_REQUIRE_TOOLS") == "1":
            pytest.fail(f"{command[0]} is required in CI but not installed")
        pytest.skip(f"{command[0]} not installed")
    proc = subprocess.run([sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
