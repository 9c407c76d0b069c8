"""Storms and failing collectors: a series missing for a cycle or several neither resolves its alert nor makes
notifications flap (issue #14 item 5), counted at a real receiver on 127.0.0.1."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import pytest
from test_alerting_receivers import firing_alert, notifiers_for

from tpuwatch.alerting.dispatch import Dispatcher
from tpuwatch.alerting.rules import LOOKBACK_S
from tpuwatch.alerting.tracker import Track, Tracker
from tpuwatch.config import AlertingConfig
from tpuwatch.samples import Sample, sample

from conftest import wait_until

T0 = 1_700_000_000.0


def chips(down: str | None = None) -> list[Sample]:
    """What the devices collector reports: four chips, one of them possibly lost."""
    return [sample("tpuwatch_device_up", 0 if d == down else 1, device=d) for d in "0123"]


def xid(count: int, device: str = "1") -> Sample:
    """The kernel collector's counter of critical Xid events on a chip."""
    return sample("tpuwatch_kernel_events_total", count, rule="nvidia_xid", severity="critical", device=device)


def test_a_storm_whose_series_vanishes_every_other_cycle_notifies_once(
        receivers: Any, make_alerting: Any, caplog: pytest.LogCaptureFixture) -> None:
    """100k Xid lines a second: the kernel and device collectors time out every other cycle, so their series
    are missing from every other evaluation.  Each alert is told once, never resolved, and an event on
    another chip in the middle of the storm is told at once.  The lost chip's own events stay inhibited
    through the cycles its reading is missing."""
    hook = receivers()
    alerting = make_alerting([{"name": "hook", "type": "webhook", "url": hook.url()}])
    alerting.start()
    started = time.monotonic()
    count = 0
    with caplog.at_level(logging.WARNING, logger="tpuwatch.alerting"):
        alerting.evaluate([*chips(), xid(0), xid(0, device="3")])
        for cycle in range(1, 61):  # 60 cycles of 50 ms: three group_intervals
            count += 100_000 // 20
            timed_out = cycle % 2 == 0
            samples = [] if timed_out else [*chips(down="3"), xid(count), xid(count, device="3")]
            if cycle >= 30 and not timed_out:
                samples.append(xid(1, device="2"))  # a new event, on another chip, mid-storm
            alerting.evaluate(samples)
            time.sleep(0.05)
        storm_ended = time.time()
        wait_until(lambda: len(hook.requests) >= 3, 5, "the notifications")
        time.sleep(max(0.0, started + 4.5 - time.monotonic()))  # past another group_interval: nothing more
    groups = sorted((b["groupLabels"]["alertname"], b["groupLabels"]["device"], b["status"]) for b in hook.json())
    assert groups == [("AcceleratorLost", "3", "firing"), ("KernelHardwareErrorCritical", "1", "firing"),
                      ("KernelHardwareErrorCritical", "2", "firing")]
    mid_storm = next(r for r in hook.requests if '"device": "2"' in r["body"].decode())
    assert mid_storm["at"] < storm_ended  # told during the storm, not held back by it
    assert "resolved" not in caplog.text
    assert {a["labels"]["alertname"] for a in alerting.active_alerts() if a["state"] == "firing"} == {
        "AcceleratorLost", "KernelHardwareErrorCritical"}


def test_the_tracker_keeps_a_missing_series_for_its_window_then_forgets_it() -> None:
    tracker = Tracker()
    tracks = {"tpuwatch_kernel_events_total": Track("tpuwatch", 3600.0, 3600.0),
              "tpuwatch_device_up": Track("gauge", 0.0, LOOKBACK_S)}
    tracker.observe([xid(0), *chips()], tracks, T0)
    tracker.observe([xid(5), *chips()], tracks, T0 + 10)
    tracker.observe([], tracks, T0 + 20)  # both collectors failed this cycle
    held = {s.name for s, _ in tracker.held(T0 + 20)}
    assert held == {"tpuwatch_kernel_events_total", "tpuwatch_device_up"}
    assert tracker.increase(xid(0)[:2], 3600.0, T0 + 20) == 5
    tracker.observe([xid(7)], tracks, T0 + 30)  # back: counted on, not as a new series
    assert tracker.increase(xid(0)[:2], 3600.0, T0 + 30) == 7
    tracker.observe([], tracks, T0 + 10 + LOOKBACK_S + 1)
    assert {s.name for s, _ in tracker.held(T0 + 10 + LOOKBACK_S + 1)} == {"tpuwatch_kernel_events_total"}
    tracker.observe([], tracks, T0 + 30 + 3601)
    assert tracker.held(T0 + 30 + 3601) == []


def test_value_rules_hold_a_missing_series_for_the_lookback(make_alerting: Any) -> None:
    alerting = make_alerting([])
    alerting.evaluate(chips(down="3"), T0)
    alerting.evaluate([], T0 + 10)
    assert [a["state"] for a in alerting.active_alerts()] == ["firing"]
    alerting.evaluate([], T0 + LOOKBACK_S + 1)
    assert alerting.active_alerts() == []


def test_a_resolve_and_refire_tell_the_group_at_most_once_per_group_interval() -> None:
    """Even when an alert does resolve (its series gone for longer than it is held) and fire again, and again,
    its group is told once per group_interval, not once per flap."""
    notifiers = notifiers_for("  - {name: hook, type: webhook, url: 'http://127.0.0.1:9/'}\n")
    dispatcher = Dispatcher(AlertingConfig(group_wait=0.0, group_interval=300.0), notifiers, 10.0, "x")
    told: list[tuple[float, list[str]]] = []
    alert = firing_alert("0")
    for t in range(0, 1800, 10):  # firing for 40 s, gone for 30 s, over and over
        now = T0 + t
        if t % 70 >= 40 and alert.state == "firing":
            alert.state, alert.resolved_at = "resolved", now
        elif t % 70 < 40 and alert.state == "resolved":
            alert.state, alert.resolved_at, alert.fired_at = "firing", None, now
        out, _ = dispatcher.due([alert], now)
        for n in out:
            told.append((t, [a["status"] for a in json.loads(n.bodies[0])["alerts"]]))
            if n.told_firing:
                alert.notified[n.receiver] = now
            if n.told_resolved:
                alert.notified.pop(n.receiver, None)
    times = [t for t, _ in told]
    assert times[0] == 0 and all(b - a >= 300 for a, b in zip(times, times[1:]))
    assert ["resolved"] in [statuses for _, statuses in told]  # it did flap, as told
    assert len(told) <= 1800 // 300 + 1
