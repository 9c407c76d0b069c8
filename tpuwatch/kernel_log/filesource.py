"""A followed text log file (kern.log, dmesg output, raw kmsg records, journalctl -o json) as a kernel log source,
and a stream read once from its start (``StreamSource``: what ``tpuwatch logscan`` reads): both through the one
record splitter (``blocks.Splitter``)."""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from tpuwatch.kernel_log.blocks import Block, Splitter
from tpuwatch.kernel_log.position import INT64_MAX, Position, is_count
from tpuwatch.kernel_log.sources import Source, SourceError

log = logging.getLogger(__name__)

FILE_READ_BYTES = 256 << 10


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
    the path, which are refused (opened without blocking, never read).  ``read()`` gives the next ``Block`` of
    whole records, at most ``FILE_READ_BYTES`` of the file (see ``blocks.Splitter`` for lines that are no
    records, and for a record's continuation lines).
    """

    name = "file"

    def __init__(self, path: str, state_file: Path | None) -> None:
        super().__init__(Position(state_file, _file_check))
        self.path = path
        self._handle: BinaryIO | None = None
        self._identity: tuple[int, int] | None = None
        self._offset = 0  # the first byte not in a block yet: the position saved
        self._read_at = 0  # the first byte not read yet
        self._splitter = Splitter()
        self._draining_old = False
        self._problem: str | None = None
        self._missing_problem: str | None = None  # the text of _problem while the path is missing
        self._missing_reads = 0
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
        self._read_at = self._offset
        self._splitter = Splitter(start=self._offset == 0)

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

    def read(self) -> Block:
        """The next block of complete new records; switches to the new file after a rotation."""
        self.caught_up = False
        current = _identity_of(self.path)
        self._note_missing(current is None)
        for _ in range(4):  # the old file's last piece, the switch to the new one, its first piece
            if self._handle is None and (current is None or not self._follow_path()):
                break
            assert self._handle is not None
            rotated = self._draining_old or (current is not None and current != self._identity)
            data = os.pread(self._handle.fileno(), FILE_READ_BYTES, self._read_at)
            if data:
                more = len(data) == FILE_READ_BYTES
                block = self._splitter.split(data, "more" if more else "final" if rotated else "eof")
                self._read_at += len(data)
                self._offset = self._read_at - self._splitter.pending
                self.caught_up = not more and not rotated
                return self.counted(block)
            if rotated and current is not None:  # the old file is read to its end: follow the new one
                if self._splitter.pending:  # its last line, without a newline
                    self._offset = self._read_at
                    return self.counted(self._splitter.split(b"", "final"))
                if not self._follow_path():
                    break
            elif os.fstat(self._handle.fileno()).st_size < self._read_at:
                self._open(self.path, 0)  # truncated in place
            else:
                break
        self.caught_up = True
        return Block("")

    def _note_missing(self, missing: bool) -> None:
        """A path missing at two reads in a row (not just between a rename and a create) is degraded."""
        self._missing_reads = self._missing_reads + 1 if missing else 0
        if self._missing_reads >= 2 and self._problem is None:
            self._problem = self._missing()
            log.warning("kernel log: %s", self._problem)
        elif not missing and self._handle is not None and self._problem == self._missing_problem:
            self._problem = None  # back under its old name: it is read on

    def commit(self) -> None:
        """Save the file identity and the offset of the first unread byte."""
        if self._identity is not None:
            self.position.save({"path": self.path, "dev": self._identity[0], "ino": self._identity[1],
                                "offset": self._offset})

    def close(self) -> None:
        """Close the file."""
        if self._handle is not None:
            self._handle.close()


class StreamSource(Source):
    """A stream read once, from its start to its end: a file, stdin or a decompressed log (``tpuwatch logscan``).

    ``read`` is the stream's: up to the bytes asked for, fewer only at its end.  Its records come through the
    same splitter as a followed file's; ``lines`` counts the lines read so far.
    """

    name = "file"

    def __init__(self, read: Callable[[int], bytes]) -> None:
        super().__init__(Position(None, _file_check))
        self._read = read
        self._splitter = Splitter(start=True)

    @property
    def lines(self) -> int:
        """The lines read so far."""
        return self._splitter.line - 1

    def skip(self, reason: str, detail: str, count: int = 1) -> None:
        """Count lines passed over, and say nothing: logscan's summary says how many."""
        self.skipped[reason] += count

    def read(self) -> Block:
        """The next block of whole records (the rest, at the end of the stream)."""
        data = self._read(FILE_READ_BYTES)
        self.caught_up = len(data) < FILE_READ_BYTES
        return self.counted(self._splitter.split(data, "final" if self.caught_up else "more"))


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
