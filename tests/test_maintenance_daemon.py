"""Maintenance notices in a real `tpuwatch run` and `tpuwatch check`: the --simulate maintenance drill (a stand-in
metadata server inside the daemon, read by the real watcher) fires MaintenanceScheduled within a minute and shows
on /metrics, /healthz and the status page; GCE_METADATA_HOST points the daemon and `check` at a stand-in; reload
and shutdown do not wait for an open watch; on Kubernetes the notice becomes a node condition and, ahead of the
window, a cordon within the cluster limit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from k8s_apiserver import ApiServer
from test_maintenance import UPCOMING

from tpuwatch.cloud.standin import MetadataStandIn

from certs import make_tls_files
from conftest import SIM_FAST, DaemonProcess, wait_until


@pytest.fixture
def standin() -> Iterator[MetadataStandIn]:
    server = MetadataStandIn()
    yield server
    server.close()


def firing(daemon: DaemonProcess, alertname: str) -> dict[str, Any] | None:
    alerts = requests.get(f"{daemon.url}/api/alerts", timeout=5).json()["alerts"]
    return next((a for a in alerts if a["labels"]["alertname"] == alertname and a["state"] == "firing"), None)


def _scheduled(health: dict[str, Any]) -> dict[str, Any] | None:
    check = health["checks"]["maintenance"]
    return check if check["status"] == "scheduled" else None


def test_the_maintenance_drill_fires_within_a_minute(start_daemon: Any) -> None:
    daemon = start_daemon({**SIM_FAST, "devices": {"backend": "sim", "sim": {"fault_after": "1s"}}},
                          args=["--simulate", "maintenance"])
    daemon.wait_ready()
    started = time.monotonic()
    alert = wait_until(lambda: firing(daemon, "MaintenanceScheduled"), timeout=60, what="MaintenanceScheduled")
    assert time.monotonic() - started < 60
    labels = alert["labels"]
    assert (labels["cloud"], labels["kind"], labels["severity"]) == ("gce", "terminate", "warning")
    assert alert["annotations"]["summary"].startswith(
        f"Maintenance scheduled (terminate): window {labels['window']}, in 2h ")
    # A cycle whose collector misses its 150 ms deadline on a loaded machine has no maintenance samples (by
    # design: a failed collector contributes nothing that cycle), so each view is polled, not read once.
    wait_until(lambda: 'tpuwatch_maintenance_scheduled{cloud="gce"' in requests.get(f"{daemon.url}/metrics",
                                                                                   timeout=5).text,
               timeout=20, what="the notice on /metrics")
    check = wait_until(lambda: _scheduled(requests.get(f"{daemon.url}/healthz", timeout=5).json()),
                       timeout=20, what="the notice on /healthz")
    assert check["notices"][0]["text"].startswith("terminate on host maintenance, window ")
    wait_until(lambda: "gce maintenance scheduled</strong>: terminate on host maintenance" in requests.get(
        daemon.url + "/", timeout=5).text, timeout=20, what="the notice on the status page")
    assert "drill, a stand-in Compute Engine metadata server" in daemon.log()


def test_check_reads_the_metadata_server_gce_metadata_host_names(standin: MetadataStandIn, tmp_path: Path) -> None:
    standin.set_gce("upcoming-maintenance", 200, UPCOMING)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"devices": {"backend": "none"}, "kernel_log": {"source": "none"},
                                      "canary": {"enabled": False}, "state_dir": str(tmp_path / "state"),
                                      "collector_timeout": "4s", "maintenance": {"cloud": "gce"}}))
    result = subprocess.run([sys.executable, "-m", "tpuwatch", "check", "--json", "--config", str(config)],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "GCE_METADATA_HOST": standin.host})
    report = json.loads(result.stdout)
    (notice,) = report["maintenance"]
    assert (notice["cloud"], notice["kind"], notice["window"]) == ("gce", "migrate", "2026-12-06 03:00-07:00 UTC")
    assert any(w.startswith("gce maintenance scheduled: live migration on host maintenance, window 2026-12-06 "
                            "03:00-07:00 UTC") for w in report["warnings"])
    assert f"watching maintenance-event and upcoming-maintenance at http://{standin.host}" in " ".join(report["notes"])


def test_reload_and_shutdown_do_not_wait_for_an_open_watch(start_daemon: Any, standin: MetadataStandIn) -> None:
    config = {**SIM_FAST, "maintenance": {"cloud": "gce", "watch_timeout": "10m"}}
    daemon = start_daemon(config, env={"GCE_METADATA_HOST": standin.host})
    daemon.wait_ready()
    wait_until(lambda: sum("wait_for_change=true" in p for _, p, _ in standin.requests) >= 2,
               what="both watches hanging")
    daemon.write_config({**config, "listen": f"127.0.0.1:{daemon.port}",
                         "maintenance": {"cloud": "gce", "watch_timeout": "9m"}})
    began = time.monotonic()
    daemon.signal(signal.SIGHUP)
    wait_until(lambda: "config reloaded" in daemon.log(), what="the reload")
    assert time.monotonic() - began < 5
    standin.set_gce("upcoming-maintenance", 200, UPCOMING)
    wait_until(lambda: firing(daemon, "MaintenanceScheduled"), timeout=30, what="the new watcher's notice")
    began = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.proc.wait(timeout=5) == 0
    assert time.monotonic() - began < 5
    assert "Traceback" not in daemon.log()


def test_kubernetes_condition_and_cordon_ahead_of_the_window(start_daemon: Any, tmp_path: Path) -> None:
    tls = make_tls_files(tmp_path)
    with ApiServer(tls=tls) as api:
        api.add_node("tpu-node-1")
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", tls.ca_cert)
        daemon = start_daemon({
            **SIM_FAST, "devices": {"backend": "sim", "sim": {"fault_after": "1s"}},
            "maintenance": {"node_condition": True},
            "kubernetes": {"node_conditions": True, "kubeconfig": str(kubeconfig), "max_unhealthy_nodes": 1,
                           "lease_namespace": "monitoring", "remediation": [{"trigger": "MaintenanceScheduled",
                                            "actions": [{"type": "cordon", "before_window": "3h"}]}]}},
            args=["--simulate", "maintenance"], env={"NODE_NAME": "tpu-node-1"})
        daemon.wait_ready()

        def scheduled() -> dict[str, Any] | None:
            condition = api.condition("tpu-node-1", "HostMaintenanceScheduled")
            return condition if condition and condition["status"] == "True" else None

        condition = wait_until(scheduled, timeout=60, what="HostMaintenanceScheduled on the node")
        assert condition["reason"] == "MaintenanceScheduled"
        # The drill's window opens in 2h 20m, within before_window: the node is cordoned, holding a slot.
        wait_until(lambda: api.node("tpu-node-1")["spec"].get("unschedulable"), timeout=30, what="the cordon")
        assert api.holders("monitoring") == {"tpuwatch-slot-0": "tpu-node-1"}
        # /api/kubernetes shows the agent's round once it has ended, a moment after the cordon was written.
        payload = wait_until(lambda: (answer := requests.get(f"{daemon.url}/api/kubernetes", timeout=5).json())
                             ["actions"] and answer, what="the cordon recorded in /api/kubernetes")
        assert [(a["trigger"], a["action"], a["result"]) for a in payload["actions"]] == [
            ("MaintenanceScheduled", "cordon", "done")]
