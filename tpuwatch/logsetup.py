"""Logging: one line per event on stderr, or structured journald records under systemd."""

from __future__ import annotations

import logging
import os
import sys

_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}


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


def configure(level: str) -> None:
    """Route tpuwatch's logs; call once at start and again on reload to change the level."""
    root = logging.getLogger()
    root.setLevel(level.upper())
    if root.handlers:
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
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
