"""A real `tpuwatch run` with simulated chips as the node agent of a stand-in API server (over TLS, from a
kubeconfig): the ECC fault becomes a node condition and a taint, ``tpuwatch ack`` clears it, /metrics and
/api/kubernetes show it; a config without a node name refuses to start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import requests
import yaml
from k8s_apiserver import ApiServer

from certs import make_tls_files
from conftest import SIM_FAST, run_cli, wait_until


def test_daemon_sets_condition_and_taint_and_ack_clears_them(start_daemon: Any, tmp_path: Path) -> None:
    tls = make_tls_files(tmp_path)
    with ApiServer(tls=tls) as api:
        api.add_node("tpu-node-1")
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", tls.ca_cert)
        daemon = start_daemon({
            **SIM_FAST, "alerting": {"group_wait": "0s"},
            "devices": {"backend": "sim", "sim": {"count": 4, "fault_after": "2s"}},  # the counter is born at 0
            "kubernetes": {"node_conditions": True, "kubeconfig": str(kubeconfig),
                           "clear_after": "1h", "max_unhealthy_nodes": 1, "lease_namespace": "monitoring",
                           "remediation": [{"trigger": "AcceleratorHardwareProblem",
                                            "actions": [{"type": "taint", "effect": "NoSchedule"}]}]}},
            args=["--simulate", "ecc-errors"], env={"NODE_NAME": "tpu-node-1"})
        daemon.wait_ready()

        def hardware() -> dict[str, Any] | None:
            condition = api.condition("tpu-node-1", "AcceleratorHardwareProblem")
            return condition if condition and condition["status"] == "True" else None

        condition = wait_until(hardware, timeout=30, what="the ECC fault on the node's conditions")
        assert condition["reason"] == "EccUncorrectable"
        assert condition["message"] == "EccUncorrectable on chip 0 (PCI 0000:10:00.0)"
        wait_until(lambda: api.taints("tpu-node-1"), timeout=30, what="the taint")
        assert api.taints("tpu-node-1") == [{"key": "tpuwatch.io/AcceleratorHardwareProblem",
                                             "value": "EccUncorrectable", "effect": "NoSchedule"}]
        assert api.holders("monitoring") == {"tpuwatch-slot-0": "tpu-node-1"}
        # /metrics shows the agent's round once it has ended, a moment after the taint was written.
        wanted = ('tpuwatch_kubernetes_node_condition{condition="AcceleratorHardwareProblem"} 1.0',
                  "tpuwatch_kubernetes_slot_held 1.0")
        wait_until(lambda: all(w in requests.get(f"{daemon.url}/metrics", timeout=5).text for w in wanted),
                   what="the agent's metrics")
        payload = wait_until(lambda: (answer := requests.get(f"{daemon.url}/api/kubernetes", timeout=5).json())
                             ["actions"] and answer, what="the taint recorded in /api/kubernetes")
        assert payload["node"] == "tpu-node-1" and payload["slot"] == "tpuwatch-slot-0"
        assert [(a["action"], a["result"]) for a in payload["actions"]] == [("taint", "done")]

        acked = run_cli("ack", "0", "--config", str(daemon.config_path))
        assert acked.returncode == 0, acked.stderr
        assert "AcceleratorEccUncorrectable acknowledged" in acked.stdout
        wait_until(lambda: not hardware() and not api.taints("tpu-node-1"), timeout=30,
                   what="the ack to clear the condition and the taint")
        wait_until(lambda: api.holders("monitoring") == {}, timeout=30, what="the slot to be given back")
        assert daemon.stop() == 0
    assert "Traceback" not in daemon.log()


def test_ack_without_kubernetes_or_daemon(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "listen": "127.0.0.1:9"}))
    off = run_cli("set-healthy", "--config", str(config))
    assert off.returncode == 2 and "kubernetes.node_conditions is off" in off.stderr
    config.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "listen": "127.0.0.1:9",
                                      "kubernetes": {"node_conditions": True}}))
    waiting = run_cli("ack", "3", "--wait", "0.5", "--config", str(config))
    assert waiting.returncode == 1 and "has not confirmed" in waiting.stderr
    (request,) = (tmp_path / "state" / "kubernetes-requests").glob("*.json")
    assert json.loads(request.read_text()) == {"devices": ["3"]}  # applied at the daemon's next start
    assert run_cli("ack", "--config", str(config)).returncode == 2  # a device is required


def test_daemon_without_node_name_refuses_to_start(start_daemon: Any) -> None:
    daemon = start_daemon({**SIM_FAST, "kubernetes": {"node_conditions": True}}, env={"NODE_NAME": ""})
    assert daemon.proc.wait(timeout=60) == 2
    assert "kubernetes.node_name: unset and $NODE_NAME is empty" in daemon.log()
    assert "Traceback" not in daemon.log()
