"""Where kernel messages come from: /dev/kmsg, the systemd journal, or a followed file (FileSource, in filesource.py).

Every source has ``read(limit) -> list[Record]`` (what is new, at most
``limit`` records, never blocking; ``caught_up`` says whether it reached the
end), ``skip_ahead(keep, in_time, sieve)`` (pass over all but about the last
``keep`` records of a backlog, counted, keeping the lines a ``BacklogSieve``
picks for ``take_picked()``), ``lost`` (records known to be lost),
``skipped`` (records passed over, by reason: SKIP_REASONS), ``degraded`` (why
it cannot see everything, or None) and ``commit()``, which saves its position
atomically under the state directory so that a restart neither repeats nor
skips a record.  Call ``commit()`` after the records read have been
processed; it never raises (a failed save is counted and retried).  With
``state_file=None`` a source neither loads nor saves a position (``tpuwatch
check`` must not move the daemon's).  No record, whatever it holds, makes a
source raise: what cannot be parsed is counted, logged once and passed over.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuwatch.kernel_log.position import Position, is_count
from tpuwatch.kernel_log.records import MAX_MESSAGE_CHARS, SKIP_REASONS, Record, parse_kmsg

if TYPE_CHECKING:
    from tpuwatch.kernel_log.sieve import BacklogSieve

log = logging.getLogger(__name__)

KMSG_READ_BYTES = 16384
_CURSOR_RE = re.compile(r"(?:[a-z]=[0-9a-f]{1,64};){0,16}[a-z]=[0-9a-f]{1,64}")
_SKIP_WHAT = {"not_text": "a line that is not text (mostly invalid UTF-8 or control bytes)",
              "too_long": "a line over 64 KiB", "malformed": "a record it cannot parse",
              "error": "a record whose parsing failed", "backlog": "records of a backlog"}


class SourceError(Exception):
    """A source that cannot be opened or read."""


class Source:
    """A kernel log source (see the module docstring); the base of every source."""

    name = "source"

    def __init__(self, position: Position) -> None:
        self.position = position
        self.caught_up = False
        self.skipped: Counter[str] = Counter(dict.fromkeys(SKIP_REASONS, 0))
        self._logged: set[str] = set()
        self._picked: list[Record] = []

    @property
    def lost(self) -> int:
        """Records lost before they could be read."""
        return 0

    @property
    def degraded(self) -> str | None:
        """Why this source cannot see everything it should, or None."""
        return None

    def skip(self, reason: str, detail: str, count: int = 1) -> None:
        """Count ``count`` records passed over for ``reason``; the first of each reason is logged."""
        self.skipped[reason] += count
        if reason not in self._logged and reason != "backlog":
            self._logged.add(reason)
            log.warning("kernel log (%s): skipped %s: %s (logged once; counted in "
                        "tpuwatch_kernel_log_skipped_total{reason=\"%s\"})", self.name, _SKIP_WHAT[reason],
                        detail[:200], reason)

    def read(self, limit: int) -> list[Record]:
        """Records after the last one read, at most ``limit``."""
        raise NotImplementedError

    def skip_ahead(self, keep: int, in_time: Callable[[], bool], sieve: BacklogSieve | None = None) -> int:
        """Pass over the backlog but about its last ``keep`` records while ``in_time()``; how many were passed.
        The records of the lines ``sieve`` picks from what is passed over wait for ``take_picked()``."""
        return 0

    def take_picked(self) -> list[Record]:
        """The records the sieve picked out of the last skip, oldest first (read: not counted as passed over)."""
        picked, self._picked = self._picked, []
        return picked

    def commit(self) -> None:
        """Save the position reached (never raises)."""

    def close(self) -> None:
        """Release what the source holds open."""


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


def _kmsg_check(state: dict[str, Any]) -> str | None:
    if not isinstance(state.get("boot_id"), str) or len(state["boot_id"]) > 64:
        return "boot_id is not a boot id"
    return None if is_count(state.get("seq"), (1 << 64) - 1) else f"seq is not a sequence number: {state.get('seq')!r}"


class NoSource(Source):
    """No kernel log source could be opened: nothing is read, and ``degraded`` says why."""

    name = "none"

    def __init__(self, reason: str) -> None:
        super().__init__(Position(None, _kmsg_check))
        self.reason = reason
        self.caught_up = True

    @property
    def degraded(self) -> str:
        """Why no source is read."""
        return self.reason

    def read(self, limit: int) -> list[Record]:
        """Nothing."""
        return []


class KmsgSource(Source):
    """/dev/kmsg, read without blocking until EAGAIN; the last sequence number is saved per boot.

    Without a saved position it starts at the oldest record still in the ring
    (this boot's history), passing over the records older than ``lookback``
    seconds (None: none); it logs how many once.  EPIPE (the ring
    overwrote unread records) and any gap in sequence numbers, also across a
    restart, are counted in ``lost``.  A saved sequence number beyond the
    newest record in the ring is impossible this boot: it is ignored (logged)
    and reading starts as on a first start.  The ring bounds any backlog, so
    ``skip_ahead`` passes over nothing: what a storm overwrites counts as lost.
    """

    name = "kmsg"

    def __init__(self, path: str, state_file: Path | None, boot_id: str, lookback: float | None = None) -> None:
        super().__init__(Position(state_file, _kmsg_check))
        self.path = path
        self._boot_id = boot_id
        self._lookback = lookback
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise SourceError(f"cannot open {path}: {exc.strerror}") from None
        state = self.position.load()
        saved = state["seq"] if state and state["boot_id"] == boot_id else None
        self._sequence = SequenceTracker(saved)
        self._unverified = saved  # a saved position not yet seen in the ring
        self._newest: int | None = None
        self._passed_over = 0
        self._skip_before_usec: float | None = None
        if saved is None:
            self._start_fresh()

    def _start_fresh(self) -> None:
        if self._lookback is not None:
            self._skip_before_usec = (time.clock_gettime(time.CLOCK_MONOTONIC) - self._lookback) * 1e6

    @property
    def lost(self) -> int:
        """Records lost to ring-buffer overrun since start (including while tpuwatch was down)."""
        return self._sequence.lost

    def read(self, limit: int) -> list[Record]:
        """Records after the last one read, at most ``limit``."""
        out: list[Record] = []
        self.caught_up = False
        while len(out) < limit:
            try:
                raw = os.read(self._fd, KMSG_READ_BYTES)
            except BlockingIOError:
                if self._saved_position_impossible():
                    continue
                self.caught_up = True
                break
            except BrokenPipeError:
                continue  # overrun: the next read gives the oldest record left; the sequence gap counts the loss
            self._take(raw, out)
        if self._passed_over:
            log.info("kernel log: first read this boot: passed over %d records older than kernel_log.lookback",
                     self._passed_over)
            self._passed_over = 0
        return out

    def _take(self, raw: bytes, out: list[Record]) -> None:
        try:
            parsed = parse_kmsg(raw.decode("utf-8", "replace"))
        except Exception as exc:  # noqa: BLE001 - no record may stop the reading
            self.skip("error", f"{type(exc).__name__}: {exc}")
            return
        if parsed is None:
            self.skip("malformed", repr(raw[:80]))
            return
        if self._newest is None or parsed.seq > self._newest:
            self._newest = parsed.seq
        if not self._sequence.accept(parsed.seq):
            return
        self._unverified = None
        if self._skip_before_usec is not None:
            if parsed.usec < self._skip_before_usec:
                self._passed_over += 1
                return
            self._skip_before_usec = None  # the ring is in time order: the rest is within the lookback
        out.append(parsed.record)

    def _saved_position_impossible(self) -> bool:
        """At the end of the ring: a saved position beyond its newest record is dropped and reading restarts."""
        if self._unverified is None or self._newest is None or self._newest >= self._unverified:
            return False
        log.warning("kernel log: ignoring the saved kmsg position (seq %d): this boot's newest record is seq %d; "
                    "reading as on a first start", self._unverified, self._newest)
        self._unverified = None
        os.lseek(self._fd, 0, os.SEEK_SET)
        self._sequence = SequenceTracker(None)
        self._start_fresh()
        return True

    def commit(self) -> None:
        """Save the last sequence number read."""
        if self._sequence.last is not None and self._unverified is None:
            self.position.save({"boot_id": self._boot_id, "seq": self._sequence.last})

    def close(self) -> None:
        """Close /dev/kmsg."""
        os.close(self._fd)


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
    (MESSAGE, _KERNEL_DEVICE), not converted whole, so a backlog is read fast.
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
        self._on_entry = False  # the reader stands on an entry (the last one read)
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
                self._on_entry = bool(self._reader._previous())
            elif self._reader.test_cursor(cursor):
                self._on_entry = True
            else:
                self._on_unread = True  # the saved entry was vacuumed: this is the next one
        except (OSError, ValueError) as exc:
            log.warning("kernel log: ignoring the saved journal cursor: %s; starting as if none was saved", exc)
            return False
        return True

    def read(self, limit: int) -> list[Record]:
        """Kernel entries after the cursor, at most ``limit``."""
        out: list[Record] = []
        self.caught_up = False
        self._reader.process()
        moved = False
        while len(out) < limit:
            if self._on_unread:
                self._on_unread = False
            elif not self._reader._next():
                self.caught_up = True
                break
            moved = self._on_entry = self._seen = True
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

    def skip_ahead(self, keep: int, in_time: Callable[[], bool], sieve: BacklogSieve | None = None) -> int:
        """Walk to the end of the journal (counting, reading what ``sieve`` picks), then step back ``keep``
        entries."""
        if self._on_unread or not self._on_entry:
            return 0
        walked, at_end = 0, False
        picked: list[tuple[int, Record]] = []
        self._picked = []
        while not at_end and in_time():
            for _ in range(4096):
                if not self._reader._next():
                    at_end = True
                    break
                walked += 1
                if sieve is not None and sieve.active:
                    self._sift(sieve, walked, picked)
        back = min(keep, walked) if at_end else 0
        if back:
            self._reader._previous(back)
        self._picked = [record for index, record in picked if index <= walked - back]  # the kept ones are read
        if walked:
            self._cursor = self._reader._get_cursor()
            self.skip("backlog", "", walked - back - len(self._picked))
        return walked - back - len(self._picked)

    def _sift(self, sieve: BacklogSieve, index: int, picked: list[tuple[int, Record]]) -> None:
        try:
            message = self._reader._get("MESSAGE")
        except Exception:  # noqa: BLE001 - KeyError without MESSAGE, or a corrupt entry: passed over, as before
            return
        if sieve.pick(message[:4 * MAX_MESSAGE_CHARS].replace(b"\n", b" ")):
            found: list[Record] = []
            self._take(found)
            picked.extend((index, record) for record in found)

    def commit(self) -> None:
        """Save the cursor of the last entry read."""
        if self._cursor is not None:
            self.position.save({"cursor": self._cursor})

    def close(self) -> None:
        """Close the journal."""
        self._reader.close()
