"""The one record splitter: the bytes of a text log to ``Block``s of whole records (pure, no I/O).

Text logs (a followed file, logscan's input, the raw records /dev/kmsg gives)
go through one ``Splitter``: bytes in pieces of any size become ``Block``s of
whole records, where a line that starts with white space continues the record
above it (kmsg's `` KEY=VALUE`` lines; the indented later lines dmesg and
journalctl print for a message with newlines).  A line is cut at
``MAX_LINE_BYTES``; junk and over-long lines are counted as skipped, never
raised on.  A block's records are parsed by ``records.py``.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from typing import Protocol

from tpuwatch.kernel_log.formats import (
    MAX_LINE_BYTES,
    is_text,
    text_or_reason,
)
from tpuwatch.kernel_log.records import Record, parse_record

# A line that starts with white space continues the record above it, at most MAX_CONTINUATION_LINES of them (the
# next one begins a record of its own).
MAX_CONTINUATION_LINES = 16
_CONTINUATION_RE = re.compile(r"\n[ \t]")
_LINE_START_RE = re.compile(r"\n(?=.)", re.DOTALL)
ESCAPE_RE = re.compile(r"\\")  # a kmsg or JSON escape: the message parsed from the line may hold a keyword
_RECORD_SPLIT_RE = re.compile(r"\n(?![ \t])")  # where records begin, while none has over MAX_CONTINUATION_LINES
_WHITE = (" ", "\t")
_TERMINAL_CODE_RE = re.compile(rb"\x1b\[[0-?]{0,32}[ -/]{0,8}[@-~]")  # an ECMA-48 control sequence (CSI)
BLANK = "\ufffd"  # stands for a line that is no record (junk, over 64 KiB), so that line numbers hold
# `dmesg --json` (util-linux 2.38+): one document, {"dmesg": [{"pri": 4, "time": 5.1, "msg": "..."}, ...]}, an
# entry's fields on lines of their own, indented.  Each "msg" line becomes the journal JSON line of its message and
# the other lines lose their indent (they are no continuation lines), line for line.
_DMESG_JSON_RE = re.compile(rb'\A\s*\{\s*"dmesg"\s*:\s*\[')
_DMESG_JSON_MSG_RE = re.compile(rb'^[ \t]*"msg"[ \t]*:[ \t]*("(?:[^"\\\n]|\\.)*")[ \t]*,?[ \t]*$', re.MULTILINE)
_INDENT_RE = re.compile(rb"^[ \t]+", re.MULTILINE)


class Passing(Protocol):
    """What a walk over a block may pass over unread (``BacklogSieve``: the lines of the storms it knows)."""

    def held(self, text: str) -> list[int]:
        """Where, in ``text``, the records that may be passed over hold what tells them (sorted offsets)."""

    def passes(self, raw: str) -> bool:
        """True if the record whose text is ``raw`` (its lines, each with its newline) is passed over; it is then
        counted with the records that went by."""


class Block:
    """Whole records of a text log, in order: what a followed file, logscan and /dev/kmsg hand the matcher.

    ``text`` holds complete lines, each ending in a newline (only the last line of an input may lack it).  A line
    that starts with white space continues the record above it (``MAX_CONTINUATION_LINES`` at most); the first
    line always begins a record.  ``line`` is the 1-based number of the first line in its stream; ``skipped``
    counts the lines that are no records (``BLANK`` lines in the text: ``not_text``, ``too_long``).  Records are
    parsed only when asked for (``record``): most lines of a log hold no keyword and are only counted.
    """

    __slots__ = ("text", "line", "skipped", "lines", "_whole_split", "_continuations", "_blanks", "_length")

    def __init__(self, text: str, line: int = 1, skipped: dict[str, int] | None = None,
                 blanks: tuple[int, ...] = ()) -> None:
        self.text = text
        self.line = line
        self.skipped = skipped or {}
        self._blanks = blanks  # offsets of the BLANK lines, which are counted as records, and skipped
        continuations = [m.start() + 1 for m in _CONTINUATION_RE.finditer(text)]  # (5x faster than "\n " in text)
        self._continuations = _bounded(text, continuations)
        self._whole_split = len(self._continuations) == len(continuations)  # no record past the bound: one split
        self.lines = text.count("\n") + (bool(text) and not text.endswith("\n"))
        """The lines of the block."""
        self._length = self.lines - len(self._continuations)

    def __len__(self) -> int:
        """The records of the block (``BLANK`` lines included: each is counted as skipped, not read)."""
        return self._length

    def count(self, start: int, end: int) -> int:
        """The records whose first lines begin in ``text[start:end]`` (``start`` begins a record)."""
        if end <= start:
            return 0
        text, continuations = self.text, self._continuations
        lines = text.count("\n", start, end) + (text[end - 1] != "\n")
        return lines - (bisect_left(continuations, end) - bisect_right(continuations, start))

    def start_of(self, offset: int) -> int:
        """Where the record that holds ``offset`` begins."""
        start = self.text.rfind("\n", 0, offset) + 1
        continuations = self._continuations
        while continuations and start and _holds(continuations, start):
            start = self.text.rfind("\n", 0, start - 1) + 1
        return start

    def end_of(self, start: int) -> int:
        """The offset just past the record that begins at ``start`` (its last line's newline)."""
        text, continuations = self.text, self._continuations
        end = text.find("\n", start)
        while continuations and end >= 0 and _holds(continuations, end + 1):
            end = text.find("\n", end + 1)
        return len(text) if end < 0 else end + 1

    def record(self, start: int, line: int | None = None) -> Record:
        """The record that begins at ``start`` (``line``: its line number, kept on the record)."""
        end = self.end_of(start)
        if start in self._blanks:
            return Record("", None, line)
        return parse_record(self.text[start:end].rstrip("\n").split("\n"), line)

    def records(self) -> list[Record]:
        """Every record, parsed (for what needs them all: tests, short reads); ``BLANK`` lines are none."""
        out, start, line, text = [], 0, self.line, self.text
        while start < len(text):
            end = self.end_of(start)
            if start not in self._blanks:
                out.append(self.record(start, line))
            line += text.count("\n", start, end)
            start = end
        return out

    def walk(self, finds: Callable[[str], list[tuple[int, str]]] | None, context: int,
             wants_context: Callable[[str], bool], passing: Passing | None = None) -> Iterator[int | Record]:
        """The records to feed a stream matcher, and between them how many went by that hold no keyword (counted,
        not parsed): the records where ``finds`` finds a keyword (or an escape that parsing decodes, which may hide
        one; ``finds`` None: every record), up to ``context`` records before one whose message ``wants_context``
        (a rule over several records), and the last ``context`` records (the next block's context).  With
        ``passing``, a record where only ``passing.held`` finds something is passed over, counted with those that
        went by, when ``passing.passes`` its text (a storm's line; never parsed)."""
        text = self.text
        if finds is None:
            reads = [0, *(m.end() for m in _LINE_START_RE.finditer(text))]
        else:
            reads = [offset for offset, _ in finds(text)]
            if "\\" in text:
                reads = sorted([*reads, *(m.start() for m in ESCAPE_RE.finditer(text))])
        held = passing.held(text) if passing is not None else []
        reads.append(len(text))
        held.append(len(text))
        passes = passing.passes if passing is not None else None
        start_of, end_of, size, continuations = self.start_of, self.end_of, len(text), self._continuations
        r = h = 0
        pos, line, gap = 0, self.line, 0
        while True:
            while reads[r] < pos:
                r += 1  # in a record fed or passed over already
            while held[h] < pos:
                h += 1
            offset = min(reads[r], held[h])
            if offset < size:
                if continuations:
                    start = start_of(offset)
                    end = end_of(start)
                else:  # every line a record (the storm's path: no calls)
                    start = text.rfind("\n", 0, offset) + 1
                    end = text.find("\n", offset) + 1 or size
                if passes is not None and reads[r] >= end and passes(text[start:end]):
                    newlines = text.count("\n", pos, end)
                    gap += self.count(pos, end) if continuations else newlines + (text[end - 1] != "\n")
                    line += newlines
                    pos = end
                    continue
                record: Record | None = self.record(start, line + text.count("\n", pos, start))
            else:
                start, record = offset, None
            before = self._previous(start, pos, context) if context and (
                record is None or wants_context(record.message)) else []
            if gap := gap + self.count(pos, before[0] if before else start):
                yield gap
            gap = 0
            for at in before:
                yield self.record(at, line + text.count("\n", pos, at))
            if record is None:
                return
            yield record
            line += text.count("\n", pos, end)
            pos = end

    def raws(self) -> list[str]:
        """The text of each record (its lines joined by newlines), in order, as the block counts them."""
        text = self.text
        if self._whole_split:  # every record is a line unless there are continuation lines
            raws = _RECORD_SPLIT_RE.split(text) if self._continuations else text.split("\n")
            if text.endswith("\n") or not text:
                raws.pop()  # the split's empty piece after the last newline (or of an empty block)
            return raws
        out, start = [], 0
        while start < len(text):
            end = self.end_of(start)
            out.append(text[start:end].removesuffix("\n"))
            start = end
        return out

    def _previous(self, start: int, floor: int, count: int) -> list[int]:
        """The starts of up to ``count`` records before the one at ``start`` and not before ``floor``, oldest first."""
        out: list[int] = []
        while len(out) < count and start > floor:
            start = self.start_of(start - 1)
            out.append(start)
        return out[::-1]


def _bounded(text: str, continuations: list[int]) -> list[int]:
    """``continuations`` (the starts of lines that start with white space) without those past a record's
    ``MAX_CONTINUATION_LINES``th: each of those begins a record."""
    out: list[int] = []
    run = 0
    for start in continuations:
        run = run + 1 if out and text.find("\n", out[-1]) + 1 == start else 1
        if run > MAX_CONTINUATION_LINES:
            run = 0
            continue
        out.append(start)
    return out


def _holds(offsets: list[int], offset: int) -> bool:
    index = bisect_left(offsets, offset)
    return index < len(offsets) and offsets[index] == offset


class Splitter:
    """The one record splitter: the bytes of a text log, in pieces of any size, to ``Block``s of whole records.

    ``split(data, end)``: ``end`` is "more" when more bytes follow at once (the last record waits for the next
    piece: continuation lines may follow), "eof" at the end of what a followed file holds now (a line without its
    newline waits), "final" at the end of the input (everything is given).  Runs of NUL bytes (a crash's
    zero-filled tail) are dropped; terminal colour codes are taken out; a line mostly of invalid UTF-8 or control
    bytes, or one over ``MAX_LINE_BYTES`` (never held in memory whole), is a ``BLANK`` line, counted as skipped.
    ``pending`` is how many bytes of the input given so far are not in a block yet; ``line`` the number of the
    next block's first line.  A `dmesg --json` document (at the input's start) is read one message per entry.
    """

    def __init__(self, line: int = 1, start: bool = False) -> None:
        self.line = line
        self._pending = b""
        self._discarding = False  # in the rest of a line over MAX_LINE_BYTES
        self._first = start  # the input's start, where a dmesg --json document would begin
        self._json = False

    @property
    def pending(self) -> int:
        """Bytes given but not yet in a block (a partial line, a record that may continue)."""
        return len(self._pending)

    def split(self, data: bytes, end: str = "final") -> Block:
        """The whole records of what was given so far (see the class docstring)."""
        skipped: dict[str, int] = {}
        if b"\0" in data:  # a crash leaves runs of NUL where the file was not written: no line is in them
            data = data.replace(b"\0", b"")
        lead = 0  # a line over MAX_LINE_BYTES that ended in this piece: a BLANK line first
        if self._discarding:
            newline = data.find(b"\n")
            if newline < 0:
                if end != "final":
                    return self._block(b"", skipped)
                data = b""
            else:
                data = data[newline + 1:]
            self._discarding, lead, skipped["too_long"] = False, 1, 1
        buffer = self._pending + data
        if self._first and buffer:
            self._first = False
            self._json = _DMESG_JSON_RE.match(buffer) is not None
        cut = buffer.rfind(b"\n") + 1
        if len(buffer) - cut > MAX_LINE_BYTES:  # a line too long to hold: passed over to its newline
            self._pending = b""
            if end == "final":
                skipped["too_long"] = skipped.get("too_long", 0) + 1
                return self._block(buffer[:cut], skipped, lead, trail=True)
            self._discarding = True  # its BLANK line, and its count, come with its end
            return self._block(buffer[:cut], skipped, lead)
        if end == "final":
            cut = len(buffer)
        elif end == "more" and cut:
            cut = _hold_back(buffer, cut)
        self._pending = buffer[cut:]
        return self._block(buffer[:cut], skipped, lead)

    def _block(self, data: bytes, skipped: dict[str, int], lead: int = 0, trail: bool = False) -> Block:
        """A block of ``data`` (whole lines), after ``lead`` BLANK lines and before a ``trail`` one (over-long
        lines)."""
        if self._json:
            data = _INDENT_RE.sub(b"", _DMESG_JSON_MSG_RE.sub(rb'{"MESSAGE": \1}', data))
        text, blanks = _decoded(data, skipped)
        if lead:
            text = BLANK + "\n" + text
            blanks = [0, *(offset + 2 for offset in blanks)]
        if trail:
            blanks.append(len(text))
            text += BLANK
        block = Block(text, self.line, {k: n for k, n in skipped.items() if n}, tuple(blanks))
        self.line += block.lines
        return block


def _hold_back(buffer: bytes, end: int) -> int:
    """Where the last record of ``buffer[:end]`` (whole lines) begins: it waits for the next piece, as continuation
    lines may follow.  A run of continuation lines is counted from its head as ``Block`` counts it (each
    MAX_CONTINUATION_LINES + 1st begins a record), so records are the same wherever pieces end."""
    start = buffer.rfind(b"\n", 0, end - 1) + 1
    run = 0
    while start and buffer.startswith((b" ", b"\t"), start):
        run += 1
        start = buffer.rfind(b"\n", 0, start - 1) + 1
    for _ in range(run // (MAX_CONTINUATION_LINES + 1) * (MAX_CONTINUATION_LINES + 1)):
        start = buffer.index(b"\n", start) + 1
    return start


def _decoded(data: bytes, skipped: dict[str, int]) -> tuple[str, list[int]]:
    """``data`` (whole lines) as text, and the offsets of the lines blanked (``text_or_reason``: junk, or over 64
    KiB as written); terminal colour codes (``dmesg --color=always``, a captured terminal) are taken out: one
    between "NVRM: " and "Xid" would hide the Xid."""
    if is_text(data) and not _has_long_line(data):  # ESC is no text byte: plain text has no colour codes
        try:
            return data.decode("utf-8"), []
        except UnicodeDecodeError:
            pass
    out: list[str] = []
    blanks: list[int] = []
    offset = 0
    for raw in data.split(b"\n"):
        if len(raw) <= MAX_LINE_BYTES and b"\x1b" in raw:
            raw = _TERMINAL_CODE_RE.sub(b"", raw)
        text, reason = text_or_reason(raw)
        if text is None:
            skipped[reason] = skipped.get(reason, 0) + 1
            blanks.append(offset)
            text = BLANK
        out.append(text)
        offset += len(text) + 1
    return "\n".join(out), blanks


def _has_long_line(data: bytes) -> bool:
    position = 0
    while len(data) - position > MAX_LINE_BYTES:
        newline = data.rfind(b"\n", position, position + MAX_LINE_BYTES + 1)
        if newline < 0:
            return True
        position = newline + 1
    return False
