"""Grouping, timing and routing of notifications (Alertmanager's group_wait/interval/repeat), on a fake clock."""

from __future__ import annotations

import json
from pathlib import Path

from test_alerting_receivers import firing_alert, notifiers_for

from tpuwatch.alerting.db import Notification
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


HOOK = "  - {name: hook, type: webhook, url: 'http://127.0.0.1:9/'}\n"


def _resolve_and_tell(dispatcher: Dispatcher, alert: Alert, at: float) -> float:
    """Resolve a firing ``alert`` whose group was last told before ``at``; return when the resolve went out."""
    alert.state, alert.resolved_at = "resolved", at
    _, wake = dispatcher.due([alert], at)
    assert wake is not None
    out, _ = dispatcher.due([alert], wake)
    assert [n.told_resolved for n in out] == [(alert.fingerprint,)]
    tell([alert], out, wake)
    return wake


def test_a_group_that_fires_again_after_its_timer_is_forgotten_waits_group_wait_again() -> None:
    """A group's timer outlives its alerts by group_interval and no longer: a re-fire after that is a new group
    (group_wait), whether the resolved alert is still in the book or already dropped from it."""
    for keep_resolved in (True, False):
        dispatcher = Dispatcher(CONFIG, notifiers_for(HOOK), 10.0, "x")
        old = firing_alert("0")
        assert dispatcher.due([old], T0) == ([], T0 + 30)
        out, _ = dispatcher.due([old], T0 + 30)
        tell([old], out, T0 + 30)
        told = _resolve_and_tell(dispatcher, old, T0 + 100)
        assert told == T0 + 330
        # Told, nothing firing: nothing is pending for this group.
        assert dispatcher.due([old], T0 + 400) == ([], None)
        # At group_interval after that notification the timer goes.
        assert dispatcher.due([old] if keep_resolved else [], told + 300) == ([], None)
        again = firing_alert("0")
        assert dispatcher.due([old, again] if keep_resolved else [again], told + 310) == ([], told + 340)
        out, _ = dispatcher.due([again], told + 340)
        assert [n.told_firing for n in out] == [(again.fingerprint,)]


def test_a_group_that_fires_again_within_group_interval_waits_for_it_not_group_wait() -> None:
    dispatcher = Dispatcher(CONFIG, notifiers_for(HOOK), 10.0, "x")
    old = firing_alert("0")
    dispatcher.due([old], T0)
    out, _ = dispatcher.due([old], T0 + 30)
    tell([old], out, T0 + 30)
    told = _resolve_and_tell(dispatcher, old, T0 + 100)
    again = firing_alert("0")
    assert dispatcher.due([again], told + 200) == ([], told + 300)


def test_the_next_wake_is_the_earliest_due_of_any_group_and_any_receiver() -> None:
    a0, a1 = firing_alert("0"), firing_alert("1")
    for order in ([a0, a1], [a1, a0]):
        dispatcher = Dispatcher(CONFIG, notifiers_for(HOOK), 10.0, "x")
        assert dispatcher.due([a0], T0) == ([], T0 + 30)
        assert dispatcher.due(order, T0 + 10) == ([], T0 + 30)  # group 1 is due at T0 + 40
        out, wake = dispatcher.due(order, T0 + 30)
        assert [n.told_firing for n in out] == [(a0.fingerprint,)] and wake == T0 + 40
    # A webhook still in group_wait and an Alertmanager told at once (next resend in 60 s): the webhook is first.
    both = notifiers_for(HOOK + "  - {name: am, type: alertmanager, urls: ['http://127.0.0.1:9/']}\n")
    out, wake = Dispatcher(CONFIG, both, 10.0, "x").due([firing_alert("0")], T0)
    assert [n.receiver for n in out] == ["am/0"] and wake == T0 + 30


def test_a_route_reads_a_missing_label_as_empty() -> None:
    """As Alertmanager's matchers do: ``team: 'db|'`` takes alerts without a team label, ``team: db`` does not."""
    notifiers = notifiers_for("  - {name: any, type: webhook, url: 'http://127.0.0.1:9/', match: {team: 'db|'}}\n"
                              "  - {name: db, type: webhook, url: 'http://127.0.0.1:9/', match: {team: db}}\n")
    out, _ = Dispatcher(AlertingConfig(group_wait=0.0), notifiers, 10.0, "x").due([firing_alert("0")], T0)
    assert [n.receiver for n in out] == ["any"]


def test_a_resolved_alert_is_told_with_its_end_time() -> None:
    dispatcher = Dispatcher(CONFIG, notifiers_for(HOOK), 10.0, "x")
    alert = firing_alert("0")
    dispatcher.due([alert], T0)
    out, _ = dispatcher.due([alert], T0 + 30)
    tell([alert], out, T0 + 30)
    alert.state, alert.resolved_at = "resolved", T0 + 100
    out, _ = dispatcher.due([alert], T0 + 330)
    (resolved,) = json.loads(out[0].bodies[0])["alerts"]
    assert (resolved["status"], resolved["endsAt"]) == ("resolved", "2023-11-14T22:15:00.000Z")  # T0 + 100


def test_send_resolved_false_tells_no_resolve_but_marks_it_told() -> None:
    notifiers = notifiers_for("  - {name: hook, type: webhook, url: 'http://127.0.0.1:9/', send_resolved: false}\n")
    dispatcher = Dispatcher(CONFIG, notifiers, 10.0, "x")
    alert, other = firing_alert("0"), firing_alert("0", "AcceleratorLost")
    dispatcher.due([alert, other], T0)
    out, _ = dispatcher.due([alert, other], T0 + 30)
    tell([alert, other], out, T0 + 30)
    alert.state, alert.resolved_at = "resolved", T0 + 100
    out, _ = dispatcher.due([alert, other], T0 + 330)
    assert out == [Notification("hook", (), (), (alert.fingerprint,))]
    tell([alert, other], out, T0 + 330)
    assert dispatcher.due([alert, other], T0 + 400) == ([], T0 + 30 + 3600)


def test_notifications_carry_their_groups_delivery_priority_and_identity() -> None:
    """Delivery sends critical before warning across groups, and keeps one group's messages in order."""
    warning = firing_alert("1", "AcceleratorThrottled")
    warning.labels = {**warning.labels, "severity": "warning"}
    critical = firing_alert("0")
    dispatcher = Dispatcher(AlertingConfig(group_wait=0.0, repeat_interval=3600.0), notifiers_for(HOOK), 10.0, "x")
    out, _ = dispatcher.due([warning, critical], T0)
    assert [(n.told_firing, n.priority) for n in out] == [((warning.fingerprint,), 1), ((critical.fingerprint,), 0)]
    assert len({n.group for n in out}) == 2 and "" not in {n.group for n in out}
    tell([warning, critical], out, T0)
    repeat, _ = dispatcher.due([warning, critical], T0 + 3600)
    assert [n.group for n in repeat] == [n.group for n in out]
    am = notifiers_for("  - {name: am, type: alertmanager, urls: ['http://127.0.0.1:9/']}\n")
    (sent,) = Dispatcher(CONFIG, am, 10.0, "x").due([warning], T0)[0]
    assert sent.priority == 1
    (sent,) = Dispatcher(CONFIG, am, 10.0, "x").due([warning, critical], T0)[0]
    assert sent.priority == 0


def test_alertmanager_is_told_the_generator_url() -> None:
    am = notifiers_for("  - {name: am, type: alertmanager, urls: ['http://127.0.0.1:9/']}\n")
    (sent,) = Dispatcher(CONFIG, am, 10.0, "http://h1:9847").due([firing_alert("0")], T0)[0]
    assert [a["generatorURL"] for a in json.loads(sent.bodies[0])] == ["http://h1:9847"]


def test_alertmanager_is_resent_firing_alerts_every_resend_delay_not_every_cycle() -> None:
    dispatcher = Dispatcher(CONFIG, notifiers_for("  - {name: am, type: alertmanager, "
                                                  "urls: ['http://127.0.0.1:9/']}\n"), 10.0, "x")
    alert = firing_alert("0")
    for at in range(0, 600, 10):
        out, wake = dispatcher.due([alert], T0 + at)
        assert len(out) == (1 if at % 60 == 0 else 0), at
        assert all(n.told_resolved == () for n in out)
        assert wake == T0 + at + 60 - at % 60
        tell([alert], out, T0 + at)


def test_alertmanager_keeps_a_resolved_alert_for_resolved_retention_inclusive() -> None:
    dispatcher = Dispatcher(CONFIG, notifiers_for("  - {name: am, type: alertmanager, "
                                                  "urls: ['http://127.0.0.1:9/']}\n"), 10.0, "x")
    alert = firing_alert("0")
    tell([alert], dispatcher.due([alert], T0)[0], T0)
    alert.state, alert.resolved_at = "resolved", T0 + 70
    tell([alert], dispatcher.due([alert], T0 + 70)[0], T0 + 70)
    (out,), _ = dispatcher.due([alert], T0 + 70 + 900)
    assert [a["endsAt"] for a in json.loads(out.bodies[0])] == ["2023-11-14T22:14:30.000Z"]
    assert dispatcher.due([alert], T0 + 70 + 901) == ([], None)


def test_alertmanager_with_nothing_active_forgets_its_resend_clock() -> None:
    """Nothing to tell (here the one alert is inhibited): nothing pending.  When it is back, Alertmanager, told
    nothing meanwhile (the alert's endsAt may have passed), hears it at once."""
    dispatcher = Dispatcher(CONFIG, notifiers_for("  - {name: am, type: alertmanager, "
                                                  "urls: ['http://127.0.0.1:9/']}\n"), 10.0, "x")
    assert dispatcher.due([], T0) == ([], None)
    alert = firing_alert("0")
    tell([alert], dispatcher.due([alert], T0)[0], T0)
    alert.inhibited = True
    assert dispatcher.due([alert], T0 + 10) == ([], None)
    alert.inhibited = False
    out, wake = dispatcher.due([alert], T0 + 20)
    assert len(out) == 1 and wake == T0 + 80
