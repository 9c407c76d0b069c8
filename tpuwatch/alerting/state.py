"""Alert identity and life cycle: pending -> firing -> resolved, with inhibition by lost chips.

An alert's fingerprint is Alertmanager's (prometheus/common ``model/signature.go``:
FNV-1a 64 over the label names, sorted, and their values, each followed by the
0xff separator byte, written ``%016x``), so one alert has one id in tpuwatch's
webhooks, its API and Alertmanager's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from tpuwatch.alerting.rules import Candidate
from tpuwatch.notifiers.base import Sent, rfc3339

State = Literal["pending", "firing", "resolved"]
_FNV_OFFSET = 14695981039346656037
_FNV_PRIME = 1099511628211
_SEPARATOR = 0xFF


def fingerprint(labels: dict[str, str]) -> str:
    """Alertmanager's fingerprint of a label set: 16 hex digits, label order does not matter."""
    digest = _FNV_OFFSET
    for name in sorted(labels):
        for part in (name, labels[name]):
            for byte in part.encode("utf-8", "surrogatepass") + bytes([_SEPARATOR]):
                digest = ((digest ^ byte) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return f"{digest:016x}"


@dataclass
class Alert:
    """One alert instance, identified by the fingerprint of its labels.

    ``told_as`` is the id receivers were told before an upgrade changed how
    fingerprints are computed: kept, so that their resolve closes what they opened.
    """

    fingerprint: str
    labels: dict[str, str]
    annotations: dict[str, str]
    state: State
    active_at: float
    fired_at: float | None = None
    resolved_at: float | None = None
    value: float = 0.0
    inhibited: bool = False
    hold_until: float = 0.0
    notified: dict[str, float] = field(default_factory=dict)
    told_as: str | None = None

    @property
    def key(self) -> str:
        """The id receivers know this alert by (PagerDuty's dedup_key, the webhook's fingerprint)."""
        return self.told_as or self.fingerprint

    @property
    def group_key(self) -> tuple[str, str]:
        """Alerts are grouped by alert name and chip."""
        return self.labels.get("alertname", ""), self.labels.get("device", "")

    def told(self, firing: bool, ends_at: float | None = None) -> Sent:
        """This alert as a notification tells it: firing, or resolved at ``ends_at``."""
        return Sent(self.labels, self.annotations, self.key, self.fired_at or self.active_at, firing, ends_at)

    def to_json(self) -> dict[str, Any]:
        """The alert as ``/api/alerts`` and ``tpuwatch alerts`` show it."""
        return {"fingerprint": self.fingerprint, "state": self.state, "labels": self.labels,
                "annotations": self.annotations, "value": self.value, "inhibited": self.inhibited,
                "activeAt": rfc3339(self.active_at),
                "startsAt": rfc3339(self.fired_at) if self.fired_at is not None else None,
                "endsAt": rfc3339(self.resolved_at) if self.resolved_at is not None else None}


@dataclass
class Changes:
    """What one ``apply`` changed: alerts to store, those that started or stopped firing, ids that moved."""

    saved: list[Alert] = field(default_factory=list)
    fired: list[Alert] = field(default_factory=list)
    resolved: list[Alert] = field(default_factory=list)
    rekeyed: list[tuple[str, str]] = field(default_factory=list)

    def save(self, alert: Alert) -> None:
        if all(a is not alert for a in self.saved):
            self.saved.append(alert)


class AlertBook:
    """Every known alert; ``apply`` moves them through their states from one evaluation's candidates."""

    def __init__(self, alerts: list[Alert] | None = None) -> None:
        self.alerts: dict[str, Alert] = {a.fingerprint: a for a in alerts or []}

    def apply(self, candidates: list[Candidate], down_devices: set[str], now: float) -> Changes:
        """Update states from the candidates that hold now."""
        changes = Changes()
        seen: dict[str, Candidate] = {}
        for candidate in candidates:
            seen.setdefault(fingerprint(candidate.labels), candidate)
        for fp, candidate in seen.items():
            alert = self.alerts.get(fp)
            if alert is None:
                alert = self._adopt(fp, candidate, changes)
            if alert is None or alert.state == "resolved":
                notified = alert.notified if alert is not None else {}
                told_as = alert.told_as if alert is not None and notified else None
                alert = self.alerts[fp] = Alert(fp, candidate.labels, candidate.annotations, "pending", now,
                                                notified=notified, told_as=told_as)
                changes.save(alert)
            alert.annotations, alert.value = candidate.annotations, candidate.value
            alert.inhibited = (candidate.rule.inhibit_when_device_down
                               and candidate.labels.get("device") in down_devices)
            if alert.state == "pending" and now - alert.active_at >= candidate.rule.for_:
                alert.state, alert.fired_at = "firing", now
                changes.save(alert)
                changes.fired.append(alert)
        for fp, alert in list(self.alerts.items()):
            if fp in seen or alert.state == "resolved" or alert.hold_until > now:
                continue
            self.resolve(fp, now, changes)
        return changes

    def resolve(self, fp: str, now: float, changes: Changes) -> None:
        """End an alert now: a pending one is forgotten, a firing one resolves (and is told so)."""
        alert = self.alerts[fp]
        if alert.state == "pending":
            del self.alerts[fp]
            alert.state = "resolved"
        else:
            alert.state, alert.resolved_at = "resolved", now
            changes.resolved.append(alert)
        changes.save(alert)

    def _adopt(self, fp: str, candidate: Candidate, changes: Changes) -> Alert | None:
        """An active alert stored before chip alerts carried ``pci``, re-keyed to the candidate's labels."""
        if "pci" not in candidate.labels:
            return None
        bare = {k: v for k, v in candidate.labels.items() if k != "pci"}
        old = next((a for a in self.alerts.values() if a.state != "resolved" and a.labels == bare), None)
        if old is None:
            return None
        del self.alerts[old.fingerprint]
        changes.rekeyed.append((old.fingerprint, fp))
        old.told_as = old.key if old.notified else None
        old.fingerprint, old.labels = fp, candidate.labels
        self.alerts[fp] = old
        changes.save(old)
        return old

    def forget_resolved(self, before: float) -> list[str]:
        """Drop resolved alerts that every receiver has been told about and that resolved before ``before``."""
        gone = [fp for fp, a in self.alerts.items()
                if a.state == "resolved" and not a.notified and (a.resolved_at or 0.0) < before]
        for fp in gone:
            del self.alerts[fp]
        return gone

    def active(self) -> list[Alert]:
        """Pending and firing alerts, oldest first."""
        return sorted((a for a in self.alerts.values() if a.state != "resolved"), key=lambda a: a.active_at)
