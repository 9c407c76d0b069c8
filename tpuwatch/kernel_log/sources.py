"""Where kernel messages come from: /dev/kmsg, the systemd journal, or a followed file.

Every source has ``read(limit) -> list[Record]`` (what is new, at most
``limit`` records, never blocking), ``lost`` (records known to be lost) and
``commit()``, which saves its position atomically under the state directory so
that a restart neither repeats nor skips a record.  Call ``commit()`` after
the records read have been processed.  With ``state_file=None`` a source
neither loads nor saves a position (``tpuwatch check`` must not move the
daemon's).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Protocol

from tpuwatch import statefile
from tpuwatch.kernel_log.records import (
    MAX_LINE_BYTES,
    MAX_MESSAGE_CHARS,
    Record,
    as_text,
    parse_kmsg,
    parse_line,
)

log = logging.getLogger(__name__)

KMSG_READ_BYTES = 16384
FILE_READ_BYTES = 1 << 20
FILE_BUDGET_BYTES = 8 << 20


class SourceError(Exception):
    """A source that cannot be opened or read."""


class Source(Protocol):
    """A kernel log source (see the module docstring)."""

    name: str

    @property
    def lost(self) -> int: ...

    def read(self, limit: int) -> list[Record]: ...

    def commit(self) -> None: ...

    def close(self) -> None: ...


def read_boot_id(procfs: str = "/proc") -> str:
    """This boot's id; kmsg sequence numbers restart at every boot."""
    return Path(procfs, "sys", "kernel", "random", "boot_id").read_text().strip()


class SequenceTracker:
    """Which kmsg sequence numbers are new after ``last``, and how many were skipped over (lost)."""

    def __init__(self, last: int | None) -> None:
        self.last = last
        self.lost = 0

    def accept(self, seq: int) -> bool:
        """True for a record not seen yet; a gap before it counts as lost records."""
        if self.last is not None:
            if seq <= self.last:
                return False
            self.lost += seq - self.last - 1
        self.last = seq
        return True


class KmsgSource:
    """/dev/kmsg, read without blocking until EAGAIN; the last sequence number is saved per boot.

    Without a saved position it starts at the oldest record still in the ring
    (this boot's history), passing over the records older than ``lookback``
    seconds (None: none); it logs how many once.  EPIPE (the ring
    overwrote unread records) and any gap in sequence numbers, also across a
    restart, are counted in ``lost``.
    """

    name = "kmsg"

    def __init__(self, path: str, state_file: Path | None, boot_id: str, lookback: float | None = None) -> None:
        self.path = path
        self._state_file = state_file
        self._boot_id = boot_id
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise SourceError(f"cannot open {path}: {exc.strerror}") from None
        state = statefile.load(state_file, "kernel log position")
        saved = state.get("seq") if state and state.get("boot_id") == boot_id else None
        self._sequence = SequenceTracker(saved if isinstance(saved, int) else None)
        self._saved_seq = self._sequence.last
        self._passed_over = 0
        self._skip_before_usec: float | None = None
        if self._sequence.last is None and lookback is not None:
            self._skip_before_usec = (time.clock_gettime(time.CLOCK_MONOTONIC) - lookback) * 1e6

    @property
    def lost(self) -> int:
        """Records lost to ring-buffer overrun since start (including while tpuwatch was down)."""
        return self._sequence.lost

    def read(self, limit: int) -> list[Record]:
        """Records after the last one read, at most ``limit``."""
        out: list[Record] = []
        while len(out) < limit:
            try:
                raw = os.read(self._fd, KMSG_READ_BYTES)
            except BlockingIOError:
                break
            except BrokenPipeError:
                continue  # overrun: the next read gives the oldest record left; the sequence gap counts the loss
            parsed = parse_kmsg(raw.decode("utf-8", "replace"))
            if parsed is None or not self._sequence.accept(parsed.seq):
                continue
            if self._skip_before_usec is not None:
                if parsed.usec < self._skip_before_usec:
                    self._passed_over += 1
                    continue
                self._skip_before_usec = None  # the ring is in time order: the rest is within the lookback
            out.append(parsed.record)
        if self._passed_over:
            log.info("kernel log: first read this boot: passed over %d records older than kernel_log.lookback",
                     self._passed_over)
            self._passed_over = 0
        return out

    def commit(self) -> None:
        """Save the last sequence number read."""
        if self._sequence.last != self._saved_seq:
            statefile.save(self._state_file, {"boot_id": self._boot_id, "seq": self._sequence.last})
            self._saved_seq = self._sequence.last

    def close(self) -> None:
        """Close /dev/kmsg."""
        os.close(self._fd)


class JournalSource:
    """The systemd journal's kernel transport (systemd-python); the cursor is saved.

    ``path`` is a journal directory or file (default: the system journal).
    Without a saved cursor it starts at this boot's first kernel message, or
    at the first one of the last ``lookback`` seconds (None: the whole boot).
    """

    name = "journal"

    def __init__(self, state_file: Path | None, path: str | None = None, lookback: float | None = None) -> None:
        try:
            from systemd import journal
        except ImportError:
            raise SourceError("systemd-python is not installed (pip install tpuwatch[systemd])") from None
        self.lost = 0
        self._state_file = state_file
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
        state = statefile.load(state_file, "kernel log position")
        self._cursor: str | None = state.get("cursor") if state else None
        self._saved_cursor = self._cursor
        self._pending: dict[str, Any] | None = None
        if self._cursor is None:
            self._reader.this_boot()
            if lookback is None:
                self._reader.seek_head()
            else:
                self._reader.seek_realtime(time.time() - lookback)
        else:
            self._reader.seek_cursor(self._cursor)
            entry = self._reader.get_next()
            if entry and not self._reader.test_cursor(self._cursor):
                self._pending = entry  # the saved entry was vacuumed: this is the next one

    def read(self, limit: int) -> list[Record]:
        """Kernel entries after the cursor, at most ``limit``."""
        out: list[Record] = []
        self._reader.process()
        while len(out) < limit:
            entry, self._pending = (self._pending or self._reader.get_next()), None
            if not entry:
                break
            self._cursor = entry["__CURSOR"]
            message = entry.get("MESSAGE")
            if isinstance(message, bytes):
                message = message.decode("utf-8", "replace")
            if isinstance(message, str):
                device = entry.get("_KERNEL_DEVICE")
                out.append(Record(message[:MAX_MESSAGE_CHARS], device if isinstance(device, str) else None))
        return out

    def commit(self) -> None:
        """Save the cursor of the last entry read."""
        if self._cursor != self._saved_cursor:
            statefile.save(self._state_file, {"cursor": self._cursor})
            self._saved_cursor = self._cursor

    def close(self) -> None:
        """Close the journal."""
        self._reader.close()


class FileSource:
    """A text log file (kern.log, dmesg output) followed across rotation; identity and offset are saved.

    Rotation by rename is noticed when the path names a new file: the old one
    is read to its end first.  A truncated file is read again from the start.
    After a restart, the saved offset is used if the file is the same one;
    if it was rotated meanwhile, the rest of ``PATH.1`` (when it is the saved
    file) is read first.  Without a saved position it starts at the end.
    Lines that are not text or longer than 64 KiB are skipped and counted.
    """

    name = "file"

    def __init__(self, path: str, state_file: Path | None) -> None:
        self.path = path
        self.lost = 0
        self.skipped = 0
        self._state_file = state_file
        self._handle: Any = None
        self._identity: tuple[int, int] | None = None
        self._offset = 0
        self._saved: dict[str, Any] | None = statefile.load(state_file, "kernel log position")
        self._draining_old = False
        self._discarding = False
        state = self._saved
        if state and isinstance(state.get("dev"), int) and isinstance(state.get("ino"), int):
            saved = (state["dev"], state["ino"])
            offset = int(state.get("offset", 0))
            if self._identity_of(path) == saved:
                self._open(path, offset)
            elif self._identity_of(path + ".1") == saved:
                self._open(path + ".1", offset)
                self._draining_old = True
        elif os.path.exists(path):
            self._open(path, os.path.getsize(path))

    @staticmethod
    def _identity_of(path: str) -> tuple[int, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def _open(self, path: str, offset: int) -> None:
        if self._handle is not None:
            self._handle.close()
        try:
            self._handle = open(path, "rb")
        except OSError as exc:
            raise SourceError(f"cannot open {path}: {exc.strerror}") from None
        st = os.fstat(self._handle.fileno())
        self._identity = (st.st_dev, st.st_ino)
        self._offset = offset if offset <= st.st_size else 0
        self._handle.seek(self._offset)

    def read(self, limit: int) -> list[Record]:
        """Complete new lines, at most ``limit`` records; switches to the new file after a rotation."""
        out: list[Record] = []
        budget = FILE_BUDGET_BYTES
        while len(out) < limit and budget > 0:
            if self._handle is None:
                if not os.path.exists(self.path):
                    break
                self._open(self.path, 0)
            current = self._identity_of(self.path)
            rotated = self._draining_old or (current is not None and current != self._identity)
            consumed = self._read_lines(out, limit, final=rotated)
            budget -= consumed
            if consumed:
                continue
            if rotated and current is not None:  # the old file is read to its end: follow the new one
                self._draining_old = False
                self._open(self.path, 0)
            elif os.fstat(self._handle.fileno()).st_size < self._offset:  # truncated in place
                self._open(self.path, 0)
            else:
                break
        return out

    def _read_lines(self, out: list[Record], limit: int, final: bool) -> int:
        """Append records from the open file and return the bytes consumed.

        A last line without a newline is taken only when ``final`` (the file was rotated away).
        """
        assert self._handle is not None
        self._handle.seek(self._offset)
        data = self._handle.read(FILE_READ_BYTES)
        skip = 0
        if self._discarding:  # the rest of an over-long line
            newline = data.find(b"\n")
            skip = len(data) if newline < 0 else newline + 1
            self._discarding = newline < 0
        end = data.rfind(b"\n") + 1
        if final and len(data) < FILE_READ_BYTES:
            end = len(data)
        if end <= skip:
            if len(data) - skip > MAX_LINE_BYTES:  # no newline in sight: skip this line
                self.skipped += 1
                self._discarding = True
                skip = len(data)
            self._offset += skip
            return skip
        position = skip
        while position < end and len(out) < limit:
            newline = data.find(b"\n", position, end)
            stop = end if newline < 0 else newline + 1
            line = data[position:stop].rstrip(b"\r\n")
            position = stop
            if line.startswith(b" ") and out:  # kmsg continuation lines of the previous record
                if line.startswith(b" DEVICE="):
                    out[-1] = Record(out[-1].message, line[len(b" DEVICE="):].decode("ascii", "replace"))
                continue
            text = as_text(line)
            if text is None:
                self.skipped += 1
                continue
            out.append(parse_line(text))
        self._offset += position
        return position

    def commit(self) -> None:
        """Save the file identity and the offset of the first unread byte."""
        if self._identity is None:
            return
        state = {"path": self.path, "dev": self._identity[0], "ino": self._identity[1], "offset": self._offset}
        if state != self._saved:
            statefile.save(self._state_file, state)
            self._saved = state

    def close(self) -> None:
        """Close the file."""
        if self._handle is not None:
            self._handle.close()
