"""Shared by the benchmark scripts: where BENCHMARKS.md is and how a section of it is replaced."""

from __future__ import annotations

import compileall
import functools
import os
import platform
import re
import subprocess
import time
from datetime import datetime
from pathlib import Path

import requests

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS_MD = REPO_ROOT / "BENCHMARKS.md"
_HEADER = ("# tpuwatch benchmarks\n\nEach section is written by one script under benchmarks/ "
           "(`python benchmarks/run.py` runs them all) and states its command, machine and date.\n")


def checkout_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this environment) for a Python child that runs this checkout's tpuwatch as an installed
    one runs: first on its path, its bytecode compiled beforehand into the checkout's __pycache__ directories, as
    pip and Debian compile it at install (a child compiling at import instead spends time and resident memory on
    it; with PYTHONDONTWRITEBYTECODE it would do so at every start)."""
    _compile_checkout()
    return {**(os.environ if base is None else base), "PYTHONPATH": str(REPO_ROOT)}


@functools.cache
def _compile_checkout() -> None:
    """Compile tpuwatch's bytecode, once per benchmark process."""
    compileall.compile_dir(str(REPO_ROOT / "tpuwatch"), quiet=1)


def write_section(topic: str, markdown: str, path: Path = BENCHMARKS_MD) -> None:
    """Replace (or append) the ``<!-- topic:begin -->`` ... ``<!-- topic:end -->`` block of ``path``."""
    block = f"<!-- {topic}:begin -->\n{markdown.strip()}\n<!-- {topic}:end -->"
    text = path.read_text() if path.exists() else _HEADER
    pattern = re.compile(rf"<!-- {re.escape(topic)}:begin -->.*?<!-- {re.escape(topic)}:end -->", re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else f"{text.rstrip()}\n\n{block}\n"
    path.write_text(text)


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def machine_and_command(facts: dict[str, str], started: datetime, command: str) -> list[str]:
    """The closing lines of a section: the machine, the date and the exact command."""
    return ["### Machine", "", *[f"- {key}: {value}" for key, value in facts.items()],
            f"- Date: {started.strftime('%Y-%m-%d %H:%M UTC')}", "", "### Command", "", "```", command, "```", ""]


def to_ere(pattern: str) -> str:
    """A Python rule regex as an ERE for GNU grep: groups plain, lookarounds dropped, lazy quantifiers greedy."""
    ere = re.sub(r"\(\?P<\w+>", "(", pattern.replace("(?:", "("))
    ere = re.sub(r"\(\?<?[=!][^()]*\)", "", ere)
    ere = re.sub(r"([*+?}])\?", r"\1", ere).replace(r"\d", "[0-9]")
    return ere


def wait_for_first_cycle(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60.0) -> None:
    """Wait until the daemon at ``url`` (its /metrics) has finished its first sampling cycle; exit with its log if
    it dies or does not get there in ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if "tpuwatch_last_sample_timestamp_seconds" in requests.get(f"{url}/metrics", timeout=2).text:
                return
        except requests.RequestException:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit(f"the daemon did not come up: {log.read_text()[-4000:]}")
        time.sleep(0.1)
