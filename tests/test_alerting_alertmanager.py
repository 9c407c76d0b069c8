"""One alert, one id (issue #15 item 4): tpuwatch's fingerprints and group keys are Alertmanager's, checked
against a real prometheus-alertmanager; alerting.db rows from before are re-keyed without re-sending or losing."""

from __future__ import annotations

import hashlib
import json
import socket
import sqlite3
import time
from pathlib import Path
from typing import Any

import requests
import yaml

from tpuwatch import config as config_module
from tpuwatch.alerting import Alerting
from tpuwatch.alerting.db import DB_NAME
from tpuwatch.samples import Sample, sample

from conftest import wait_until

FAST = {"group_wait": "0s", "group_interval": "1s", "rule_files": [], "retry_initial": "20ms",
        "retry_max": "100ms", "resend_delay": "1s"}
# Label values Go quotes differently from a plain "...": a quote, a backslash, a tab, a soft hyphen, non-ASCII.
ODD = 'gpu "a"\\b\tc\u00ad\u00e9'


def make(tmp_path: Path, notify: list[dict[str, Any]], rules: str | None = None) -> Alerting:
    rule_files = []
    if rules is not None:
        (tmp_path / "rules.yaml").write_text(rules)
        rule_files = [str(tmp_path / "rules.yaml")]
    config = config_module.parse(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "notify": notify,
                                                 "alerting": {**FAST, "rule_files": rule_files}}))
    return Alerting(config, config.state_dir)


def test_fingerprints_and_group_keys_are_alertmanagers(tmp_path: Path, alertmanager: tuple[str, Any],
                                                       receivers: Any) -> None:
    url, am_hook = alertmanager
    direct = receivers()
    alerting = make(tmp_path, [{"name": "am", "type": "alertmanager", "url": url},
                               {"name": "hook", "type": "webhook", "url": direct.url()}],
                    rules=f"rules: [{{alert: OddLabels, metric: tpuwatch_device_up, op: '==', threshold: 0, "
                          f"inhibit_when_device_down: false, labels: {{note: {json.dumps(ODD)}, empty: ''}}}}]\n")
    alerting.start()
    try:
        alerting.evaluate([sample("tpuwatch_device_up", 0, device=ODD),
                           sample("tpuwatch_memory_leak_suspected", 1, memory="host", device="", pid="")])
        ours = {a["labels"]["alertname"] + "/" + a["labels"].get("device", ""): a for a in alerting.active_alerts()}
        assert set(ours) == {f"AcceleratorLost/{ODD}", f"OddLabels/{ODD}", "AcceleratorMemoryLeak/"}
        assert "pid" not in ours["AcceleratorMemoryLeak/"]["labels"]  # empty values are no labels, as in Alertmanager
        listed = wait_until(lambda: len(requests.get(f"{url}/api/v2/alerts", timeout=5).json()) == 3
                            and requests.get(f"{url}/api/v2/alerts", timeout=5).json(), 10, "alerts in Alertmanager")
        theirs = {a["labels"]["alertname"] + "/" + a["labels"].get("device", ""): a for a in listed}
        assert {k: a["fingerprint"] for k, a in theirs.items()} == {k: a["fingerprint"] for k, a in ours.items()}
        assert {k: a["labels"] for k, a in theirs.items()} == {k: a["labels"] for k, a in ours.items()}
        # Their webhook and ours: the same group keys and alert fingerprints.
        wait_until(lambda: len(am_hook.requests) == 3 and len(direct.requests) == 3, 10, "both webhooks")

        def keys(hook: Any) -> dict[str, tuple[str, list[str]]]:
            return {b["groupLabels"]["alertname"]: (b["groupKey"], [a["fingerprint"] for a in b["alerts"]])
                    for b in hook.json()}

        assert keys(direct) == keys(am_hook)
        assert keys(direct)["AcceleratorLost"][0] == '{}:{alertname="AcceleratorLost", device="gpu \\"a\\"\\\\b\\tc' \
                                                     '\\u00ad\u00e9"}'
    finally:
        alerting.stop()


def old_fingerprint(labels: dict[str, str]) -> str:
    """How tpuwatch fingerprinted alerts before it computed Alertmanager's."""
    digest = hashlib.sha256()
    for key in sorted(labels):
        digest.update(f"{key}\0{labels[key]}\0".encode())
    return digest.hexdigest()[:16]


def store_old_alert(db: Path, labels: dict[str, str], told: list[str], at: float) -> str:
    """A firing alert as an older tpuwatch stored it, told to ``told``; its old fingerprint."""
    fp = old_fingerprint(labels)
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO alerts VALUES (?, ?, ?, 'firing', ?, ?, NULL, 1)",
                     (fp, json.dumps(labels), json.dumps({"summary": "old"}), at, at))
        conn.executemany("INSERT INTO notified VALUES (?, ?, ?)", [(r, fp, at) for r in told])
    return fp


def test_an_upgrade_rekeys_stored_alerts_without_resending_or_losing_them(tmp_path: Path, receivers: Any) -> None:
    hook, pd = receivers(), receivers()
    notify = [{"name": "hook", "type": "webhook", "url": hook.url()},
              {"name": "pd", "type": "pagerduty", "url": pd.url("/v2/enqueue"), "routing_key": "k3y-for-pd"}]
    make(tmp_path, notify).stop()  # the database, with today's schema, then rows as an older tpuwatch wrote them
    db = tmp_path / "state" / DB_NAME
    host, told_at = socket.gethostname(), time.time() - 60
    lost = store_old_alert(db, {"alertname": "AcceleratorLost", "severity": "critical", "device": "3", "host": host},
                           ["hook", "pd"], told_at)
    leak = store_old_alert(db, {"alertname": "AcceleratorMemoryLeak", "severity": "warning", "host": host,
                                "memory": "host", "device": "", "pid": ""}, ["hook", "pd"], told_at)
    alerting = make(tmp_path, notify)
    alerting.start()
    try:
        info = sample("tpuwatch_device_info", 1, device="3", chip="v5e", pci="0000:13:00.0", backend="sim")
        still: list[Sample] = [info, sample("tpuwatch_device_up", 0, device="3"),
                               sample("tpuwatch_memory_leak_suspected", 1, memory="host", device="", pid="")]
        alerting.evaluate(still)
        active = {a["labels"]["alertname"]: a for a in alerting.active_alerts()}
        assert {k: a["state"] for k, a in active.items()} == {"AcceleratorLost": "firing",
                                                              "AcceleratorMemoryLeak": "firing"}
        assert active["AcceleratorLost"]["labels"]["pci"] == "0000:13:00.0"  # it now names the chip's address
        time.sleep(1.5)  # past group_wait and group_interval: a re-announcement would have gone
        assert hook.requests == [] and pd.requests == []
    finally:
        alerting.stop()
    alerting = make(tmp_path, notify)  # and once more, now that the rows are re-keyed
    alerting.start()
    try:
        alerting.evaluate(still)
        time.sleep(1.5)
        assert hook.requests == [] and pd.requests == []
        alerting.evaluate([info, sample("tpuwatch_device_up", 1, device="3")], time.time() + 301)
        wait_until(lambda: len(hook.requests) == 2 and len(pd.requests) == 2, 10, "the resolutions")
    finally:
        alerting.stop()
    # Receivers are told the resolve under the id they were told the alert by, so incidents close.
    assert sorted(e["dedup_key"] for e in pd.json()) == sorted([lost, leak])
    assert {e["event_action"] for e in pd.json()} == {"resolve"}
    assert sorted(a["fingerprint"] for b in hook.json() for a in b["alerts"]) == sorted([lost, leak])
    with sqlite3.connect(db) as conn:
        stored = {r[0] for r in conn.execute("SELECT fingerprint FROM alerts")}
    assert lost not in stored and leak not in stored  # re-keyed to today's fingerprints
