"""Scan a whole log file with the rules, fast: 1 MiB blocks, one keyword prefilter, per-record work only on hits.

Records are recognised one by one (dmesg text with or without timestamps,
syslog, raw kmsg records with their continuation lines, ``journalctl -o
json``).  A line that starts with white space continues the record above it
(kmsg's `` KEY=VALUE`` lines; the indented lines ``dmesg`` and ``journalctl``
print for a message with newlines), so a record is what /dev/kmsg or the
journal would have given the daemon's collector.  Records go through the same
``StreamMatcher`` as the collector's: the ones with a keyword hit are fed,
with the records before them a message spanning several lines needs; the rest
are only counted (``skip``).  A line's bad bytes are read as U+FFFD
(``records.as_text``); a line mostly of them (binary junk) or longer than
64 KiB is skipped and counted; memory stays bounded by the block size.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import chain, islice
from typing import BinaryIO

from tpuwatch.kernel_log.attribution import Attribution, as_attribution
from tpuwatch.kernel_log.events import KernelEvent, make_event
from tpuwatch.kernel_log.matcher import StreamMatcher
from tpuwatch.kernel_log.records import (
    JSON_STREAM_HEADS,
    KMSG_HEAD_RE,
    MAX_LINE_BYTES,
    MAX_MESSAGE_CHARS,
    Record,
    as_text,
    is_text,
    kmsg_record,
    parse_kmsg,
    parse_line,
)
from tpuwatch.kernel_log.rule import Match
from tpuwatch.kernel_log.rules import Expects, RuleSet

BLOCK_BYTES = 1 << 20
MAX_CONTINUATION_LINES = 16
_LINE_MEMORY = 512
# _rejected saves parsing and feeding a line its keyword's regexes cannot match, and costs a search of the line that
# they can: after _TRY_RUN finds of a keyword in a row that it let through, it is tried on every _TRY_EVERY-th
# find of that keyword only, until it refuses one again.  The events are the same either way.
_TRY_RUN, _TRY_EVERY = 8, 64
_CONTINUATION = re.compile(r"\n[ \t]")
_WHITE = (" ", "\t")  # what a continuation line starts with
_SYSLOG_ESCAPE = re.compile(r"#0[0-3][0-7]")  # rsyslog writes control characters as #ooo
_TERMINAL_CODE = re.compile(rb"\x1b\[[0-?]{0,32}[ -/]{0,8}[@-~]")  # an ECMA-48 control sequence (CSI)


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
    for block in _as_lines(_blocks(stream)):
        if block is None:  # one over-long line, dropped unread
            stats.lines += 1
            stats.skipped += 1
            for event in scanner.drop_line():
                stats.severities[event.severity] += 1
                yield event
            continue
        text, bad = _clean(block, scanner.is_text)
        stats.skipped += bad
        events = scanner.block(text)
        stats.lines += scanner.block_lines
        for event in events:
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
        self.lines_of: dict[int, int] = {}  # record index -> 1-based line, for recent fed records
        self.passed: dict[str, int] = {}  # keyword -> its finds since _rejected last refused one
        self.block_lines = 0  # lines in the last block
        self.is_text = is_text
        self.line_counter = _python_counter

    def drop_line(self) -> list[KernelEvent]:
        """A line dropped unread (over 64 KiB): no record, but it counts for line numbers and ends the context."""
        out: list[KernelEvent] = []
        self._events(self.matcher.skip(self._skip_carry()), None, out)
        self.carry, self.carry_lines = "", 0
        self.line_base += 1
        return out

    def block(self, block: str) -> list[KernelEvent]:
        """Events of one block (``block_lines`` then says how many lines it had); its last records wait (unfed) for
        the next block, which may need them as context."""
        text = self.carry + block
        counts = self.line_counter(text)
        out: list[KernelEvent] = []
        pos, line, last_start = 0, self.line_base - self.carry_lines, -1
        rules, matcher, lines_of, wants_context = self.rules, self.matcher, self.lines_of, self.rules.wants_context
        checks, follow_only, restarts = rules.checks, rules.follow_only, rules.restarts
        expects_any, fresh = matcher.expects_any, matcher.fresh
        start, line_end, refused = 0, -1, set[str]()  # the last find's record and line end; keywords it failed for
        for hit, keyword in rules.keyed_hits(text):
            if (followed := follow_only.get(keyword)) is not None and not expects_any(followed):
                continue  # only follow lines of rules with no fault open: like a line without keywords
            if (restart := keyword in restarts) and fresh():
                continue  # a boot or driver load with nothing to end: like a line without keywords
            tests = checks.get(keyword)
            if hit >= line_end:  # a find on a new line (finds in one line, a flood of them, share this work)
                start = _record_start(text, hit)
                line_end = text.find("\n", hit)
                line_end = len(text) if line_end < 0 else line_end
                refused = set()
            if start < pos or start == last_start:
                continue
            if restart and start > pos and fresh(counts(pos, start)[1]):
                continue  # ... nor once the records before it are counted
            if tests is not None:
                if keyword in refused:
                    continue
                passed = self.passed.get(keyword, 0)
                if (passed < _TRY_RUN or passed % _TRY_EVERY == 0) and _rejected(text, start, hit, keyword, rules,
                                                                                    expects_any):
                    self.passed[keyword] = 0
                    refused.add(keyword)
                    continue  # no regex matches: like a line without keywords (another keyword may still count)
                self.passed[keyword] = passed + 1
            last_start = start
            record, end = _record(text, start)
            before: list[tuple[int, Record]] = []
            if self.context and wants_context(record.message):
                before = _previous(text, start, pos, self.context)
            gap_end = before[0][0] if before else start
            if gap_end > pos:  # records with no keyword: counted, not parsed (gap_end starts a line)
                newlines, skipped = counts(pos, gap_end)
                line += newlines
                self.index += skipped
                if released := matcher.skip(skipped):
                    self._events(released, None, out)
            for at, previous in before:
                line += text.count("\n", gap_end, at)
                gap_end = at
                self.index += 1
                lines_of[self.index] = line + 1
                if matches := matcher.feed(previous):
                    self._events(matches, previous, out)
            line += text.count("\n", gap_end, start)
            self.index += 1
            lines_of[self.index] = line + 1
            if matches := matcher.feed_found(record):
                self._events(matches, record, out)
            line += text.count("\n", start, end)
            pos = end
            if len(lines_of) > 2 * _LINE_MEMORY:
                self._forget_lines()
        tail = _previous(text, len(text), pos, self.context)[0][0] if self.context and pos < len(text) else len(text)
        newlines, skipped = counts(pos, tail)  # with the counts at each hit, every newline is counted once
        if tail > pos:
            self.index += skipped
            self._events(matcher.skip(skipped), None, out)
        self.carry = text[tail:]
        carry_newlines = self.carry.count("\n")
        partial = bool(text) and not text.endswith("\n")  # the last line, if the stream ends without a newline
        text_lines = line - (self.line_base - self.carry_lines) + newlines + carry_newlines + partial
        self.block_lines = text_lines - self.carry_lines
        self.carry_lines = carry_newlines + (partial and bool(self.carry))
        self.line_base += self.block_lines
        return out

    def finish(self) -> list[KernelEvent]:
        out: list[KernelEvent] = []
        self._events(self.matcher.skip(self._skip_carry()), None, out)
        self._events(self.matcher.flush(), None, out)
        return out

    def _skip_carry(self) -> int:
        """The records held back from the last block, skipped (they hold no keyword the matcher has not been fed)."""
        count = self.line_counter(self.carry)(0, len(self.carry))[1]
        self.index += count
        return count

    def _forget_lines(self) -> None:
        """Keep the line numbers of the last _LINE_MEMORY fed records (the ones a waiting event can start at)."""
        for index in list(islice(self.lines_of, len(self.lines_of) - _LINE_MEMORY)):  # oldest first
            del self.lines_of[index]

    def _events(self, matches: list[Match], record: Record | None, out: list[KernelEvent]) -> None:
        for match in matches:
            line = self.lines_of.get(match.index) if match.index is not None else None
            out.append(make_event(match, match.record or record or Record(""), self.attribution, line=line))


def _rejected(text: str, start: int, hit: int, keyword: str, rules: RuleSet, expects: Expects) -> bool:
    """True if ``keyword`` at ``hit`` cannot make the record at ``start`` match: its rules' regexes, searched in
    the raw line, find nothing (``RuleSet.line_may_match``, ``StreamMatcher.expects_any``).  Only for a one-line record
    whose message is the raw line's text as it stands (not JSON, no kmsg or syslog escapes, not cut short), which
    those regexes cannot see past."""
    end = text.find("\n", start)
    end = len(text) if end < 0 else end
    if hit >= end or end - start > MAX_MESSAGE_CHARS or text.startswith(("{", *JSON_STREAM_HEADS), start):
        return False
    if text.startswith(_WHITE, end + 1) and not KMSG_HEAD_RE.match(text, start):
        return False  # a continuation line joins the message
    raw = text[start:end]
    if "\\" in raw or ("#0" in raw and _SYSLOG_ESCAPE.search(raw)):
        return False
    return not rules.line_may_match(keyword, raw, expects)


def _python_counter(text: str) -> Callable[[int, int], tuple[int, int]]:
    """``counts(start, end)``: the newlines in ``text[start:end]`` and the records whose head lines begin there
    (``start`` begins one; a line that starts with white space continues the record above it)."""
    continuations = [m.start() for m in _CONTINUATION.finditer(text)]  # the newlines that begin continuation lines

    def counts(start: int, end: int) -> tuple[int, int]:
        if end <= start:
            return 0, 0
        newlines = text.count("\n", start, end)
        return newlines, newlines + (text[end - 1] != "\n") - (
            bisect_left(continuations, end - 1) - bisect_left(continuations, start))

    return counts


def _record_start(text: str, offset: int) -> int:
    """Where the record holding ``offset`` starts: the start of its line, or of the line a continuation continues."""
    start = text.rfind("\n", 0, offset) + 1
    for _ in range(MAX_CONTINUATION_LINES):
        if start == 0 or not text.startswith(_WHITE, start):
            break
        start = text.rfind("\n", 0, start - 1) + 1
    return start


def _record(text: str, start: int) -> tuple[Record, int]:
    """The record whose head line starts at ``start``, and the offset just past its last line."""
    end = text.find("\n", start)
    end = len(text) if end < 0 else end
    head = text[start:end]
    extra: list[str] = []
    while end < len(text) and len(extra) < MAX_CONTINUATION_LINES and text.startswith(_WHITE, end + 1):
        following = text.find("\n", end + 1)
        following = len(text) if following < 0 else following
        extra.append(text[end + 1:following])
        end = following
    end = min(end + 1, len(text))
    kmsg = KMSG_HEAD_RE.match(head)
    if kmsg is not None:
        if len(head) + sum(map(len, extra)) + len(extra) <= MAX_LINE_BYTES:  # as parse_kmsg, which cuts there
            return kmsg_record(head, kmsg, extra), end
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


def _blocks(stream: BinaryIO) -> Iterator[bytes | None]:
    """Blocks of whole records (a record is never split from its continuation lines); None for a line
    over MAX_LINE_BYTES that never fit in memory."""
    pending = b""
    discarding = False
    while data := stream.read(BLOCK_BYTES):
        if b"\0" in data:  # a crash leaves runs of NUL where the file was not written: no line is in them
            data = data.replace(b"\0", b"")
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


# `dmesg --json` (util-linux 2.38+): one document, {"dmesg": [{"pri": 4, "time": 5.1, "msg": "..."}, ...]}, an
# entry's fields on lines of their own, indented.  Each "msg" line becomes the journal JSON line of its message and
# the other lines lose their indent (they are no continuation lines), line for line.
_DMESG_JSON = re.compile(rb'\A\s*\{\s*"dmesg"\s*:\s*\[')
_DMESG_JSON_MSG = re.compile(rb'^[ \t]*"msg"[ \t]*:[ \t]*("(?:[^"\\\n]|\\.)*")[ \t]*,?[ \t]*$', re.MULTILINE)
_INDENT = re.compile(rb"^[ \t]+", re.MULTILINE)


def _as_lines(blocks: Iterator[bytes | None]) -> Iterator[bytes | None]:
    """The blocks, with a `dmesg --json` document turned into one line per message."""
    first = next(blocks, b"")
    if not isinstance(first, bytes) or not _DMESG_JSON.match(first):
        return chain([first], blocks) if first != b"" else blocks
    return (None if block is None else _INDENT.sub(b"", _DMESG_JSON_MSG.sub(rb'{"MESSAGE": \1}', block))
            for block in chain([first], blocks))


def _hold_back(buffer: bytes, end: int) -> int:
    """Where to cut ``buffer[:end]`` so that its last record waits for more continuation lines."""
    start = buffer.rfind(b"\n", 0, end - 1) + 1
    for _ in range(MAX_CONTINUATION_LINES):
        if start == 0 or not buffer.startswith((b" ", b"\t"), start):
            break
        start = buffer.rfind(b"\n", 0, start - 1) + 1
    return start


def _clean(block: bytes, is_text: Callable[[bytes], bool]) -> tuple[str, int]:
    """The block as text (``as_text`` of each line: bad bytes replaced, a junk or over-long line blanked, so that
    line numbers hold), and how many lines were blanked.  Terminal colours (``dmesg --color=always``, a captured
    terminal session) are taken out first: a colour code between "NVRM: " and "Xid" would hide the Xid.
    ``is_text``: the check for control bytes (``records.is_text``, or its C twin)."""
    text = is_text(block)
    if not text and b"\x1b" in block:  # ESC is no text byte: a block of plain text needs no look for it
        block = _TERMINAL_CODE.sub(b"", block)
        text = is_text(block)
    if text and not _has_long_line(block):
        try:
            return block.decode("utf-8"), 0
        except UnicodeDecodeError:
            pass
    lines = [as_text(line) for line in block.split(b"\n")]
    # A blanked line is one U+FFFD, not empty: the last line of a file that ends without a newline still counts.
    return "\n".join("\ufffd" if line is None else line for line in lines), lines.count(None)


def _has_long_line(block: bytes) -> bool:
    position = 0
    while len(block) - position > MAX_LINE_BYTES:
        newline = block.rfind(b"\n", position, position + MAX_LINE_BYTES + 1)
        if newline < 0:
            return True
        position = newline + 1
    return False
