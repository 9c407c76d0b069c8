"""End to end: a daemon, and a separate JAX job on 4 host CPU devices holding the 4 simulated chips' device files.

The job runs tpuwatch.probe in its loop (tests/probejob.py); its reports cross the daemon's real socket and
checks.  An injected fault on the job's chip 2 pages CanaryWrongResult on chip 2 naming the job's process;
a healthy job raises nothing; a process that does not hold chip 2 cannot report about it.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from test_jobreports_message import report

from tpuwatch.probe.channel import exchange

from conftest import SIM_FAST, DaemonProcess, stop_process, wait_until

pytestmark = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="the canary extra (jax) is missing")
JOB = Path(__file__).with_name("probejob.py")
EVERY_S = 1.0


@pytest.fixture
def chips(tmp_path: Path) -> Path:
    dev = tmp_path / "dev"
    dev.mkdir()
    for chip in range(4):
        (dev / f"accel{chip}").touch()
    return dev


@pytest.fixture
def daemon(start_daemon: Callable[..., DaemonProcess], chips: Path) -> DaemonProcess:
    started = start_daemon({**SIM_FAST, "devices": {"backend": "sim", "sim": {"count": 4, "device_dir": str(chips)}}})
    started.wait_ready()
    # A first cycle may be sampled with the chips' read past its deadline (a busy host): no inventory yet, and a
    # report would be refused as unknown_chip.  The chips are known once their readings are stored.
    wait_until(lambda: all(f'tpuwatch_device_up{{device="{d}"}}' in metrics(started) for d in "0123"), timeout=30,
               what="the four simulated chips in the daemon's inventory")
    return started


@pytest.fixture
def jobs() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(daemon: DaemonProcess, chips: Path, *options: str) -> subprocess.Popen[bytes]:
        command = [sys.executable, str(JOB), "hold", "--socket", str(daemon.workdir / "probe.sock"),
                   "--every", str(EVERY_S), "--hold", *(str(chips / f"accel{c}") for c in range(4)), *options]
        started.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        return started[-1]

    yield start
    for job in started:
        stop_process(job)


def metrics(daemon: DaemonProcess) -> dict[str, float]:
    out = {}
    for line in requests.get(f"{daemon.url}/metrics", timeout=5).text.splitlines():
        if line.startswith("tpuwatch_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def canary_alerts(daemon: DaemonProcess) -> list[dict[str, str]]:
    alerts = requests.get(f"{daemon.url}/api/alerts", timeout=5).json()["alerts"]
    return [{**a["labels"], "summary": a["annotations"]["summary"]} for a in alerts
            if a["labels"]["alertname"].startswith("Canary")]


def test_a_fault_injected_in_the_job_pages_its_chip_naming_the_job(
        daemon: DaemonProcess, chips: Path, jobs: Callable[..., subprocess.Popen[bytes]]) -> None:
    healthy = jobs(daemon, chips)
    wait_until(lambda: metrics(daemon).get("tpuwatch_probe_reports_total", 0) >= 3, timeout=90,
               what="three reports from the healthy job")
    found = metrics(daemon)
    assert [found[f'tpuwatch_canary_healthy{{device="{d}"}}'] for d in "0123"] == [1, 1, 1, 1]
    assert canary_alerts(daemon) == []
    stop_process(healthy)
    before = metrics(daemon)["tpuwatch_probe_reports_total"]

    faulty = jobs(daemon, chips, "--inject", "bitflip@2")
    first = wait_until(lambda: canary_alerts(daemon), timeout=90, what="a canary alert from the faulty job")
    reports = metrics(daemon)["tpuwatch_probe_reports_total"] - before
    assert reports <= 2, f"paged after {reports:g} reports of the faulty job, not within one probe period"
    wrong = [a for a in first if a["alertname"] == "CanaryWrongResult"] or wait_until(
        lambda: [a for a in canary_alerts(daemon) if a["alertname"] == "CanaryWrongResult"], timeout=10,
        what="CanaryWrongResult")
    assert [(a["device"], a["pid"], a["path"]) for a in wrong] == [("2", str(faulty.pid), "job")]
    assert f"in process {faulty.pid} (python" in wrong[0]["summary"]
    assert {a["device"] for a in canary_alerts(daemon)} == {"2"}
    page = requests.get(f"{daemon.url}/api/status", timeout=5).json()
    assert json.dumps(page)  # the status page's document still builds with job-path runs in it


def test_a_process_that_does_not_hold_chip_2_cannot_report_about_it(
        daemon: DaemonProcess, chips: Path) -> None:
    about_2: dict[str, Any] = report(named_by="env", results=[{**report()["results"][0], "device": "2",
                                                               "finite": False, "max_abs_error": None}])
    with open(chips / "accel0"):  # this process holds chip 0 only
        answer = exchange(str(daemon.workdir / "probe.sock"), about_2)
    assert answer["accepted"] is False and answer["reason"] == "not_holder"
    wait_until(lambda: metrics(daemon)['tpuwatch_probe_reports_rejected_total{reason="not_holder"}'] == 1,
               what="the refusal counted on /metrics")
    assert canary_alerts(daemon) == [] and metrics(daemon)["tpuwatch_probe_reports_total"] == 0


def test_the_probe_sdc_drill_pages_its_chip_naming_its_simulated_job(
        start_daemon: Callable[..., DaemonProcess]) -> None:
    drill = start_daemon({**SIM_FAST, "devices": {"sim": {"count": 4, "fault_device": 3, "fault_after": "0s"}}},
                         args=["--simulate", "probe-sdc"])
    drill.wait_ready()
    wrong = wait_until(lambda: [a for a in canary_alerts(drill) if a["alertname"] == "CanaryWrongResult"],
                       timeout=90, what="CanaryWrongResult from the simulated job")
    assert [(a["device"], a["path"]) for a in wrong] == [("3", "job")]
    job = int(wrong[0]["pid"])
    assert Path(f"/proc/{job}/cmdline").read_bytes().split(b"\0")[1:3] == [b"-m", b"tpuwatch.probe.drill"]
    drill.stop()
    wait_until(lambda: not Path(f"/proc/{job}").exists(), what="the simulated job gone with the daemon")
