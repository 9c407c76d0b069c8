"""Which notifications are due: grouping and timing as Alertmanager does them, routes to receivers.

Pure logic over the alert book and what each receiver was told
(``Alert.notified``): :meth:`Dispatcher.due` returns the notifications to queue
now and when to look again.  Group timers live in memory; after a restart a
group's last notification is the latest time its alerts were told, so firing
alerts are not announced again before ``repeat_interval``.  A group's timer
outlives its alerts by ``group_interval``, so an alert that resolves and fires
again is told at most once per ``group_interval``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from tpuwatch.alerting.db import Notification, priority
from tpuwatch.alerting.state import Alert
from tpuwatch.config import AlertingConfig
from tpuwatch.notifiers import Notifier

GroupKey = tuple[str, str]


@dataclass
class _Timer:
    created: float
    last_flush: float | None


class Dispatcher:
    """Turns alert state into due notifications for every notifier."""

    def __init__(self, config: AlertingConfig, notifiers: Sequence[Notifier], interval: float,
                 external_url: str) -> None:
        self.config = config
        self.notifiers = list(notifiers)
        self.external_url = external_url
        self._valid_for = 4 * max(config.resend_delay, interval)
        self._routes = {n.name: {k: re.compile(v) for k, v in n.config.match.items()} for n in notifiers}
        self._timers: dict[tuple[str, GroupKey], _Timer] = {}
        self._am_last: dict[str, float] = {}

    def routed(self, notifier: Notifier, alert: Alert) -> bool:
        """Whether the receiver's ``match`` regexes all match the alert's labels."""
        return all(p.fullmatch(alert.labels.get(k, "")) for k, p in self._routes[notifier.name].items())

    def due(self, alerts: Sequence[Alert], now: float) -> tuple[list[Notification], float | None]:
        """Notifications to queue now, and the earliest time another may fall due (None: nothing pending)."""
        out: list[Notification] = []
        wake: float | None = None
        for notifier in self.notifiers:
            mine = [a for a in alerts if self.routed(notifier, a) or notifier.name in a.notified]
            found, when = (self._resend if notifier.kind.resend else self._grouped)(notifier, mine, now)
            out += found
            if when is not None:
                wake = when if wake is None else min(wake, when)
        return out, wake

    def _grouped(self, notifier: Notifier, alerts: Sequence[Alert], now: float) -> tuple[list[Notification],
                                                                                       float | None]:
        groups: dict[GroupKey, list[Alert]] = {}
        for a in alerts:
            groups.setdefault(a.group_key, []).append(a)
        for stale in [k for k, t in self._timers.items() if k[0] == notifier.name and k[1] not in groups
                      and self._expired(t, now)]:
            del self._timers[stale]
        out, wake = [], None
        for key, members in groups.items():
            firing = [a for a in members if a.state == "firing" and not a.inhibited]
            gone = [a for a in members if a.state == "resolved" and notifier.name in a.notified]
            new = [a for a in firing if notifier.name not in a.notified]
            timer = self._timers.get((notifier.name, key))
            if timer is None:
                told = [a.notified[notifier.name] for a in members if notifier.name in a.notified]
                timer = self._timers[(notifier.name, key)] = _Timer(now, max(told) if told else None)
            if new or gone:
                due = (timer.created + self.config.group_wait if timer.last_flush is None
                       else timer.last_flush + self.config.group_interval)
            elif firing and timer.last_flush is not None:
                due = timer.last_flush + self.config.repeat_interval
            else:
                if not firing and self._expired(timer, now):
                    del self._timers[(notifier.name, key)]
                continue
            if due > now:
                wake = due if wake is None else min(wake, due)
                continue
            timer.last_flush = now
            out.append(self._group_notification(notifier, key, firing, gone))
            wake = (now + self.config.repeat_interval) if wake is None else min(wake, now + self.config.repeat_interval)
        return out, wake

    def _expired(self, timer: _Timer, now: float) -> bool:
        """Whether a group without firing alerts may forget its timer (its next notice would wait group_wait)."""
        return timer.last_flush is None or now >= timer.last_flush + self.config.group_interval

    def _group_notification(self, notifier: Notifier, key: GroupKey, firing: list[Alert],
                            gone: list[Alert]) -> Notification:
        told_resolved = tuple(a.fingerprint for a in gone)
        sent = [a.told(True) for a in firing]
        if notifier.config.send_resolved:
            sent += [a.told(False, a.resolved_at) for a in gone]
        if not sent:
            return Notification(notifier.name, (), (), told_resolved)
        bodies = notifier.bodies(key, sent, self.external_url)
        return Notification(notifier.name, tuple(bodies), tuple(a.fingerprint for a in firing), told_resolved,
                            priority=priority(s.labels.get("severity", "") for s in sent), group="\0".join(key))

    def _resend(self, notifier: Notifier, alerts: Sequence[Alert], now: float) -> tuple[list[Notification],
                                                                                      float | None]:
        """Alertmanager's API path: every active alert at once on a change, again every resend_delay."""
        firing = [a for a in alerts if a.state == "firing" and not a.inhibited]
        recent = [a for a in alerts if a.state == "resolved" and a.resolved_at is not None
                  and now - a.resolved_at <= self.config.resolved_retention]
        changed = (any(notifier.name not in a.notified for a in firing)
                   or any(notifier.name in a.notified for a in alerts if a.state == "resolved"))
        if not firing and not recent and not changed:
            self._am_last.pop(notifier.name, None)
            return [], None
        last = self._am_last.get(notifier.name)
        due = now if changed or last is None else last + self.config.resend_delay
        if due > now:
            return [], due
        self._am_last[notifier.name] = now
        sent = [a.told(True, now + self._valid_for) for a in firing]
        sent += [a.told(False, a.resolved_at) for a in recent]
        told_resolved = tuple(a.fingerprint for a in alerts if a.state == "resolved" and notifier.name in a.notified)
        bodies = notifier.bodies(("", ""), sent, self.external_url)
        urgency = priority(s.labels.get("severity", "") for s in sent)
        return [Notification(notifier.name, tuple(bodies), tuple(a.fingerprint for a in firing), told_resolved,
                             supersede=True, priority=urgency)], now + self.config.resend_delay
