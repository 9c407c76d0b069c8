"""The canary end to end: real worker subprocesses running jax on four CPU devices.

jax is imported only by those subprocesses; without jax installed these tests skip.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import wait_until

pytestmark = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax not installed")

FOUR_CPUS = "--xla_force_host_platform_device_count=4"


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One state dir for the module: its compile cache stays warm across the runs."""
    return tmp_path_factory.mktemp("canary-state")


def canary(tmp_path: Path, state_dir: Path, *args: str, config: dict[str, Any] | None = None,
           env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`tpuwatch canary` as a subprocess, with XLA giving it four CPU devices."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"state_dir": str(state_dir), **(config or {})}))
    return subprocess.run([sys.executable, "-m", "tpuwatch", "canary", "--config", str(path), *args],
                          check=False, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "XLA_FLAGS": FOUR_CPUS, **(env or {})})


def report(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    return json.loads(proc.stdout)


def statuses(data: dict[str, Any]) -> dict[str, str]:
    return {d["device"]: d["status"] for d in data["devices"]}


def test_clean_run_passes_on_four_devices(tmp_path: Path, state_dir: Path) -> None:
    proc = canary(tmp_path, state_dir, "--json")
    assert proc.returncode == 0, proc.stderr
    data = report(proc)
    assert (data["status"], data["reason"], data["platform"]) == ("pass", None, "cpu")
    assert statuses(data) == {"0": "pass", "1": "pass", "2": "pass", "3": "pass"}
    assert len({d["fingerprint"] for d in data["devices"]}) == 1
    for device in data["devices"]:
        assert set(device) >= {"device", "status", "max_abs_error", "fingerprint", "duration_seconds", "reason"}
        assert 0 < device["max_abs_error"] < data["tolerance"] and device["duration_seconds"] > 0
    assert (state_dir / "canary" / "fingerprints.json").exists()
    assert any((state_dir / "canary" / "jax-cache").iterdir())


def test_readable_report(tmp_path: Path, state_dir: Path) -> None:
    proc = canary(tmp_path, state_dir)
    assert proc.returncode == 0
    assert proc.stdout.startswith("canary: PASS\nchip: cpu (cpu); stack: jax ")
    assert "DEVICE  STATUS  MAX ABS ERR  FINGERPRINT       TIME ms" in proc.stdout


@pytest.mark.parametrize("kind, check", [("bitflip", "peers"), ("scale", "peers"), ("nan", "reference")])
def test_each_wrong_number_injection_fails_only_its_chip(tmp_path: Path, state_dir: Path, kind: str,
                                                         check: str) -> None:
    proc = canary(tmp_path, state_dir, "--json", "--inject", kind, "--inject-device", "2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    data = report(proc)
    assert statuses(data) == {"0": "pass", "1": "pass", "2": "fail", "3": "pass"}
    assert data["devices"][2]["check"] == check
    assert data["reason"].startswith("device 2: ")


def _leftovers(marker: str) -> list[int]:
    """Pids of processes whose environment carries ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and marker.encode() in Path(f"/proc/{entry}/environ").read_bytes():
                found.append(int(entry))
        except OSError:
            continue
    return found


def test_hang_ends_as_an_error_within_the_timeout_leaving_no_process(tmp_path: Path, state_dir: Path) -> None:
    marker = f"TPUWATCH_CANARY_TEST={uuid.uuid4()}"
    key, value = marker.split("=")
    started = time.monotonic()
    proc = canary(tmp_path, state_dir, "--json", "--inject", "hang", "--inject-device", "1", "--timeout", "8s",
                  env={key: value})
    assert time.monotonic() - started < 8 + 4
    assert proc.returncode == 3
    data = report(proc)
    assert data["status"] == "error" and data["reason"].startswith("timed out after 8s")
    assert statuses(data) == {"0": "pass", "1": "error", "2": "skipped", "3": "skipped"}
    # The hang waits on a child of the worker: killing the group must take both.
    wait_until(lambda: not _leftovers(marker), timeout=2, what="no canary process left")


def test_crash_names_the_signal(tmp_path: Path, state_dir: Path) -> None:
    proc = canary(tmp_path, state_dir, "--json", "--inject", "crash", "--inject-device", "3")
    assert proc.returncode == 3
    data = report(proc)
    assert data["reason"] == "worker crashed with SIGSEGV"
    assert statuses(data) == {"0": "pass", "1": "pass", "2": "pass", "3": "error"}


def _holder(code: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", code + "; print('held', flush=True); import time; "
                             "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def test_a_chip_whose_device_file_another_process_holds_is_skipped(tmp_path: Path, state_dir: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    for chip in range(4):
        (dev / f"accel{chip}").touch()
    holder = _holder(f"import fcntl; f = open({str(dev / 'accel2')!r}, 'r+'); fcntl.lockf(f, fcntl.LOCK_EX)")
    try:
        proc = canary(tmp_path, state_dir, "--json", config={"paths": {"dev": str(dev)}})
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = report(proc)
    assert statuses(data) == {"0": "pass", "1": "pass", "2": "skipped", "3": "pass"}
    assert data["devices"][2]["reason"] == f"held by pid {holder.pid} (device file open)"


def test_tpu_chips_under_another_process_lock_are_skipped_before_jax_starts(tmp_path: Path,
                                                                          state_dir: Path) -> None:
    sysfs = tmp_path / "sys"
    for slot in range(4):
        device = sysfs / "bus/pci/devices" / f"0000:00:0{slot + 4}.0"
        device.mkdir(parents=True)
        (device / "vendor").write_text("0x1ae0\n")
    lockfile = tmp_path / "libtpu_lockfile"
    lockfile.touch()
    holder = _holder(f"import fcntl; f = open({str(lockfile)!r}, 'r+'); fcntl.lockf(f, fcntl.LOCK_EX)")
    try:
        proc = canary(tmp_path, tmp_path / "state", "--json",
                      config={"paths": {"sysfs": str(sysfs)}, "canary": {"lockfile": str(lockfile)}})
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 3
    data = report(proc)
    reason = f"held by pid {holder.pid} (lock on {lockfile})"
    assert (data["status"], data["reason"], data["platform"], data["stack"]) == ("skipped", reason, "tpu", None)
    assert statuses(data) == {"0": "skipped", "1": "skipped", "2": "skipped", "3": "skipped"}
    assert not (tmp_path / "state" / "canary" / "jax-cache").exists()  # jax never started


def test_jax_that_cannot_be_imported_is_an_error(tmp_path: Path, state_dir: Path) -> None:
    broken = tmp_path / "broken"
    (broken / "jax").mkdir(parents=True)
    (broken / "jax" / "__init__.py").write_text("raise ImportError('this jax is broken')\n")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={broken}:$PYTHONPATH exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    proc = canary(tmp_path, state_dir, "--json", config={"canary": {"python": str(python)}})
    assert proc.returncode == 3
    assert report(proc)["reason"] == f"cannot import jax with {sys.executable}: this jax is broken"


def test_a_missing_interpreter_is_an_error(tmp_path: Path, state_dir: Path) -> None:
    proc = canary(tmp_path, state_dir, "--json", config={"canary": {"python": str(tmp_path / "nope")}})
    assert proc.returncode == 3
    assert report(proc)["reason"] == f"cannot start canary.python {tmp_path / 'nope'}: No such file or directory"


@pytest.mark.parametrize("args, message", [
    (("--inject-device", "1"), "tpuwatch canary: --inject-device needs --inject KIND\n"),
    (("--timeout", "soon"), "invalid duration 'soon'"),
    (("--inject", "melt"), "invalid choice: 'melt'"),
])
def test_usage_errors_exit_2_with_one_line(tmp_path: Path, state_dir: Path, args: tuple[str, ...],
                                           message: str) -> None:
    proc = canary(tmp_path, state_dir, *args)
    assert proc.returncode == 2 and proc.stdout == ""
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_the_collector_runs_the_canary_without_importing_jax(tmp_path: Path, state_dir: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from tpuwatch.canary.collector import CanaryCollector
    from tpuwatch.config import Config

    monkeypatch.setenv("XLA_FLAGS", FOUR_CPUS)
    collector = CanaryCollector(Config(state_dir=str(state_dir)))
    assert collector.run_once().status == "pass"
    assert "jax" not in sys.modules
    names = {s.name for s in collector.collect()}
    assert {"tpuwatch_canary_healthy", "tpuwatch_canary_info", "tpuwatch_canary_duration_seconds"} <= names
