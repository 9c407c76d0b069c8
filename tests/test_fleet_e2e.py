"""A fleet on this machine: real tpuwatch daemons with simulated faults, Debian's Prometheus scraping them with
alerts/ loaded, Debian's Alertmanager forwarding to a recording webhook, and tpuwatch's own notifications.

One stack for the module (starting it costs seconds): tpuwatch "a" with `--simulate ecc-errors`, a followed
kernel log file and three receivers (a webhook, the Alertmanager, a webhook that rejects everything);
tpuwatch "b" with `--simulate sdc` and the canary on, so chip 1 computes wrong numbers; tpuwatch "c" with
`--simulate hbm-leak` on chip 2, notifying the webhook, and reading a stand-in Compute Engine metadata server
(GCE_METADATA_HOST) that announces a maintenance window; tpuwatch "d" with `--simulate hung` on chip 1, the
hang time shortened to 1s.

Prometheus loads alerts/ time-compressed: every `for` longer than 0 becomes 1s, so that a leak alert held
for 15m arrives within seconds.  promtool's unit tests (test_fleet.py) check the real `for` durations.
"""

from __future__ import annotations

import importlib.util
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from test_fleet import dashboard_queries
from test_maintenance import UPCOMING

from tpuwatch.cloud.standin import MetadataStandIn

from conftest import SIM_FAST, DaemonProcess, free_port, require_tool, stop_process, wait_until
from http_receiver import Receiver

REPO = Path(__file__).resolve().parent.parent
# An Xid 79 for simulated chip 1 (the simulator puts chip N at PCI 0000:1N:00.0).
XID_LINE = "Nov 30 05:00:00 host kernel: NVRM: Xid (PCI:0000:11:00): 79, pid=4242, name=python3, " \
           "GPU has fallen off the bus.\n"


class Service:
    """A real server subprocess with its log; stopped by SIGTERM, killed after 10 s."""

    def __init__(self, args: list[str], log: Path, ready_url: str) -> None:
        self.name = Path(args[0]).name
        self.log_path = log
        self._log = open(log, "wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT)
        self.ready_url = ready_url

    def wait_ready(self) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited:\n{self.log_path.read_text(errors='replace')}")
            return requests.get(self.ready_url, timeout=2).status_code == 200
        wait_until(ready, timeout=20, what=f"{self.name} to be ready")

    def stop(self) -> None:
        stop_process(self.proc)
        self._log.close()


@dataclass
class Fleet:
    """The running stack."""

    prometheus: str
    am_hook: Receiver
    direct_hook: Receiver
    rejecting_hook: Receiver
    a: DaemonProcess
    b: DaemonProcess
    c: DaemonProcess
    d: DaemonProcess
    metadata: MetadataStandIn

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Prometheus's instant-query result for ``expr`` (fails on an error answer)."""
        answer = requests.get(f"{self.prometheus}/api/v1/query", params={"query": expr}, timeout=5).json()
        assert answer["status"] == "success", f"{expr}: {answer}"
        return answer["data"]["result"]


def alerts_at(hook: Receiver) -> list[dict[str, Any]]:
    """Every alert a recording webhook received, in Alertmanager's webhook format."""
    return [alert for body in hook.json() for alert in body["alerts"]]


def firing(hook: Receiver, alertname: str, **labels: str) -> dict[str, Any] | None:
    """The first firing alert at ``hook`` with that name and labels."""
    return next((a for a in alerts_at(hook) if a["status"] == "firing" and a["labels"]["alertname"] == alertname
                 and labels.items() <= a["labels"].items()), None)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    prometheus_bin, alertmanager_bin = require_tool("prometheus"), require_tool("prometheus-alertmanager")
    if importlib.util.find_spec("jax") is None:  # not importorskip: jax must stay out of this process
        pytest.skip("the canary extra (jax) is not installed")
    tmp = tmp_path_factory.mktemp("fleet")
    hooks = [Receiver("record"), Receiver("record"), Receiver("reject")]
    am_hook, direct_hook, rejecting_hook = hooks
    started: list[DaemonProcess | Service] = []
    metadata = MetadataStandIn()
    metadata.set_gce("upcoming-maintenance", 200, UPCOMING)
    try:
        am_port, prometheus_port = free_port(), free_port()
        alertmanager = f"http://127.0.0.1:{am_port}"
        (tmp / "alertmanager.yml").write_text(yaml.safe_dump({
            "route": {"receiver": "hook", "group_by": ["alertname", "instance", "device"],
                      "group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"},
            "receivers": [{"name": "hook", "webhook_configs": [{"url": am_hook.url()}]}]}))
        started.append(Service([alertmanager_bin, f"--config.file={tmp / 'alertmanager.yml'}",
                                f"--storage.path={tmp / 'alertmanager'}", f"--web.listen-address=127.0.0.1:{am_port}",
                                "--cluster.listen-address="], tmp / "alertmanager.log", f"{alertmanager}/-/ready"))

        kernel_log = tmp / "kern.log"
        kernel_log.write_text("")
        alerting = {"group_wait": "0s", "group_interval": "1s", "resend_delay": "1s", "retry_initial": "100ms"}
        a = DaemonProcess(_workdir(tmp, "a"), {
            **SIM_FAST, "kernel_log": {"source": "file", "path": str(kernel_log)}, "alerting": alerting,
            "devices": {"sim": {"count": 4, "fault_after": "2s"}},
            "notify": [{"name": "oncall", "type": "webhook", "url": direct_hook.url()},
                       {"name": "am", "type": "alertmanager", "url": alertmanager},
                       {"name": "broken", "type": "webhook", "url": rejecting_hook.url()}]},
            args=["--simulate", "ecc-errors"])
        started.append(a)
        b = DaemonProcess(_workdir(tmp, "b"), {
            **SIM_FAST, "canary": {"enabled": True, "every": "1h", "jitter": "0s", "timeout": "60s"},
            "devices": {"sim": {"count": 4, "fault_device": 1}}}, args=["--simulate", "sdc"])
        started.append(b)
        c = DaemonProcess(_workdir(tmp, "c"), {
            **SIM_FAST, "alerting": alerting, "devices": {"sim": {"count": 4, "fault_device": 2}},
            "maintenance": {"cloud": "gce"},
            "notify": [{"name": "oncall", "type": "webhook", "url": direct_hook.url()}]},
            args=["--simulate", "hbm-leak"], env={"GCE_METADATA_HOST": metadata.host})
        started.append(c)
        d = DaemonProcess(_workdir(tmp, "d"), {
            **SIM_FAST, "devices": {"sim": {"count": 2, "fault_device": 1, "fault_after": "1s"},
                                    "hang": {"after": "1s"}}}, args=["--simulate", "hung"])
        started.append(d)

        (tmp / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": _time_compressed_rules(tmp / "rules"),
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
            "scrape_configs": [{"job_name": "tpuwatch",
                                "static_configs": [{"targets": [f"127.0.0.1:{d.port}" for d in (a, b, c, d)]}]}]}))
        prometheus = f"http://127.0.0.1:{prometheus_port}"
        started.append(Service([prometheus_bin, f"--config.file={tmp / 'prometheus.yml'}",
                                f"--storage.tsdb.path={tmp / 'prometheus'}",
                                f"--web.listen-address=127.0.0.1:{prometheus_port}",
                                f"--web.external-url={prometheus}"],
                               tmp / "prometheus.log", f"{prometheus}/-/ready"))
        for part in started:
            part.wait_ready()
        wait_until(lambda: "tpuwatch_kernel_log_records_total" in requests.get(f"{a.url}/metrics", timeout=5).text,
                   what="the kernel log collector to open the file")
        with open(kernel_log, "a") as log:
            log.write(XID_LINE)
        yield Fleet(prometheus, am_hook, direct_hook, rejecting_hook, a, b, c, d, metadata)
    finally:
        for part in reversed(started):
            part.stop()
        for hook in hooks:
            hook.close()
        metadata.close()


def _time_compressed_rules(directory: Path) -> list[str]:
    """Copies of alerts/*.rules.yml with every non-zero `for` shortened to 1s; their paths."""
    directory.mkdir()
    paths = []
    for source in sorted((REPO / "alerts").glob("*.rules.yml")):
        rules = yaml.safe_load(source.read_text())
        for group in rules["groups"]:
            for rule in group["rules"]:
                if rule.get("for", "0m") not in ("0m", "0s"):
                    rule["for"] = "1s"
        (directory / source.name).write_text(yaml.safe_dump(rules))
        paths.append(str(directory / source.name))
    return paths


def _workdir(tmp: Path, name: str) -> Path:
    path = tmp / name
    path.mkdir()
    return path


def test_prometheus_scrapes_every_daemon_and_loads_the_rules(fleet: Fleet) -> None:
    targets = {f"127.0.0.1:{d.port}" for d in (fleet.a, fleet.b, fleet.c, fleet.d)}
    wait_until(lambda: {r["metric"]["instance"] for r in fleet.query('up{job="tpuwatch"} == 1')} == targets,
               timeout=15, what="every target scraped")

    def rule_groups() -> list[dict[str, Any]]:
        return requests.get(f"{fleet.prometheus}/api/v1/rules", timeout=5).json()["data"]["groups"]

    assert {g["name"] for g in rule_groups()} == {"tpuwatch-fleet", "tpuwatch-canary", "tpuwatch-kubernetes"}
    # A rule's health is "unknown" until its group's first evaluation, on a clock of its own, apart from the scrapes.
    wait_until(lambda: all(r["health"] != "unknown" for g in rule_groups() for r in g["rules"]), timeout=15,
               what="every rule evaluated once")
    groups = rule_groups()
    assert all(r["health"] == "ok" for g in groups for r in g["rules"]), groups


def test_hardware_faults_page_through_prometheus_and_alertmanager(fleet: Fleet) -> None:
    instance_a = f"127.0.0.1:{fleet.a.port}"
    ecc = wait_until(lambda: firing(fleet.am_hook, "AcceleratorEccUncorrectable", instance=instance_a, device="0"),
                     timeout=30, what="the ECC alert through Prometheus and Alertmanager")
    assert {"job": "tpuwatch", "kind": "uncorrected", "severity": "critical",
            "pci": "0000:10:00.0"}.items() <= ecc["labels"].items()
    assert ecc["annotations"]["runbook_url"] == "file:///usr/share/doc/tpuwatch/alerting.md#acceleratoreccuncorrectable"
    assert ecc["generatorURL"].startswith(fleet.prometheus)
    # The Xid line was the counter's birth at 1: only the recording rule's birth clause sees it.
    xid = wait_until(lambda: firing(fleet.am_hook, "KernelHardwareErrorCritical", instance=instance_a, device="1"),
                     timeout=30, what="the kernel Xid alert through Prometheus and Alertmanager")
    assert xid["labels"]["rule"] == "nvidia_xid" and xid["annotations"]["summary"].startswith("Kernel reported")
    assert xid["labels"]["pci"] == "0000:11:00.0"
    # The receiver that rejects every notification: tpuwatch gives up, Prometheus notices.
    lost = wait_until(lambda: firing(fleet.am_hook, "TpuwatchNotificationsLost", instance=instance_a),
                      timeout=30, what="the lost-notifications alert")
    assert lost["labels"]["receiver"] == "broken" and fleet.rejecting_hook.attempts >= 1


def test_canary_faults_page_through_prometheus_and_alertmanager(fleet: Fleet) -> None:
    instance_b = f"127.0.0.1:{fleet.b.port}"
    # Prometheus may evaluate the canary group before the fleet group has recorded tpuwatch:device_pci:info
    # once: the alert then fires for one evaluation without pci (the rules' "or ignoring (pci)") and is
    # replaced by the one with its address.
    wrong = wait_until(lambda: firing(fleet.am_hook, "CanaryWrongResult", instance=instance_b, pci="0000:11:00.0"),
                       timeout=45, what="the canary's wrong result through Prometheus and Alertmanager")
    assert {"device": "1", "severity": "critical"}.items() <= wrong["labels"].items()
    failed = wait_until(lambda: firing(fleet.am_hook, "CanaryUnhealthy", instance=instance_b),
                        timeout=15, what="the canary's unhealthy chip through Prometheus and Alertmanager")
    assert {"device": "1", "severity": "warning"}.items() <= failed["labels"].items()
    # Chips 0, 2 and 3 agree bit for bit; chip 1's fingerprint is the fleet's outlier.
    outlier = wait_until(lambda: firing(fleet.am_hook, "CanaryFleetOutlier", instance=instance_b),
                         timeout=15, what="the fingerprint outlier alert")
    assert outlier["labels"]["device"] == "1" and outlier["labels"]["fingerprint"]


def test_a_hung_chip_pages_through_prometheus_and_alertmanager(fleet: Fleet) -> None:
    instance_d = f"127.0.0.1:{fleet.d.port}"
    hung = wait_until(lambda: firing(fleet.am_hook, "AcceleratorHung", instance=instance_d, pci="0000:11:00.0"),
                      timeout=45, what="the hung chip through Prometheus and Alertmanager")
    expected = {"device": "1", "pid": "4101", "command": "python3", "severity": "critical"}
    assert expected.items() <= hung["labels"].items()
    assert hung["annotations"]["summary"] == f"Chip 1 on {instance_d} hung: process 4101 (python3) makes no progress"
    assert hung["annotations"]["runbook_url"] == "file:///usr/share/doc/tpuwatch/alerting.md#acceleratorhung"
    assert not firing(fleet.am_hook, "AcceleratorHung", instance=instance_d, device="0"), "chip 0 makes progress"


def test_memory_leak_pages_through_prometheus_and_straight_from_tpuwatch(fleet: Fleet) -> None:
    instance_c = f"127.0.0.1:{fleet.c.port}"
    for alertname in ("AcceleratorMemoryExhaustionSoon", "AcceleratorMemoryLeak"):
        alert = wait_until(lambda: firing(fleet.am_hook, alertname, instance=instance_c),
                           timeout=30, what=f"{alertname} through Prometheus and Alertmanager")
        assert {"device": "2", "pci": "0000:12:00.0", "memory": "hbm"}.items() <= alert["labels"].items()
        assert alert["annotations"]["summary"].startswith(f"hbm memory 2 on {instance_c} ")
    for alertname, severity in (("AcceleratorMemoryLeak", "warning"), ("AcceleratorMemoryExhaustionSoon", "critical")):
        direct = wait_until(lambda: firing(fleet.direct_hook, alertname, device="2"),
                            timeout=30, what=f"tpuwatch's own {alertname} at its webhook")
        assert direct["labels"]["severity"] == severity and direct["labels"]["memory"] == "hbm"
    # The chips without the leak, whose allocator sawtooth is the same, stay quiet.
    leaking = {a["labels"]["device"] for a in alerts_at(fleet.direct_hook) + alerts_at(fleet.am_hook)
               if "Memory" in a["labels"]["alertname"] and a["labels"]["alertname"] != "AcceleratorMemoryFull"}
    assert leaking == {"2"}
    chips = {r["metric"]["device"]: r["value"][1] for r in
             fleet.query(f'tpuwatch_memory_leak_suspected{{instance="{instance_c}", memory="hbm"}}')}
    assert chips == {"0": "0", "1": "0", "2": "1", "3": "0"}


def test_tpuwatch_alerts_arrive_straight_and_through_its_alertmanager_receiver(fleet: Fleet) -> None:
    # tpuwatch's own rules, to its own webhook receiver, without Prometheus.
    direct = wait_until(lambda: firing(fleet.direct_hook, "AcceleratorEccUncorrectable", device="0"),
                        timeout=30, what="tpuwatch's own ECC alert at its webhook")
    assert "instance" not in direct["labels"] and direct["labels"]["host"]
    kernel = wait_until(lambda: firing(fleet.direct_hook, "KernelHardwareErrorCritical", device="1"),
                        timeout=30, what="tpuwatch's own kernel alert at its webhook")
    assert kernel["labels"]["rule"] == "nvidia_xid"
    # tpuwatch's alertmanager receiver posts to the same Alertmanager, which routes them like Prometheus's.
    routed = wait_until(lambda: firing(fleet.am_hook, "AcceleratorEccUncorrectable", device="0",
                                       host=direct["labels"]["host"]),
                        timeout=30, what="tpuwatch's own ECC alert routed by Alertmanager")
    assert routed["annotations"]["summary"] == direct["annotations"]["summary"]
    # The same fault told by Prometheus's rules: one name, severity, chip and PCI address on either path.
    scraped = wait_until(lambda: firing(fleet.am_hook, "AcceleratorEccUncorrectable", device="0",
                                        instance=f"127.0.0.1:{fleet.a.port}"),
                         timeout=30, what="the fleet rules' ECC alert")
    same = ("alertname", "severity", "device", "pci")
    assert [routed["labels"][k] for k in same] == [scraped["labels"][k] for k in same] == [
        "AcceleratorEccUncorrectable", "critical", "0", "0000:10:00.0"]


def test_a_maintenance_notice_pages_through_prometheus_and_alertmanager(fleet: Fleet) -> None:
    alert = wait_until(lambda: firing(fleet.am_hook, "MaintenanceScheduled", instance=f"127.0.0.1:{fleet.c.port}"),
                       timeout=30, what="the maintenance notice through Prometheus and Alertmanager")
    assert {k: alert["labels"][k] for k in ("severity", "cloud", "kind", "window")} == {
        "severity": "warning", "cloud": "gce", "kind": "migrate", "window": "2026-12-06 03:00-07:00 UTC"}
    fleet.metadata.set_gce("upcoming-maintenance", 200, b"{ }")
    wait_until(lambda: any(a["status"] == "resolved" and a["labels"]["alertname"] == "MaintenanceScheduled"
                           for a in alerts_at(fleet.am_hook)), timeout=30, what="the withdrawn notice resolved")


def test_every_dashboard_query_returns_data(fleet: Fleet) -> None:
    # Grafana's template variable with "All" selected becomes its allValue.
    queries = [(title, expr.replace("$instance", ".*")) for title, expr in dashboard_queries()]
    assert not [expr for _, expr in queries if "$" in expr], "only $instance is substituted"

    def without_data() -> list[str]:
        return [title for title, expr in queries if not fleet.query(expr)]

    try:
        wait_until(lambda: not without_data(), timeout=45, what="data for every dashboard query")
    except AssertionError:
        pytest.fail(f"dashboard panels without data: {without_data()}")
