"""``type: pagerduty``: Events API v2, one event per alert, ``dedup_key`` = the alert's fingerprint."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tpuwatch.notifiers.base import GroupKey, Notifier, NotifierType, Receiver, Sent, rfc3339
from tpuwatch.schema import ConfigError
from tpuwatch.syntax import short

_SEVERITY = {"critical": "critical", "warning": "warning", "info": "info"}


class PagerDuty(NotifierType):
    """A trigger while firing and a resolve once resolved, so the incident closes; the routing key is added
    at send time, never stored in the outbox."""

    name = "pagerduty"
    default_url = "https://events.pagerduty.com/v2/enqueue"

    def validate(self, receiver: Receiver, path: str) -> None:
        if receiver.routing_key is None and receiver.routing_key_file is None:
            raise ConfigError(path, f"receiver {short(receiver.name)} needs routing_key or routing_key_file")

    def bodies(self, receiver: str, group: GroupKey, sent: Sequence[Sent], external_url: str) -> list[str]:
        out = []
        for s in sent:
            summary = s.annotations.get("summary") or s.labels.get("alertname", "alert")
            event: dict[str, Any] = {
                "event_action": "trigger" if s.firing else "resolve", "dedup_key": s.fingerprint,
                "client": "tpuwatch",
                "payload": {"summary": summary[:1024], "source": s.labels.get("host", "tpuwatch"),
                            "severity": _SEVERITY.get(s.labels.get("severity", ""), "error"),
                            "timestamp": rfc3339(s.starts_at),
                            "component": f"device {s.labels['device']}" if "device" in s.labels else "host",
                            "group": s.labels.get("alertname", ""), "class": s.labels.get("severity", ""),
                            "custom_details": {"labels": s.labels, "annotations": s.annotations}}}
            if s.annotations.get("runbook_url"):
                event["links"] = [{"href": s.annotations["runbook_url"], "text": "runbook"}]
            out.append(json.dumps(event, sort_keys=True))
        return out

    def request(self, target: Notifier, body: str) -> tuple[str, str]:
        return target.url, json.dumps({**json.loads(body), "routing_key": target.routing_key}, sort_keys=True)


TYPE = PagerDuty()
