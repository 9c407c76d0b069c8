"""Receivers: the bodies each kind takes (pure) and one HTTP POST per queued body.

Bodies are built when a notification is queued and stored without secrets;
the routing key, signature and custom headers are added at send time.  Every
notifier has one ``send(body, key) -> Answer``.  Error details never contain a
secret: the HTTP status, a short reason, where a redirect points, and the
start of a body, each with every known secret (:mod:`tpuwatch.logsetup`,
which also hides them from every log line) replaced by ``<secret>``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuwatch import __version__
from tpuwatch.alerting.state import ZERO_TIME, Alert, label_set_string, rfc3339
from tpuwatch.config import ReceiverConfig
from tpuwatch.logsetup import add_secrets, redact, redact_data
from tpuwatch.schema import ConfigError

PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"
SIGNATURE_HEADER = "X-Tpuwatch-Signature"
ID_HEADER = "X-Tpuwatch-Notification-Id"
_PD_SEVERITY = {"critical": "critical", "warning": "warning", "info": "info"}


@dataclass(frozen=True)
class Answer:
    """What a receiver answered: delivered, or failed (retryable or not) with a redacted detail."""

    ok: bool
    retry: bool
    detail: str


@dataclass(frozen=True)
class Sent:
    """An alert as one notification tells it: firing, or resolved at ``ends_at``."""

    alert: Alert
    firing: bool
    ends_at: float | None = None

    def am_alert(self, generator_url: str) -> dict[str, Any]:
        """Alertmanager's alert object (the webhook adds status and fingerprint)."""
        a = self.alert
        return {"labels": a.labels, "annotations": a.annotations,
                "startsAt": rfc3339(a.fired_at or a.active_at),
                "endsAt": rfc3339(self.ends_at) if self.ends_at is not None else ZERO_TIME,
                "generatorURL": generator_url}


def read_secret(path: str, what: str) -> str:
    """A secret file's stripped text; relative paths are read from $CREDENTIALS_DIRECTORY."""
    base = os.environ.get("CREDENTIALS_DIRECTORY")
    full = Path(base, path) if base and not os.path.isabs(path) else Path(path)
    try:
        return full.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(what, f"cannot read {full}: {getattr(exc, 'strerror', None) or exc}") from None


def _common(items: Sequence[dict[str, str]]) -> dict[str, str]:
    if not items:
        return {}
    first = items[0]
    return {k: v for k, v in first.items() if all(i.get(k) == v for i in items[1:])}


def webhook_body(receiver: str, group: tuple[str, str], sent: Sequence[Sent], external_url: str) -> str:
    """Alertmanager's webhook JSON, version 4, for one group."""
    alerts = [{"status": "firing" if s.firing else "resolved", **s.am_alert(external_url),
               "fingerprint": s.alert.key} for s in sent]
    group_labels = {"alertname": group[0], **({"device": group[1]} if group[1] else {})}
    return json.dumps({
        "version": "4", "groupKey": "{}:" + label_set_string(group_labels), "truncatedAlerts": 0,
        "status": "firing" if any(s.firing for s in sent) else "resolved", "receiver": receiver,
        "groupLabels": group_labels,
        "commonLabels": _common([s.alert.labels for s in sent]),
        "commonAnnotations": _common([s.alert.annotations for s in sent]),
        "externalURL": external_url, "alerts": alerts}, sort_keys=True)


def alertmanager_body(sent: Sequence[Sent], external_url: str) -> str:
    """The JSON array POST /api/v2/alerts takes."""
    return json.dumps([s.am_alert(external_url) for s in sent], sort_keys=True)


def pagerduty_bodies(sent: Sequence[Sent]) -> list[str]:
    """One Events v2 event per alert, dedup_key = fingerprint; routing_key is added at send time."""
    out = []
    for s in sent:
        a = s.alert
        summary = a.annotations.get("summary") or a.labels.get("alertname", "alert")
        event: dict[str, Any] = {
            "event_action": "trigger" if s.firing else "resolve", "dedup_key": a.key,
            "client": "tpuwatch",
            "payload": {"summary": summary[:1024], "source": a.labels.get("host", "tpuwatch"),
                        "severity": _PD_SEVERITY.get(a.labels.get("severity", ""), "error"),
                        "timestamp": rfc3339(a.fired_at or a.active_at),
                        "component": f"device {a.labels['device']}" if "device" in a.labels else "host",
                        "group": a.labels.get("alertname", ""), "class": a.labels.get("severity", ""),
                        "custom_details": {"labels": a.labels, "annotations": a.annotations}}}
        if a.annotations.get("runbook_url"):
            event["links"] = [{"href": a.annotations["runbook_url"], "text": "runbook"}]
        out.append(json.dumps(event, sort_keys=True))
    return out


def slack_body(group: tuple[str, str], sent: Sequence[Sent]) -> str:
    """A short text (the notification fallback) plus blocks, one section per alert."""
    firing = sum(1 for s in sent if s.firing)
    status = f"FIRING:{firing}" if firing else "RESOLVED"
    where = f" device {group[1]}" if group[1] else ""
    text = f"[{status}] {group[0]}{where}"
    blocks: list[dict[str, Any]] = [{"type": "header", "text": {"type": "plain_text", "text": text[:150]}}]
    for s in sent[:40]:
        a = s.alert
        mark = ":red_circle:" if s.firing else ":large_green_circle:"
        line = f"{mark} *{a.annotations.get('summary', a.labels.get('alertname', ''))}*"
        if a.annotations.get("description"):
            line += f"\n{a.annotations['description']}"
        if a.annotations.get("runbook_url"):
            line += f"\n<{a.annotations['runbook_url']}|runbook>"
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": line[:3000]}})
    return json.dumps({"text": text, "blocks": blocks}, sort_keys=True)


def bodies_for(notifier: Notifier, group: tuple[str, str], sent: Sequence[Sent], external_url: str) -> list[str]:
    """The bodies one notification about a group becomes for this notifier's kind, every known secret hidden
    (one pasted into a rule or a log line must not travel to a receiver)."""
    if notifier.type == "webhook":
        bodies = [webhook_body(notifier.config.name, group, sent, external_url)]
    elif notifier.type == "slack":
        bodies = [slack_body(group, sent)]
    elif notifier.type == "pagerduty":
        bodies = pagerduty_bodies(sent)
    else:
        bodies = [alertmanager_body(sent, external_url)]
    return [json.dumps(redact_data(json.loads(b)), sort_keys=True) for b in bodies]


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A receiver that redirects is answered as it is: a 3xx is a rejection, never followed."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


# The standard library, not requests, on the daemon's delivery path: requests and its
# dependencies would add about 15 MB to the resident memory of a daemon that must stay small.
_OPENER = urllib.request.build_opener(_NoRedirects())
_BODY_PREFIX = 4096
_TAIL_DROP = 512


class Notifier:
    """One delivery target: a receiver, or one of an alertmanager receiver's urls."""

    def __init__(self, config: ReceiverConfig, name: str, url: str, timeout: float) -> None:
        self.config = config
        self.name = name
        self.type = config.type
        self._configured_url = url
        self._url, self._authorization = _split_credentials(url)
        self._timeout = timeout
        self._routing_key = config.routing_key
        if config.routing_key_file is not None:
            self._routing_key = read_secret(config.routing_key_file, f"notify.{config.name}.routing_key_file")
        self._secret = (read_secret(config.secret_file, f"notify.{config.name}.secret_file").encode()
                        if config.secret_file is not None else None)

    def secrets(self) -> list[str]:
        """Every secret this notifier holds, in each form it is sent in (registered for redaction)."""
        parts = urllib.parse.urlsplit(self._configured_url)
        password = urllib.parse.unquote(parts.password) if parts.password else None
        token = self._authorization.split(" ", 1)[1] if self._authorization else None
        url_secret = self.config.url_file is not None  # a URL kept in a file is itself the secret (Slack's)
        path = urllib.parse.urlsplit(self._url)
        return [s for s in (
            password, parts.password, self._authorization, token, self._routing_key,
            self._secret and self._secret.decode(), *(self.config.headers or {}).values(),
            *((self._configured_url, self._url, path.path + (f"?{path.query}" if path.query else ""))
              if url_secret else ())) if s]

    def send(self, body: str, key: str) -> Answer:
        """POST one body; never raises for network trouble."""
        if self.type == "pagerduty":
            body = json.dumps({**json.loads(body), "routing_key": self._routing_key}, sort_keys=True)
        data = body.encode()
        headers = {"Content-Type": "application/json", "User-Agent": f"tpuwatch/{__version__}",
                   ID_HEADER: key, **(self.config.headers or {})}
        if self._authorization is not None and "authorization" not in {h.lower() for h in headers}:
            headers["Authorization"] = self._authorization
        if self._secret is not None:
            headers[SIGNATURE_HEADER] = "sha256=" + hmac.new(self._secret, data, hashlib.sha256).hexdigest()
        url = self._url.rstrip("/") + "/api/v2/alerts" if self.type == "alertmanager" else self._url
        try:
            request = urllib.request.Request(url, data=data, headers=headers, method="POST")
            with _OPENER.open(request, timeout=self._timeout) as response:
                status, reason, raw = response.status, response.reason, response.read(_BODY_PREFIX)
                location = None
        except urllib.error.HTTPError as exc:
            status, reason, raw, location = exc.code, exc.reason, exc.read(_BODY_PREFIX), exc.headers.get("Location")
        except (TimeoutError, urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
            reason_of = getattr(exc, "reason", exc)
            if isinstance(exc, TimeoutError) or isinstance(reason_of, TimeoutError):
                return Answer(False, True, f"no answer within {self._timeout:g}s")
            return Answer(False, True, redact(f"connection failed: {reason_of}")[:300])
        detail = f"HTTP {status} {reason or ''}".rstrip()
        if location is not None and 300 <= status < 400:
            detail += f" to {redact(location)[:300]} (redirects are not followed)"
        text = _body_text(raw)
        detail = redact(detail + (f": {text}" if text else ""))
        if 200 <= status < 300:
            return Answer(True, False, detail)
        retry = status >= 500 or status in (408, 429)
        return Answer(False, retry, detail)


def _body_text(raw: bytes) -> str:
    """The start of an answer's body on one line, secrets removed before it is cut (never half a secret)."""
    text = redact(raw.decode("utf-8", "replace"))
    if len(raw) >= _BODY_PREFIX:  # the read stopped mid-body: what ends it may be the start of a secret
        text = text[:-_TAIL_DROP]
    return redact(" ".join(text.split()))[:200]


def _split_credentials(url: str) -> tuple[str, str | None]:
    """``https://user:pw@host/x`` -> (``https://host/x``, the basic-auth header value); urllib sends no userinfo."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port is not None else "")
    user = urllib.parse.unquote(parts.username or "")
    password = urllib.parse.unquote(parts.password or "")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc)), f"Basic {token}"


def build_notifiers(receivers: Sequence[ReceiverConfig], timeout: float) -> list[Notifier]:
    """One notifier per receiver, one per url of an alertmanager receiver (named NAME/INDEX)."""
    out = []
    for receiver in receivers:
        if receiver.urls:
            out += [Notifier(receiver, f"{receiver.name}/{i}", url, timeout) for i, url in enumerate(receiver.urls)]
            continue
        url = receiver.url
        if receiver.url_file is not None:
            url = read_secret(receiver.url_file, f"notify.{receiver.name}.url_file")
            if not _usable_url(url):
                raise ConfigError(f"notify.{receiver.name}.url_file",
                                  f"{receiver.url_file} does not hold an http:// or https:// URL with a host")
        out.append(Notifier(receiver, receiver.name, url or PAGERDUTY_URL, timeout))
    for notifier in out:
        add_secrets(notifier.secrets())
    return out


def inline_secrets(receivers: Sequence[ReceiverConfig]) -> list[str]:
    """The secrets written in the config itself (secret files are not read): URL passwords, keys, headers."""
    out: list[str] = []
    for r in receivers:
        for url in (r.url, *r.urls):
            password = urllib.parse.urlsplit(url).password if url else None
            out += [password, urllib.parse.unquote(password)] if password else []
        out += [r.routing_key or "", *(r.headers or {}).values()]
    return [s for s in out if s]


def _usable_url(url: str) -> bool:
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)
