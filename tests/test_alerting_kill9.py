"""kill -9 during delivery, again and again (issue #14 item 8): a real daemon on simulated chips with a fault,
its kernel log a file that gains one new (composed) critical event per run, a real receiver that fails now and
then; every run is killed at a seeded random moment after its event became an alert, and restarted on the same
state_dir.  Every firing alert reaches the receiver, at least once and, when repeated, under the same
notification id; the outbox ends empty."""

from __future__ import annotations

import random
import signal
import sqlite3
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import requests

from conftest import SIM_FAST, DaemonProcess, wait_until, write_selftest_rule

RUNS = 8
SEED = 14
TAG = "tpuwatch-kill9-selftest"  # the composed rule's marker: a line no driver writes


def test_kill_9_at_random_points_during_delivery_loses_nothing(tmp_path: Path, receivers: Any) -> None:
    rng = random.Random(SEED)
    hook = receivers()
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("")
    workdir = tmp_path / "daemon"
    workdir.mkdir()
    config = {**SIM_FAST, "state_dir": str(tmp_path / "state"),
              "kernel_log": {"source": "file", "path": str(kernel_log),
                             "rules_dirs": [write_selftest_rule(tmp_path / "rules.d", TAG)]},
              "devices": {"sim": {"count": RUNS, "fault_device": 0, "fault_after": "0s"}},
              "alerting": {"group_wait": "0s", "group_interval": "1s", "retry_initial": "20ms",
                           "retry_max": "200ms", "breaker_reset": "300ms"},
              "notify": [{"name": "oncall", "type": "webhook", "url": hook.url()}]}

    def alert_on(daemon: DaemonProcess, device: str) -> bool:
        alerts = requests.get(f"{daemon.url}/api/alerts", timeout=2).json()["alerts"]
        return any(a["labels"]["alertname"] == "KernelHardwareErrorCritical" and a["labels"]["device"] == device
                   for a in alerts)

    kills = []
    for run in range(RUNS):
        hook.mode = "error" if rng.random() < 0.4 else "record"
        daemon = DaemonProcess(workdir, config, args=["--simulate", "ecc-errors"])
        try:
            daemon.wait_ready()
            wait_until(lambda: 'collector="kernel_log"} 1.0' in requests.get(f"{daemon.url}/metrics", timeout=2).text,
                       10, "the kernel log collector")
            with open(kernel_log, "a") as log:
                log.write(f"Dec  1 12:00:0{run} host kernel: {TAG}: device 0000:{0x10 + run:02x}:00.0 failed\n")
            wait_until(lambda: alert_on(daemon, str(run)), 10, f"run {run}'s event to become an alert")
            delay = rng.uniform(0.0, 0.4)
            kills.append((run, hook.mode, round(delay, 3)))
            time.sleep(delay)  # the random point of the kill, not a wait for something
            daemon.proc.send_signal(signal.SIGKILL)
            daemon.proc.wait(timeout=10)
        finally:
            daemon.stop()
    hook.mode = "record"
    final = DaemonProcess(workdir, config, args=["--simulate", "ecc-errors"])
    try:
        final.wait_ready()
        state = tmp_path / "state" / "simulated" / "alerting.db"  # simulated chips keep their state apart

        def outbox() -> int:
            with sqlite3.connect(state) as conn:
                return conn.execute("SELECT COUNT(*) FROM outbox").fetchone()[0]

        firing = {(a["labels"]["alertname"], a["labels"].get("device", ""))
                  for a in requests.get(f"{final.url}/api/alerts", timeout=5).json()["alerts"]
                  if a["state"] == "firing" and not a["inhibited"]}
        assert {("KernelHardwareErrorCritical", str(run)) for run in range(RUNS)} | {
            ("AcceleratorEccUncorrectable", "0")} <= firing, kills

        def told() -> set[tuple[str, str]]:
            return {(a["labels"]["alertname"], a["labels"].get("device", "")) for body in hook.json()
                    for a in body["alerts"] if a["status"] == "firing"}

        wait_until(lambda: firing <= told() and outbox() == 0, 20, f"every alert delivered (kills: {kills})")
    finally:
        final.stop()
    # Repeats are the documented at-least-once case only: the same notification again, under its id.
    ids: dict[str, set[str]] = defaultdict(set)
    for request, body in zip(hook.requests, hook.json(), strict=True):
        ids[body["groupKey"]].add(request["headers"]["X-Tpuwatch-Notification-Id"])
    assert all(len(keys) == 1 for keys in ids.values()), (dict(ids), kills)
    assert not any(b["status"] == "resolved" for b in hook.json()), kills
