"""Logging: one line per event on stderr, or structured journald records under systemd; secrets hidden.

Every secret the config holds (``add_secrets``: URL passwords, routing keys,
header values, basic-auth tokens, secret files) is replaced by ``<secret>`` in
every log record (message, arguments, exception and stack text) by a filter on
every handler, and by :func:`redact` in whatever else tpuwatch prints or
serves.  A secret is found however a receiver may have echoed it: raw (any
case), percent-encoded (``+`` for a space), JSON-escaped (``\\uXXXX``,
``\\/``), HTML-escaped, and a base64 token also URL-safe or unpadded.  Values
shorter than ``MIN_SECRET_LEN`` characters are left alone: hiding every
``1`` or ``on`` a header may hold would make the log unreadable.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Iterable
from typing import Any

MIN_SECRET_LEN = 4
PLACEHOLDER = "<secret>"
_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}
_JSON_ESCAPES = {'"': '\\"', "\\": "\\\\", "/": "\\/", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b",
                 "\f": "\\f"}
_HTML_NAMES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&apos;"}
_BASE64 = re.compile(r"^[A-Za-z0-9+/]{8,}={0,2}$")

_lock = threading.Lock()
_secrets: set[str] = set()
_pattern: re.Pattern[str] | None = None


def _char(char: str) -> str:
    """A regex for one character of a secret in any of the encodings it may come back in."""
    code = ord(char)
    forms = [re.escape(char), "".join(f"%{b:02x}" for b in char.encode("utf-8", "surrogatepass")),
             f"&#0*{code};", f"&#x0*{code:x};"]
    if code < 0x10000:
        forms.append(re.escape(f"\\u{code:04x}"))
    else:
        high, low = 0xD800 + ((code - 0x10000) >> 10), 0xDC00 + ((code - 0x10000) & 0x3FF)
        forms.append(re.escape(f"\\u{high:04x}\\u{low:04x}"))
    forms += [re.escape(f) for f in (_JSON_ESCAPES.get(char), _HTML_NAMES.get(char)) if f]
    if char == " ":
        forms.append(r"\+")
    return "(?:" + "|".join(forms) + ")"


def _forms(secret: str) -> list[str]:
    texts = [secret]
    if _BASE64.match(secret):
        texts += [secret.rstrip("="), secret.replace("+", "-").replace("/", "_").rstrip("=")]
    return ["".join(_char(c) for c in text) for text in texts]


def add_secrets(values: Iterable[str | None]) -> None:
    """Remember secrets to hide from now on (for the life of the process: a reload never un-hides one)."""
    global _pattern
    with _lock:
        new = {v for v in values if v and len(v) >= MIN_SECRET_LEN} - _secrets
        if not new:
            return
        _secrets.update(new)
        forms = sorted({f for s in _secrets for f in _forms(s)}, key=len, reverse=True)
        _pattern = re.compile("|".join(forms), re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with every known secret replaced by ``<secret>``."""
    pattern = _pattern
    return text if pattern is None else pattern.sub(PLACEHOLDER, text)


def redact_data(data: Any) -> Any:
    """JSON-like data with every string (keys included) redacted."""
    if isinstance(data, str):
        return redact(data)
    if isinstance(data, dict):
        return {redact_data(k): redact_data(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [redact_data(v) for v in data]
    return data


class RedactingFilter(logging.Filter):
    """Rewrites a record with its message merged and redacted, and its exception and stack text redacted."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _pattern is None:
            return True
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            message = f"{record.msg} {record.args}"
        record.msg, record.args = redact(message), None
        if record.exc_info:
            record.exc_text = record.exc_text or logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


_FILTER = RedactingFilter()


class _JournalPrefixFormatter(logging.Formatter):
    """``<N>message``: journald reads the priority from the prefix on a stream."""

    def format(self, record: logging.LogRecord) -> str:
        return f"<{_PRIORITY.get(record.levelno, 6)}>{super().format(record)}"


def _stderr_is_journal() -> bool:
    stream = os.environ.get("JOURNAL_STREAM", "")
    device, _, inode = stream.partition(":")
    try:
        stat = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return f"{stat.st_dev}:{stat.st_ino}" == f"{device}:{inode}"


def _guard(root: logging.Logger) -> None:
    for handler in root.handlers:
        if _FILTER not in handler.filters:
            handler.addFilter(_FILTER)


def configure(level: str) -> None:
    """Route tpuwatch's logs; call once at start and again on reload to change the level."""
    root = logging.getLogger()
    root.setLevel(level.upper())
    if root.handlers:
        _guard(root)
        return
    handler: logging.Handler
    if _stderr_is_journal():
        try:
            from systemd.journal import JournalHandler  # optional extra: tpuwatch[systemd]

            handler = JournalHandler(SYSLOG_IDENTIFIER="tpuwatch")
        except ImportError:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(_JournalPrefixFormatter("%(name)s: %(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    _guard(root)
    # APScheduler's warnings (a run missed, a run skipped while the last one runs) and its job tracebacks repeat,
    # at every run, what the daemon counts and logs itself once per kind and then at most every few minutes.
    logging.getLogger("apscheduler.scheduler").setLevel(logging.ERROR)
    logging.getLogger("apscheduler.executors").setLevel(logging.CRITICAL)


class Once:
    """Which problems were already logged, so that each is logged once: ``once(key)`` is True the first time.

    At most ``limit`` keys are remembered (a problem whose text changes at every read cannot grow it without
    bound); past that, nothing new is logged.
    """

    def __init__(self, limit: int = 256) -> None:
        self.limit = limit
        self._seen: set[Any] = set()

    def __call__(self, key: Any) -> bool:
        if key in self._seen or len(self._seen) >= self.limit:
            return False
        self._seen.add(key)
        return True


class Sparse:
    """A repeating problem logged the first time and then at most every ``every`` seconds per key, with how
    often it happened since: ``sparse(key, now)`` is None to stay quiet, else the count the line reports.

    At most ``limit`` keys are remembered; past that, new keys are not logged.
    """

    def __init__(self, every: float, limit: int = 256) -> None:
        self.every, self.limit = every, limit
        self._keys: dict[Any, list[float]] = {}  # key -> [when last logged, times since]

    def __call__(self, key: Any, now: float) -> int | None:
        entry = self._keys.get(key)
        if entry is None:
            if len(self._keys) >= self.limit:
                return None
            self._keys[key] = [now, 0]
            return 1
        entry[1] += 1
        if now - entry[0] < self.every:
            return None
        count, entry[0], entry[1] = int(entry[1]), now, 0
        return count
