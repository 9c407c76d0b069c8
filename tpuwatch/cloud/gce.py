"""Compute Engine: hanging watches of the metadata server's maintenance keys.

https://cloud.google.com/compute/docs/metadata/querying-metadata: every request carries
``Metadata-Flavor: Google`` (the server refuses one without it); ``?wait_for_change=true&last_etag=E&timeout_sec=N``
hangs until the value's ETag (the answer's ``ETag`` header) differs from E, or N seconds passed.  The server is
``metadata.google.internal``, or ``GCE_METADATA_HOST`` (host[:port]), then the older ``GCE_METADATA_ROOT``, as
google-auth reads them (google/auth/compute_engine/_metadata.py).  Two keys are watched: ``maintenance-event``
(changes shortly before a live migration or a termination) and ``upcoming-maintenance`` (the scheduled window,
days ahead); ``scheduling/on-host-maintenance`` (MIGRATE or TERMINATE) names what the window will do.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from urllib.parse import urlencode

from tpuwatch.cloud.events import Maintenance, parse_gce_event, parse_gce_upcoming
from tpuwatch.cloud.http import Failed, Link
from tpuwatch.cloud.plugin import MaintenanceConfig
from tpuwatch.cloud.watch import HttpError, Watch

ROOT = "/computeMetadata/v1/instance/"
HEADERS = {"Metadata-Flavor": "Google"}
POLICY_KIND = {"MIGRATE": "migrate", "TERMINATE": "terminate"}
WATCH_SLACK_S = 10.0  # a hanging watch's deadline beyond timeout_sec


def endpoint(env: dict[str, str] | None = None) -> str:
    """The metadata server's host[:port], as google-auth chooses it."""
    env = dict(os.environ) if env is None else env
    return env.get("GCE_METADATA_HOST") or env.get("GCE_METADATA_ROOT") or "metadata.google.internal"


class GceWatch(Watch):
    """``maintenance-event`` and ``upcoming-maintenance``, each watched by a thread of its own."""

    cloud = "gce"

    def __init__(self, settings: MaintenanceConfig, host: str | None = None) -> None:
        super().__init__(settings, Link(host or endpoint()))
        self.policy: str | None = None  # MIGRATE | TERMINATE, once read
        self._etags: dict[str, str | None] = {}

    def loops(self) -> dict[str, Callable[[], float]]:
        return {"maintenance-event": lambda: self._round("maintenance-event", {}),
                "upcoming-maintenance": lambda: self._round("upcoming-maintenance", {"alt": "json"})}

    def merge(self, by_key: dict[str, list[Maintenance]]) -> list[Maintenance]:
        """One notice: the window from ``upcoming-maintenance``, what happens from ``maintenance-event`` (or the
        VM's on-host-maintenance policy before it changes)."""
        event = next(iter(by_key.get("maintenance-event") or []), None)
        upcoming = next(iter(by_key.get("upcoming-maintenance") or []), None)
        if upcoming is None:
            return [event] if event is not None else []
        kind = event.kind if event is not None else POLICY_KIND.get(self.policy or "", upcoming.kind)
        return [Maintenance("gce", kind, event.event if event else upcoming.event, upcoming.start, upcoming.end,
                            upcoming.latest_start, upcoming.status, upcoming.can_reschedule)]

    def _round(self, key: str, query: dict[str, str]) -> float:
        etag = self._etags.get(key)
        if key == "upcoming-maintenance" and self.policy is None:
            self._read_policy()
        if etag is not None:
            query = {**query, "wait_for_change": "true", "last_etag": etag,
                     "timeout_sec": str(int(self.settings.watch_timeout))}
        timeout = self.settings.watch_timeout + WATCH_SLACK_S if etag else self.settings.request_timeout
        answer = self.link.request("GET", ROOT + key + (f"?{urlencode(query)}" if query else ""), HEADERS, timeout)
        if key == "maintenance-event":
            if answer.status != 200:
                raise HttpError(f"HTTP {answer.status}")
            self._set(key, [n for n in [parse_gce_event(answer.body)] if n is not None])
        else:
            if answer.status not in (200, 404, 503):
                raise HttpError(f"HTTP {answer.status}")
            self._set(key, [n for n in [parse_gce_upcoming(answer.status, answer.body)] if n is not None])
        self._etags[key] = answer.headers.get("etag") if answer.status == 200 else None
        return 0.0 if self._etags[key] else self.settings.poll_interval  # no ETag to wait on: poll

    def _read_policy(self) -> None:
        try:
            answer = self.link.request("GET", ROOT + "scheduling/on-host-maintenance", HEADERS,
                                       self.settings.request_timeout, limit=64)
        except Failed:
            return  # the window is then told as "host maintenance"; read again at the next round
        text = answer.body.decode("ascii", "replace").strip()
        if answer.status == 200 and text in POLICY_KIND:
            self.policy = text
