"""Grouping, timing and routing of notifications (Alertmanager's group_wait/interval/repeat), on a fake clock."""

from __future__ import annotations

import json
from pathlib import Path

from test_alerting_receivers import firing_alert, notifiers_for

from tpuwatch.alerting.delivery import Breaker, backoff
from tpuwatch.alerting.dispatch import Dispatcher
from tpuwatch.alerting.state import Alert
from tpuwatch.config import AlertingConfig

T0 = 1_700_000_000.0
CONFIG = AlertingConfig(group_wait=30.0, group_interval=300.0, repeat_interval=3600.0, resend_delay=60.0)
TESTDATA = Path(__file__).parent / "testdata" / "alerting"


def tell(alerts: list[Alert], notifications: list, now: float) -> None:
    """What Alerting does once the notifications are queued."""
    by_fp = {a.fingerprint: a for a in alerts}
    for n in notifications:
        for fp in n.told_firing:
            by_fp[fp].notified[n.receiver] = now
        for fp in n.told_resolved:
            by_fp[fp].notified.pop(n.receiver, None)


def test_group_wait_then_group_interval_then_repeat() -> None:
    notifiers = notifiers_for("  - {name: hook, type: webhook, url: 'http://127.0.0.1:9/'}\n")
    dispatcher = Dispatcher(CONFIG, notifiers, 10.0, "http://h1:9847")
    a0 = firing_alert("0")
    alerts = [a0]
    assert dispatcher.due(alerts, T0) == ([], T0 + 30)
    out, wake = dispatcher.due(alerts, T0 + 30)
    assert [len(n.bodies) for n in out] == [1] and wake == T0 + 30 + 3600
    tell(alerts, out, T0 + 30)
    # A second alert in the same group waits for group_interval after the last notification.
    a0b = firing_alert("0")
    a0b.labels = {**a0b.labels, "kind": "uncorrected"}
    a0b.fingerprint = "f" * 16
    alerts.append(a0b)
    assert dispatcher.due(alerts, T0 + 40) == ([], T0 + 330)
    out, _ = dispatcher.due(alerts, T0 + 330)
    body = json.loads(out[0].bodies[0])
    assert [a["fingerprint"] for a in body["alerts"]] == [a0.fingerprint, "f" * 16]
    tell(alerts, out, T0 + 330)
    # Nothing new: the next one is the repeat.
    assert dispatcher.due(alerts, T0 + 1000) == ([], T0 + 330 + 3600)
    out, _ = dispatcher.due(alerts, T0 + 3930)
    assert len(out) == 1
    tell(alerts, out, T0 + 3930)
    # Resolution goes out after group_interval, as resolved.
    a0.state, a0.resolved_at = "resolved", T0 + 4000
    out, _ = dispatcher.due(alerts, T0 + 4230)
    body = json.loads(out[0].bodies[0])
    assert body["status"] == "firing"
    assert [(a["fingerprint"], a["status"]) for a in body["alerts"]] == [("f" * 16, "firing"),
                                                                         (a0.fingerprint, "resolved")]
    assert out[0].told_resolved == (a0.fingerprint,)


def test_groups_are_per_alertname_and_device_and_restarts_do_not_reannounce() -> None:
    notifiers = notifiers_for("  - {name: hook, type: webhook, url: 'http://127.0.0.1:9/'}\n")
    alerts = [firing_alert("0"), firing_alert("1"), firing_alert("1", "AcceleratorLost")]
    dispatcher = Dispatcher(CONFIG, notifiers, 10.0, "x")
    assert dispatcher.due(alerts, T0)[0] == []
    out, _ = dispatcher.due(alerts, T0 + 30)
    groups = [json.loads(n.bodies[0])["groupLabels"] for n in out]
    assert groups == [{"alertname": "AcceleratorEccUncorrectable", "device": "0"},
                      {"alertname": "AcceleratorEccUncorrectable", "device": "1"},
                      {"alertname": "AcceleratorLost", "device": "1"}]
    tell(alerts, out, T0 + 30)
    # A new dispatcher (a restart) sees what was told: no notification until the repeat interval.
    restarted = Dispatcher(CONFIG, notifiers, 10.0, "x")
    assert restarted.due(alerts, T0 + 100) == ([], T0 + 30 + 3600)


def test_routes_match_labels_and_inhibited_alerts_are_held_back() -> None:
    notifiers = notifiers_for("  - {name: pager, type: pagerduty, routing_key: k, match: {severity: critical}}\n"
                              "  - {name: chat, type: slack, url: 'http://127.0.0.1:9/', "
                              "match: {severity: warning|info}}\n")
    dispatcher = Dispatcher(AlertingConfig(group_wait=0.0), notifiers, 10.0, "x")
    critical = firing_alert("0")
    inhibited = firing_alert("1")
    inhibited.inhibited = True
    out, _ = dispatcher.due([critical, inhibited], T0)
    assert [(n.receiver, n.told_firing) for n in out] == [("pager", (critical.fingerprint,))]


def test_alertmanager_resends_every_minute_with_ends_at_and_keeps_resolved_for_a_while() -> None:
    notifiers = notifiers_for("  - {name: am, type: alertmanager, "
                              "urls: ['http://127.0.0.1:9/', 'http://127.0.0.1:8/']}\n")
    assert [n.name for n in notifiers] == ["am/0", "am/1"]
    dispatcher = Dispatcher(CONFIG, notifiers[:1], 10.0, "x")
    alert = firing_alert("0")
    out, wake = dispatcher.due([alert], T0)
    assert wake == T0 + 60 and out[0].supersede
    (sent,) = json.loads(out[0].bodies[0])
    assert sent["endsAt"] == "2023-11-14T22:17:20.000Z"  # now + 4 x max(resend_delay, interval)
    tell([alert], out, T0)
    assert dispatcher.due([alert], T0 + 30) == ([], T0 + 60)
    assert len(dispatcher.due([alert], T0 + 60)[0]) == 1
    alert.state, alert.resolved_at = "resolved", T0 + 70
    out, _ = dispatcher.due([alert], T0 + 70)
    (sent,) = json.loads(out[0].bodies[0])
    assert sent["endsAt"] == "2023-11-14T22:14:30.000Z"
    tell([alert], out, T0 + 70)
    assert len(dispatcher.due([alert], T0 + 70 + 60)[0]) == 1
    assert dispatcher.due([alert], T0 + 70 + 901) == ([], None)


def test_webhook_body_has_the_shape_alertmanager_sends() -> None:
    """Compare with a body captured from Debian's prometheus-alertmanager 0.25 (tests/testdata/alerting)."""
    captured = json.loads((TESTDATA / "alertmanager-webhook.json").read_text())
    notifiers = notifiers_for("  - {name: hook, type: webhook, url: 'http://127.0.0.1:9/'}\n")
    out, _ = Dispatcher(AlertingConfig(group_wait=0.0), notifiers, 10.0, "http://h1:9847").due([firing_alert()], T0)
    ours = json.loads(out[0].bodies[0])
    assert set(ours) == set(captured)
    assert set(ours["alerts"][0]) == set(captured["alerts"][0])
    assert ours["version"] == captured["version"] == "4" and ours["groupKey"] == captured["groupKey"]
    for key, value in captured.items():
        assert type(ours[key]) is type(value), key


def test_backoff_doubles_with_jitter_up_to_the_cap() -> None:
    config = AlertingConfig(retry_initial=1.0, retry_max=300.0)
    for attempts, ceiling in ((0, 1), (1, 2), (5, 32), (9, 300), (500, 300)):
        delays = [backoff(config, attempts) for _ in range(200)]
        assert all(ceiling / 2 <= d < ceiling for d in delays)
        assert max(delays) - min(delays) > ceiling / 10  # jittered, not in lockstep


def test_breaker_opens_after_consecutive_failures_and_a_failed_trial_reopens_quietly() -> None:
    breaker = Breaker(failures=3, reset=300.0)
    assert [breaker.record(False, T0) for _ in range(2)] == [None, None] and breaker.blocked_until(T0) is None
    assert breaker.record(False, T0) == "opened" and breaker.blocked_until(T0 + 1) == T0 + 300
    assert breaker.blocked_until(T0 + 300) is None  # the trial may go
    assert breaker.record(False, T0 + 300) == "still" and breaker.blocked_until(T0 + 301) == T0 + 600
    assert breaker.record(True, T0 + 600) == "closed"
    assert breaker.blocked_until(T0 + 600) is None and breaker.consecutive == 0 and not breaker.is_open


def test_open_breaker_lets_a_trial_through_every_trial_period_and_reports_once_per_reset() -> None:
    breaker = Breaker(failures=5, reset=300.0, trial=30.0)
    assert [breaker.record(False, T0 + i) for i in range(5)] == [None, None, None, None, "opened"]
    assert breaker.is_open and breaker.blocked_until(T0 + 5) == T0 + 34
    events = []
    for trial in range(1, 12):  # a receiver that stays dead: one trial per 30 s, no more
        start = T0 + 4 + 30 * trial
        assert breaker.blocked_until(start - 0.5) == start and breaker.blocked_until(start) is None
        events.append(breaker.record(False, start))
    assert events.count("still") == 1 and events[9] == "still"  # T0 + 304: one report per reset period
    # A trial that is answered closes it at once: the backlog goes without waiting for the reset.
    assert breaker.record(True, T0 + 364) == "closed" and breaker.blocked_until(T0 + 364) is None
    # The trial period is never longer than the reset (the old behaviour with breaker_trial >= breaker_reset).
    assert Breaker(failures=1, reset=10.0, trial=30.0).trial == 10.0
