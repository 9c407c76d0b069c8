"""Durable delivery end to end: the Alerting facade, its SQLite outbox and real receivers on 127.0.0.1."""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from prometheus_client import generate_latest

from tpuwatch import config as config_module
from tpuwatch.alerting import Alerting
from tpuwatch.alerting.database import OutboxFull
from tpuwatch.alerting.db import DB_NAME, Notification
from tpuwatch.exporter import build_registry
from tpuwatch.samples import Sample, sample
from tpuwatch.schema import ConfigError

from conftest import ALERTING_FAST, free_port, require_tool, run_cli, wait_until

AGENT = Path(__file__).parent / "testdata" / "alerting" / "agent.py"
FAST = ALERTING_FAST


def ecc(devices: range | list[int], value: float = 1) -> list[Sample]:
    """Chips up, with ``value`` uncorrectable ECC errors on each of ``devices``."""
    out = [sample("tpuwatch_device_up", 1, device=str(d)) for d in range(8)]
    return out + [sample("tpuwatch_device_ecc_errors_total", value if d in devices else 0, device=str(d),
                         kind="uncorrected") for d in range(8)]


def metric(alerting: Alerting, name: str, **labels: str) -> float | None:
    wanted = tuple(sorted(labels.items()))
    return next((s.value for s in alerting.samples() if s.name == name and s.labels == wanted), None)


def delivered(alerting: Alerting, receiver: str = "hook") -> float | None:
    """Notifications the receiver acknowledged (counted after its answer, not when it records)."""
    return metric(alerting, "tpuwatch_notifications_total", receiver=receiver, result="delivered")


def fire(alerting: Alerting, devices: range | list[int]) -> None:
    """Two evaluations: counters seen at 0, then raised on ``devices``."""
    now = time.time()
    alerting.evaluate(ecc([]), now - 1)
    alerting.evaluate(ecc(devices), now)


def test_firing_to_post_within_a_second_of_group_wait(receivers: Any, make_alerting: Any) -> None:
    hook = receivers()
    alerting = make_alerting([{"name": "hook", "type": "webhook", "url": hook.url()}], group_wait="500ms")
    alerting.start()
    fired = time.time()
    fire(alerting, [1])
    wait_until(lambda: delivered(alerting) == 1, 5, "the webhook POST")
    delay = hook.requests[0]["at"] - fired
    assert 0.5 <= delay < 1.5
    (sent,) = hook.json()[0]["alerts"]
    assert sent["labels"]["alertname"] == "AcceleratorEccUncorrectable" and sent["labels"]["device"] == "1"
    assert metric(alerting, "tpuwatch_alerts", alertname="AcceleratorEccUncorrectable", severity="critical") == 1


def test_receiver_down_for_a_while_then_back_gets_everything(receivers: Any, make_alerting: Any) -> None:
    hook = receivers("error")
    alerting = make_alerting([{"name": "hook", "type": "webhook", "url": hook.url()}])
    alerting.start()
    fire(alerting, range(6))
    wait_until(lambda: hook.attempts >= 5, 5, "failed attempts")
    assert metric(alerting, "tpuwatch_notification_queue_length", receiver="hook") == 6
    assert metric(alerting, "tpuwatch_notification_queue_oldest_age_seconds", receiver="hook") > 0
    hook.mode = "record"
    wait_until(lambda: len(hook.requests) == 6, 10, "every notification")
    devices = sorted(a["labels"]["device"] for body in hook.json() for a in body["alerts"])
    assert devices == ["0", "1", "2", "3", "4", "5"]
    # The receiver has the last POST before the worker hears its answer and removes the row: wait for that.
    wait_until(lambda: metric(alerting, "tpuwatch_notification_queue_length", receiver="hook") == 0, 5,
               "an empty queue")
    assert metric(alerting, "tpuwatch_notifications_total", receiver="hook", result="failed") >= 4


def test_hanging_receiver_delays_only_itself_and_stop_is_quick(receivers: Any, make_alerting: Any) -> None:
    hung, hook = receivers("hang"), receivers()
    alerting = make_alerting([{"name": "hung", "type": "webhook", "url": hung.url()},
                              {"name": "hook", "type": "webhook", "url": hook.url()}], send_timeout="30s")
    alerting.start()
    fire(alerting, [0])
    wait_until(lambda: hook.requests and hung.attempts, 5, "both receivers reached")
    started = time.monotonic()
    alerting.stop()
    assert time.monotonic() - started < 2.5


def test_circuit_opens_after_consecutive_failures_then_closes(receivers: Any, make_alerting: Any) -> None:
    dropping = receivers("drop")
    alerting = make_alerting([{"name": "flaky", "type": "webhook", "url": dropping.url()}],
                             breaker_failures=3, breaker_reset="1500ms")
    alerting.start()
    fire(alerting, [0])
    wait_until(lambda: metric(alerting, "tpuwatch_notifier_circuit_open", receiver="flaky") == 1, 5, "open circuit")
    attempts = dropping.attempts
    assert attempts == 3
    dropping.mode = "record"
    # On the delivery's own clock: while the circuit is open a step waits for its reset and attempts nothing.
    assert alerting.delivery.step("flaky", time.time()) > 0
    assert dropping.attempts == attempts
    wait_until(lambda: dropping.requests, 5, "delivery after the reset time")
    wait_until(lambda: metric(alerting, "tpuwatch_notifier_circuit_open", receiver="flaky") == 0, 5,
               "the circuit closed by that answer")


def test_old_notifications_expire_counted_and_logged(receivers: Any, make_alerting: Any,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    broken = receivers("error")
    alerting = make_alerting([{"name": "hook", "type": "webhook", "url": broken.url()}], max_age="1s")
    alerting.start()
    with caplog.at_level(logging.ERROR):
        fire(alerting, [0, 1])
        wait_until(lambda: metric(alerting, "tpuwatch_notifications_total", receiver="hook", result="expired") == 2,
                   5, "expiry")
        # The expiry is counted before it is logged: wait for the line too.
        wait_until(lambda: "receiver hook: 2 notification(s) expired undelivered after 1s" in caplog.text, 5,
                   "the expiry logged")
    assert metric(alerting, "tpuwatch_notification_queue_length", receiver="hook") == 0


def test_full_outbox_refuses_new_work_loudly_and_keeps_the_old(receivers: Any, make_alerting: Any,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    hook = receivers("error")
    alerting = make_alerting([{"name": "hook", "type": "webhook", "url": hook.url()}],
                             outbox_max_bytes=1 << 20, retry_initial="10s", retry_max="10s")
    for size in (100_000, 100):  # big rows, then small ones to fill the last pages
        with pytest.raises(OutboxFull):
            for _ in range(100_000):
                alerting.db.enqueue([Notification("hook", (json.dumps("x" * size),))], time.time())
    queued = metric(alerting, "tpuwatch_notification_queue_length", receiver="hook")
    assert queued and queued >= 10
    with caplog.at_level(logging.ERROR):
        fire(alerting, [3])
        alerting.flush()
    assert "outbox full" in caplog.text and "refusing new notifications" in caplog.text
    assert metric(alerting, "tpuwatch_notifications_total", receiver="hook", result="refused") == 1
    assert metric(alerting, "tpuwatch_notification_queue_length", receiver="hook") == queued
    # Space comes back (the receiver recovers and drains the old work): the refused alert is then queued.
    # The old work's retries are 10 s away; make them due now rather than wait.
    hook.mode = "record"
    with sqlite3.connect(alerting.db.path) as conn:
        conn.execute("UPDATE outbox SET next_attempt = 0")
    alerting.start()
    wait_until(lambda: any(b.get("alerts") for b in hook.json() if isinstance(b, dict)), 10, "the refused alert")
    wait_until(lambda: metric(alerting, "tpuwatch_notification_queue_length", receiver="hook") == 0, 5,
               "an empty queue")


def chip_down(samples: list[Sample], device: int) -> list[Sample]:
    """``samples`` with chip ``device`` lost."""
    return [s for s in samples if s != sample("tpuwatch_device_up", 1, device=str(device))] + [
        sample("tpuwatch_device_up", 0, device=str(device))]


def test_restart_neither_reannounces_nor_forgets_to_resolve(receivers: Any, make_alerting: Any) -> None:
    hook = receivers()
    notify = [{"name": "hook", "type": "webhook", "url": hook.url()}]
    first = make_alerting(notify)
    first.start()
    now = time.time()
    first.evaluate(ecc([]), now - 1)
    first.evaluate(chip_down(ecc([2]), 5), now)
    wait_until(lambda: delivered(first) == 2, 5, "two firing notifications")
    first.stop()
    second = make_alerting(notify)
    assert sorted(a["labels"]["device"] for a in second.active_alerts()) == ["2", "5"]
    second.start()
    second.evaluate(ecc([2]))  # chip 5 is back; chip 2's error is still within the rule's hour
    wait_until(lambda: len(hook.requests) == 3, 5, "the resolved notification")
    # The receiver has the POST before the worker hears its answer and removes the row: wait for that.
    wait_until(lambda: delivered(second) == 1, 5, "the resolved notification acknowledged")
    # On the dispatcher's own clock, past group_wait and group_interval: a re-announcement would be queued now.
    second.flush(time.time() + 2.0)
    assert second.db.queue_stats() == {} and len(hook.requests) == 3
    resolved = hook.json()[2]
    assert (resolved["status"], resolved["groupLabels"]["alertname"]) == ("resolved", "AcceleratorLost")
    # The counter memory came through the restart: the ECC alert is neither re-announced nor resolved.
    assert [(a["labels"]["device"], a["state"]) for a in second.active_alerts()] == [("2", "firing")]


def test_kill_9_with_notifications_queued_then_restart(receivers: Any, tmp_path: Path) -> None:
    hook = receivers("error")
    state = tmp_path / "state"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(state), "alerting": FAST,
                                      "notify": [{"name": "hook", "type": "webhook", "url": hook.url()}]}))
    samples = tmp_path / "samples.json"
    samples.write_text(json.dumps([[s.name, s.value, dict(s.labels)] for s in ecc([])]))
    evaluations = tmp_path / "evaluations.log"  # a line per evaluation the agent made

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, str(AGENT), str(config), str(samples)],
                                stdout=open(evaluations, "ab"), stderr=open(tmp_path / "agent.log", "ab"))

    def queued() -> int:
        with sqlite3.connect(state / DB_NAME) as conn:
            return conn.execute("SELECT COUNT(*) FROM outbox").fetchone()[0]

    def count(query: str) -> int:  # -1 until the agent has made its tables
        try:
            with sqlite3.connect(state / DB_NAME) as conn:
                return conn.execute(query).fetchone()[0]
        except sqlite3.OperationalError:
            return -1

    def told() -> int:
        return count("SELECT COUNT(*) FROM notified WHERE receiver = 'hook'")

    agent = start()
    try:
        wait_until(lambda: evaluations.exists() and evaluations.read_text().count("\n") >= 2, 10,
                   "the agent's first evaluations, counters at 0")
        samples.write_text(json.dumps([[s.name, s.value, dict(s.labels)] for s in ecc([0, 1, 2])]))
        wait_until(lambda: queued() == 3 and hook.attempts >= 3, 10, "three queued notifications")
        agent.send_signal(signal.SIGKILL)
        agent.wait()
        hook.mode = "record"
        agent = start()
        wait_until(lambda: len(hook.requests) == 3, 10, "delivery after restart")
        # Delivered and recorded as told: the dispatcher announces them again only after repeat_interval.
        wait_until(lambda: queued() == 0 and told() == 3, 10, "the deliveries recorded")
    finally:
        agent.kill()
        agent.wait()
    assert len(hook.requests) == 3
    assert sorted(b["alerts"][0]["labels"]["device"] for b in hook.json()) == ["0", "1", "2"]
    keys = {r["headers"]["X-Tpuwatch-Notification-Id"] for r in hook.requests}
    assert len(keys) == 3


def test_alertmanager_receives_resends_and_forwards_resolution(make_alerting: Any,
                                                           alertmanager: tuple[str, Any]) -> None:
    url, hook = alertmanager
    alerting = make_alerting([{"name": "am", "type": "alertmanager",
                               "urls": [url, f"http://127.0.0.1:{free_port()}"]}],
                             resend_delay="1s")
    alerting.start()
    now = time.time()
    alerting.evaluate(ecc([]), now - 1)
    alerting.evaluate(chip_down(ecc([4]), 3), now)
    wait_until(lambda: len(hook.requests) >= 2, 10, "alertmanager's webhooks")
    bodies = {b["groupLabels"]["alertname"]: b for b in hook.json()}
    assert {name: (b["status"], b["alerts"][0]["labels"]["device"]) for name, b in bodies.items()} == {
        "AcceleratorEccUncorrectable": ("firing", "4"), "AcceleratorLost": ("firing", "3")}
    listed = requests.get(f"{url}/api/v2/alerts", timeout=5).json()
    assert sorted(a["labels"]["alertname"] for a in listed) == ["AcceleratorEccUncorrectable", "AcceleratorLost"]
    # The second Alertmanager is down: only its queue grows, the first keeps being re-sent to.
    wait_until(lambda: (delivered(alerting, "am/0") or 0) >= 2, 5, "a re-send")
    # Superseded, not piled: a re-send replaces the queued message, except one claimed by a failing attempt at
    # that moment, which the next re-send replaces (a pile would only grow).
    wait_until(lambda: metric(alerting, "tpuwatch_notification_queue_length", receiver="am/1") == 1, 5,
               "one message queued for the Alertmanager that is down")
    alerting.evaluate(ecc([4]))  # chip 3 is back
    wait_until(lambda: any(b["status"] == "resolved" and b["groupLabels"]["alertname"] == "AcceleratorLost"
                           for b in hook.json()), 10, "resolution forwarded")


def test_secrets_stay_out_of_logs_metrics_and_config_show(receivers: Any, tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    broken = receivers("error")
    secrets = {"url": broken.url("/hook/URLT0KEN"), "key": "PDR0UTINGKEY", "hmac": "HMACS3CRET",
               "header": "Bearer HEADERT0KEN"}
    for name in ("url", "key", "hmac"):
        (tmp_path / name).write_text(secrets[name])
    notify = [{"name": "hook", "type": "webhook", "url_file": str(tmp_path / "url"),
               "secret_file": str(tmp_path / "hmac"), "headers": {"Authorization": secrets["header"]}},
              {"name": "pd", "type": "pagerduty", "url": broken.url("/v2/enqueue"),
               "routing_key_file": str(tmp_path / "key")}]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "alerting": FAST, "notify": notify}))
    config = config_module.load(path)
    alerting = Alerting(config, config.state_dir)
    try:
        with caplog.at_level(logging.DEBUG):
            alerting.start()
            fire(alerting, [0])
            # The receiver counts an attempt before it answers; the failure is logged once its answer is heard.
            wait_until(lambda: broken.attempts >= 4 and "receiver hook:" in caplog.text
                       and "receiver pd:" in caplog.text, 5, "failed attempts, logged")
            exported = generate_latest(build_registry(alerting.samples)).decode()
        shown = run_cli("config", "show", "--config", str(path)).stdout
        rows = sqlite3.connect(alerting.db.path).execute("SELECT body FROM outbox").fetchall()
    finally:
        alerting.stop()
    assert "tpuwatch_notifications_total" in exported and "receiver hook" in caplog.text
    for secret in secrets.values():
        for where, text in (("log", caplog.text), ("metrics", exported), ("config show", shown),
                            ("outbox", json.dumps(rows))):
            assert secret not in text, (secret, where)


def test_reconfigure_keeps_the_old_config_on_bad_rules(receivers: Any, make_alerting: Any, tmp_path: Path) -> None:
    hook = receivers()
    alerting = make_alerting([{"name": "hook", "type": "webhook", "url": hook.url()}])
    alerting.start()
    (tmp_path / "bad.yaml").write_text("rules: [{alert: X, metric: m, op: '=>'}]\n")
    bad = config_module.parse(yaml.safe_dump({"alerting": {**FAST, "rule_files": [str(tmp_path / "*.yaml")]}}))
    with pytest.raises(ConfigError, match=r"bad\.yaml: rules\[0\]\.op"):
        alerting.reconfigure(bad)
    fire(alerting, [5])
    wait_until(lambda: delivered(alerting) == 1, 5, "delivery with the old config")
    other = receivers()
    alerting.reconfigure(config_module.parse(yaml.safe_dump(
        {"alerting": FAST, "notify": [{"name": "other", "type": "webhook", "url": other.url()}]})))
    alerting.evaluate(ecc([5, 6], 2))
    wait_until(lambda: delivered(alerting, "other") == 2, 5, "both groups delivered to the new receiver")
    assert delivered(alerting) == 1 and len(hook.requests) == 1
    assert os.path.exists(alerting.db.path)


def test_alerting_metrics_pass_promtool(receivers: Any, make_alerting: Any) -> None:
    promtool = require_tool("promtool")
    hook = receivers()
    alerting = make_alerting([{"name": "hook", "type": "webhook", "url": hook.url()}])
    alerting.start()
    fire(alerting, [0])
    wait_until(lambda: delivered(alerting) == 1, 5, "a delivery")
    exported = generate_latest(build_registry(alerting.samples))
    checked = subprocess.run([promtool, "check", "metrics"], input=exported, capture_output=True, timeout=30)
    assert checked.returncode == 0, checked.stderr.decode() + checked.stdout.decode()
    assert b'tpuwatch_notifications_total{receiver="hook",result="delivered"} 1.0' in exported
