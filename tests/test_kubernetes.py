"""The Kubernetes node agent, driven through its real client against the stand-in API server.

Alerts are fed as ``/api/alerts`` lists them (tpuwatch/alerting/state.py ``Alert.to_json``); time is
passed explicitly to ``step()`` so that hold times and lease expiry are tested without sleeping.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from k8s_apiserver import ApiServer, strategic_merge

from tpuwatch import config as config_module
from tpuwatch.kubernetes import node as node_marks
from tpuwatch.kubernetes.agent import KubernetesAgent
from tpuwatch.kubernetes.client import ApiError, Credentials, KubeClient, from_kubeconfig, in_cluster
from tpuwatch.kubernetes.conditions import DEFAULT_CONDITIONS, ConditionBook, PatchGate, faults, format_time
from tpuwatch.kubernetes.plugin import KubernetesConfig
from tpuwatch.kubernetes.slots import SlotLimiter, slot_limit
from tpuwatch.schema import ConfigError

from certs import make_tls_files
from conftest import require_tool, wait_until

T0 = 1_800_000_000.0
PCI = {str(i): f"0000:{0x10 + i:02x}:00.0" for i in range(8)}
TAINT_LADDER = [{"trigger": "AcceleratorHardwareProblem", "actions": [{"type": "taint"}]}]


def alert(name: str, device: str = "0", severity: str = "critical", state: str = "firing", value: float = 1.0,
          fingerprint: str | None = None) -> dict[str, Any]:
    """An alert as /api/alerts lists it."""
    return {"fingerprint": fingerprint or f"{name}-{device}", "state": state, "value": value, "inhibited": False,
            "labels": {"alertname": name, "device": device, "severity": severity, "host": "h"},
            "annotations": {"summary": f"{name} on device {device}"},
            "activeAt": "2027-01-15T08:00:00.000Z", "startsAt": "2027-01-15T08:00:00.000Z", "endsAt": None}


def section(**values: Any) -> KubernetesConfig:
    """A validated kubernetes section."""
    return config_module.build(KubernetesConfig, {"node_conditions": True, **values}, "kubernetes")


def client_for(api: ApiServer, timeout: float = 2.0) -> KubeClient:
    return KubeClient(Credentials(api.url, token=api.token), timeout)


def make_agent(api: ApiServer, tmp_path: Path, node: str = "node-0", **values: Any) -> KubernetesAgent:
    values.setdefault("retry_initial", "1s")
    return KubernetesAgent(section(**values), node, client_for(api), tmp_path / node)


@pytest.fixture
def api() -> Any:
    with ApiServer() as server:
        server.add_node("node-0")
        yield server


def cycle(agent: KubernetesAgent, now: float, *alerts: dict[str, Any]) -> None:
    agent.feed(list(alerts), PCI)
    agent.step(now)


# --- pure: conditions ----------------------------------------------------------------------------


def test_default_table_maps_alerts_to_conditions_with_reasons_and_pci() -> None:
    found = faults([alert("AcceleratorEccUncorrectable", "3"), alert("AcceleratorLost", "5"),
                    alert("CanaryWrongResult", "1"), alert("AcceleratorTemperatureHigh", "2", severity="warning"),
                    alert("AcceleratorMemoryExhaustionSoon", "4", state="pending")], PCI, DEFAULT_CONDITIONS)
    book = ConditionBook(DEFAULT_CONDITIONS, 300, T0)
    book.update(found, T0)
    hardware = book.states["AcceleratorHardwareProblem"]
    assert hardware.status and hardware.reason == "ChipLost"  # first in the table's order
    assert hardware.message == "ChipLost on chip 5 (PCI 0000:15:00.0); EccUncorrectable on chip 3 (PCI 0000:13:00.0)"
    compute = book.states["AcceleratorComputeProblem"]
    assert compute.status and compute.reason == "CanaryWrongResult" and "chip 1 (PCI 0000:11:00.0)" in compute.message
    memory = book.states["AcceleratorMemoryProblem"]  # a pending alert, or a warning, raises nothing
    assert not memory.status and memory.reason == "AcceleratorMemoryHealthy"


def test_condition_clears_only_after_the_hold_time() -> None:
    book = ConditionBook(DEFAULT_CONDITIONS, 300, T0)
    ecc = faults([alert("AcceleratorEccUncorrectable")], PCI, DEFAULT_CONDITIONS)
    assert book.update(ecc, T0) == ["AcceleratorHardwareProblem"]
    assert book.update([], T0 + 299) == []
    assert book.update(ecc, T0 + 299) == []  # back before the hold ran out: still the same episode
    assert book.update([], T0 + 500) == []
    assert book.update([], T0 + 599) == ["AcceleratorHardwareProblem"]
    state = book.states["AcceleratorHardwareProblem"]
    assert not state.status and state.transition == T0 + 599 and state.reason == "AcceleratorHardwareHealthy"


def test_patch_gate_heartbeat_and_resync_limits() -> None:
    book, gate = ConditionBook(DEFAULT_CONDITIONS, 300, T0), PatchGate(300)
    assert gate.due(book, T0)
    gate.sent(book, T0)
    assert not gate.due(book, T0 + 1)
    book.update(faults([alert("AcceleratorLost", "1")], PCI, DEFAULT_CONDITIONS), T0 + 2)
    assert gate.due(book, T0 + 2)  # a status change goes out at once
    gate.sent(book, T0 + 2)
    book.update(faults([alert("AcceleratorLost", "1"), alert("AcceleratorLost", "2")], PCI, DEFAULT_CONDITIONS),
                T0 + 3)
    assert not gate.due(book, T0 + 3) and gate.due(book, T0 + 12)  # a message change waits for the resync
    gate.sent(book, T0 + 12)
    assert not gate.due(book, T0 + 311) and gate.due(book, T0 + 312)  # heartbeat


def test_slot_limit_counts_and_percentages() -> None:
    assert [slot_limit("10%", n) for n in (20, 25, 5, 0)] == [2, 2, 1, 1]
    assert slot_limit("0%", 100) == 0 and slot_limit("3", 100) == 3


def test_node_patch_keeps_foreign_taints_and_an_operators_cordon() -> None:
    node = {"metadata": {"resourceVersion": "7"},
            "spec": {"unschedulable": True, "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}}
    want = node_marks.Marks({"tpuwatch.io/AcceleratorHardwareProblem": ("NoSchedule", "EccUncorrectable")}, "X")
    patch = node_marks.patch_for(node, want)
    assert patch == {"metadata": {"resourceVersion": "7"}, "spec": {"taints": [
        {"key": "nvidia.com/gpu", "effect": "NoSchedule"},
        {"key": "tpuwatch.io/AcceleratorHardwareProblem", "value": "EccUncorrectable", "effect": "NoSchedule"}]}}
    # Already cordoned by someone else: tpuwatch neither claims nor, later, lifts it.
    assert node_marks.patch_for(strategic_merge(node, patch), node_marks.Marks()) == {
        "metadata": {"resourceVersion": "7"}, "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}}


# --- client: credentials --------------------------------------------------------------------------


def test_in_cluster_credentials_and_their_absence(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("abc\n")
    (tmp_path / "ca.crt").write_text("pem")
    found = in_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}, tmp_path)
    assert found == Credentials("https://10.0.0.1:443", str(tmp_path / "ca.crt"), token_file=str(tmp_path / "token"))
    assert in_cluster({"KUBERNETES_SERVICE_HOST": "fd00::1"}, tmp_path).server == "https://[fd00::1]:443"
    with pytest.raises(ConfigError, match="not in a pod"):
        in_cluster({}, tmp_path)
    with pytest.raises(ConfigError, match="no service account token"):
        in_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, tmp_path / "none")


def test_kubeconfig_errors_name_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text("current-context: x\ncontexts: []\n")
    with pytest.raises(ConfigError, match="no context named 'x'"):
        from_kubeconfig(str(path))
    with pytest.raises(ConfigError, match="cannot read"):
        from_kubeconfig(str(tmp_path / "missing"))
    path.write_text("current-context: x\ncurrent-context: y\n")  # read by the one bounded YAML loader
    with pytest.raises(ConfigError, match=rf"^kubernetes\.kubeconfig: {path}: line 2, column 1: duplicate key"):
        from_kubeconfig(str(path))


def test_inline_kubeconfig_credentials_live_in_a_private_dir_removed_on_close(tmp_path: Path) -> None:
    tls = make_tls_files(tmp_path)
    with ApiServer(tls=tls) as api:
        api.add_node("node-0")
        path = api.write_kubeconfig(tmp_path / "kubeconfig", tls.ca_cert)
        plain = from_kubeconfig(str(path))
        assert plain.scratch is None  # nothing inline: no directory made
        data = json.loads(path.read_text())
        cluster = data["clusters"][0]["cluster"]
        cluster["certificate-authority-data"] = base64.b64encode(Path(cluster.pop("certificate-authority"))
                                                                 .read_bytes()).decode()
        path.write_text(json.dumps(data))
        inline = from_kubeconfig(str(path))
        assert inline.scratch is not None and inline.ca_file == str(Path(inline.scratch, "certificate-authority"))
        assert os.stat(inline.scratch).st_mode & 0o777 == 0o700 and os.stat(inline.ca_file).st_mode & 0o777 == 0o600
        client = KubeClient(inline, 5)
        assert client.get_node("node-0")["metadata"]["name"] == "node-0"  # TLS verified with the decoded CA
        client.close()
    assert not os.path.exists(inline.scratch)  # the decoded credentials do not outlive the client


def test_tls_kubeconfig_client_and_kubectl_read_the_same_node(tmp_path: Path) -> None:
    kubectl = require_tool("kubectl")
    tls = make_tls_files(tmp_path)
    with ApiServer(tls=tls) as api:
        api.add_node("node-0")
        path = api.write_kubeconfig(tmp_path / "kubeconfig", tls.ca_cert)
        agent = KubernetesAgent(section(), "node-0", KubeClient(from_kubeconfig(str(path)), 5), tmp_path / "s")
        cycle(agent, T0, alert("AcceleratorEccUncorrectable", "3"))
        result = subprocess.run([kubectl, "get", "node", "node-0", "-o", "json"], capture_output=True, text=True,
                                timeout=120, env={**os.environ, "KUBECONFIG": str(path), "HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    conditions = {c["type"]: c for c in json.loads(result.stdout)["status"]["conditions"]}
    assert conditions["Ready"]["status"] == "True"  # the kubelet's condition is untouched by the merge
    assert conditions["AcceleratorHardwareProblem"] | {"lastHeartbeatTime": ""} == {
        "type": "AcceleratorHardwareProblem", "status": "True", "reason": "EccUncorrectable",
        "message": "EccUncorrectable on chip 3 (PCI 0000:13:00.0)", "lastTransitionTime": format_time(T0),
        "lastHeartbeatTime": ""}
    assert conditions["AcceleratorComputeProblem"]["status"] == "False"
    assert ("PATCH", "/api/v1/nodes/node-0/status", "application/strategic-merge-patch+json") in api.requests


# --- conditions on the node -----------------------------------------------------------------------------


def test_each_condition_set_and_cleared_with_its_reason(api: ApiServer, tmp_path: Path) -> None:
    agent = make_agent(api, tmp_path, clear_after="60s")
    for name, condition, reason in (("AcceleratorLost", "AcceleratorHardwareProblem", "ChipLost"),
                                    ("KernelHardwareErrorCritical", "AcceleratorHardwareProblem",
                                     "KernelHardwareError"),
                                    ("CanaryWrongResult", "AcceleratorComputeProblem", "CanaryWrongResult"),
                                    ("AcceleratorMemoryExhaustionSoon", "AcceleratorMemoryProblem",
                                     "MemoryExhaustionSoon"),
                                    ("AcceleratorHung", "AcceleratorProgressProblem", "CoreHung")):
        start = agent.last_sync or T0
        cycle(agent, start + 1, alert(name, "2"))
        on_node = api.condition("node-0", condition)
        assert on_node and (on_node["status"], on_node["reason"]) == ("True", reason), name
        assert on_node["lastTransitionTime"] == format_time(start + 1)
        cycle(agent, start + 30)
        assert api.condition("node-0", condition)["status"] == "True"  # held
        cycle(agent, start + 62)
        cleared = api.condition("node-0", condition)
        assert (cleared["status"], cleared["lastTransitionTime"]) == ("False", format_time(start + 62)), name
    assert api.condition("node-0", "Ready")["status"] == "True"


def test_restart_keeps_a_true_condition_and_clears_a_stale_one(api: ApiServer, tmp_path: Path) -> None:
    first = make_agent(api, tmp_path, clear_after="120s")
    cycle(first, T0, alert("AcceleratorEccUncorrectable", "1"))
    first.stop()
    # Restarted while the fault is still there: no reset to False, the transition time is kept.
    second = make_agent(api, tmp_path, clear_after="120s")
    cycle(second, T0 + 1000, alert("AcceleratorEccUncorrectable", "1"))
    kept = api.condition("node-0", "AcceleratorHardwareProblem")
    assert (kept["status"], kept["lastTransitionTime"]) == ("True", format_time(T0))
    second.stop()
    # Restarted after the repair: True for the hold time, then False, never stuck.
    third = make_agent(api, tmp_path, clear_after="120s")
    cycle(third, T0 + 2000)
    assert api.condition("node-0", "AcceleratorHardwareProblem")["status"] == "True"
    cycle(third, T0 + 2121)
    assert api.condition("node-0", "AcceleratorHardwareProblem")["status"] == "False"


def test_api_down_for_minutes_then_everything_is_written(api: ApiServer, tmp_path: Path) -> None:
    agent = make_agent(api, tmp_path, retry_max="30s", api_timeout="1s")
    cycle(agent, T0)
    with api.outage():
        for second in range(1, 600, 10):  # ten minutes of cycles, the fault appearing at 100 s
            cycle(agent, T0 + second, *([alert("AcceleratorLost", "4")] if second >= 100 else []))
        errors = sum(n for (op, reason), n in agent.errors.items() if reason == "Unavailable")
        assert 5 <= errors <= 40  # counted, and backed off rather than hammered
    cycle(agent, T0 + 601, alert("AcceleratorLost", "4"))
    cycle(agent, T0 + 640, alert("AcceleratorLost", "4"))  # past the last backoff
    written = api.condition("node-0", "AcceleratorHardwareProblem")
    assert (written["status"], written["lastTransitionTime"]) == ("True", format_time(T0 + 101))
    metrics = {s.name for s in agent.samples()}
    assert "tpuwatch_kubernetes_api_errors_total" in metrics


def test_a_slow_server_never_blocks_feed(api: ApiServer, tmp_path: Path) -> None:
    agent = make_agent(api, tmp_path, api_timeout="500ms")
    api.delay = 5.0
    agent.start()
    try:
        wait_until(lambda: any(t.name == "kubernetes" for t in threading.enumerate()), what="the agent thread")
        for _ in range(200):  # as the sampling thread would, while the agent waits on the server
            agent.feed([alert("AcceleratorLost")], PCI)
        wait_until(lambda: agent.errors, timeout=20, what="the deadline to count a timeout")
        assert any(reason == "Timeout" for _, reason in agent.errors)
        assert agent.dropped >= 150  # the mailbox kept only the newest
    finally:
        api.delay = 0.0
        agent.stop()


def test_forbidden_is_counted_and_named(api: ApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    api.forbidden.add(("patch", "nodes/status"))
    agent = make_agent(api, tmp_path)
    cycle(agent, T0, alert("AcceleratorLost"))
    assert agent.errors[("patch_node_status", "Forbidden")] == 1
    assert 'cannot patch resource "nodes/status"' in caplog.text
    assert api.condition("node-0", "AcceleratorHardwareProblem") is None


# --- taints, cordon, dry run -------------------------------------------------------------------------


def test_taint_added_and_removed_and_other_taints_kept(api: ApiServer, tmp_path: Path) -> None:
    api.nodes["node-0"]["spec"]["taints"] = [{"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}]
    agent = make_agent(api, tmp_path, clear_after="60s", max_unhealthy_nodes=1, remediation=[
        {"trigger": "AcceleratorHardwareProblem", "actions": [{"type": "taint", "effect": "NoExecute"},
                                                             {"type": "cordon"}]}])
    api.conflicts = 1  # someone else writes the node first: read again, patch again
    cycle(agent, T0, alert("AcceleratorEccUncorrectable", "2"))
    assert {(t["key"], t["effect"]) for t in api.taints("node-0")} == {
        ("google.com/tpu", "NoSchedule"), ("tpuwatch.io/AcceleratorHardwareProblem", "NoExecute")}
    node = api.node("node-0")
    assert node["spec"]["unschedulable"] and node["metadata"]["annotations"][node_marks.CORDONED]
    assert api.holders("default") == {"tpuwatch-slot-0": "node-0"}
    cycle(agent, T0 + 61)
    node = api.node("node-0")
    assert node["spec"]["taints"] == [{"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}]
    assert not node["spec"]["unschedulable"] and node_marks.CORDONED not in node["metadata"].get("annotations", {})
    assert api.holders("default") == {}  # slot given back
    results = [(r["action"], r["result"]) for r in agent.api_payload()["actions"]]
    assert results == [("taint", "done"), ("cordon", "done")]


def test_manual_release_keeps_the_taint_until_set_healthy(api: ApiServer, tmp_path: Path) -> None:
    agent = make_agent(api, tmp_path, clear_after="10s", remediation=[
        {"trigger": "AcceleratorComputeProblem", "actions": [{"type": "taint", "manual_release": True}]}])
    cycle(agent, T0, alert("CanaryWrongResult", "6"))
    cycle(agent, T0 + 11)
    assert api.condition("node-0", "AcceleratorComputeProblem")["status"] == "False"
    assert [t["key"] for t in api.taints("node-0")] == ["tpuwatch.io/AcceleratorComputeProblem"]
    agent.stop()
    agent = make_agent(api, tmp_path, clear_after="10s", remediation=[
        {"trigger": "AcceleratorComputeProblem", "actions": [{"type": "taint", "manual_release": True}]}])
    cycle(agent, T0 + 20)
    assert api.taints("node-0"), "the hold survives a restart"
    (tmp_path / "node-0" / "kubernetes-requests").mkdir(parents=True)
    (tmp_path / "node-0" / "kubernetes-requests" / "1-all.json").write_text('{"devices": null}')
    cycle(agent, T0 + 21)
    assert api.taints("node-0") == [] and api.holders("default") == {}


def test_dry_run_records_and_touches_nothing(api: ApiServer, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    agent = make_agent(api, tmp_path, dry_run=True, remediation=[
        {"trigger": "AcceleratorHardwareProblem", "actions": [
            {"type": "taint"}, {"type": "exec", "command": ["touch", str(marker)]}, {"type": "drain-request"}]}])
    cycle(agent, T0, alert("AcceleratorLost", "0"))
    cycle(agent, T0 + 10, alert("AcceleratorLost", "0"))
    assert api.taints("node-0") == [] and not marker.exists() and api.holders("default") == {}
    assert [(r["action"], r["result"]) for r in agent.api_payload()["actions"]] == [
        ("taint", "dry_run"), ("exec", "dry_run"), ("drain-request", "dry_run")]
    assert api.condition("node-0", "AcceleratorHardwareProblem")["status"] == "True"  # reporting is not an action


def test_ladder_escalates_with_debounce_interval_and_daily_cap(api: ApiServer, tmp_path: Path) -> None:
    log = tmp_path / "actions.log"
    script = f'echo "$TPUWATCH_TRIGGER $TPUWATCH_REASON $TPUWATCH_DEVICES $TPUWATCH_PCI $TPUWATCH_REPEATS" >> {log}'
    agent = make_agent(api, tmp_path, clear_after="0s", remediation=[{"trigger": "AcceleratorHardwareProblem",
                       "actions": [{"type": "exec", "command": ["sh", "-c", script], "debounce": "30s",
                                    "min_interval": "1m", "daily_cap": 2, "max_repeats": 2},
                                   {"type": "drain-request", "min_repeats": 3}]}])
    cycle(agent, T0, alert("AcceleratorEccUncorrectable", "3"))
    assert not log.exists()  # debounced
    cycle(agent, T0 + 31, alert("AcceleratorEccUncorrectable", "3"))
    assert log.read_text() == "AcceleratorHardwareProblem EccUncorrectable 3 0000:13:00.0 1\n"
    cycle(agent, T0 + 40)  # cleared (clear_after 0)
    cycle(agent, T0 + 50, alert("AcceleratorEccUncorrectable", "3"))
    cycle(agent, T0 + 85, alert("AcceleratorEccUncorrectable", "3"))  # 54 s after the first run: rate-limited
    assert log.read_text().count("\n") == 1
    cycle(agent, T0 + 95, alert("AcceleratorEccUncorrectable", "3"))
    assert log.read_text().endswith(" 2\n")
    cycle(agent, T0 + 100)
    cycle(agent, T0 + 200, alert("AcceleratorEccUncorrectable", "3"))  # third episode: drain request instead
    drain = api.node("node-0")["metadata"]
    assert drain["labels"][node_marks.DRAIN] == "true"
    assert json.loads(drain["annotations"][node_marks.DRAIN])["devices"] == ["3"]
    results = [r["result"] for r in agent.api_payload()["actions"]]
    assert results == ["done", "rate_limited", "done", "done"]
    totals = {(s.labels, s.value) for s in agent.samples() if s.name == "tpuwatch_kubernetes_remediation_actions_total"}
    assert (( ("action", "exec"), ("result", "done"), ("trigger", "AcceleratorHardwareProblem")), 2) in {
        (tuple(sorted(dict(labels).items())), value) for labels, value in totals}


def test_ack_clears_a_device_until_its_alert_counts_again(api: ApiServer, tmp_path: Path) -> None:
    agent = make_agent(api, tmp_path, clear_after="1h")
    cycle(agent, T0, alert("CanaryWrongResult", "1", value=1))
    requests_dir = tmp_path / "node-0" / "kubernetes-requests"
    requests_dir.mkdir(parents=True)
    (requests_dir / "1-ack.json").write_text('{"devices": ["1"]}')
    cycle(agent, T0 + 5, alert("CanaryWrongResult", "1", value=1))
    assert api.condition("node-0", "AcceleratorComputeProblem")["status"] == "False"  # no hold after an ack
    assert agent.api_payload()["acks"][0]["alerts"] == ["CanaryWrongResult"]
    cycle(agent, T0 + 20, alert("CanaryWrongResult", "1", value=2))  # a new wrong result after the repair
    assert api.condition("node-0", "AcceleratorComputeProblem")["status"] == "True"


# --- the blast-radius limit ----------------------------------------------------------------------------


def test_limit_with_many_nodes_racing_for_slots(tmp_path: Path) -> None:
    with ApiServer() as api:
        names = [f"node-{i}" for i in range(20)]
        for name in names:
            api.add_node(name, {"pool": "tpu"})
        agents = [make_agent(api, tmp_path, name, max_unhealthy_nodes="10%", node_selector="pool=tpu",
                             remediation=TAINT_LADDER) for name in names[:8]]
        barrier = threading.Barrier(len(agents))

        def fail(agent: KubernetesAgent) -> None:
            barrier.wait()
            cycle(agent, T0, alert("AcceleratorEccUncorrectable", "0"))

        threads = [threading.Thread(target=fail, args=(a,)) for a in agents]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        tainted = [n for n in names if api.taints(n)]
        assert len(tainted) == 2 and sorted(api.holders("default").values()) == sorted(tainted)
        held = [a for a in agents if a.held_back]
        assert len(held) == 6 and all(api.condition(a.node, "AcceleratorHardwareProblem")["status"] == "True"
                                      for a in held)
        assert all(r["result"] == "held_back" for a in held for r in a.api_payload()["actions"])
        # One recovers: its slot goes to one of the waiting nodes, no more.
        winner = next(a for a in agents if a.node == tainted[0])
        cycle(winner, T0 + 400)
        for agent in held:
            cycle(agent, T0 + 401, alert("AcceleratorEccUncorrectable", "0"))
        assert len([n for n in names if api.taints(n)]) == 2 and not api.taints(tainted[0])


def test_expired_slot_of_a_tainted_dead_node_is_not_taken(tmp_path: Path) -> None:
    with ApiServer() as api:
        for name in ("a", "b", "c"):
            api.add_node(name)
        a, b = (make_agent(api, tmp_path, n, max_unhealthy_nodes=1, lease_duration="60s", remediation=TAINT_LADDER)
                for n in ("a", "b"))
        cycle(a, T0, alert("AcceleratorLost", "0"))
        assert api.taints("a")
        # "a" dies tainted; its lease runs out, but its node still carries tpuwatch's taint.
        cycle(b, T0 + 600, alert("AcceleratorLost", "0"))
        assert not api.taints("b") and b.held_back
        api.nodes["a"]["spec"]["taints"] = []  # an operator cleans "a" up
        cycle(b, T0 + 700, alert("AcceleratorLost", "0"))
        assert api.taints("b") and api.holders("default") == {"tpuwatch-slot-0": "b"}


def test_slot_limiter_renews_and_survives_a_restart(api: ApiServer) -> None:
    limiter = SlotLimiter(client_for(api), "monitoring", "p", "node-0", 90, "", "1")
    assert limiter.acquire(T0) and limiter.slot == "p-0"
    version = api.leases[("monitoring", "p-0")]["metadata"]["resourceVersion"]
    assert limiter.acquire(T0 + 10) and api.leases[("monitoring", "p-0")]["metadata"]["resourceVersion"] == version
    assert limiter.acquire(T0 + 31)  # a third of the duration: renewed
    lease = api.leases[("monitoring", "p-0")]
    assert lease["metadata"]["resourceVersion"] != version and lease["spec"]["leaseDurationSeconds"] == 90
    restarted = SlotLimiter(client_for(api), "monitoring", "p", "node-0", 90, "", "1")
    assert restarted.acquire(T0 + 40) and restarted.slot == "p-0"
    other = SlotLimiter(client_for(api), "monitoring", "p", "node-1", 90, "", "1")
    assert not other.acquire(T0 + 41)


def test_lease_rbac_missing_is_an_error_not_a_slot(api: ApiServer, tmp_path: Path) -> None:
    api.forbidden.add(("create", "leases"))
    agent = make_agent(api, tmp_path, remediation=TAINT_LADDER)
    cycle(agent, T0, alert("AcceleratorLost"))
    assert agent.errors[("remediate", "Forbidden")] == 1 and api.taints("node-0") == []
    with pytest.raises(ApiError) as raised:
        client_for(api).create_lease("default", {"metadata": {"name": "x"}})
    assert raised.value.code == 403 and 'in the namespace "default"' in raised.value.message


def test_config_refuses_remediation_without_conditions() -> None:
    with pytest.raises(ConfigError, match="kubernetes.remediation: needs node_conditions"):
        config_module.parse("kubernetes: {remediation: [{trigger: X, actions: [{type: taint}]}]}")
    assert dataclasses.asdict(config_module.parse("").kubernetes)["node_conditions"] is False


def test_agent_never_starts_without_a_node_name(tmp_path: Path) -> None:
    code = ("import os; os.environ.pop('NODE_NAME', None)\n"
            "from tpuwatch import config; from tpuwatch.kubernetes.agent import build\n"
            "build(config.parse('kubernetes: {node_conditions: true}'))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "kubernetes.node_name: unset and $NODE_NAME is empty" in result.stderr


def test_an_alert_name_triggers_a_ladder_with_all_its_chips(api: ApiServer, tmp_path: Path) -> None:
    log = tmp_path / "event.json"
    agent = make_agent(api, tmp_path, remediation=[{"trigger": "AcceleratorTemperatureHigh", "actions": [
        {"type": "exec", "command": ["sh", "-c", f'printf %s "$TPUWATCH_EVENT" > {log}']}]}])
    cycle(agent, T0, alert("AcceleratorTemperatureHigh", "0", severity="warning"),
          alert("AcceleratorTemperatureHigh", "1", severity="warning"), alert("AcceleratorLost", "2", state="pending"))
    event = json.loads(log.read_text())
    assert event | {"time": ""} == {
        "node": "node-0", "trigger": "AcceleratorTemperatureHigh", "reason": "AcceleratorTemperatureHigh",
        "message": "AcceleratorTemperatureHigh on device 1", "devices": ["0", "1"], "pci": [], "repeats": 1,
        "action": "exec", "dry_run": False, "time": ""}
    assert api.condition("node-0", "AcceleratorHardwareProblem")["status"] == "False"  # a warning raises none
