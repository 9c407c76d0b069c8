"""`tpuwatch top --url URL`: the daemon named, not the config's, and never this host's hardware in its place;
and a terminal that cannot show "°C" or "·" gets "?" rather than an error.

A real daemon (`tpuwatch run`) on a free port; top as a subprocess, as a user runs it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from conftest import SIM_FAST, DaemonProcess, free_port, run_cli

SECRET = "s3cret-pw"


def config_elsewhere(tmp_path: Path, chips: int = 2) -> Path:
    """A config whose listen address nothing answers at, with simulated chips of its own: a view of ``chips``
    chips would be this host's hardware read in place of the daemon's."""
    path = tmp_path / "elsewhere.yaml"
    path.write_text(yaml.safe_dump({**SIM_FAST, "listen": f"127.0.0.1:{free_port()}",
                                    "state_dir": str(tmp_path / "state"),
                                    "devices": {"backend": "sim", "sim": {"count": chips}}}))
    return path


def test_top_reads_the_daemon_at_url_not_the_configs(start_daemon: Callable[..., DaemonProcess],
                                                     tmp_path: Path) -> None:
    daemon = start_daemon(SIM_FAST)  # 4 chips
    daemon.wait_ready()
    result = run_cli("top", "--config", str(config_elsewhere(tmp_path)), "--once", "--url", daemon.url + "/")
    lines = result.stdout.splitlines()
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert lines[0].startswith("tpuwatch top · ") and f" · from the daemon at {daemon.url} · every " in lines[0]
    assert lines[1].startswith("4 chip(s): ")


def test_a_daemon_at_url_that_does_not_answer_is_said_so_and_the_hardware_left_alone(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = run_cli("top", "--config", str(config_elsewhere(tmp_path)), "--once", "--url", url)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == f"tpuwatch: the daemon at {url} does not answer (ConnectionError)\n"


def test_without_a_terminal_top_keeps_asking_the_daemon_at_url(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    proc = subprocess.Popen([sys.executable, "-m", "tpuwatch", "top", "--config", str(config_elsewhere(tmp_path)),
                             "--url", url, "--interval", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    try:
        seen = [proc.stdout.readline() for _ in range(2)]
    finally:
        proc.send_signal(signal.SIGINT)
        _, errors = proc.communicate(timeout=10)
    assert seen == [f"tpuwatch top: the daemon at {url} does not answer (ConnectionError); trying again in 200ms\n"] * 2
    assert proc.returncode == 0 and errors == ""


@pytest.mark.parametrize(("url", "says"), [
    ("127.0.0.1:9847", "invalid URL"),
    ("ftp://127.0.0.1:9847", "invalid URL"),
    (f"http://oncall:{SECRET}@127.0.0.1:9847", "a URL with credentials"),
    ("http://127.0.0.1:9847/?token=1", "a URL with a query or fragment"),
])
def test_top_refuses_a_url_that_is_not_a_daemons_address_in_one_line(url: str, says: str, tmp_path: Path) -> None:
    result = run_cli("top", "--config", str(config_elsewhere(tmp_path)), "--once", "--url", url)
    assert result.returncode == 2 and result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert "argument --url: " + says in result.stderr and SECRET not in result.stderr


def test_url_and_local_exclude_each_other(tmp_path: Path) -> None:
    result = run_cli("top", "--once", "--local", "--url", "http://127.0.0.1:9847")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "not allowed with argument" in result.stderr


def test_a_terminal_that_cannot_show_the_units_gets_question_marks(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "tpuwatch", "top", "--config", str(config_elsewhere(tmp_path)),
                             "--once", "--local"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout.startswith("tpuwatch top ? ") and " ?C  " in result.stdout
