"""`tpuwatch top` in a real terminal (tmux: send-keys, capture-pane), without one, and without a daemon; and
`tpuwatch run` never imports it.

The live view's capture goes to $TPUWATCH_ARTIFACTS (default: the test's tmp dir) as text and, drawn by
Chromium, as top.png; with TPUWATCH_UPDATE_SCREENSHOTS=1 the README's docs/top.png is rewritten from it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import bcrypt
import pytest
import yaml

from browser import Browser
from conftest import SIM_FAST, DaemonProcess, free_port, require_tool, run_cli, wait_until
from terminal import Tmux, pane_html

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "correct horse"
RED_CRITICAL = re.compile(r"\x1b\[(?:[0-9]+;)*31(?:;[0-9]+)*m(?:\x1b\[[0-9;]*m)*CRITICAL")


def artifacts(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("TPUWATCH_ARTIFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def in_terminal(config: Path) -> str:
    """A shell line: a marker, top, then its exit status and the terminal's settings once it has quit."""
    return (f"printf 'before top\\n'; {sys.executable} -m tpuwatch top --config {config}; echo \"exit=$?\"; "
            "stty -a | tr ';' '\\n' | tr ' ' '\\n' | grep -x -E -e '-?(icanon|echo)' | tr '\\n' ' '; echo '<- flags'; "
            "exec sleep 600")


def terminal_flags(pane: str) -> set[str]:
    """The flags stty printed on the line after top's exit status ("-echo" for echo off)."""
    lines = pane.splitlines()
    return set(lines[next(k for k, line in enumerate(lines) if line.startswith("exit=")) + 1].split()) - {"<-", "flags"}


def wait_for_exit(terminal: Tmux) -> str:
    """The pane once top has quit and the shell has printed its exit status and the terminal's flags after it (the
    two lines are printed apart: waiting for the first alone can catch the pane between them)."""
    return terminal.wait_for("<- flags")


def start_terminal(config: Path) -> Tmux:
    return Tmux(require_tool("tmux"), f"cd {ROOT} && {in_terminal(config)}", env={"LANG": "C.UTF-8"})


def screenshot(captured: str, folder: Path) -> None:
    """top.png of the capture, drawn by Chromium (in CI, where it is installed; elsewhere when it is)."""
    if shutil.which("chromium") is None and os.environ.get("TPUWATCH_REQUIRE_TOOLS") != "1":
        return
    browser = Browser(require_tool("chromium"))
    try:
        tab = browser.page(width=1180, height=24 + 18 * len(captured.rstrip().splitlines()))
        tab.show_html(pane_html(captured, "tpuwatch top"))
        tab.screenshot(folder / "top.png", full_page=False)
        if os.environ.get("TPUWATCH_UPDATE_SCREENSHOTS") == "1":
            tab.screenshot(ROOT / "docs" / "top.png", full_page=False)
    finally:
        browser.close()


def test_top_draws_the_chips_live_and_quits_on_q_restoring_the_terminal(
        start_daemon: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    # The error comes a second in, so that the alert's increase() sees it; an hour of history, the simulated
    # chips' past included, fills the sparklines.
    daemon = start_daemon({**SIM_FAST, "interval": "1s", "collector_timeout": "500ms",
                           "store": {"points_per_series": 3600},
                           "devices": {"backend": "sim", "sim": {"count": 4, "fault_device": 1, "fault_after": "1s"}}},
                          args=["--simulate", "ecc-errors"])
    daemon.wait_ready()
    terminal = start_terminal(daemon.config_path)
    try:
        shown = terminal.wait_for(f"from the daemon at {daemon.url} · every 1s")
        shown = terminal.wait_for("└ 1 uncorrectable ECC error(s) since the driver loaded")
        lines = {line.split()[0]: line for line in shown.splitlines() if re.match(r"^\d +(ok|CRITICAL) ", line)}
        assert set(lines) == {"0", "1", "2", "3"} and lines["1"].split()[1] == "CRITICAL"
        assert all(lines[d].split()[1] != "CRITICAL" for d in "023")
        assert all(len(re.findall("[▁▂▃▄▅▆▇█]", line)) >= 8 for line in lines.values()), lines  # the sparklines
        first = terminal.capture()
        redrawn = "└ AcceleratorEccUncorrectable: Uncorrectable ECC error(s) on chip 1 (0000:11:00.0)"
        terminal.wait_for(redrawn)
        coloured = terminal.capture(colours=True)
        assert RED_CRITICAL.search(coloured), coloured
        wait_until(lambda: terminal.capture() != first, what="a redraw")  # the clock and the readings move
        folder = artifacts(tmp_path)
        (folder / "top.txt").write_text(coloured)
        screenshot(coloured, folder)
        terminal.keys("q")
        after = wait_for_exit(terminal)
        assert "exit=0" in after, after
        assert "before top" in after and "tpuwatch top ·" not in after  # the screen it found, back
        assert terminal_flags(after) == {"icanon", "echo"}, after  # cooked mode and echo, as before
    finally:
        terminal.close()


def test_top_in_an_80_by_24_terminal_shows_every_chips_state_memory_temperature_and_ecc(
        start_daemon: Callable[..., DaemonProcess]) -> None:
    daemon = start_daemon({**SIM_FAST, "devices": {"backend": "sim", "sim": {"count": 4, "fault_device": 1,
                                                                              "fault_after": "0s"}}},
                          args=["--simulate", "ecc-errors"])
    daemon.wait_ready()
    terminal = Tmux(require_tool("tmux"), f"cd {ROOT} && {in_terminal(daemon.config_path)}",
                    env={"LANG": "C.UTF-8"}, width=80, height=24)
    try:
        shown = terminal.wait_for("uncorrectable ECC error(s) since the driver loaded")
        header = next(line for line in shown.splitlines() if line.startswith("DEV"))
        assert header.split()[:6] == ["DEV", "HEALTH", "MEM", "TEMP", "ECC", "CE/UE"], header
        rows = [line for line in shown.splitlines() if re.match(r"^\d +(ok|CRITICAL|WARNING) ", line)]
        assert [row.split()[0] for row in rows] == ["0", "1", "2", "3"], shown
        for row in rows:  # whole, not cut at the edge: the state, memory, temperature and ECC counts
            assert re.match(r"^\d +(ok|CRITICAL) +[\d.]+/[\d.]+ GiB +[\d.]+ °C +\d+/\d+ ", row), row
        terminal.keys("q")
        assert "exit=0" in wait_for_exit(terminal)
    finally:
        terminal.close()


def test_top_quits_on_ctrl_c_restoring_the_terminal(start_daemon: Callable[..., DaemonProcess]) -> None:
    daemon = start_daemon(SIM_FAST)
    daemon.wait_ready()
    terminal = start_terminal(daemon.config_path)
    try:
        terminal.wait_for(f"from the daemon at {daemon.url}")
        terminal.keys("C-c")
        after = wait_for_exit(terminal)
        assert "exit=0" in after, after
        assert "before top" in after and "Traceback" not in after
        assert terminal_flags(after) == {"icanon", "echo"}, after  # cooked mode and echo, as before
    finally:
        terminal.close()


def test_without_a_daemon_top_reads_the_hardware_and_says_so(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        **SIM_FAST, "listen": f"127.0.0.1:{free_port()}", "state_dir": str(tmp_path / "state"),
        "devices": {"backend": "sim", "sim": {"count": 2, "scenario": "ecc-errors", "fault_device": 1,
                                              "fault_after": "0s"}}}))
    result = run_cli("top", "--config", str(config), "--once")
    lines = result.stdout.splitlines()
    port = yaml.safe_load(config.read_text())["listen"].rsplit(":", 1)[1]
    assert f"reading the hardware directly: the daemon at http://127.0.0.1:{port} does not answer " \
           "(ConnectionError)" in lines[0]
    assert result.returncode == 1 and "\x1b" not in result.stdout and result.stderr == ""
    assert any(re.match(r"^1 +CRITICAL .* v5e +yes ", line) for line in lines), result.stdout
    assert "      └ 1 uncorrectable ECC error(s) since the driver loaded" in lines


def test_without_a_terminal_top_prints_plain_text_each_interval(start_daemon: Callable[..., DaemonProcess]) -> None:
    daemon = start_daemon(SIM_FAST)
    daemon.wait_ready()
    # Started with SIGINT ignored, as a shell starts a background job (and CI runs the suite): Ctrl-C still quits.
    proc = subprocess.Popen([sys.executable, "-m", "tpuwatch", "top", "--config", str(daemon.config_path),
                             "--interval", "0.3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert proc.stdout is not None
    frames = 0
    seen = []
    while frames < 2:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        seen.append(line)
        frames += line.startswith("tpuwatch top · ")
    proc.send_signal(signal.SIGINT)
    rest, errors = proc.communicate(timeout=10)  # read on: a full pipe would block its last frame and its exit
    assert proc.returncode == 0, errors
    assert "\x1b" not in "".join(seen) + rest and f"from the daemon at {daemon.url}" in seen[0]


def test_top_asks_a_daemon_with_basic_auth_with_the_password_file(start_daemon: Callable[..., DaemonProcess],
                                                                  tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({"basic_auth_users": {
        "oncall": bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()}}))
    daemon = start_daemon({**SIM_FAST, "web_config": str(web)})
    daemon.wait_ready()
    refused = run_cli("top", "--config", str(daemon.config_path), "--once")
    assert f"reading the hardware directly: the daemon at {daemon.url} asks for credentials" in refused.stdout
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")
    asked = run_cli("top", "--config", str(daemon.config_path), "--once", "--user", "oncall",
                    "--password-file", str(secret))
    assert f"from the daemon at {daemon.url}" in asked.stdout.splitlines()[0] and asked.returncode == 0
    assert PASSWORD not in asked.stdout + asked.stderr + daemon.log()
    missing = run_cli("top", "--config", str(daemon.config_path), "--once", "--user", "oncall",
                      "--password-file", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "nowhere" in missing.stderr


def test_run_never_imports_top_or_curses(start_daemon: Callable[..., DaemonProcess]) -> None:
    # -X importtime's log names every module the daemon imports, when it imports it: serve the page first.
    daemon = start_daemon(SIM_FAST, env={"PYTHONPROFILEIMPORTTIME": "1"})
    daemon.wait_ready()
    import requests

    for path in ("/", "/api/status", "/api/series", "/status.js"):
        assert requests.get(daemon.url + path, timeout=5).status_code == 200
    wait_until(lambda: "tpuwatch.views.page" in daemon.log(), what="the import log")
    imported = {line.rsplit("|", 1)[1].strip() for line in daemon.log().splitlines() if line.startswith("import time:")}
    assert "tpuwatch.views.render" in imported and "tpuwatch.daemon" in imported
    assert not {"tpuwatch.views.top", "tpuwatch.views.lines", "curses", "_curses"} & imported


@pytest.mark.parametrize("args", [["--interval", "x"], ["--nonsense"]])
def test_top_refuses_bad_options_in_one_line(args: list[str]) -> None:
    result = run_cli("top", *args)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
