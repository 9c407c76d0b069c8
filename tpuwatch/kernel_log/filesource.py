"""A followed text log file (kern.log, dmesg output, raw kmsg records, journalctl -o json) as a kernel log source."""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from tpuwatch.kernel_log.position import INT64_MAX, Position, is_count
from tpuwatch.kernel_log.records import (
    KMSG_HEAD_BYTES_RE,
    MAX_LINE_BYTES,
    Record,
    parse_line,
    text_or_reason,
    unescape_kmsg,
)
from tpuwatch.kernel_log.sources import Source, SourceError

if TYPE_CHECKING:
    from tpuwatch.kernel_log.sieve import BacklogSieve

log = logging.getLogger(__name__)

FILE_READ_BYTES = 1 << 20
FILE_BUDGET_BYTES = 8 << 20
SKIP_CHUNK_BYTES = 1 << 20
_CONTINUATION = re.compile(rb" [A-Z0-9_]{1,64}=")
_DEFAULT_LINE_BYTES = 128.0


def _file_check(state: dict[str, Any]) -> str | None:
    for key, limit in (("dev", (1 << 64) - 1), ("ino", (1 << 64) - 1), ("offset", INT64_MAX)):
        if not is_count(state.get(key), limit):
            return f"{key} is not a non-negative integer: {state.get(key)!r}"[:200]
    return None


class FileSource(Source):
    """A text log file followed like ``tail -F``; its identity and offset are saved.

    Rotation by rename is noticed when the path names a new file: the old one
    is read to its end first.  A truncated file is read again from the start.
    After a restart, the saved offset is used if the file is the same one (an
    offset beyond its end means it was truncated meanwhile: read from the
    start); if it was rotated meanwhile, the rest of ``PATH.1`` (when it is
    the saved file) is read first.  Without a saved position it starts at the
    end.  A path that does not exist (yet) is a warning and ``degraded``; the
    file is followed from its start once it appears; so is one that replaces a FIFO, a device or a directory at
    the path, which are refused (opened without blocking, never read).  Bad bytes in a line are read as
    U+FFFD; lines mostly of them (binary junk) or longer than 64 KiB are skipped and counted; runs of NUL bytes before a
    line (a crash's zero-filled tail, however long) are dropped.  kmsg continuation lines (`` DEVICE=...``)
    after a raw kmsg record belong to it.
    """

    name = "file"

    def __init__(self, path: str, state_file: Path | None) -> None:
        super().__init__(Position(state_file, _file_check))
        self.path = path
        self._handle: BinaryIO | None = None
        self._identity: tuple[int, int] | None = None
        self._offset = 0
        self._draining_old = False
        self._discarding = False
        self._after_kmsg = False  # the last line was a raw kmsg record (or one of its continuation lines)
        self._problem: str | None = None
        self._missing_problem: str | None = None  # the text of _problem while the path is missing
        self._missing_reads = 0
        self._bytes_seen = 0
        self._lines_seen = 0
        self._start_at_end = False  # an existing file that could not be opened at start: no replay once it can
        state = self.position.load()
        try:
            if state is not None:
                self._resume(state)
            elif os.path.exists(path):
                self._start_at_end = os.path.isfile(path)  # a FIFO or device there is refused: no history to skip
                self._open(path, os.path.getsize(path))
        except SourceError as exc:
            self._problem = str(exc)
            log.warning("kernel log: %s (retried every cycle)", exc)
        if not os.path.exists(path):
            self._problem = self._missing()
            log.warning("kernel log: %s", self._problem)

    def _missing(self) -> str:
        self._missing_problem = f"kernel log file {absent(self.path)} (it is followed once it appears)"
        return self._missing_problem

    def _resume(self, state: dict[str, Any]) -> None:
        saved = (state["dev"], state["ino"])
        for path, old in ((self.path, False), (self.path + ".1", True)):
            if _identity_of(path) == saved:
                if state["offset"] > os.path.getsize(path):
                    log.warning("kernel log: the saved offset %d is beyond the end of %s: it was truncated while "
                                "tpuwatch was down; reading it from the start", state["offset"], path)
                    state = {**state, "offset": 0}
                self._open(path, state["offset"])
                self._draining_old = old
                return

    @property
    def degraded(self) -> str | None:
        """Why the file is not followed right now (missing, unreadable), or None."""
        return self._problem

    def _open(self, path: str, offset: int) -> None:
        handle = open_regular(path)
        if self._handle is not None:
            self._handle.close()
        self._handle = handle
        st = os.fstat(handle.fileno())
        self._identity = (st.st_dev, st.st_ino)
        self._offset = offset if offset <= st.st_size else 0
        if self._start_at_end:
            self._offset, self._start_at_end = st.st_size, False
        self._discarding = self._after_kmsg = False

    def _follow_path(self) -> bool:
        """Open the path from its start (a new file after rotation, or one that appeared); False if it cannot be."""
        appeared = self._problem is not None
        try:
            self._open(self.path, 0)
        except SourceError as exc:
            if self._problem != str(exc):
                log.warning("kernel log: %s (retried every cycle)", exc)
            self._problem = str(exc)
            return False
        if appeared:
            log.info("kernel log: following %s from its start", self.path)
        self._problem = None
        self._draining_old = False
        return True

    def read(self, limit: int) -> list[Record]:
        """Complete new lines, at most ``limit`` records; switches to the new file after a rotation."""
        out: list[Record] = []
        self.caught_up = False
        current = _identity_of(self.path)
        self._note_missing(current is None)
        budget = FILE_BUDGET_BYTES
        while len(out) < limit and budget > 0:
            if self._handle is None:
                if current is None or not self._follow_path():
                    self.caught_up = True
                    break
            rotated = self._draining_old or (current is not None and current != self._identity)
            consumed = self._read_lines(out, limit, final=rotated)
            budget -= consumed
            if consumed:
                continue
            if rotated and current is not None:  # the old file is read to its end: follow the new one
                if not self._follow_path():
                    self.caught_up = True
                    break
            elif self._handle is not None and os.fstat(self._handle.fileno()).st_size < self._offset:
                self._open(self.path, 0)  # truncated in place
            else:
                self.caught_up = True
                break
        return out

    def _note_missing(self, missing: bool) -> None:
        """A path missing at two reads in a row (not just between a rename and a create) is degraded."""
        self._missing_reads = self._missing_reads + 1 if missing else 0
        if self._missing_reads >= 2 and self._problem is None:
            self._problem = self._missing()
            log.warning("kernel log: %s", self._problem)
        elif not missing and self._handle is not None and self._problem == self._missing_problem:
            self._problem = None  # back under its old name: it is read on

    def _read_lines(self, out: list[Record], limit: int, final: bool) -> int:
        """Append records from the open file and return the bytes consumed.

        A last line without a newline is taken only when ``final`` (the file was rotated away).
        """
        assert self._handle is not None
        self._handle.seek(self._offset)
        data = self._handle.read(FILE_READ_BYTES)
        if not self._discarding and data.startswith(b"\0"):  # a crash's zero-filled tail: no line is in it
            run = len(data) - len(data.lstrip(b"\0"))
            self._offset += run
            self._bytes_seen += run
            return run
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
                self.skip("too_long", f"in {self.path} at offset {self._offset + skip}")
                self._discarding = True
                skip = len(data)
            self._offset += skip
            return skip
        position, lines, kmsg_start = skip, 0, -1
        while position < end:
            newline = data.find(b"\n", position, end)
            stop = end if newline < 0 else newline + 1
            line = data[position:stop].rstrip(b"\r\n")
            if self._after_kmsg and _CONTINUATION.match(line):
                if line.startswith(b" DEVICE=") and out and kmsg_start >= 0:
                    device = unescape_kmsg(line[len(b" DEVICE="):][:256].decode("ascii", "replace"))
                    out[-1] = Record(out[-1].message, device)
                position, lines = stop, lines + 1
                continue
            if len(out) >= limit:
                break
            record = self._parse(line)
            self._after_kmsg = record is not None and KMSG_HEAD_BYTES_RE.match(line) is not None
            if record is not None:
                out.append(record)
                kmsg_start = position if self._after_kmsg else -1
            position, lines = stop, lines + 1
        if self._after_kmsg and kmsg_start > skip and position == end and len(data) == FILE_READ_BYTES:
            out.pop()  # more continuation lines may follow in the next block: read this record again with them
            position, self._after_kmsg = kmsg_start, False
        self._offset += position
        self._bytes_seen += position - skip
        self._lines_seen += lines
        return position

    def _parse(self, line: bytes) -> Record | None:
        text, reason = text_or_reason(line.lstrip(b"\0"))
        if text is None:
            self.skip(reason, f"in {self.path} at offset {self._offset}")
            return None
        try:
            return parse_line(text)
        except Exception as exc:  # noqa: BLE001 - no line may stop the reading
            self.skip("error", f"{type(exc).__name__}: {exc}")
            return None

    def skip_ahead(self, keep: int, in_time: Callable[[], bool], sieve: BacklogSieve | None = None) -> int:
        """Move to about ``keep`` lines (at the average line length seen) before the end, counting the lines passed
        and reading the lines ``sieve`` picks from them (``take_picked``).

        Lines that start with a space (kmsg continuation lines) are not counted: they are no records.
        """
        if self._handle is None:
            return 0
        fd = self._handle.fileno()
        average = self._bytes_seen / self._lines_seen if self._lines_seen else _DEFAULT_LINE_BYTES
        target = os.fstat(fd).st_size - int(keep * average)
        start = position = line_start = self._offset
        lines = continuations = 0  # continuation lines (" KEY=...") of kmsg records are no records
        previous = b""
        partial: bytes | None = None if self._discarding else b""  # a line going on in the next chunk (None: too long)
        self._picked = []
        while position < target and in_time():
            chunk = os.pread(fd, min(SKIP_CHUNK_BYTES, target - position), position)
            if not chunk:
                break
            lines += chunk.count(b"\n")
            continuations += chunk.count(b"\n ") + (previous == b"\n" and chunk.startswith(b" "))
            last = chunk.rfind(b"\n")
            if last >= 0:
                line_start = position + last + 1
            if sieve is not None and sieve.active:
                partial = self._sift(sieve, partial, chunk, last)
            previous = chunk[-1:]
            position += len(chunk)
        kept_first = os.pread(fd, 1, line_start) if line_start < position else b""
        passed = lines - continuations + (kept_first == b" ") - len(self._picked)  # its own start counted above
        if line_start == start:
            return 0
        self._offset = line_start
        self._discarding = False
        self._after_kmsg = True  # continuation lines here belong to a record passed over
        self.skip("backlog", "", passed)
        return passed

    def _sift(self, sieve: BacklogSieve, partial: bytes | None, chunk: bytes, last: int) -> bytes | None:
        """Hand the whole lines that ``chunk`` completes to ``sieve`` and keep the records of those it picks;
        returns the new partial line."""
        if last < 0:
            if partial is None or len(partial) + len(chunk) > MAX_LINE_BYTES:
                return None
            return partial + chunk
        if partial is None:  # the rest of an over-long line
            lines = chunk[chunk.find(b"\n") + 1:last + 1]
        else:
            lines = partial + chunk[:last + 1]
        for line in sieve.pick(lines):
            record = self._parse(line.rstrip(b"\r"))
            if record is not None:
                self._picked.append(record)
        rest = chunk[last + 1:]
        return rest if len(rest) <= MAX_LINE_BYTES else None

    def commit(self) -> None:
        """Save the file identity and the offset of the first unread byte."""
        if self._identity is not None:
            self.position.save({"path": self.path, "dev": self._identity[0], "ino": self._identity[1],
                                "offset": self._offset})

    def close(self) -> None:
        """Close the file."""
        if self._handle is not None:
            self._handle.close()


def absent(path: str) -> str:
    """What is wrong with a ``path`` that cannot be found: it does not exist, or it is a symbolic link that leads
    nowhere (to a missing file, or round in a loop)."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"{path} is a loop of symbolic links"
        if os.path.islink(path):
            return f"{path} is a symbolic link to {os.readlink(path)}, which does not exist"
    return f"{path} does not exist"


def open_regular(path: str) -> BinaryIO:
    """``path`` opened for reading if it is a regular file; SourceError otherwise.

    Opened without blocking: a FIFO (or a device) at the path would block ``open`` until a writer comes, or
    give endless data, and stall the collector's thread for good; it is refused instead.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise SourceError(f"cannot open {path}: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) \
                else "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise SourceError(f"{path} is {kind}, not a log file (kernel_log.source: file follows a regular file)")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _identity_of(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino
