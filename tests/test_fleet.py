"""The fleet's Prometheus rules (alerts/) and the Grafana dashboard (packaging/grafana/), checked statically:
promtool's own checks and unit tests, annotations, runbook links, and catalogued metric names."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tpuwatch.catalog import CATALOG

from conftest import require_tool

REPO = Path(__file__).resolve().parent.parent
RULE_FILES = sorted((REPO / "alerts").glob("*.rules.yml"))
TEST_FILES = sorted((REPO / "alerts").glob("*.test.yml"))
DASHBOARD = REPO / "packaging" / "grafana" / "tpuwatch.json"
RUNBOOK_PREFIX = "file:///usr/share/doc/tpuwatch/"  # where the .deb installs docs/*.md
NAME = re.compile(r"\btpuwatch(?::[a-z0-9_]+)+|\btpuwatch_[a-z0-9_]+")
# What the fleet must be paged for (docs/fleet.md): chip down, uncorrectable errors, canary failing or stale,
# fingerprint disagreement, leak ETA, exporter absent, notifications failing.
REQUIRED_ALERTS = {"AcceleratorLost", "AcceleratorEccUncorrectable", "KernelHardwareErrorCritical",
                   "CanaryUnhealthy", "CanaryWrongResult", "CanaryStale", "CanaryFleetOutlier",
                   "AcceleratorMemoryExhaustionSoon", "TpuwatchExporterAbsent", "TpuwatchExporterDown",
                   "TpuwatchNotificationsFailing", "TpuwatchNotificationsLost"}


def rules() -> list[dict[str, Any]]:
    """Every rule of every alerts/*.rules.yml file."""
    return [rule for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"]]


def dashboard_panels(panels: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every panel of the dashboard that is not a row, rows' nested panels included."""
    panels = json.loads(DASHBOARD.read_text())["panels"] if panels is None else panels
    return [p for panel in panels
            for p in (dashboard_panels(panel.get("panels", [])) if panel["type"] == "row" else [panel])]


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel."""
    return [(panel["title"], target["expr"]) for panel in dashboard_panels() for target in panel["targets"]]


def slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_promtool_checks_every_rule_file() -> None:
    promtool = require_tool("promtool")
    result = subprocess.run([promtool, "check", "rules", *map(str, RULE_FILES)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(test_file: Path) -> None:
    promtool = require_tool("promtool")
    result = subprocess.run([promtool, "test", "rules", test_file.name], cwd=test_file.parent, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_rule_file_has_unit_tests_and_every_alert_is_tested() -> None:
    tested_files = {f for path in TEST_FILES for f in yaml.safe_load(path.read_text())["rule_files"]}
    assert tested_files == {path.name for path in RULE_FILES}
    tested = {case["alertname"] for path in TEST_FILES for test in yaml.safe_load(path.read_text())["tests"]
              for case in test.get("alert_rule_test", []) if case["exp_alerts"]}
    alerts = {rule["alert"] for rule in rules() if "alert" in rule}
    assert REQUIRED_ALERTS <= alerts
    assert alerts - tested == set(), "alerts no unit test shows firing"


def test_every_alert_has_severity_summary_description_and_a_runbook_that_exists() -> None:
    for rule in (r for r in rules() if "alert" in r):
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], rule["alert"]
        url = annotations["runbook_url"]
        assert url.startswith(RUNBOOK_PREFIX), url
        doc, _, anchor = url.removeprefix(RUNBOOK_PREFIX).partition("#")
        text = (REPO / "docs" / doc).read_text()
        anchors = {slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}
        assert not anchor or anchor in anchors, f"{rule['alert']}: no heading for #{anchor} in {doc}"


def test_rules_and_dashboard_use_catalogued_metrics_and_recorded_series() -> None:
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    expressions = [rule["expr"] for rule in rules()] + [expr for _, expr in dashboard_queries()]
    used = {name for expr in expressions for name in NAME.findall(expr)}
    assert used - set(CATALOG) - recorded == set()
    assert {name for name in used if ":" in name} == recorded, "every recording rule is used"


def test_dashboard_is_importable_with_a_datasource_choice() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["instance"]["includeAll"] and variables["instance"]["multi"]
    top = dashboard["panels"]
    ids = [p["id"] for p in top] + [p["id"] for row in top for p in row.get("panels", [])]
    assert len(ids) == len(set(ids))
    panels = dashboard_panels()
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"] and all(t["expr"] and t["refId"] for t in panel["targets"]), panel["title"]
    titles = " ".join(p["title"].lower() for p in panels)
    for topic in ("memory", "leak forecast", "utilization", "temperature", "kernel events", "canary", "alerts"):
        assert topic in titles
