"""Alert identity and life cycle: pending -> firing -> resolved, with inhibition by lost chips."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

from tpuwatch.alerting.rules import Candidate

State = Literal["pending", "firing", "resolved"]
ZERO_TIME = "0001-01-01T00:00:00Z"


def fingerprint(labels: dict[str, str]) -> str:
    """A stable 16-hex-digit id of a label set (order does not matter)."""
    digest = hashlib.sha256()
    for key in sorted(labels):
        digest.update(f"{key}\0{labels[key]}\0".encode())
    return digest.hexdigest()[:16]


def rfc3339(timestamp: float) -> str:
    """Unix time as RFC 3339 UTC with milliseconds, the form Alertmanager writes."""
    moment = datetime.fromtimestamp(timestamp, timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


@dataclass
class Alert:
    """One alert instance, identified by the fingerprint of its labels."""

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

    @property
    def group_key(self) -> tuple[str, str]:
        """Alerts are grouped by alert name and chip."""
        return self.labels.get("alertname", ""), self.labels.get("device", "")

    def to_json(self) -> dict[str, Any]:
        """The alert as ``/api/alerts`` and ``tpuwatch alerts`` show it."""
        return {"fingerprint": self.fingerprint, "state": self.state, "labels": self.labels,
                "annotations": self.annotations, "value": self.value, "inhibited": self.inhibited,
                "activeAt": rfc3339(self.active_at),
                "startsAt": rfc3339(self.fired_at) if self.fired_at is not None else None,
                "endsAt": rfc3339(self.resolved_at) if self.resolved_at is not None else None}


class AlertBook:
    """Every known alert; ``apply`` moves them through their states from one evaluation's candidates."""

    def __init__(self, alerts: list[Alert] | None = None) -> None:
        self.alerts: dict[str, Alert] = {a.fingerprint: a for a in alerts or []}

    def apply(self, candidates: list[Candidate], down_devices: set[str], now: float) -> list[Alert]:
        """Update states; returns the alerts whose state changed (for persistence)."""
        changed: list[Alert] = []
        seen: dict[str, Candidate] = {}
        for candidate in candidates:
            seen.setdefault(fingerprint(candidate.labels), candidate)
        for fp, candidate in seen.items():
            alert = self.alerts.get(fp)
            if alert is None or alert.state == "resolved":
                notified = alert.notified if alert is not None else {}
                alert = self.alerts[fp] = Alert(fp, candidate.labels, candidate.annotations, "pending", now,
                                                notified=notified)
                changed.append(alert)
            alert.annotations, alert.value = candidate.annotations, candidate.value
            alert.inhibited = (candidate.rule.inhibit_when_device_down
                               and candidate.labels.get("device") in down_devices)
            if alert.state == "pending" and now - alert.active_at >= candidate.rule.for_:
                alert.state, alert.fired_at = "firing", now
                if alert not in changed:
                    changed.append(alert)
        for fp, alert in list(self.alerts.items()):
            if fp in seen or alert.state == "resolved" or alert.hold_until > now:
                continue
            if alert.state == "pending":
                del self.alerts[fp]
                alert.state = "resolved"
            else:
                alert.state, alert.resolved_at = "resolved", now
            changed.append(alert)
        return changed

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
