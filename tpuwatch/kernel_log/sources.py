"""Where kernel messages come from: /dev/kmsg, the systemd journal (JournalSource, in journal.py), or a followed file
(FileSource, in filesource.py).

Every source has ``read() -> Block | list[Record]`` (what is new, a bounded
batch, never blocking; ``caught_up`` says whether it reached the end), ``lost``
(records known to be lost), ``skipped`` (records passed over, by reason:
SKIP_REASONS), ``degraded`` (why it cannot see everything, or None),
``start()`` (a source that must be read continuously, /dev/kmsg, starts its
reader thread) and ``commit()``, which saves its position atomically under
the state directory so that a restart neither repeats nor skips a record.
Call ``commit()`` after the records read have been processed; it never raises
(a failed save is counted and retried).  With ``state_file=None`` a source
neither loads nor saves a position (``tpuwatch check`` must not move the
daemon's).  No record, whatever it holds, makes a source raise: what cannot
be parsed is counted, logged once and passed over.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

from tpuwatch.kernel_log.blocks import Block, Splitter
from tpuwatch.kernel_log.formats import KMSG_HEAD_BYTES_RE
from tpuwatch.kernel_log.position import Position, is_count
from tpuwatch.kernel_log.records import SKIP_REASONS, Record

log = logging.getLogger(__name__)

KMSG_READ_BYTES = 16384
KMSG_QUEUE_BYTES = 4 << 20  # records read from /dev/kmsg and not yet matched, at most (a few times the ring)
KMSG_BATCH_BYTES = 1 << 20
POLL_S = 0.25
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

    def counted(self, block: Block) -> Block:
        """``block``, its lines that are no records counted (``Block.skipped``)."""
        for reason, count in block.skipped.items():
            self.skip(reason, f"in {self.name} source", count)
        return block

    def read(self) -> Block | list[Record]:
        """Records after the last one read: a bounded batch."""
        raise NotImplementedError

    def start(self) -> None:
        """Read continuously from now on, where waiting would lose records (a ring buffer)."""

    def commit(self) -> None:
        """Save the position reached (never raises)."""

    def close(self) -> None:
        """Release what the source holds open."""


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

    def read(self) -> list[Record]:
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
    and reading starts as on a first start.  Once ``start()`` is called a
    thread of its own reads the ring as records come into a bounded queue
    (``KMSG_QUEUE_BYTES``), so that a storm the matcher cannot keep up with
    does not make the kernel overwrite records unread; past that bound it
    stops reading, and what the ring then overwrites counts as lost.  The
    position saved is that of the last record handed out by ``read()``.
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
        self._queue: deque[tuple[int, bytes]] = deque()  # (seq, raw record) read and not handed out yet
        self._queued = 0  # their bytes
        self._handed: int | None = saved  # the sequence number of the last record handed out
        self._lock = threading.Lock()
        self._room = threading.Event()  # set while the queue has room
        self._room.set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if saved is None:
            self._start_fresh()

    def _start_fresh(self) -> None:
        if self._lookback is not None:
            self._skip_before_usec = (time.clock_gettime(time.CLOCK_MONOTONIC) - self._lookback) * 1e6

    @property
    def lost(self) -> int:
        """Records lost to ring-buffer overrun since start (including while tpuwatch was down)."""
        return self._sequence.lost

    def start(self) -> None:
        """Read the ring from now on in a thread of its own, as records come."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kernel-log-kmsg", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        while not self._stop.is_set():
            try:
                self._pull()
                if not self._room.is_set():
                    self._room.wait(POLL_S)
                else:
                    poller.poll(POLL_S * 1000)
            except Exception as exc:  # noqa: BLE001 - the reader must outlive any record or error
                self.skip("error", f"{type(exc).__name__}: {exc}")
                self._stop.wait(POLL_S)

    def read(self) -> Block:
        """The records read since the last call (at most ``KMSG_BATCH_BYTES``), as a block."""
        if self._thread is None:
            self._pull()
        taken: list[bytes] = []
        size = 0
        with self._lock:
            while self._queue and size < KMSG_BATCH_BYTES:
                seq, raw = self._queue.popleft()
                taken.append(raw)
                size += len(raw)
                self._handed = seq
            self._queued -= size
            self.caught_up = not self._queue
            self._room.set()
        if self._passed_over:
            log.info("kernel log: first read this boot: passed over %d records older than kernel_log.lookback",
                     self._passed_over)
            self._passed_over = 0
        return self.counted(Splitter().split(b"".join(taken)))

    def _pull(self) -> None:
        """Read what is in the ring into the queue, while there is room."""
        while self._queued < KMSG_QUEUE_BYTES:
            try:
                raw = os.read(self._fd, KMSG_READ_BYTES)
            except BlockingIOError:
                if self._saved_position_impossible():
                    continue
                return
            except BrokenPipeError:
                continue  # overrun: the next read gives the oldest record left; the sequence gap counts the loss
            self._take(raw if raw.endswith(b"\n") else raw + b"\n")
        self._room.clear()

    def _take(self, raw: bytes) -> None:
        head = KMSG_HEAD_BYTES_RE.match(raw)
        if head is None:
            self.skip("malformed", repr(raw[:80]))
            return
        seq = int(head[2])
        if self._newest is None or seq > self._newest:
            self._newest = seq
        if not self._sequence.accept(seq):
            return
        self._unverified = None
        if self._skip_before_usec is not None:
            if int(head[3]) < self._skip_before_usec:
                self._passed_over += 1
                with self._lock:  # older than any record queued: the position moves past it
                    self._handed = seq
                return
            self._skip_before_usec = None  # the ring is in time order: the rest is within the lookback
        with self._lock:
            self._queue.append((seq, raw))
            self._queued += len(raw)

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
        """Save the sequence number of the last record handed out."""
        if self._handed is not None and self._unverified is None:
            self.position.save({"boot_id": self._boot_id, "seq": self._handed})

    def close(self) -> None:
        """Stop the reader thread and close /dev/kmsg."""
        self._stop.set()
        self._room.set()
        if self._thread is not None:
            self._thread.join(2 * POLL_S)
        os.close(self._fd)
