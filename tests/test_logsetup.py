"""Logging: plain lines on a terminal or file, priority-prefixed lines when stderr is the journal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import logging, sys
if sys.argv[1] == "no-systemd":
    sys.modules["systemd"] = None  # as on a host without systemd-python
from tpuwatch import logsetup
logsetup.configure("info")
logging.getLogger("tpuwatch.test").error("chip 3 lost")
logging.getLogger("tpuwatch.test").info("all good")
"""


def run_logging(tmp_path: Path, journal: bool) -> str:
    log_file = tmp_path / "stderr.log"
    with open(log_file, "wb") as stderr:
        env = dict(os.environ)
        env.pop("JOURNAL_STREAM", None)
        if journal:
            stat = os.fstat(stderr.fileno())
            env["JOURNAL_STREAM"] = f"{stat.st_dev}:{stat.st_ino}"
        subprocess.run([sys.executable, "-c", SCRIPT, "no-systemd"], stderr=stderr, env=env, check=True, timeout=60)
    return log_file.read_text()


def test_plain_lines_with_time_and_level(tmp_path: Path) -> None:
    lines = run_logging(tmp_path, journal=False).splitlines()
    assert len(lines) == 2
    assert lines[0].endswith("ERROR tpuwatch.test: chip 3 lost") and lines[1].endswith("INFO tpuwatch.test: all good")


def test_journal_stream_gets_syslog_priorities(tmp_path: Path) -> None:
    assert run_logging(tmp_path, journal=True).splitlines() == ["<3>tpuwatch.test: chip 3 lost",
                                                                 "<6>tpuwatch.test: all good"]
