"""`tpuwatch run` as a real subprocess: scrape, health, reload, signals, isolation, sd_notify."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from conftest import SIM_FAST, DaemonProcess, free_port, run_cli, wait_until, write_selftest_rule
from fakeproc import make_hanging_procfs
from http_receiver import Receiver


def metric(daemon: DaemonProcess, line_prefix: str) -> float | None:
    """Value of the first /metrics line starting with ``line_prefix``."""
    for line in requests.get(f"{daemon.url}/metrics", timeout=5).text.splitlines():
        if line.startswith(line_prefix + " ") or line.startswith(line_prefix + "{") and "}" not in line_prefix:
            return float(line.rsplit(" ", 1)[1])
    return None


def up_devices(daemon: DaemonProcess) -> set[str]:
    text = requests.get(f"{daemon.url}/metrics", timeout=5).text
    return {line.split('"')[1] for line in text.splitlines()
            if line.startswith("tpuwatch_device_up{") and line.endswith(" 1.0")}


def test_without_accelerators_it_says_so_and_serves_host_metrics(
        start_daemon: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    # A deadline that a loaded CI machine meets: this test is about what is served, not how fast.
    daemon = start_daemon({"interval": "1s", "collector_timeout": "1s",
                           "paths": {"sysfs": str(tmp_path / "empty-sysfs")}})
    daemon.wait_ready()
    assert "no accelerator" in daemon.log() and "host metrics only" in daemon.log()
    wait_until(lambda: "canary not scheduled: no accelerator" in daemon.log(), what="the canary decision")
    health = requests.get(f"{daemon.url}/healthz", timeout=5)
    assert health.status_code == 200
    report = health.json()
    assert set(report) == {"status", "uptime_seconds", "version", "checks", "warnings"}
    assert report["status"] == "healthy"
    assert report["checks"]["collector:host"]["status"] == "ok"
    assert metric(daemon, "tpuwatch_host_memory_total_bytes") > 0
    assert metric(daemon, 'tpuwatch_collector_success{collector="host"}') == 1.0
    # Counters exist at 0 before anything goes wrong, so that rate() and increase() see the first failure.
    assert metric(daemon, 'tpuwatch_collector_errors_total{collector="host",reason="timeout"}') == 0.0
    assert metric(daemon, 'tpuwatch_readings_dropped_total{collector="host",reason="nan"}') == 0.0
    assert daemon.proc.poll() is None


def test_sigterm_stops_within_five_seconds(start_daemon: Callable[..., DaemonProcess]) -> None:
    daemon = start_daemon(SIM_FAST)
    daemon.wait_ready()
    started = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.proc.wait(timeout=5) == 0
    assert time.monotonic() - started < 5
    assert "Traceback" not in daemon.log()


def test_reload_applies_a_good_config_and_refuses_a_bad_one(start_daemon: Callable[..., DaemonProcess]) -> None:
    daemon = start_daemon(SIM_FAST)
    daemon.wait_ready()
    wait_until(lambda: up_devices(daemon) == {"0", "1", "2", "3"}, what="four simulated chips")
    good = {**SIM_FAST, "listen": f"127.0.0.1:{daemon.port}", "devices": {"backend": "sim", "sim": {"count": 2}}}
    daemon.write_config(good)
    daemon.signal(signal.SIGHUP)
    wait_until(lambda: up_devices(daemon) == {"0", "1"}, what="the reload to two chips")
    wait_until(lambda: metric(daemon, "tpuwatch_config_last_reload_successful") == 1.0, what="the reload metric")

    daemon.config_path.write_text("interval: 200ms\ndevices:\n  backend: quantum\n")
    daemon.signal(signal.SIGHUP)
    wait_until(lambda: "reload refused" in daemon.log(), what="the refusal to be logged")
    assert "devices.backend: must be one of auto, " in daemon.log() and "got 'quantum'" in daemon.log()
    # /metrics shows what the last sampling cycle stored: the refusal within a cycle.
    wait_until(lambda: metric(daemon, "tpuwatch_config_last_reload_successful") == 0.0, what="the refusal metric")
    report = requests.get(f"{daemon.url}/healthz", timeout=5).json()
    assert report["checks"]["config"]["status"] == "reload_failed"
    # Said at the top level, where a glance (or a probe reading only "status") looks: degraded, and why.
    assert report["status"] == "degraded"
    (refused,) = [w for w in report["warnings"] if w.startswith("config reload refused")]
    assert "the config loaded before still runs: devices.backend: must be one of auto, " in refused
    assert "got 'quantum'" in report["checks"]["config"]["error"]
    before = metric(daemon, "tpuwatch_last_sample_timestamp_seconds")
    wait_until(lambda: metric(daemon, "tpuwatch_last_sample_timestamp_seconds") > before,
               what="sampling to go on under the old config")
    assert up_devices(daemon) == {"0", "1"}
    assert daemon.proc.poll() is None


def test_reload_keeps_simulate(start_daemon: Callable[..., DaemonProcess]) -> None:
    # The file says no devices; --simulate says simulated chips, before and after a reload.
    daemon = start_daemon({**SIM_FAST, "devices": {"backend": "none"}}, args=["--simulate", "ecc-errors"])
    daemon.wait_ready()
    wait_until(lambda: up_devices(daemon) == {"0", "1", "2", "3"}, what="four simulated chips")
    daemon.signal(signal.SIGHUP)
    wait_until(lambda: "config reloaded" in daemon.log(), what="the reload")
    before = metric(daemon, "tpuwatch_last_sample_timestamp_seconds")
    wait_until(lambda: metric(daemon, "tpuwatch_last_sample_timestamp_seconds") > before, what="a sample after it")
    assert up_devices(daemon) == {"0", "1", "2", "3"}


def test_reload_can_move_the_listen_address(start_daemon: Callable[..., DaemonProcess]) -> None:
    daemon = start_daemon(SIM_FAST)
    daemon.wait_ready()
    new_port = free_port()
    daemon.write_config({**SIM_FAST, "listen": f"127.0.0.1:{new_port}"})
    daemon.signal(signal.SIGHUP)
    wait_until(lambda: requests.get(f"http://127.0.0.1:{new_port}/healthz", timeout=2).ok, what="the new port")
    old_port, daemon.port = daemon.port, new_port

    def old_port_closed() -> bool:
        try:
            requests.get(f"http://127.0.0.1:{old_port}/healthz", timeout=2)
        except requests.ConnectionError:
            return True
        return False  # still closing (the new endpoint answers first): ask again until the deadline

    wait_until(old_port_closed, what="the old port to close")


def test_a_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "tpuwatch", "run", "--config", "/dev/stdin"],
                                input=f"listen: 127.0.0.1:{port}\ndevices: {{backend: none}}\n",
                                capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert f"listen 127.0.0.1:{port}: address already in use" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_hung_collector_stalls_neither_the_others_nor_metrics_nor_shutdown(
        start_daemon: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    procfs, dev = make_hanging_procfs(tmp_path)
    config = {**SIM_FAST, "paths": {"procfs": str(procfs), "dev": str(dev)}}
    daemon = start_daemon(config)
    daemon.wait_ready()
    wait_until(lambda: metric(daemon, 'tpuwatch_collector_errors_total{collector="host",reason="still_running"}'),
               what="the hung host collector to be counted")
    assert metric(daemon, 'tpuwatch_collector_success{collector="host"}') == 0.0
    assert metric(daemon, 'tpuwatch_collector_success{collector="devices"}') == 1.0
    before = metric(daemon, "tpuwatch_last_sample_timestamp_seconds")
    wait_until(lambda: metric(daemon, "tpuwatch_last_sample_timestamp_seconds") > before, what="sampling")
    health = requests.get(f"{daemon.url}/healthz", timeout=5)
    assert health.status_code == 503 and health.json()["checks"]["collector:host"]["status"] == "failing"
    assert daemon.log().count("collector host failed") == 1
    started = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.proc.wait(timeout=5) == 0 and time.monotonic() - started < 5


def test_simulate_shows_the_fault_on_its_chip(start_daemon: Callable[..., DaemonProcess]) -> None:
    daemon = start_daemon({**SIM_FAST, "devices": {"sim": {"fault_after": "0s", "fault_device": 2}}},
                          args=["--simulate", "ecc-errors"])
    daemon.wait_ready()
    # The first cycle's chips may have answered past its deadline on a busy host: wait for their readings.
    wait_until(lambda: metric(daemon, 'tpuwatch_device_ecc_errors_total{device="2",kind="uncorrected"}'),
               timeout=20, what="chip 2's uncorrected ECC errors")
    assert metric(daemon, 'tpuwatch_device_ecc_errors_total{device="0",kind="uncorrected"}') == 0
    problems = requests.get(f"{daemon.url}/healthz", timeout=5).json()["checks"]["devices"]["problems"]
    assert problems == [
        "device 2 (v5e, pci 0000:12:00.0): 1 uncorrectable ECC error(s) since the driver loaded"]


def test_sd_notify_protocol(start_daemon: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(str(path))
        listener.settimeout(10)
        daemon = start_daemon(SIM_FAST, env={"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "400000"})

        def next_message(containing: str) -> str:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                message = listener.recv(4096).decode()
                if containing in message.split("\n"):
                    return message
            raise AssertionError(f"no {containing} from the daemon")

        ready = next_message("READY=1")
        assert re.search(r"^STATUS=\d+/\d+ devices up, ", ready, re.M)
        # On a busy host the first cycle's chips may answer past its deadline (READY said "0/0 devices up, 1
        # problem(s)" there): the watchdog's pings carry the status of the cycles after it.
        next_message("STATUS=4/4 devices up, healthy")
        next_message("WATCHDOG=1")
        daemon.signal(signal.SIGHUP)
        reloading = next_message("RELOADING=1")
        assert "MONOTONIC_USEC=" in reloading
        next_message("READY=1")
        daemon.signal(signal.SIGTERM)
        next_message("STOPPING=1")
        assert daemon.proc.wait(timeout=5) == 0


def test_check_json_verdicts(tmp_path: Path) -> None:
    healthy, faulty = tmp_path / "healthy.yaml", tmp_path / "faulty.yaml"
    healthy.write_text("kernel_log: {source: none}\ndevices: {backend: sim, sim: {count: 2}}\n")
    faulty.write_text("kernel_log: {source: none}\ndevices: {backend: sim, sim: {count: 2, scenario: ecc-errors, "
                      "fault_after: 0s, fault_device: 1}}\n")
    result = run_cli("check", "--json", "--config", str(healthy))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["status"] == "healthy" and report["backend"] == "sim" and report["problems"] == []
    device = report["devices"][0]
    assert {"device": "0", "chip": "v5e", "pci": "0000:10:00.0", "up": True}.items() <= device.items()
    assert device["memory_total_bytes"] == 16 << 30 and 0 < device["memory_used_bytes"] < 16 << 30
    bad = run_cli("check", "--json", "--config", str(faulty))
    assert bad.returncode == 1
    assert json.loads(bad.stdout)["problems"] == [
        "device 1 (v5e, pci 0000:11:00.0): 1 uncorrectable ECC error(s) since the driver loaded"]
    table = run_cli("check", "--config", str(faulty))
    assert table.returncode == 1
    assert "DEVICE" in table.stdout and "UNHEALTHY: 1 problem(s)" in table.stdout


def test_check_reports_a_hung_collector_as_unhealthy(tmp_path: Path) -> None:
    procfs, dev = make_hanging_procfs(tmp_path)
    path = tmp_path / "c.yaml"
    path.write_text(f"collector_timeout: 300ms\ndevices: {{backend: none}}\nkernel_log: {{source: none}}\n"
                    f"paths: {{procfs: {procfs}, dev: {dev}}}\n")
    started = time.monotonic()
    result = run_cli("check", "--json", "--config", str(path))
    assert time.monotonic() - started < 10
    assert result.returncode == 1
    assert json.loads(result.stdout)["problems"] == ["collector host failed: no answer after 0.3s"]


def test_importing_tpuwatch_never_imports_jax() -> None:
    code = ("import sys, tpuwatch.cli, tpuwatch.daemon, tpuwatch.report; "
            "sys.exit(any(m == 'jax' or m.startswith('jax.') for m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="the canary extra (jax) is not installed")
def test_simulated_sdc_fails_the_canary_on_its_chip_only(start_daemon: Callable[..., DaemonProcess]) -> None:
    # find_spec, not importorskip: jax must stay out of this process (other tests check that nothing imports it).
    daemon = start_daemon({**SIM_FAST, "canary": {"enabled": True, "every": "1h", "jitter": "0s", "timeout": "60s"},
                           "devices": {"sim": {"count": 4, "fault_device": 1}}}, args=["--simulate", "sdc"])
    daemon.wait_ready()
    healthy = wait_until(lambda: {d: metric(daemon, f'tpuwatch_canary_healthy{{device="{d}"}}') for d in "0123"}
                         if metric(daemon, 'tpuwatch_canary_runs_total{path="scheduled",result="fail"}') else None,
                         timeout=60, what="the first canary run")
    assert healthy == {"0": 1.0, "1": 0.0, "2": 1.0, "3": 1.0}
    assert "drill" not in requests.get(f"{daemon.url}/healthz", timeout=5).json()["checks"]  # it ran: not blocked
    # The page names the chip.
    def wrong_results() -> list[dict[str, str]]:
        alerts = requests.get(f"{daemon.url}/api/alerts", timeout=5).json()["alerts"]
        return [a["labels"] for a in alerts if a["labels"]["alertname"] == "CanaryWrongResult"]

    wrong = wait_until(wrong_results, what="CanaryWrongResult")
    assert [labels["device"] for labels in wrong] == ["1"]


@pytest.mark.usefixtures("kmsg_ring")
def test_kernel_log_events_reach_metrics_and_healthz(start_daemon: Callable[..., DaemonProcess],
                                                    tmp_path: Path) -> None:
    if not os.access("/dev/kmsg", os.R_OK | os.W_OK):
        pytest.skip("needs root's read and write access to /dev/kmsg")
    tag = f"tpuwatch-e2e-{os.getpid()}-{time.monotonic_ns()}"
    rules = write_selftest_rule(tmp_path / "rules.d", tag)
    daemon = start_daemon({**SIM_FAST, "kernel_log": {"source": "kmsg", "rules_dirs": [rules]}})
    daemon.wait_ready()
    counter = 'tpuwatch_kernel_events_total{device="1",rule="selftest",severity="critical"}'
    wait_until(lambda: metric(daemon, 'tpuwatch_collector_success{collector="kernel_log"}') == 1.0,
               what="the kernel log collector")
    assert metric(daemon, counter) is None
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(f"<3>{tag}: device 0000:11:00.0 failed\n")
    # Attributed to simulated chip 1 by its PCI address, counted, and listed in /healthz.
    wait_until(lambda: metric(daemon, counter) == 1.0, what="the kernel event to be counted")
    events = requests.get(f"{daemon.url}/healthz", timeout=5).json()["checks"]["kernel_log"]["recent_events"]
    assert any(e["rule"] == "selftest" and e["device"] == "1" and e["pci"] == "0000:11:00.0" for e in events)


def test_logscan_command(tmp_path: Path) -> None:
    log_file = tmp_path / "dmesg.txt"
    log_file.write_text("[  5.1] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python3, GPU has fallen off the bus.\n"
                        "[  5.2] just a line\n")
    result = run_cli("logscan", "--json", str(log_file))
    assert result.returncode == 1
    assert json.loads(result.stdout)["events"][0]["rule"] == "nvidia_xid"
    bad_rules = tmp_path / "bad.yaml"
    bad_rules.write_text("rules:\n  - name: broken\n    regex: '('\n    severity: critical\n")
    broken = run_cli("logscan", "--rules", str(bad_rules), str(log_file))
    assert broken.returncode == 2 and len(broken.stderr.strip().splitlines()) == 1 and "broken" in broken.stderr


def test_analyze_command_replays_a_recorded_series() -> None:
    data = Path(__file__).parent / "testdata" / "trend"
    leak = run_cli("analyze", "--json", "--capacity", str(16 << 30), str(data / "leak.csv"))
    assert leak.returncode == 1
    (series,) = json.loads(leak.stdout)["series"]
    assert series["verdict"] == "leak" and series["first_alert_at"] is not None
    assert series["slope_bytes_per_second"] > 0 and series["exhaustion_eta_seconds"] > 0
    assert run_cli("analyze", str(data / "ok.csv")).returncode == 0
    missing = run_cli("analyze", str(data / "absent.csv"))
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1


def test_trend_analysis_runs_each_cycle(start_daemon: Callable[..., DaemonProcess]) -> None:
    daemon = start_daemon(SIM_FAST)
    daemon.wait_ready()
    wait_until(lambda: metric(daemon, 'tpuwatch_collector_success{collector="trend"}') == 1.0,
               what="the trend stage to run")


def test_a_simulated_fault_pages_through_the_webhook(start_daemon: Callable[..., DaemonProcess]) -> None:
    hook = Receiver("record")
    try:
        daemon = start_daemon({**SIM_FAST,
                               "alerting": {"group_wait": "0s", "group_interval": "1s"},
                               "notify": [{"name": "oncall", "type": "webhook", "url": hook.url()}],
                               "devices": {"sim": {"count": 4, "fault_device": 2, "fault_after": "1s"}}},
                              args=["--simulate", "ecc-errors"])
        daemon.wait_ready()

        def ecc_alert() -> dict | None:
            alerts = [a for body in hook.json() for a in body["alerts"]]
            return next((a for a in alerts if a["labels"]["alertname"] == "AcceleratorEccUncorrectable"), None)

        alert = wait_until(ecc_alert, timeout=30, what="the ECC alert at the webhook")
        assert alert["status"] == "firing" and alert["labels"]["device"] == "2"
        assert alert["labels"]["severity"] == "critical" and alert["annotations"]["summary"]
        runbook = alert["annotations"]["runbook_url"]  # the daemon's own, at its listen address
        assert runbook == f"{daemon.url}/runbooks/AcceleratorEccUncorrectable"
        page = requests.get(runbook, timeout=5)
        assert page.status_code == 200 and "uncorrectable memory errors" in page.text
        assert alert["labels"]["pci"] == "0000:12:00.0"
        listed = run_cli("alerts", "--json", "--config", str(daemon.config_path))
        assert listed.returncode == 0, listed.stderr
        assert any(a["labels"]["alertname"] == "AcceleratorEccUncorrectable"
                   for a in json.loads(listed.stdout)["alerts"])
        # /metrics is rendered at the end of the cycle that fired the alert, which its POST can overtake.
        wait_until(lambda: (metric(daemon, 'tpuwatch_alerts{alertname="AcceleratorEccUncorrectable",'
                                   'severity="critical"}') or 0) >= 1, what="the firing alert in /metrics")
    finally:
        hook.close()


def test_reloads_do_not_leak_file_descriptors(start_daemon: Callable[..., DaemonProcess]) -> None:
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("needs read access to /dev/kmsg")
    config = {**SIM_FAST, "kernel_log": {"source": "kmsg"}}
    daemon = start_daemon(config)
    daemon.wait_ready()

    def kmsg_fds() -> int:
        fd_dir = Path(f"/proc/{daemon.proc.pid}/fd")
        return sum(1 for fd in fd_dir.iterdir() if os.path.realpath(fd) == "/dev/kmsg")

    assert kmsg_fds() == 1
    for count in (2, 3, 4):  # each reload changes the sampling section, so the collectors are rebuilt
        daemon.write_config({**config, "listen": f"127.0.0.1:{daemon.port}",
                             "devices": {"backend": "sim", "sim": {"count": count}}})
        daemon.signal(signal.SIGHUP)
        wait_until(lambda: len(up_devices(daemon)) == count, what=f"the reload to {count} chips")
    # A cycle of the new collectors can be rendered before the reload closes the old ones: wait for that (a
    # leaked descriptor would stay open).
    wait_until(lambda: kmsg_fds() == 1, what="one /dev/kmsg descriptor")


def test_stopping_kills_a_running_canary_worker(start_daemon: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    pid_file = tmp_path / "worker.pid"
    interpreter = tmp_path / "python-that-hangs"
    interpreter.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 300\n")
    interpreter.chmod(0o755)
    daemon = start_daemon({**SIM_FAST, "canary": {"enabled": True, "python": str(interpreter), "jitter": "0s",
                                                  "timeout": "10m"}})
    daemon.wait_ready()
    worker = int(wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the canary worker"))
    assert Path(f"/proc/{worker}").exists()
    daemon.signal(signal.SIGTERM)
    assert daemon.proc.wait(timeout=5) == 0
    wait_until(lambda: not Path(f"/proc/{worker}").exists() or "Z" in Path(f"/proc/{worker}/stat").read_text()
               .split()[2], timeout=5, what="the worker to be killed with the daemon")


def test_reloads_faster_than_the_interval_never_hold_sampling_back(start_daemon: Callable[..., DaemonProcess]
                                                                     ) -> None:
    # Each reload put the sampling job (and the watchdog's ping) a whole interval away again: reloads coming
    # faster than the interval stopped sampling while they lasted.
    config = {**SIM_FAST, "interval": "2s"}
    daemon = start_daemon(config)
    daemon.wait_ready()
    wait_until(lambda: metric(daemon, "tpuwatch_last_sample_timestamp_seconds") is not None, what="a first cycle")
    first = metric(daemon, "tpuwatch_last_sample_timestamp_seconds")
    deadline = time.monotonic() + 30
    count = 2
    while metric(daemon, "tpuwatch_last_sample_timestamp_seconds") < first + 3:  # two more cycles at least
        assert time.monotonic() < deadline, "no sampling cycle while reloads came every 0.5 s"
        count = 5 - count  # 2, 3, 2, ...: the device collector is rebuilt by each reload
        daemon.write_config({**config, "listen": f"127.0.0.1:{daemon.port}",
                             "devices": {"backend": "sim", "sim": {"count": count}}})
        daemon.signal(signal.SIGHUP)
        time.sleep(0.5)  # the storm's pace: a reload every half interval or faster
    assert daemon.proc.poll() is None
