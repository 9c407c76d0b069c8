"""One alert vocabulary: the table in docs/alerting.md ("One name per fault") holds tpuwatch's built-in rules and
the fleet's Prometheus rules (alerts/) to one name, severity and set of labels per fault.

The built-in rules' labels are those of the alerts the real Alerting raises from samples (the chips' PCI
addresses learned from tpuwatch_device_info, as in the daemon); the fleet rules' are those their promtool unit
tests show firing (test_fleet.py runs them, so those labels are what Prometheus gives).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml
from test_alerting_rules import DEFAULT_CASES
from test_fleet import DASHBOARD, TEST_FILES, rules

from tpuwatch import config as config_module
from tpuwatch.alerting import Alerting
from tpuwatch.alerting.rules import load_rules
from tpuwatch.kubernetes.conditions import DEFAULT_CONDITIONS
from tpuwatch.samples import sample

DOC = Path(__file__).resolve().parent.parent / "docs" / "alerting.md"
T0 = 1_700_000_000.0
NONE = "—"
OWN = {"alertname", "severity"}  # every alert's; beside them the daemon adds host, Prometheus instance and job
# Cases beyond test_alerting_rules' DEFAULT_CASES, for labels those leave out: (before, after, alert, severity).
EXTRA_CASES = [
    ([], [("tpuwatch_kernel_events_total", 1, {"rule": "nvidia_xid", "severity": "critical", "device": "0",
                                               "gpu_instance": "5"})], "KernelHardwareErrorCritical", "critical"),
    ([], [("tpuwatch_maintenance_scheduled", 1, {"cloud": "ec2", "kind": "reboot", "event": "system-reboot",
                                                 "event_id": "instance-event-0d59937288b749b32",
                                                 "window": "2027-01-21 09:00-09:17 UTC", "start": "1800522043"})],
     "MaintenanceScheduled", "warning"),
    ([], [("tpuwatch_memory_leak_suspected", 1, {"memory": "process", "device": "", "pid": "4242"})],
     "AcceleratorMemoryLeak", "warning"),
    ([], [("tpuwatch_memory_exhaustion_eta_seconds", 3600, {"memory": "process", "device": "", "pid": "4242"})],
     "AcceleratorMemoryExhaustionSoon", "critical"),
    ([("tpuwatch_canary_runs_total", 3, {"result": "pass"})], [("tpuwatch_canary_runs_total", 3, {"result": "pass"})],
     "CanaryNotRunning", "warning"),
    ([], [("tpuwatch_canary_device_runs_total", 1, {"device": "2", "result": "fail", "path": "job", "pid": "4242",
                                                   "command": "python3", "namespace": "ml", "pod": "trainer-0"})],
     "CanaryWrongResult", "critical"),
    ([], [("tpuwatch_canary_device_runs_total", 1, {"device": "1", "result": "slow", "path": "scheduled"})],
     "CanarySlowChip", "warning"),
]
# When the cases are evaluated: the after samples at every time but the first (before, when given).
TIMES = (0.0, 10.0, 400.0, 11_000.0)


class Row(NamedTuple):
    condition: str
    alert: str
    severity: str
    labels: frozenset[str]
    built_in: bool
    fleet: bool


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def table() -> list[Row]:
    """The rows of the table under "### One name per fault"."""
    text = DOC.read_text()
    lines = text[text.index("### One name per fault"):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| Condition |"))
    assert _cells(lines[start]) == ["Condition", "Alert", "Severity", "Labels", "Built-in rule", "Fleet rule"]
    out = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        condition, alert, severity, labels, built_in, fleet = _cells(line)
        names = frozenset() if labels == NONE else frozenset(n.strip().strip("`") for n in labels.split(","))
        out.append(Row(condition, alert.strip("`"), severity, names, built_in != NONE, fleet != NONE))
    return out


def _keys(rows: list[Row], **where: bool) -> set[tuple[str, str]]:
    return {(r.alert, r.severity) for r in rows if all(getattr(r, k) == v for k, v in where.items())}


def test_the_table_has_one_row_per_alert_and_severity() -> None:
    rows = table()
    assert len(rows) == len(_keys(rows)) > 20
    assert all(r.severity in ("critical", "warning", "info") and (r.built_in or r.fleet) for r in rows)


def test_the_built_in_rules_are_the_tables() -> None:
    assert {(r.alert, r.severity) for r in load_rules(True, [])} == _keys(table(), built_in=True)


def test_the_fleet_rules_are_the_tables() -> None:
    fleet = {(r["alert"], r["labels"]["severity"]) for r in rules() if "alert" in r}
    assert fleet == _keys(table(), fleet=True)


def built_in_labels(state: Path) -> dict[tuple[str, str], set[str]]:
    """(alert, severity) -> the label names of the built-in alerts the real Alerting raises in the cases."""
    procfs = state / "proc"
    (procfs / "sys" / "kernel" / "random").mkdir(parents=True)
    (procfs / "sys" / "kernel" / "random" / "boot_id").write_text("boot-1\n")
    chips = [sample("tpuwatch_device_info", 1, device=d, chip="h100", pci=f"0000:1{d}:00.0", backend="nvidia")
             for d in "0123"]
    seen: dict[tuple[str, str], set[str]] = defaultdict(set)
    for i, case in enumerate([c[1:] for c in DEFAULT_CASES] + EXTRA_CASES):
        before, after = case[0], case[1]
        config = config_module.parse(yaml.safe_dump({"state_dir": str(state / str(i)),
                                                     "paths": {"procfs": str(procfs)}}))
        alerting = Alerting(config, config.state_dir)
        try:
            for t in TIMES:
                rows = before if t == TIMES[0] and before else after
                alerting.evaluate(chips + [sample(name, value, **labels) for name, value, labels in rows], T0 + t)
                for alert in alerting.active_alerts():
                    if alert["state"] == "firing":
                        labels = alert["labels"]
                        seen[(labels["alertname"], labels["severity"])] |= set(labels) - OWN - {"host"}
        finally:
            alerting.stop()
    return seen


def fleet_labels() -> dict[tuple[str, str], set[str]]:
    """(alert, severity) -> the label names of the fleet alerts the promtool unit tests show firing."""
    seen: dict[tuple[str, str], set[str]] = defaultdict(set)
    for path in TEST_FILES:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                for alert in case["exp_alerts"]:
                    labels = alert["exp_labels"]
                    seen[(case["alertname"], labels["severity"])] |= set(labels) - OWN - {"instance", "job"}
    return seen


@pytest.mark.parametrize("path", ["built-in", "fleet"])
def test_each_path_gives_each_alert_the_tables_labels(path: str, tmp_path: Path) -> None:
    seen = built_in_labels(tmp_path) if path == "built-in" else fleet_labels()
    rows = [r for r in table() if (r.built_in if path == "built-in" else r.fleet)]
    assert {(r.alert, r.severity) for r in rows} <= set(seen), "alerts no case shows firing"
    wrong = {f"{r.alert} ({r.severity}): table {sorted(r.labels)}, {path} alerts {sorted(seen[r.alert, r.severity])}"
             for r in rows if seen[(r.alert, r.severity)] != r.labels}
    assert not wrong, "; ".join(sorted(wrong))


def test_an_alert_about_a_chip_names_it_by_device_and_pci_on_both_paths() -> None:
    chip_rows = [r for r in table() if "device" in r.labels]
    assert chip_rows and all("pci" in r.labels for r in chip_rows)
    both = [r for r in table() if r.built_in and r.fleet]
    assert {"AcceleratorLost", "AcceleratorEccUncorrectable", "KernelHardwareErrorCritical", "CanaryWrongResult",
            "AcceleratorMemoryExhaustionSoon"} <= {r.alert for r in both}


def test_node_conditions_and_the_dashboard_speak_the_same_vocabulary() -> None:
    rows = table()
    names = {r.alert for r in rows}
    for condition in DEFAULT_CONDITIONS:
        for source in condition.sources:
            assert source.alert in names, f"{condition.type}: {source.alert} is in no rule set"
            assert source.severity is None or (source.alert, source.severity) in _keys(rows)
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    panels = [p for row in dashboard["panels"] for p in [row, *row.get("panels", [])]]
    (pattern,) = [m.group(1) for p in panels for t in p.get("targets", [])
                  if (m := re.search(r'ALERTS\{[^}]*alertname=~"([^"]+)"', t["expr"].replace('\\"', '"')))]
    fleet = {r.alert for r in rows if r.fleet}
    assert all(re.fullmatch(pattern, name) for name in fleet), pattern
