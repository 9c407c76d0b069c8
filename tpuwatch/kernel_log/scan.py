"""Scan a whole log file with the rules, fast: 1 MiB blocks, one keyword prefilter, per-record work only on hits.

Records are recognised one by one (dmesg text with or without timestamps,
syslog, raw kmsg records with their continuation lines, ``journalctl -o
json``).  A line that starts with white space continues the record above it
(kmsg's `` KEY=VALUE`` lines; the indented lines ``dmesg`` and ``journalctl``
print for a message with newlines), so a record is what /dev/kmsg or the
journal would have given the daemon's collector.  Records go through the same
``StreamMatcher`` as the collector's: the ones with a keyword hit are fed,
with the records before them a message spanning several lines needs; the rest
are only counted (``skip``).  A line that is not text (invalid UTF-8, control
bytes) or is longer than 64 KiB is skipped and counted; memory stays bounded
by the block size.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

from tpuwatch.kernel_log.attribution import Attribution, as_attribution
from tpuwatch.kernel_log.events import KernelEvent, make_event
from tpuwatch.kernel_log.matcher import StreamMatcher
from tpuwatch.kernel_log.records import (
    KMSG_HEAD_RE,
    MAX_LINE_BYTES,
    MAX_MESSAGE_CHARS,
    Record,
    as_text,
    is_text,
    parse_kmsg,
    parse_line,
)
from tpuwatch.kernel_log.rule import Match
from tpuwatch.kernel_log.rules import RuleSet

BLOCK_BYTES = 1 << 20
MAX_CONTINUATION_LINES = 16
_LINE_MEMORY = 512
_CONTINUATION = re.compile(r"\n[ \t]")
_KMSG_HEAD_BYTES = re.compile(rb"\d+,\d+,\d+,[^;\n]*;")


@dataclass
class ScanStats:
    """What a scan saw."""

    lines: int = 0
    skipped: int = 0
    severities: Counter[str] = field(default_factory=Counter)


def scan(stream: BinaryIO, rules: RuleSet, device_for_pci: Attribution | Callable[[str], str | int | None],
         stats: ScanStats) -> Iterator[KernelEvent]:
    """Events for every matching record of ``stream``, in order; ``stats`` is updated as it goes."""
    scanner = _Scanner(rules, as_attribution(device_for_pci))
    for block in _blocks(stream):
        if block is None:  # one over-long line, dropped unread
            stats.lines += 1
            stats.skipped += 1
            for event in scanner.drop_line():
                stats.severities[event.severity] += 1
                yield event
            continue
        text, bad = _clean(block)
        stats.skipped += bad
        stats.lines += text.count("\n") + (not text.endswith("\n"))
        for event in scanner.block(text):
            stats.severities[event.severity] += 1
            yield event
    for event in scanner.finish():
        stats.severities[event.severity] += 1
        yield event


class _Scanner:
    """Walks blocks of whole records, feeding the matcher exactly the records it needs, in order."""

    def __init__(self, rules: RuleSet, attribution: Attribution) -> None:
        self.rules = rules
        self.matcher: StreamMatcher = rules.stream()
        self.attribution = attribution
        self.context = rules.max_lines - 1
        self.line_base = 0  # lines before the current block
        self.carry = ""  # the last records of the previous block, not given to the matcher yet
        self.carry_lines = 0
        self.index = 0  # records the matcher has been given (fed or skipped)
        self.lines_of: OrderedDict[int, int] = OrderedDict()  # record index -> 1-based line, for recent fed records

    def drop_line(self) -> Iterator[KernelEvent]:
        """A line dropped unread (over 64 KiB): no record, but it counts for line numbers and ends the context."""
        self.continuations = [m.start() for m in _CONTINUATION.finditer(self.carry)]
        yield from self._events(self.matcher.skip(self._skip(self.carry, 0, len(self.carry))))
        self.carry, self.carry_lines = "", 0
        self.line_base += 1

    def block(self, block: str) -> Iterator[KernelEvent]:
        """Events of one block; its last records wait (unfed) for the next block, which may need them as context."""
        text = self.carry + block
        self.continuations = [m.start() for m in _CONTINUATION.finditer(text)]
        pos, line, last_start = 0, self.line_base - self.carry_lines, -1
        for hit in self.rules.hits(text):
            start = _record_start(text, hit)
            if start < pos or start == last_start:
                continue
            last_start = start
            record, end = _record(text, start)
            before: list[tuple[int, Record]] = []
            if self.context and self.rules.wants_context(record.message):
                before = _previous(text, start, pos, self.context)
            gap_end = before[0][0] if before else start
            line += text.count("\n", pos, gap_end)
            yield from self._events(self.matcher.skip(self._skip(text, pos, gap_end)))
            for at, previous in before:
                line += text.count("\n", gap_end, at)
                gap_end = at
                yield from self._feed(previous, line + 1)
            line += text.count("\n", gap_end, start)
            yield from self._feed(record, line + 1)
            line += text.count("\n", start, end)
            pos = end
        tail = _previous(text, len(text), pos, self.context)[0][0] if self.context and pos < len(text) else len(text)
        yield from self._events(self.matcher.skip(self._skip(text, pos, tail)))
        self.carry = text[tail:]
        self.carry_lines = self.carry.count("\n") + (not self.carry.endswith("\n") and bool(self.carry))
        self.line_base += block.count("\n") + (not block.endswith("\n"))

    def finish(self) -> Iterator[KernelEvent]:
        self.continuations = [m.start() for m in _CONTINUATION.finditer(self.carry)]
        yield from self._events(self.matcher.skip(self._skip(self.carry, 0, len(self.carry))))
        yield from self._events(self.matcher.flush())

    def _skip(self, text: str, start: int, end: int) -> int:
        count = _records_in(text, start, end, self.continuations)
        self.index += count
        return count

    def _feed(self, record: Record, line: int) -> Iterator[KernelEvent]:
        self.index += 1
        self.lines_of[self.index] = line
        if len(self.lines_of) > _LINE_MEMORY:
            self.lines_of.popitem(last=False)
        yield from self._events(self.matcher.feed(record), record)

    def _events(self, matches: list[Match], record: Record | None = None) -> Iterator[KernelEvent]:
        for match in matches:
            line = self.lines_of.get(match.index) if match.index is not None else None
            yield make_event(match, match.record or record or Record(""), self.attribution, line=line)


def _record_start(text: str, offset: int) -> int:
    """Where the record holding ``offset`` starts: the start of its line, or of the line a continuation continues."""
    start = text.rfind("\n", 0, offset) + 1
    for _ in range(MAX_CONTINUATION_LINES):
        if start == 0 or not _continues(text, start):
            break
        start = text.rfind("\n", 0, start - 1) + 1
    return start


def _continues(text: str, start: int) -> bool:
    return text.startswith((" ", "\t"), start)


def _record(text: str, start: int) -> tuple[Record, int]:
    """The record whose head line starts at ``start``, and the offset just past its last line."""
    end = text.find("\n", start)
    end = len(text) if end < 0 else end
    head = text[start:end]
    extra: list[str] = []
    while end < len(text) and len(extra) < MAX_CONTINUATION_LINES and _continues(text, end + 1):
        following = text.find("\n", end + 1)
        following = len(text) if following < 0 else following
        extra.append(text[end + 1:following])
        end = following
    end = min(end + 1, len(text))
    if KMSG_HEAD_RE.match(head):
        parsed = parse_kmsg("\n".join([head, *extra]))
        if parsed is not None:
            return parsed.record, end
    record = parse_line(head)
    if extra:
        message = "\n".join([record.message, *(line.strip() for line in extra)])
        record = Record(message[:MAX_MESSAGE_CHARS * 2], record.kernel_device)
    return record, end


def _previous(text: str, start: int, floor: int, count: int) -> list[tuple[int, Record]]:
    """Up to ``count`` records before the one at ``start`` and not before ``floor``, oldest first."""
    out: list[tuple[int, Record]] = []
    while len(out) < count and start > floor:
        start = _record_start(text, start - 1)
        if start < floor:
            break
        out.append((start, _record(text, start)[0]))
    return out[::-1]


def _records_in(text: str, start: int, end: int, continuations: list[int]) -> int:
    """Records whose head lines start in ``text[start:end]`` (``start`` is a record start); ``continuations``:
    the sorted offsets of the newlines that start a continuation line."""
    if end <= start:
        return 0
    lines = text.count("\n", start, end) + (text[end - 1] != "\n")
    return lines - (bisect_left(continuations, end - 1) - bisect_left(continuations, start))


def _blocks(stream: BinaryIO) -> Iterator[bytes | None]:
    """Blocks of whole records (a record is never split from its continuation lines); None for a line
    over MAX_LINE_BYTES that never fit in memory."""
    pending = b""
    discarding = False
    while data := stream.read(BLOCK_BYTES):
        if discarding:
            newline = data.find(b"\n")
            if newline < 0:
                continue
            data, discarding = data[newline + 1:], False
        buffer = pending + data
        end = buffer.rfind(b"\n") + 1
        if len(buffer) - end > MAX_LINE_BYTES:
            if end:
                yield buffer[:end]
            yield None
            pending, discarding = b"", True
            continue
        cut = _hold_back(buffer, end) if end else 0
        if cut == 0 and len(buffer) > BLOCK_BYTES:
            cut = end
        if cut:
            yield buffer[:cut]
        pending = buffer[cut:]
    if pending and not discarding:
        yield pending


def _hold_back(buffer: bytes, end: int) -> int:
    """Where to cut ``buffer[:end]`` so that its last record waits for more continuation lines."""
    start = buffer.rfind(b"\n", 0, end - 1) + 1
    for _ in range(MAX_CONTINUATION_LINES):
        if start == 0 or not buffer.startswith((b" ", b"\t"), start):
            break
        start = buffer.rfind(b"\n", 0, start - 1) + 1
    return start


def _clean(block: bytes) -> tuple[str, int]:
    """The block as text with every bad line blanked (so line numbers hold), and how many were bad."""
    if is_text(block) and not _has_long_line(block):
        try:
            return block.decode("utf-8"), 0
        except UnicodeDecodeError:
            pass
    lines = block.split(b"\n")
    bad = 0
    for index, line in enumerate(lines):
        if as_text(line) is None:
            lines[index] = b""
            bad += 1
    return b"\n".join(lines).decode("utf-8"), bad


def _has_long_line(block: bytes) -> bool:
    position = 0
    while len(block) - position > MAX_LINE_BYTES:
        newline = block.rfind(b"\n", position, position + MAX_LINE_BYTES + 1)
        if newline < 0:
            return True
        position = newline + 1
    return False
