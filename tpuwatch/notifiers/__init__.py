"""Receiver types, registered by name: what ``notify[].type`` may be, how each is checked, built and sent.

Each type is one module (``webhook``, ``alertmanager``, ``pagerduty``,
``slack``) holding a :class:`~tpuwatch.notifiers.base.NotifierType`, and one
line in ``TYPES``; the config's allowed types and each type's checks come from
there.  What every type shares (the HTTP send, credentials, secrets,
redaction) is :mod:`tpuwatch.notifiers.base`.  The imports go one way: the
types and ``base`` import nothing from this module, and read a receiver's
config through :class:`~tpuwatch.notifiers.base.Receiver`, the shape of
``ReceiverConfig`` (which needs ``TYPES``).  This package sits below the
config (``tpuwatch.config`` imports ``ReceiverConfig`` from here) and below
alerting, which builds the notifiers and queues their bodies.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from tpuwatch.logsetup import add_secrets
from tpuwatch.notifiers import alertmanager, pagerduty, slack, webhook
from tpuwatch.notifiers.base import Notifier, NotifierType, read_secret
from tpuwatch.schema import Check, ConfigError, FilePath, Regex, Secret, Url, did_you_mean, join_key
from tpuwatch.syntax import short

__all__ = ["TYPES", "Notifier", "NotifierType", "ReceiverConfig", "build_notifiers", "inline_secrets"]

TYPES: dict[str, NotifierType] = {t.name: t for t in (
    webhook.TYPE,
    alertmanager.TYPE,
    pagerduty.TYPE,
    slack.TYPE,
)}

# Secret files: a relative path is read from $CREDENTIALS_DIRECTORY.
SecretPath = Annotated[str, FilePath(absolute=False)]
# An HTTP header field name (RFC 9110's token); header values must not break the request's lines.
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class TypeName(Check):
    """A name registered in ``TYPES``."""

    parses = True

    def convert(self, value: Any) -> str:
        if not isinstance(value, str) or value not in TYPES:
            raise ValueError(f"must be one of {', '.join(TYPES)}; got {short(value)}{did_you_mean(value, TYPES)}")
        return value


def _takers(flag: str) -> str:
    """``alertmanager``: the types whose ``flag`` is set, for messages."""
    return ", ".join(name for name, kind in TYPES.items() if getattr(kind, flag))


@dataclass(frozen=True)
class ReceiverConfig:
    """One alert receiver: where notifications go, which alerts it takes, and its secrets.

    Secret files (``url_file``, ``routing_key_file``, ``secret_file``) given as a
    relative path are read from ``$CREDENTIALS_DIRECTORY`` (systemd's LoadCredential).
    """

    name: str
    type: Annotated[str, TypeName()]
    url: Annotated[str, Url()] | None = None
    url_file: SecretPath | None = None
    urls: list[Annotated[str, Url()]] = field(default_factory=list)
    routing_key: Annotated[str, Secret()] | None = None
    routing_key_file: SecretPath | None = None
    secret_file: SecretPath | None = None
    headers: Annotated[dict[str, str], Secret()] | None = None
    match: dict[str, Annotated[str, Regex()]] = field(default_factory=dict)
    send_resolved: bool = True

    @property
    def kind(self) -> NotifierType:
        """The receiver's type."""
        return TYPES[self.type]

    def validate(self, path: str) -> None:
        kind = self.kind
        given = (self.url is not None) + (self.url_file is not None) + bool(self.urls)
        if self.urls and not kind.several_urls:
            raise ConfigError(f"{path}.urls", f"only {_takers('several_urls')} receivers take a list of urls")
        if given != 1 and kind.default_url is None:
            raise ConfigError(path, f"receiver {short(self.name)} needs exactly one of url, url_file"
                              + (", urls" if kind.several_urls else ""))
        if self.secret_file is not None and not kind.signs:
            raise ConfigError(f"{path}.secret_file", f"only {_takers('signs')} receivers sign their requests")
        for name, value in (self.headers or {}).items():  # the value is a secret: never in the message
            if not _HEADER_NAME.fullmatch(name):
                raise ConfigError(join_key(f"{path}.headers", name), "not a valid HTTP header name")
            if re.search(r"[\x00\r\n]", value):
                raise ConfigError(join_key(f"{path}.headers", name), "the value must not hold CR, LF or NUL")
        kind.validate(self, path)


def build_notifiers(receivers: Sequence[ReceiverConfig], timeout: float) -> list[Notifier]:
    """One notifier per receiver, one per url of a several-URL receiver (named NAME/INDEX); reads secret files
    and registers every secret for redaction.  ConfigError for an unreadable or unusable secret file."""
    out = []
    for receiver in receivers:
        kind = receiver.kind
        if receiver.urls:
            out += [Notifier(receiver, kind, f"{receiver.name}/{i}", url, timeout)
                    for i, url in enumerate(receiver.urls)]
            continue
        url = receiver.url
        if receiver.url_file is not None:
            url = read_secret(receiver.url_file, f"notify.{receiver.name}.url_file")
            if not _usable_url(url):
                raise ConfigError(f"notify.{receiver.name}.url_file",
                                  f"{receiver.url_file} does not hold an http:// or https:// URL with a host")
        out.append(Notifier(receiver, kind, receiver.name, url or kind.default_url or "", timeout))
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
