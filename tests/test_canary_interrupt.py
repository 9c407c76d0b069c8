"""Interrupts and parent deaths: the worker's process group never outlives `tpuwatch canary` or `tpuwatch run`.

Real subprocesses: `tpuwatch canary --inject hang` (the worker hangs on a
child of its own), signals and kill -9 sent to it, a pty for the progress line.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import pty
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import SIM_FAST, DaemonProcess, wait_until

needs_jax = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax not installed")


def stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, process group) of ``pid`` from /proc, or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid, pgrp = text.rsplit(")", 1)[1].split()[:3]
    return state, int(ppid), int(pgrp)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def living(pgid: int) -> list[int]:
    """Processes of group ``pgid`` that have not exited (zombies waiting for a reaper count as gone)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = stat(int(entry))
            if info is not None and info[2] == pgid and info[0] != "Z":
                found.append(int(entry))
    return found


def worker_group(parent: int) -> int | None:
    """The process group of the canary worker ``parent`` started: its supervisor leads it."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = stat(int(entry))
            if info is not None and info[1] == parent and "tpuwatch.canary.supervisor" in cmdline(int(entry)):
                return info[2]
    return None


def marked(marker: str) -> list[int]:
    """Living processes whose environment carries ``marker`` (what a test started, wherever it ended up)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and marker.encode() in Path(f"/proc/{entry}/environ").read_bytes():
                found.append(int(entry))
        except OSError:
            continue
    return [pid for pid in found if (stat(pid) or ("Z",))[0] != "Z"]


@pytest.fixture
def marker() -> Iterator[dict[str, str]]:
    """An environment variable for a test's processes; any still alive at teardown are killed."""
    env = {"TPUWATCH_TEST_MARKER": str(uuid.uuid4())}
    yield env
    for pid in marked("TPUWATCH_TEST_MARKER=" + env["TPUWATCH_TEST_MARKER"]):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def hanging(pgid: int) -> bool:
    """True once the hang drill's child (the worker blocks on it) is running in the group."""
    return any("signal.pause()" in cmdline(pid) for pid in living(pgid))


@pytest.fixture
def start_canary(tmp_path: Path, marker: dict[str, str]) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start `tpuwatch canary` with a hang drill on one CPU device; anything left is killed at teardown."""
    started: list[subprocess.Popen[bytes]] = []
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state")}))

    def start(*args: str, stderr: int = subprocess.PIPE) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "tpuwatch", "canary", "--config", str(config), "--inject", "hang", *args]
        started.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr,
                                        env={**os.environ, "XLA_FLAGS": "", **marker}))
        return started[-1]

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@needs_jax
def test_a_hang_ends_as_an_error_at_the_timeout_leaving_no_process(
        start_canary: Callable[..., subprocess.Popen[bytes]], marker: dict[str, str]) -> None:
    # The timeout covers the worker's start too (jax's import, the first compile): 20 s leaves a loaded host
    # time to reach the chip, so the hang is what the timeout ends.
    proc = start_canary("--json", "--timeout", "20s")
    data = json.loads(proc.communicate(timeout=90)[0])
    assert proc.returncode == 3
    assert data["status"] == "error" and data["reason"].startswith("timed out after 20s")
    assert data["devices"][0]["status"] == "error" and data["drill"]["checks"] == ["timeout"]
    # The hang waits on a child of the worker: killing the group must take both.
    wait_until(lambda: not marked("TPUWATCH_TEST_MARKER=" + marker["TPUWATCH_TEST_MARKER"]), timeout=5,
               what="no canary process left")


@needs_jax
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_kills_the_worker_group_and_exits_130(
        start_canary: Callable[..., subprocess.Popen[bytes]], signum: int) -> None:
    proc = start_canary()
    group = wait_until(lambda: worker_group(proc.pid), timeout=30, what="the worker's process group")
    wait_until(lambda: hanging(group), timeout=60, what="the hang drill's child")
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert stderr.decode().endswith("tpuwatch canary: interrupted; the worker's process group was killed\n")
    wait_until(lambda: not living(group), timeout=5, what="the worker's process group to be gone")


@needs_jax
def test_kill_9_of_the_canary_takes_the_worker_group_with_it(
        start_canary: Callable[..., subprocess.Popen[bytes]]) -> None:
    proc = start_canary()
    group = wait_until(lambda: worker_group(proc.pid), timeout=30, what="the worker's process group")
    wait_until(lambda: hanging(group), timeout=60, what="the hang drill's child")
    proc.kill()
    proc.wait()
    wait_until(lambda: not living(group), timeout=5, what="the orphaned worker group to kill itself")


def test_kill_9_of_a_daemon_started_by_hand_takes_its_worker_group_with_it(
        start_daemon: Callable[..., DaemonProcess], tmp_path: Path, marker: dict[str, str]) -> None:
    pids = tmp_path / "worker.pids"
    interpreter = tmp_path / "python-that-hangs"  # a worker that hangs on a child, like the hang drill
    interpreter.write_text(f"#!/bin/sh\nsleep 300 &\necho $$ $! > {pids}.part\nmv {pids}.part {pids}\nwait\n")
    interpreter.chmod(0o755)
    daemon = start_daemon({**SIM_FAST, "canary": {"enabled": True, "python": str(interpreter), "jitter": "0s",
                                                  "timeout": "10m"}}, env=marker)
    daemon.wait_ready()
    worker, child = map(int, wait_until(lambda: pids.exists() and pids.read_text().split(), what="the worker"))
    group = stat(worker)[2]
    assert stat(child)[2] == group and group != daemon.proc.pid
    daemon.proc.kill()
    daemon.proc.wait()
    wait_until(lambda: not living(group), timeout=5, what="the worker group to die with the daemon")


def test_the_supervisor_kills_its_group_when_the_pipe_closes_and_never_its_caller_s() -> None:
    read, write = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "tpuwatch.canary.supervisor", str(read), "--",
                             "sh", "-c", "sleep 300 & echo $!; wait"], pass_fds=(read,), stdout=subprocess.PIPE)
    os.close(read)
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        group = stat(child)[2]
        assert group == proc.pid != os.getpgrp()  # started without a session of its own, it made one
        assert proc.poll() is None and living(group)
    finally:
        os.close(write)  # what the kernel does when the runner dies
    assert proc.wait(timeout=10) == -signal.SIGKILL
    wait_until(lambda: not living(group), timeout=5, what="the supervisor's group to be gone")


def read_pty(master: int, proc: subprocess.Popen[bytes]) -> str:
    """All the terminal got until ``proc`` exited."""
    chunks = []
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: every holder of the terminal's other end has closed it
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait(timeout=60)
    return b"".join(chunks).decode(errors="replace")


@needs_jax
def test_on_a_terminal_a_progress_line_shows_what_it_waits_for(
        start_canary: Callable[..., subprocess.Popen[bytes]]) -> None:
    master, slave = pty.openpty()
    try:
        proc = start_canary("--timeout", "20s", stderr=slave)  # time to reach the chip on a loaded host
        os.close(slave)
        terminal = read_pty(master, proc)
    finally:
        os.close(master)
    assert proc.returncode == 3
    assert "\rcanary: device 0 running for " in terminal and " s of the 20 s timeout)\x1b[K" in terminal
    assert terminal.endswith("\r\x1b[K")  # erased before the report


@needs_jax
@pytest.mark.parametrize("terminal", [False, True])
def test_no_progress_line_when_piped_or_with_json(start_canary: Callable[..., subprocess.Popen[bytes]],
                                                  terminal: bool) -> None:
    if terminal:
        master, slave = pty.openpty()
        try:
            proc = start_canary("--timeout", "3s", "--json", stderr=slave)
            os.close(slave)
            stderr = read_pty(master, proc)
        finally:
            os.close(master)
        assert proc.stdout is not None
        stdout = proc.stdout.read()
    else:
        proc = start_canary("--timeout", "3s")
        stdout, raw = proc.communicate(timeout=60)
        stderr = raw.decode()
    assert proc.returncode == 3 and b"timed out after 3s" in stdout  # it did wait on the hang
    assert "running for" not in stderr and "\r" not in stderr


@needs_jax
def test_a_run_the_stopping_daemon_kills_is_skipped_quietly_not_a_crash(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    from tpuwatch import config as config_module
    from tpuwatch.canary import runner
    from tpuwatch.canary.collector import CanaryCollector

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state")}))
    collector = CanaryCollector(config_module.load(str(path)))
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(collector.run_once(inject="hang")))
    thread.start()
    try:
        wait_until(lambda: any(hanging(group) for group in list(runner._running)), timeout=60,
                   what="the hang drill's worker")
        runner.kill_running_workers()  # what the daemon does when it stops
    finally:
        thread.join(60)
    [result] = results
    assert (result.status, result.reason, result.devices) == ("skipped", runner.STOPPED, ())
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # no "worker crashed with SIGKILL"
    assert not runner._running and not runner._stopped
