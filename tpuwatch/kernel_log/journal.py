"""The systemd journal's kernel messages as a kernel log source (systemd-python)."""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from tpuwatch.kernel_log.position import Position
from tpuwatch.kernel_log.records import MAX_MESSAGE_CHARS, Record
from tpuwatch.kernel_log.sources import Source, SourceError

log = logging.getLogger(__name__)

JOURNAL_BATCH = 2048
_CURSOR_RE = re.compile(r"(?:[a-z]=[0-9a-f]{1,64};){0,16}[a-z]=[0-9a-f]{1,64}")


def _journal_check(state: dict[str, Any]) -> str | None:
    cursor = state.get("cursor")
    return None if isinstance(cursor, str) and _CURSOR_RE.fullmatch(cursor) else "cursor is not a journal cursor"


class JournalSource(Source):
    """The systemd journal's kernel transport (systemd-python); the cursor is saved.

    ``path`` is a journal directory or file (default: the system journal).
    Without a saved cursor it starts at this boot's first kernel message, or
    at the first one of the last ``lookback`` seconds (None: the whole boot).
    A saved cursor that cannot be used is ignored (logged); one past the end
    of the journal resumes at its end.  Entries are read field by field
    (MESSAGE, _KERNEL_DEVICE), not converted whole, so a backlog is read fast;
    the journal keeps what it was given, so reading late loses nothing.
    """

    name = "journal"

    def __init__(self, state_file: Path | None, path: str | None = None, lookback: float | None = None) -> None:
        super().__init__(Position(state_file, _journal_check))
        try:
            from systemd import journal
        except ImportError:
            raise SourceError("systemd-python is not installed (pip install tpuwatch[systemd])") from None
        try:
            if path is None:
                self._reader = journal.Reader()
            elif os.path.isdir(path):
                self._reader = journal.Reader(path=path)
            else:
                self._reader = journal.Reader(files=[path])
        except OSError as exc:
            raise SourceError(f"cannot open the journal{' at ' + path if path else ''}: {exc}") from None
        self._reader.add_match(_TRANSPORT="kernel")
        self._reader.seek_tail()
        self._seen = bool(self._reader._previous())  # the journal holds a kernel message at all
        self._where = f" in {path}" if path else ""
        state = self.position.load()
        self._cursor: str | None = state["cursor"] if state else None
        self._on_unread = False  # the reader stands on an entry not read yet
        if self._cursor is not None and not self._resume(self._cursor):
            self._cursor = None
        if self._cursor is None:
            self._reader.this_boot()
            if lookback is None:
                self._reader.seek_head()
            else:
                self._reader.seek_realtime(time.time() - lookback)

    @property
    def degraded(self) -> str | None:
        """Set while the journal holds no kernel message (journald not running, or not reading /dev/kmsg)."""
        if self._seen:
            return None
        return (f"the journal{self._where} holds no kernel messages (is journald running, with ReadKMsg=yes?); "
                "they are read once it does")

    def _resume(self, cursor: str) -> bool:
        try:
            self._reader.seek_cursor(cursor)
            if not self._reader._next():  # nothing at or after the cursor: continue from the end
                self._reader.seek_tail()
                self._reader._previous()  # on the last entry: the next read starts after it
            elif not self._reader.test_cursor(cursor):
                self._on_unread = True  # the saved entry was vacuumed: this is the next one
        except (OSError, ValueError) as exc:
            log.warning("kernel log: ignoring the saved journal cursor: %s; starting as if none was saved", exc)
            return False
        return True

    def read(self) -> list[Record]:
        """Kernel entries after the cursor, at most ``JOURNAL_BATCH``."""
        out: list[Record] = []
        self.caught_up = False
        self._reader.process()
        moved = False
        while len(out) < JOURNAL_BATCH:
            if self._on_unread:
                self._on_unread = False
            elif not self._reader._next():
                self.caught_up = True
                break
            moved = self._seen = True
            self._take(out)
        if moved:
            self._cursor = self._reader._get_cursor()
        return out

    def _take(self, out: list[Record]) -> None:
        try:
            message = self._reader._get("MESSAGE")
        except KeyError:
            self.skip("malformed", "a journal entry without MESSAGE")
            return
        except Exception as exc:  # noqa: BLE001 - a corrupt entry must not stop the reading
            self.skip("error", f"{type(exc).__name__}: {exc}")
            return
        try:
            device = self._reader._get("_KERNEL_DEVICE")[:256].decode("utf-8", "replace")
        except Exception:  # noqa: BLE001 - KeyError when absent; the message is kept without a device
            device = None
        text = message[:4 * MAX_MESSAGE_CHARS].decode("utf-8", "replace")[:MAX_MESSAGE_CHARS]
        out.append(Record(text, device))

    def commit(self) -> None:
        """Save the cursor of the last entry read."""
        if self._cursor is not None:
            self.position.save({"cursor": self._cursor})

    def close(self) -> None:
        """Close the journal."""
        self._reader.close()
