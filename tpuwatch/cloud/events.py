"""The clouds' maintenance notices as one shape, parsed from the metadata servers' answers.  Pure.

Compute Engine (https://cloud.google.com/compute/docs/metadata/getting-live-migration-notice):
``instance/maintenance-event`` is ``NONE``, ``MIGRATE_ON_HOST_MAINTENANCE`` or ``TERMINATE_ON_HOST_MAINTENANCE``;
``instance/upcoming-maintenance?alt=json`` is an UpcomingMaintenance object (google.cloud.compute_v1.types:
``type``, ``can_reschedule``, ``window_start_time``, ``window_end_time``, ``latest_window_start_time``,
``maintenance_status``, RFC 3339 times; the Cloud TPU VM docs spell them in camelCase,
https://cloud.google.com/tpu/docs/view-maintenance-notifications, with ``maintenanceType`` beside ``type``) or,
with nothing scheduled, ``{ }``, a 503, or (the TPU docs) ``{"error": "no notifications have been received yet,
try again later"}``.  EC2 (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/
monitoring-instances-status-check_sched.html): ``meta-data/events/maintenance/scheduled`` is a JSON list of
``{NotBefore, Code, Description, EventId, NotAfter, State}`` with times like ``21 Jan 2019 09:00:43 GMT``; a
finished event stays listed for a while with its description starting ``[Completed]`` (API_InstanceStatusEvent)
or ``[Canceled]``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from tpuwatch.units import from_now

MAX_ANSWER = 64 * 1024
GCE_EVENTS = {"MIGRATE_ON_HOST_MAINTENANCE": "migrate", "TERMINATE_ON_HOST_MAINTENANCE": "terminate"}
# EC2's event codes (API_InstanceStatusEvent) in a word each.
EC2_CODES = {"instance-reboot": "reboot", "system-reboot": "reboot", "system-maintenance": "maintenance",
             "instance-retirement": "retirement", "instance-stop": "stop"}
EC2_DONE = ("completed", "canceled", "cancelled")
_WORDS = {"migrate": "live migration on host maintenance", "terminate": "terminate on host maintenance",
          "reboot": "reboot", "maintenance": "system maintenance", "retirement": "instance retirement",
          "stop": "instance stop", "scheduled": "host maintenance"}
_TEXT_RE = re.compile(r"[^\x20-\x7e]")


class Garbage(ValueError):
    """An answer that is not what the metadata server documents (the message says what, in one line)."""


@dataclass(frozen=True)
class Maintenance:
    """One pending maintenance of this VM: what will happen and, where the cloud says, when."""

    cloud: str  # gce | ec2
    kind: str  # migrate | terminate | reboot | maintenance | retirement | stop | scheduled
    event: str  # the cloud's own name: MIGRATE_ON_HOST_MAINTENANCE, SCHEDULED, system-reboot, ...
    start: float | None = None  # the window's start, Unix time
    end: float | None = None
    latest_start: float | None = None
    status: str = ""  # PENDING | ONGOING (Compute Engine), active (EC2)
    can_reschedule: bool | None = None
    event_id: str = ""
    description: str = ""

    def window(self) -> str:
        """``2026-12-06 03:00-07:00 UTC`` (the end's date too when it differs); "" when the start is unknown."""
        if self.start is None:
            return ""
        start = datetime.fromtimestamp(self.start, timezone.utc)
        text = start.strftime("%Y-%m-%d %H:%M")
        if self.end is not None and self.end >= self.start:
            end = datetime.fromtimestamp(self.end, timezone.utc)
            text += "-" + end.strftime("%H:%M" if end.date() == start.date() else "%Y-%m-%d %H:%M")
        return text + " UTC"

    def sentence(self, now: float) -> str:
        """``terminate on host maintenance, window 2026-12-06 03:00-07:00 UTC, in 13h 20m``."""
        return describe(self.labels(), now) + (", ongoing" if self.status.upper() == "ONGOING" else "")

    def labels(self) -> dict[str, str]:
        """The labels of its ``tpuwatch_maintenance_scheduled`` series (empty values are left out)."""
        labels = {"cloud": self.cloud, "kind": self.kind, "event": self.event, "event_id": self.event_id,
                  "window": self.window(), "start": "" if self.start is None else str(int(self.start))}
        return {k: v for k, v in labels.items() if v}

    def to_json(self) -> dict[str, Any]:
        """The notice as ``check --json`` and ``/api/maintenance`` give it."""
        return {"cloud": self.cloud, "kind": self.kind, "event": self.event, "start": self.start, "end": self.end,
                "latest_start": self.latest_start, "status": self.status or None,
                "can_reschedule": self.can_reschedule, "event_id": self.event_id or None,
                "description": self.description or None, "window": self.window() or None}


def describe(labels: dict[str, str], now: float) -> str:
    """A notice in words from its ``tpuwatch_maintenance_scheduled`` labels (kind, window, start)."""
    kind = labels.get("kind", "")
    parts = [_WORDS.get(kind, kind or "maintenance")]
    if labels.get("window"):
        parts.append(f"window {labels['window']}")
    try:
        parts.append(from_now(float(labels["start"]), now))
    except (KeyError, ValueError):
        pass
    return ", ".join(parts)


def _text(value: Any, limit: int = 200) -> str:
    return _TEXT_RE.sub("?", str(value))[:limit] if value is not None else ""


def _decode(body: bytes) -> Any:
    if len(body) > MAX_ANSWER:
        raise Garbage(f"answer of {len(body)} bytes (at most {MAX_ANSWER})")
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise Garbage(f"not JSON: {_text(exc, 80)}") from None


def rfc3339(text: Any) -> float:
    """An RFC 3339 time (``2026-12-06T03:00:00Z``, fractions and offsets allowed) as Unix time; Garbage if not."""
    if not isinstance(text, str):
        raise Garbage(f"time {_text(text, 40)!r} is not a string")
    try:
        parsed = datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", text.strip()).replace("Z", "+00:00"))
    except ValueError:
        raise Garbage(f"time {_text(text, 40)!r} is not RFC 3339") from None
    if parsed.tzinfo is None:
        raise Garbage(f"time {_text(text, 40)!r} has no offset")
    return parsed.timestamp()


def parse_gce_event(body: bytes) -> Maintenance | None:
    """``instance/maintenance-event``'s value: a notice, None for ``NONE``; Garbage for anything else."""
    value = body[:MAX_ANSWER].decode("ascii", "replace").strip()
    if value == "NONE":
        return None
    kind = GCE_EVENTS.get(value)
    if kind is None:
        raise Garbage(f"unknown maintenance-event {_text(value, 60)!r}")
    return Maintenance("gce", kind, value)


def _field(data: dict[str, Any], snake: str) -> Any:
    camel = re.sub(r"_(\w)", lambda m: m.group(1).upper(), snake)
    return data.get(snake, data.get(camel))


def parse_gce_upcoming(status: int, body: bytes) -> Maintenance | None:
    """``instance/upcoming-maintenance?alt=json``: a notice, None when nothing is scheduled (``{ }`` or 503)."""
    if status in (404, 503):  # 404: a VM the key is not offered to ("a specific set of VMs", Google's docs)
        return None
    if status != 200:
        raise Garbage(f"HTTP {status}")
    data = _decode(body)
    if not isinstance(data, dict):
        raise Garbage(f"expected an object, got {type(data).__name__}")
    start_text = _field(data, "window_start_time")
    if not data or (start_text is None and "error" in data):  # the TPU docs' {"error": "no notifications ..."}
        return None
    if start_text is None:
        raise Garbage("an upcoming maintenance without window_start_time")
    kind = _text(_field(data, "type") or _field(data, "maintenance_type") or "SCHEDULED", 40)
    end_text, latest_text = _field(data, "window_end_time"), _field(data, "latest_window_start_time")
    reschedule = _field(data, "can_reschedule")
    return Maintenance("gce", "scheduled", kind, rfc3339(start_text),
                       rfc3339(end_text) if end_text is not None else None,
                       rfc3339(latest_text) if latest_text is not None else None,
                       _text(_field(data, "maintenance_status"), 40),
                       reschedule if isinstance(reschedule, bool) else None)


def ec2_time(text: Any) -> float:
    """``21 Jan 2019 09:00:43 GMT`` as Unix time; Garbage if not."""
    try:
        return datetime.strptime(str(text).strip(), "%d %b %Y %H:%M:%S GMT").replace(
            tzinfo=timezone.utc).timestamp()
    except ValueError:
        raise Garbage(f"time {_text(text, 40)!r} is not like '21 Jan 2019 09:00:43 GMT'") from None


def parse_ec2_scheduled(body: bytes) -> list[Maintenance]:
    """``meta-data/events/maintenance/scheduled``: the events still to come (completed and canceled left out)."""
    data = _decode(body)
    if not isinstance(data, list):
        raise Garbage(f"expected a list, got {type(data).__name__}")
    out = []
    for item in data[:64]:
        if not isinstance(item, dict):
            raise Garbage(f"expected an event object, got {type(item).__name__}")
        description = _text(item.get("Description"))
        state = _text(item.get("State"), 40)
        if state.lower() in EC2_DONE or description.lower().startswith(tuple(f"[{s}]" for s in EC2_DONE)):
            continue
        code = _text(item.get("Code"), 60)
        if not code:
            raise Garbage("an event without a Code")
        start = ec2_time(item["NotBefore"]) if item.get("NotBefore") else None
        end = ec2_time(item["NotAfter"]) if item.get("NotAfter") else None
        out.append(Maintenance("ec2", EC2_CODES.get(code, "maintenance"), code, start, end, None, state, None,
                               _text(item.get("EventId"), 80), description))
    return out


def detect(dmi: dict[str, str]) -> str | None:
    """``gce``, ``ec2`` or None from the DMI id files (name -> content).

    Compute Engine: ``product_name`` "Google Compute Engine" (https://cloud.google.com/compute/docs/instances/
    detect-compute-engine).  EC2 (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/identify_ec2_instances.html):
    ``product_uuid`` starting with "ec2" (root-only), Nitro's ``sys_vendor`` "Amazon EC2" or ``board_asset_tag``
    holding the instance id.
    """
    if dmi.get("product_name", "").strip() == "Google Compute Engine":
        return "gce"
    if (dmi.get("product_uuid", "").strip().lower().startswith("ec2") or dmi.get("sys_vendor", "").strip()
            == "Amazon EC2" or re.fullmatch(r"i-[0-9a-f]{8,17}", dmi.get("board_asset_tag", "").strip())):
        return "ec2"
    return None
