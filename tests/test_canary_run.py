"""The canary end to end: real worker subprocesses running jax on four CPU devices.

jax is imported only by those subprocesses; without jax installed these tests skip.  Hangs, interrupts and
parent deaths are in test_canary_interrupt.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax not installed")

FOUR_CPUS = "--xla_force_host_platform_device_count=4"
MODEL_ONLY = {"checks": ["model"]}  # the reference model alone: these tests are about the canary's frame and history


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One state dir for the module: its compile cache stays warm across the runs."""
    return tmp_path_factory.mktemp("canary-state")


def canary(tmp_path: Path, state_dir: Path, *args: str, config: dict[str, Any] | None = None,
           env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`tpuwatch canary` as a subprocess, with XLA giving it four CPU devices (the reference model only, unless
    ``config`` says otherwise: test_canary_suite.py runs the whole suite)."""
    path = tmp_path / "config.yaml"
    config = config or {}
    path.write_text(yaml.safe_dump({"state_dir": str(state_dir), **config,
                                    "canary": {**MODEL_ONLY, **config.get("canary", {})}}))
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


@pytest.mark.parametrize("kind, checks", [("bitflip", ["peers", "history"]), ("scale", ["peers", "history"]),
                                          ("nan", ["reference", "peers", "history"])])
def test_each_wrong_number_drill_is_caught_on_its_chip_only_and_leaves_the_history(
        tmp_path: Path, state_dir: Path, kind: str, checks: list[str]) -> None:
    assert canary(tmp_path, state_dir).returncode == 0  # the chips' honest fingerprints are on record
    history = (state_dir / "canary" / "fingerprints.json").read_bytes()
    proc = canary(tmp_path, state_dir, "--json", "--inject", kind, "--inject-device", "2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    data = report(proc)
    assert statuses(data) == {"0": "pass", "1": "pass", "2": "fail", "3": "pass"}
    assert data["devices"][2]["check"] == checks[0]
    assert data["reason"].startswith("device 2: ")
    assert data["drill"] == {"kind": kind, "device": "2", "caught": True, "checks": checks,
                             "reason": f"caught by {', '.join(checks)}"}
    assert (state_dir / "canary" / "fingerprints.json").read_bytes() == history


def test_a_drill_on_a_lone_fresh_chip_is_undetectable_and_never_poisons_the_next_honest_run(tmp_path: Path) -> None:
    state = tmp_path / "fresh"
    one_cpu = {"XLA_FLAGS": ""}
    proc = canary(tmp_path, state, "--json", "--inject", "bitflip", env=one_cpu)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    data = report(proc)
    assert (data["status"], statuses(data)) == ("undetected", {"0": "pass"})
    assert data["reason"].startswith("not detectable here: bitflip on device 0 stays inside the reference tolerance")
    assert not (state / "canary" / "fingerprints.json").exists()
    honest = canary(tmp_path, state, "--json", env=one_cpu)
    assert honest.returncode == 0, honest.stdout
    clean = report(honest)["devices"][0]["fingerprint"]
    assert list(json.loads((state / "canary" / "fingerprints.json").read_text())["state"].values()) == [{"0": clean}]
    # Now the chip's history catches the same drill.
    drill = canary(tmp_path, state, "--inject", "bitflip", env=one_cpu)
    assert drill.returncode == 1
    assert "drill: bitflip on device 0 caught by history; the fingerprint history was left as it was" in drill.stdout
    assert canary(tmp_path, state, env=one_cpu).returncode == 0


def test_reset_history_says_what_it_removed(tmp_path: Path) -> None:
    state = tmp_path / "reset"
    assert canary(tmp_path, state).returncode == 0
    fingerprint = json.loads((state / "canary" / "fingerprints.json").read_text())["state"]
    (key, devices), = fingerprint.items()
    proc = canary(tmp_path, state, "--reset-history", "2")
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == (f"canary: removed 1 fingerprint(s) from {state / 'canary' / 'fingerprints.json'}:\n"
                           f"  device 2: {devices['2']} ({key})\n")
    assert set(json.loads((state / "canary" / "fingerprints.json").read_text())["state"][key]) == {"0", "1", "3"}
    proc = canary(tmp_path, state, "--reset-history", "--json")
    assert proc.returncode == 0
    assert [r["device"] for r in report(proc)["removed"]] == ["0", "1", "3"]
    assert not (state / "canary" / "fingerprints.json").exists()
    assert canary(tmp_path, state, "--reset-history").stdout.startswith("canary: nothing to remove in ")


def test_an_unusable_history_is_reported_replaced_by_the_run_and_removed_by_reset(tmp_path: Path) -> None:
    path = tmp_path / "broken" / "canary" / "fingerprints.json"
    path.parent.mkdir(parents=True)
    path.write_text("{truncated")
    proc = canary(tmp_path, tmp_path / "broken", "--json")
    assert proc.returncode == 0 and report(proc)["status"] == "pass"
    assert f"ignoring unusable canary fingerprint history file {path}: not JSON" in proc.stderr
    assert "Traceback" not in proc.stderr
    fingerprints = {d["fingerprint"] for d in report(proc)["devices"]}
    assert {fp for devices in json.loads(path.read_text())["state"].values() for fp in devices.values()} == fingerprints
    path.write_text("{truncated")
    proc = canary(tmp_path, tmp_path / "broken", "--reset-history")
    assert proc.stdout.startswith(f"canary: removed {path}, which could not be used: not JSON: ")
    assert not path.exists()


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
        (device / "device").write_text("0x0063\n")  # v5e
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
    (("--inject", "melt"), "unknown fault class 'melt' (one of matmul, transcendental, memory, collective, nan, "
                           "slow, bitflip, scale, hang, crash)"),
    (("--inject", "matmul:bits=99"), "matmul: want 1 <= bits <= 22, 0 <= pattern < 2**bits, 0 <= flip <= 30"),
    (("--inject", "slow:speed=2"), "slow: unknown parameter 'speed' (known: p, seed, factor)"),
    (("--reset-history", "x1"), "'x1' is not a device index or 'all'"),
    (("--reset-history", "--inject", "nan"), "--reset-history runs nothing: no --inject or --timeout with it"),
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


def test_the_daemon_s_drill_never_writes_the_history(tmp_path: Path) -> None:
    from tpuwatch.canary.collector import CanaryCollector
    from tpuwatch.config import Config

    collector = CanaryCollector(Config(state_dir=str(tmp_path / "drill")))
    result = collector.run_once(inject="scale", inject_device=1, env={"XLA_FLAGS": FOUR_CPUS})  # the sdc scenario
    assert (result.status, result.drill.caught, result.drill.checks) == ("fail", True, ("peers",))
    assert not (tmp_path / "drill" / "canary" / "fingerprints.json").exists()
