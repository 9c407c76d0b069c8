"""A receiver that comes back: its backlog arrives within one trial period, critical first; one that stays dead
gets one trial per period and no flood.  The clock is the defaults' divided by 30 (a trial every 1 s for 30 s,
retry_max 1 s for 30 s, breaker_reset 10 s for 5 min), so the outages of 10 s and 50 s run as 1/3 s and 5/3 s;
benchmarks/alerting.py measures 10 s, 50 s and 10 min on the real clock."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from alertmanager import RealAlertmanager

from tpuwatch.alerting.db import DB_NAME, Notification
from tpuwatch.alerting.dbopen import open_db
from tpuwatch.samples import Sample, sample

from conftest import wait_until

SCALE = 30.0
TRIAL_S = 30.0 / SCALE
# The defaults, 30 times faster (retry_initial too, so the breaker opens as soon, relatively).
SCALED = {"retry_initial": f"{1000 / SCALE:g}ms", "retry_max": f"{TRIAL_S:g}s", "breaker_failures": 5,
          "breaker_reset": f"{300 / SCALE:g}s", "breaker_trial": f"{TRIAL_S:g}s"}
# Slack for a busy 2-CPU machine: the delivery thread's poll and the receiver's answer, not part of the bound.
SLACK_S = 1.5


def samples(critical: list[int], warning: list[int], ecc: float = 1) -> list[Sample]:
    """Eight chips up; ``ecc`` uncorrectable errors on ``critical`` (a page), a pending memory repair on
    ``warning``."""
    out = [sample("tpuwatch_device_up", 1, device=str(d)) for d in range(8)]
    out += [sample("tpuwatch_device_ecc_errors_total", ecc if d in critical else 0, device=str(d), kind="uncorrected")
            for d in range(8)]
    return out + [sample("tpuwatch_device_memory_repair_pending", 1 if d in warning else 0, device=str(d))
                  for d in range(8)]


def fire(alerting: Any, critical: list[int], warning: list[int]) -> None:
    now = time.time()
    alerting.evaluate(samples([], []), now - 1)
    alerting.evaluate(samples(critical, warning), now)


def metric(alerting: Any, name: str, **labels: str) -> float | None:
    wanted = tuple(sorted(labels.items()))
    return next((s.value for s in alerting.samples() if s.name == name and s.labels == wanted), None)


def severities(hook: Any) -> list[str]:
    return [a["labels"]["severity"] for body in hook.json() for a in body["alerts"]]


# --- the outbox's order --------------------------------------------------------------------------------------


def drain(db: Any) -> list[str]:
    bodies = []
    while (message := db.claim("hook", 1e12, 1.0)[0]) is not None:
        bodies.append(message.body)
        db.delete(message.id)
    return bodies


def test_backlog_goes_critical_first_and_a_group_keeps_its_order(tmp_path: Path) -> None:
    db = open_db(str(tmp_path), 1 << 20)
    for body, priority, group in (("warn-A", 1, "A"), ("warn-B", 1, "B"), ("crit-C", 0, "C"),
                                  ("crit-A", 0, "A"), ("info-D", 2, "D")):
        db.enqueue([Notification("hook", (body,), priority=priority, group=group)], 1.0)
    # crit-A waits behind warn-A, the notification of its own group it follows (a resolve never overtakes).
    assert drain(db) == ["crit-C", "warn-A", "crit-A", "warn-B", "info-D"]


def test_an_outbox_written_before_priorities_keeps_its_order(tmp_path: Path) -> None:
    db = open_db(str(tmp_path), 1 << 20)
    db.close()
    with sqlite3.connect(tmp_path / DB_NAME) as conn:  # the schema of a tpuwatch that kept no ranks
        conn.executescript("DROP TRIGGER outbox_rank_gone; DROP TABLE outbox_rank;")
        conn.executemany("INSERT INTO outbox (receiver, key, body, created, next_attempt) VALUES ('hook', ?, ?, 1, 1)",
                         [(f"k{i}", f"old-{i}") for i in range(3)])
    db = open_db(str(tmp_path), 1 << 20, repair=True)
    db.enqueue([Notification("hook", ("new-crit",), priority=0, group="X")], 2.0)
    assert not [p for p in tmp_path.iterdir() if ".corrupt-" in p.name]  # not taken for a corrupt file
    assert drain(db) == ["new-crit", "old-0", "old-1", "old-2"]


def test_retry_backoff_is_capped_so_recovery_is_noticed_within_30s() -> None:
    from tpuwatch.alerting.delivery import backoff
    from tpuwatch.config import AlertingConfig

    config = AlertingConfig()
    assert config.retry_max == 30.0 and config.breaker_trial == 30.0
    assert (config.breaker_failures, config.breaker_reset) == (5, 300.0)  # the breaker itself is unchanged
    assert max(backoff(config, attempts) for attempts in range(100)) <= 30.0


# --- webhook outages ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("outage_s", [10 / SCALE, 50 / SCALE], ids=["10s", "50s"])
def test_a_webhook_that_comes_back_gets_its_backlog_within_a_trial_critical_first(
        receivers: Any, make_alerting: Any, outage_s: float) -> None:
    hook = receivers("error")
    alerting = make_alerting([{"name": "hook", "type": "webhook", "url": hook.url()}], **SCALED)
    alerting.start()
    down = time.time()
    fire(alerting, critical=[5, 6], warning=[0, 1, 2, 3])
    wait_until(lambda: metric(alerting, "tpuwatch_notification_queue_length", receiver="hook") == 6, 5,
               "six notifications queued")
    wait_until(lambda: time.time() >= down + outage_s and hook.attempts > 0, outage_s + 5, "the outage")
    hook.mode = "record"
    back = time.time()
    wait_until(lambda: len(hook.requests) == 6, TRIAL_S + SLACK_S, "the backlog within one trial period")
    first = hook.requests[0]["at"] - back
    assert first <= TRIAL_S + SLACK_S
    assert severities(hook) == ["critical"] * 2 + ["warning"] * 4
    wait_until(lambda: metric(alerting, "tpuwatch_notifier_circuit_open", receiver="hook") == 0, 5, "closed")
    wait_until(lambda: metric(alerting, "tpuwatch_notification_queue_length", receiver="hook") == 0, 5, "empty")


def test_a_webhook_that_stays_dead_gets_one_trial_per_period_and_then_its_backlog(
        receivers: Any, make_alerting: Any, caplog: pytest.LogCaptureFixture) -> None:
    hook = receivers("error")
    alerting = make_alerting([{"name": "hook", "type": "webhook", "url": hook.url()}], **SCALED)
    alerting.start()
    fire(alerting, critical=[5], warning=[0, 1, 2, 3, 4])
    wait_until(lambda: metric(alerting, "tpuwatch_notifier_circuit_open", receiver="hook") == 1, 5, "open circuit")
    assert 5 <= hook.attempts <= 6  # the five that opened it (one more may be on its way)
    opened, before = time.time(), hook.attempts
    periods = 3
    # Trials keep coming (one per period), and no faster: the third after the opening one at 3 periods at least.
    wait_until(lambda: hook.attempts >= before + periods, periods * TRIAL_S + SLACK_S, "three trials")
    assert time.time() - opened >= periods * TRIAL_S - 0.2, "trials faster than one per period: a flood"
    assert metric(alerting, "tpuwatch_notifier_circuit_open", receiver="hook") == 1
    assert metric(alerting, "tpuwatch_notification_queue_length", receiver="hook") == 6
    assert "circuit open after 5 consecutive failures" in caplog.text and "one trial every 1s" in caplog.text
    hook.mode = "record"
    back = time.time()
    wait_until(lambda: len(hook.requests) == 6, TRIAL_S + SLACK_S, "the backlog within one trial period")
    assert hook.requests[0]["at"] - back <= TRIAL_S + SLACK_S
    assert severities(hook)[0] == "critical"
    wait_until(lambda: "circuit closed, delivering again" in caplog.text, 5, "the circuit's closing logged")


# --- a real Alertmanager --------------------------------------------------------------------------------------


def names(am: RealAlertmanager) -> list[str]:
    return sorted(a["labels"]["alertname"] for a in am.held())


@pytest.mark.parametrize("outage_s", [10 / SCALE, 50 / SCALE], ids=["10s", "50s"])
def test_a_restarted_alertmanager_gets_the_alerts_within_a_trial(receivers: Any, make_alerting: Any,
                                                                tmp_path: Path, outage_s: float) -> None:
    hook = receivers()
    am = RealAlertmanager(tmp_path, hook.url())
    try:
        am.start()
        am.stop()  # down from the start: what fires is queued for it
        alerting = make_alerting([{"name": "am", "type": "alertmanager", "url": am.url}], **SCALED)
        alerting.start()
        down = time.time()
        fire(alerting, critical=[5], warning=[0])
        wait_until(lambda: (metric(alerting, "tpuwatch_notifications_total", receiver="am", result="failed") or 0)
                   >= 1, 5, "a failed attempt")
        wait_until(lambda: time.time() >= down + outage_s, outage_s + 1, "the outage")
        back = am.start()
        got = wait_until(lambda: names(am) == ["AcceleratorEccUncorrectable", "AcceleratorMemoryRepairPending"],
                         TRIAL_S + SLACK_S, "Alertmanager holding both alerts within one trial period")
        assert got and time.time() - back <= TRIAL_S + SLACK_S + 0.5
        # And Alertmanager does its own job with them: its webhook hears the page.
        wait_until(lambda: any(b["groupLabels"].get("alertname") == "AcceleratorEccUncorrectable"
                               for b in hook.json()), 10, "Alertmanager's webhook")
    finally:
        am.stop()
