"""Real `tpuwatch run` daemons on broken state: a read-only state_dir, a real tmpfs filled while running, corrupt
files, kill -9 during delivery, a second daemon on the same state_dir, simulated runs beside real ones.  Each time
the daemon stays up, /healthz says degraded with the reason, and the next real event is counted and delivered."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from tpuwatch.alerting.db import DB_NAME

from conftest import SIM_FAST, DaemonProcess, Tmpfs, run_cli, wait_until, write_selftest_rule
from http_receiver import Receiver

TAG = "tpuwatch-state"
FAST_ALERTS = {"group_wait": "0s", "group_interval": "1s", "retry_initial": "50ms", "retry_max": "200ms",
               "send_timeout": "1s"}


def metric(daemon: DaemonProcess, name: str) -> float | None:
    for line in requests.get(f"{daemon.url}/metrics", timeout=5).text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def health(daemon: DaemonProcess) -> tuple[int, dict[str, Any]]:
    response = requests.get(f"{daemon.url}/healthz", timeout=5)
    return response.status_code, response.json()


def kernel_config(tmp_path: Path, hook: Receiver, state_dir: Path, **extra: Any) -> dict[str, Any]:
    """Simulated chips, a followed kernel log whose selftest rule pages through ``hook``."""
    log = tmp_path / "kern.log"
    log.touch()
    rules = write_selftest_rule(tmp_path / "rules.d", TAG)
    return {**SIM_FAST, "state_dir": str(state_dir), "alerting": FAST_ALERTS,
            "kernel_log": {"source": "file", "path": str(log), "rules_dirs": [rules]},
            "devices": {"backend": "sim", "sim": {"count": 8}},
            "notify": [{"name": "hook", "type": "webhook", "url": hook.url()}], **extra}


def kernel_event(tmp_path: Path, device: int) -> None:
    """A critical kernel line about simulated chip ``device`` (pci 0000:1N:00.0)."""
    with open(tmp_path / "kern.log", "a") as handle:
        handle.write(f"{TAG}: device 0000:1{device}:00.0 failed\n")


def delivered_devices(hook: Receiver, since: int = 0) -> set[str]:
    """The chips of the kernel-error pages ``hook`` received (after its first ``since`` requests)."""
    return {a["labels"].get("device", "") for body in hook.json()[since:] for a in body["alerts"]
            if a["labels"]["alertname"] == "KernelHardwareErrorCritical" and a["status"] == "firing"}


def counted(daemon: DaemonProcess, device: int) -> bool:
    name = f'tpuwatch_kernel_events_total{{device="{device}",rule="selftest",severity="critical"}}'
    return metric(daemon, name) == 1.0


def test_a_read_only_state_dir_degrades_but_monitors_and_persists_again_once_writable(
        start_daemon: Callable[..., DaemonProcess], tmpfs: Callable[..., Tmpfs], receivers: Any,
        tmp_path: Path) -> None:
    fs, hook = tmpfs(), receivers()
    state = fs.path / "state"
    config = kernel_config(tmp_path, hook, fs.path / "state")
    first = start_daemon(config)  # a good state from an earlier run
    first.wait_ready()
    assert first.stop() == 0
    fs.remount("ro")
    daemon = start_daemon(config)
    daemon.wait_ready()
    status, report = health(daemon)
    assert status == 200 and report["status"] == "degraded"
    assert report["checks"]["state"]["reason"] == "Read-only file system"
    assert report["checks"]["state"]["alerting_db"] == "memory"
    assert any("cannot be written (Read-only file system)" in w for w in report["warnings"])
    assert metric(daemon, "tpuwatch_state_writable") == 0.0
    kernel_event(tmp_path, 3)
    wait_until(lambda: counted(daemon, 3), what="the kernel event to be counted")
    wait_until(lambda: "3" in delivered_devices(hook), timeout=20, what="its page")

    fs.remount("rw")
    wait_until(lambda: metric(daemon, "tpuwatch_state_writable") == 1.0, timeout=20, what="persisting again")
    wait_until(lambda: health(daemon)[1]["status"] == "healthy", what="healthy again")
    assert daemon.stop() == 0
    log = daemon.log()
    assert log.count("cannot be written") == 1 and log.count("can be written again") == 1
    assert "Traceback" not in log
    conn = sqlite3.connect(state / "simulated" / DB_NAME)  # what memory held went to the file
    labels = [json.loads(row[0]) for row in conn.execute("SELECT labels FROM alerts")]
    conn.close()
    assert {"alertname": "KernelHardwareErrorCritical", "device": "3"}.items() <= \
        next(x for x in labels if x.get("device") == "3").items()


def test_a_tmpfs_filled_while_running_degrades_and_the_next_event_is_still_delivered(
        start_daemon: Callable[..., DaemonProcess], tmpfs: Callable[..., Tmpfs], receivers: Any,
        tmp_path: Path) -> None:
    fs, hook = tmpfs(size="3m"), receivers()
    daemon = start_daemon(kernel_config(tmp_path, hook, fs.path / "state"))
    daemon.wait_ready()
    kernel_event(tmp_path, 1)
    wait_until(lambda: "1" in delivered_devices(hook), timeout=20, what="a page while the disk has room")
    assert metric(daemon, "tpuwatch_state_writable") == 1.0
    filler = fs.fill()
    wait_until(lambda: metric(daemon, "tpuwatch_state_writable") == 0.0, timeout=20, what="the full disk noticed")
    status, report = health(daemon)
    assert status == 200 and report["status"] == "degraded" and "No space left" in report["checks"]["state"]["reason"]
    kernel_event(tmp_path, 2)
    wait_until(lambda: counted(daemon, 2), what="the kernel event counted on a full disk")
    wait_until(lambda: "2" in delivered_devices(hook), timeout=20, what="its page on a full disk")

    filler.unlink()
    wait_until(lambda: metric(daemon, "tpuwatch_state_writable") == 1.0, timeout=20, what="persisting again")
    kernel_event(tmp_path, 4)
    wait_until(lambda: "4" in delivered_devices(hook), timeout=20, what="a page after the disk freed up")
    assert daemon.proc.poll() is None and daemon.stop() == 0
    log = daemon.log()
    assert log.count("cannot be written") == 1 and log.count("can be written again") == 1
    assert "Traceback" not in log


def test_corrupt_state_files_at_start_are_moved_aside_or_ignored(
        start_daemon: Callable[..., DaemonProcess], receivers: Any, tmp_path: Path) -> None:
    hook = receivers()
    state = tmp_path / "state"
    real = {**kernel_config(tmp_path, hook, state), "devices": {"backend": "none"}}
    (state / "kernel_log").mkdir(parents=True)
    (state / DB_NAME).write_bytes(os.urandom(20_000))
    (state / f"{DB_NAME}-wal").write_bytes(os.urandom(5000))
    (state / f"{DB_NAME}-shm").write_bytes(os.urandom(5000))
    (state / "trend.json").write_text('{"version": 1, "saved_at": "yesterday", "leaks": 5}')
    (state / "kernel_log" / "file.json").write_text(json.dumps({"path": "x", "dev": 1, "ino": 2,
                                                                "offset": -10**20}))
    daemon = start_daemon(real)
    daemon.wait_ready()
    status, report = health(daemon)
    assert status == 200 and report["status"] == "degraded"
    assert metric(daemon, "tpuwatch_state_writable") == 1.0
    files = {d["file"] for d in report["checks"]["state"]["discarded"]}
    assert files == {str(state / DB_NAME), str(state / "trend.json"), str(state / "kernel_log" / "file.json")}
    text = requests.get(f"{daemon.url}/metrics", timeout=5).text
    assert 'tpuwatch_state_files_discarded_total{file="alerting.db"} 1.0' in text
    assert 'tpuwatch_state_files_discarded_total{file="kernel_log/file.json"} 1.0' in text
    moved = sorted(p.name for p in state.iterdir() if ".corrupt-" in p.name)
    assert moved[0].startswith(f"{DB_NAME}.corrupt-") and moved[0].endswith("Z")  # with what is left of -wal, -shm
    kernel_event(tmp_path, 5)  # no chips here: the event is not attributed, and still pages
    wait_until(lambda: "" in delivered_devices(hook), timeout=20, what="the page")
    assert "Traceback" not in daemon.log()


def test_a_second_daemon_on_the_same_state_dir_exits_2_naming_the_first(
        start_daemon: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = start_daemon({**SIM_FAST, "state_dir": str(state)})
    first.wait_ready()
    second = start_daemon({**SIM_FAST, "state_dir": str(state)})
    assert second.proc.wait(timeout=30) == 2
    [line] = [line for line in second.log().splitlines() if "cannot start" in line]
    assert line.endswith(f"cannot start: state_dir {state / 'simulated'}: in use by pid {first.proc.pid}")
    assert "Traceback" not in second.log()
    first.proc.send_signal(signal.SIGKILL)  # no clean exit, no stale lock
    first.proc.wait()
    third = start_daemon({**SIM_FAST, "state_dir": str(state)})
    third.wait_ready()


def test_kill_9_during_delivery_loses_nothing(start_daemon: Callable[..., DaemonProcess], receivers: Any,
                                              tmp_path: Path) -> None:
    hook = receivers()
    config = kernel_config(tmp_path, hook, tmp_path / "state")
    rng = random.Random(14)
    for device in range(6):
        # Even rounds: the receiver holds the POST, so the kill lands while a message is claimed and in flight;
        # odd rounds: it answers, and the kill lands at a random moment of queueing, posting or acknowledging.
        hook.mode = "hang" if device % 2 == 0 else "record"
        attempts = hook.attempts
        daemon = start_daemon(config)
        daemon.wait_ready()
        kernel_event(tmp_path, device)

        def firing(device: int = device) -> bool:
            alerts = requests.get(f"{daemon.url}/api/alerts", timeout=5).json()["alerts"]
            return any(a["labels"].get("device") == str(device) and a["state"] == "firing" for a in alerts)

        wait_until(firing, timeout=20, what=f"the alert on device {device}")
        if hook.mode == "hang":
            wait_until(lambda attempts=attempts: hook.attempts > attempts, timeout=20, what="a delivery in flight")
        else:
            time.sleep(rng.uniform(0.0, 0.4))
        daemon.proc.send_signal(signal.SIGKILL)
        daemon.proc.wait()
        assert "Traceback" not in daemon.log()
    hook.mode = "record"
    hook.release.set()
    last = start_daemon(config)
    last.wait_ready()
    wait_until(lambda: delivered_devices(hook) >= {str(d) for d in range(6)}, timeout=30,
               what="every page, after the kills")
    assert not any(".corrupt-" in p.name for p in (tmp_path / "state" / "simulated").iterdir())
    assert "Traceback" not in last.log() and health(last)[1]["status"] == "healthy"


def test_a_state_dir_that_cannot_be_made_still_runs_in_memory(start_daemon: Callable[..., DaemonProcess],
                                                              tmpfs: Callable[..., Tmpfs], receivers: Any,
                                                              tmp_path: Path) -> None:
    fs, hook = tmpfs(), receivers()
    fs.remount("ro")
    daemon = start_daemon(kernel_config(tmp_path, hook, fs.path / "var" / "lib" / "tpuwatch"))
    daemon.wait_ready()
    status, report = health(daemon)
    assert status == 200 and report["status"] == "degraded"
    assert "no lock keeps a second daemon off it" in daemon.log()
    kernel_event(tmp_path, 6)
    wait_until(lambda: "6" in delivered_devices(hook), timeout=20, what="the page")


def test_config_check_and_check_say_when_the_state_dir_cannot_be_written(tmpfs: Callable[..., Tmpfs],
                                                                         tmp_path: Path) -> None:
    fs = tmpfs()
    fs.remount("ro")
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {fs.path}/state\nkernel_log: {{source: none}}\ndevices: {{backend: sim}}\n")
    result = run_cli("config", "check", "--config", str(config))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (f"tpuwatch: config error: state_dir: {fs.path}/state/simulated cannot be written: "
                             f"Read-only file system ({fs.path}) (the daemon would run, keeping its state in "
                             "memory only)\n")
    check = run_cli("check", "--json", "--config", str(config))
    assert check.returncode == 0
    assert json.loads(check.stdout)["warnings"] == [
        f"state_dir {fs.path}/state/simulated cannot be written (Read-only file system ({fs.path})): "
        "a daemon would keep its state in memory only"]


def test_a_simulated_run_leaves_the_real_daemon_nothing(start_daemon: Callable[..., DaemonProcess],
                                                        receivers: Any, tmp_path: Path) -> None:
    hook = receivers()
    state = tmp_path / "state"
    sim = start_daemon({**SIM_FAST, "state_dir": str(state), "alerting": FAST_ALERTS,
                        "notify": [{"name": "hook", "type": "webhook", "url": hook.url()}],
                        "devices": {"sim": {"count": 4, "fault_device": 2, "fault_after": "1s"}}},
                       args=["--simulate", "ecc-errors"])
    sim.wait_ready()
    wait_until(lambda: any(a["labels"]["alertname"] == "AcceleratorEccUncorrectable"
                           for body in hook.json() for a in body["alerts"]), timeout=20, what="the simulated page")
    assert sim.stop() == 0
    assert sorted(os.listdir(state)) == ["simulated"]  # nothing of the drill where the real daemon looks
    before = {p.name: p.stat().st_mtime_ns for p in (state / "simulated").iterdir()}
    sent = len(hook.requests)

    real = start_daemon({**SIM_FAST, "state_dir": str(state), "alerting": FAST_ALERTS,
                         "notify": [{"name": "hook", "type": "webhook", "url": hook.url()}],
                         "devices": {"backend": "none"}})
    real.wait_ready()
    assert requests.get(f"{real.url}/api/alerts", timeout=5).json()["alerts"] == []
    real.write_config({**SIM_FAST, "listen": f"127.0.0.1:{real.port}", "state_dir": str(state)})  # sim by reload
    real.signal(signal.SIGHUP)
    wait_until(lambda: "reload refused" in real.log(), what="the refusal")
    assert "devices.backend: switching between simulated and real chips needs a restart" in real.log()
    assert real.stop() == 0
    assert len(hook.requests) == sent
    assert {p.name: p.stat().st_mtime_ns for p in (state / "simulated").iterdir()} == before
    assert (state / DB_NAME).exists() and (state / "lock").exists()


def test_fuzzed_state_files_never_stop_a_real_daemon(start_daemon: Callable[..., DaemonProcess], receivers: Any,
                                                     tmp_path: Path) -> None:
    """Every state file a daemon on real chips reads, broken at once, a few rounds (the 1,000-case runs of each
    file are in-process: test_state_fuzz)."""
    import numpy as np
    from test_state_fuzz import TABLES, _good_alerting_db
    from test_trend_state import START, STEP, feed

    from tpuwatch.analysis.trend import TrendAnalyzer
    from tpuwatch.config import TrendConfig

    import statefuzz

    hook = receivers()
    state = tmp_path / "state"
    config = {**kernel_config(tmp_path, hook, state), "devices": {"backend": "none"}}
    good_db = statefuzz.sqlite_files(_good_alerting_db, tmp_path)
    trend = TrendAnalyzer(TrendConfig())
    feed(trend, np.arange(START, START + 600, STEP), seed=7)
    log = tmp_path / "kern.log"
    good_position = {"path": str(log), "dev": log.stat().st_dev, "ino": log.stat().st_ino, "offset": 0}
    rng = random.Random(f"{statefuzz.SEED}:daemon")
    dbs = statefuzz.sqlite_cases(good_db, rng, tmp_path, TABLES)
    trends = statefuzz.json_cases(trend.snapshot(time.time() - 60), rng)
    positions = statefuzz.json_cases(good_position, rng)
    for round_ in range(int(os.environ.get("TPUWATCH_FUZZ_DAEMONS", "4"))):
        (state / "kernel_log").mkdir(parents=True, exist_ok=True)
        names, files = next(dbs)
        for suffix, data in files.items():
            target = state / f"{DB_NAME}{suffix}"
            target.unlink(missing_ok=True)
            if data is not None:
                target.write_bytes(data)
        trend_case, trend_data = next(trends)
        (state / "trend.json").write_bytes(trend_data)
        position_case, position_data = next(positions)
        (state / "kernel_log" / "file.json").write_bytes(position_data)
        what = f"round {round_}: db {names}; trend {trend_case}; position {position_case}"
        daemon = start_daemon(config)
        daemon.wait_ready()
        assert health(daemon)[0] == 200, what
        before = len(hook.requests)
        kernel_event(tmp_path, round_)
        wait_until(lambda: "" in delivered_devices(hook, before), timeout=20, what=what)
        assert daemon.stop() == 0 and "Traceback" not in daemon.log(), what
