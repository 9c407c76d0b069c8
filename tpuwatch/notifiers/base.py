"""What every receiver type shares: the protocol a type gives, what a notification tells, one HTTP POST per body.

A receiver type (``notify[].type``) is a :class:`NotifierType`: its name, which
config keys it takes, the bodies it makes for a group of alerts, and where and
how one body is posted.  Everything else is shared and lives here once: the
HTTP send, the credentials split off a URL, the secret files, and the
redaction of every secret from what a receiver answers.

Bodies are built when a notification is queued and stored without secrets;
the routing key, signature and custom headers are added at send time.  Error
details never contain a secret: the HTTP status, a short reason, where a
redirect points, and the start of a body, each with every known secret
(:mod:`tpuwatch.logsetup`, which also hides them from every log line)
replaced by ``<secret>``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import urllib.parse
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from tpuwatch import __version__
from tpuwatch.logsetup import redact, redact_data
from tpuwatch.schema import ConfigError

SIGNATURE_HEADER = "X-Tpuwatch-Signature"
ID_HEADER = "X-Tpuwatch-Notification-Id"
ZERO_TIME = "0001-01-01T00:00:00Z"
# A notification is about one group: (alertname, device); ("", "") for the resend path's whole set.
GroupKey = tuple[str, str]


def rfc3339(timestamp: float) -> str:
    """Unix time as RFC 3339 UTC with milliseconds, the form Alertmanager writes."""
    moment = datetime.fromtimestamp(timestamp, timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


@dataclass(frozen=True)
class Answer:
    """What a receiver answered: delivered, or failed (retryable or not) with a redacted detail."""

    ok: bool
    retry: bool
    detail: str


@dataclass(frozen=True)
class Sent:
    """An alert as one notification tells it: firing, or resolved at ``ends_at``.

    ``fingerprint`` is the id receivers know the alert by (the webhook's
    ``fingerprint``, PagerDuty's ``dedup_key``); ``starts_at`` when it fired.
    """

    labels: dict[str, str]
    annotations: dict[str, str]
    fingerprint: str
    starts_at: float
    firing: bool
    ends_at: float | None = None

    def am_alert(self, generator_url: str) -> dict[str, Any]:
        """Alertmanager's alert object (the webhook adds status and fingerprint)."""
        return {"labels": self.labels, "annotations": self.annotations, "startsAt": rfc3339(self.starts_at),
                "endsAt": rfc3339(self.ends_at) if self.ends_at is not None else ZERO_TIME,
                "generatorURL": generator_url}


class Receiver(Protocol):
    """What a notifier, a type's checks and the dispatcher read of one receiver's config.

    The config is :class:`tpuwatch.notifiers.ReceiverConfig`; it checks ``type``
    against ``TYPES``, which holds every type, so the types and this module name
    it by this shape and import nothing from the package (no cycle).
    """

    @property
    def name(self) -> str: ...

    @property
    def url_file(self) -> str | None: ...

    @property
    def routing_key(self) -> str | None: ...

    @property
    def routing_key_file(self) -> str | None: ...

    @property
    def secret_file(self) -> str | None: ...

    @property
    def headers(self) -> dict[str, str] | None: ...

    @property
    def match(self) -> dict[str, str]: ...

    @property
    def send_resolved(self) -> bool: ...


def common(items: Sequence[dict[str, str]]) -> dict[str, str]:
    """The entries every one of ``items`` has with the same value (Alertmanager's common labels)."""
    if not items:
        return {}
    first = items[0]
    return {k: v for k, v in first.items() if all(i.get(k) == v for i in items[1:])}


class NotifierType(ABC):
    """A receiver type: what ``notify[].type: NAME`` means.

    The class attributes say which of the shared config keys the type takes
    (checked by :class:`tpuwatch.notifiers.ReceiverConfig`) and which path the
    dispatcher gives it; :meth:`validate` adds checks of its own.  A type is
    registered by name in ``TYPES`` (``tpuwatch/notifiers/__init__.py``).
    """

    name: str
    # True: Alertmanager's API path (every active alert, at once on a change and again every resend_delay,
    # firing alerts with an endsAt); False: notifications grouped by alertname and device, Alertmanager's timing.
    resend: bool = False
    several_urls: bool = False  # takes ``urls``, one delivery target per URL
    default_url: str | None = None  # the URL when none is configured (then url and url_file are optional)
    signs: bool = False  # takes ``secret_file``: an HMAC-SHA256 signature header on every request

    def validate(self, receiver: Receiver, path: str) -> None:
        """Raise ConfigError (under ``path``) for what this type needs beyond the shared checks."""

    @abstractmethod
    def bodies(self, receiver: str, group: GroupKey, sent: Sequence[Sent], external_url: str) -> list[str]:
        """The JSON bodies one notification about ``group`` becomes, without secrets (pure)."""

    def request(self, target: Notifier, body: str) -> tuple[str, str]:
        """Where one stored body is POSTed and what is sent, the target's secrets added."""
        return target.url, body


def read_secret(path: str, what: str) -> str:
    """A secret file's stripped text; relative paths are read from $CREDENTIALS_DIRECTORY."""
    base = os.environ.get("CREDENTIALS_DIRECTORY")
    full = Path(base, path) if base and not os.path.isabs(path) else Path(path)
    try:
        return full.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(what, f"cannot read {full}: {getattr(exc, 'strerror', None) or exc}") from None


_BODY_PREFIX = 4096
_TAIL_DROP = 512


class Notifier:
    """One delivery target: a receiver, or one of a several-URL receiver's urls."""

    def __init__(self, config: Receiver, kind: NotifierType, name: str, url: str, timeout: float) -> None:
        self.config = config
        self.kind = kind
        self.name = name
        self.type = kind.name
        self._configured_url = url
        self.url, self._authorization = _split_credentials(url)
        self._timeout = timeout
        self.routing_key = config.routing_key
        if config.routing_key_file is not None:
            self.routing_key = read_secret(config.routing_key_file, f"notify.{config.name}.routing_key_file")
        self._secret = (read_secret(config.secret_file, f"notify.{config.name}.secret_file").encode()
                        if config.secret_file is not None else None)

    def secrets(self) -> list[str]:
        """Every secret this notifier holds, in each form it is sent in (registered for redaction)."""
        parts = urllib.parse.urlsplit(self._configured_url)
        password = urllib.parse.unquote(parts.password) if parts.password else None
        token = self._authorization.split(" ", 1)[1] if self._authorization else None
        url_secret = self.config.url_file is not None  # a URL kept in a file is itself the secret (Slack's)
        path = urllib.parse.urlsplit(self.url)
        return [s for s in (
            password, parts.password, self._authorization, token, self.routing_key,
            self._secret and self._secret.decode(), *(self.config.headers or {}).values(),
            *((self._configured_url, self.url, path.path + (f"?{path.query}" if path.query else ""))
              if url_secret else ())) if s]

    def bodies(self, group: GroupKey, sent: Sequence[Sent], external_url: str) -> list[str]:
        """The bodies one notification about a group becomes for this notifier's type, every known secret hidden
        (one pasted into a rule or a log line must not travel to a receiver)."""
        return [json.dumps(redact_data(json.loads(b)), sort_keys=True)
                for b in self.kind.bodies(self.config.name, group, sent, external_url)]

    def send(self, body: str, key: str) -> Answer:
        """POST one body; never raises for network trouble."""
        url, body = self.kind.request(self, body)
        data = body.encode()
        headers = {"Content-Type": "application/json", "User-Agent": f"tpuwatch/{__version__}",
                   ID_HEADER: key, **(self.config.headers or {})}
        if self._authorization is not None and "authorization" not in {h.lower() for h in headers}:
            headers["Authorization"] = self._authorization
        if self._secret is not None:
            headers[SIGNATURE_HEADER] = "sha256=" + hmac.new(self._secret, data, hashlib.sha256).hexdigest()
        from tpuwatch.notifiers import transport  # the HTTP stack loads with the first delivery, not the config

        try:
            status, reason, raw, location = transport.post(url, data, headers, self._timeout, _BODY_PREFIX)
        except TimeoutError:
            return Answer(False, True, f"no answer within {self._timeout:g}s")
        except transport.Unreachable as exc:
            return Answer(False, True, redact(f"connection failed: {exc}")[:300])
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
