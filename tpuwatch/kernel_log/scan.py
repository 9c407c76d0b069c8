"""Scan a whole log file with the rules, fast: 1 MiB blocks, a keyword prefilter, per-line work only on hits.

Lines are recognised one by one (dmesg text with or without timestamps,
syslog, raw kmsg records with their continuation lines, ``journalctl -o json``).
A line that is not text (invalid UTF-8, control bytes) or is longer than
64 KiB is skipped and counted; memory stays bounded by the block size.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

from tpuwatch.kernel_log.events import KernelEvent, make_event
from tpuwatch.kernel_log.records import (
    KMSG_HEAD_RE,
    MAX_LINE_BYTES,
    Record,
    as_text,
    is_text,
    parse_kmsg,
    parse_line,
)
from tpuwatch.kernel_log.rules import RuleSet

BLOCK_BYTES = 1 << 20
_KMSG_HEAD_BYTES = re.compile(rb"\d+,\d+,\d+,[^;\n]*;")


@dataclass
class ScanStats:
    """What a scan saw."""

    lines: int = 0
    skipped: int = 0
    severities: Counter[str] = field(default_factory=Counter)


def scan(stream: BinaryIO, rules: RuleSet, device_for_pci: Callable[[str], str | None],
         stats: ScanStats) -> Iterator[KernelEvent]:
    """Events for every matching line of ``stream``, in order; ``stats`` is updated as it goes."""
    for block in _blocks(stream):
        if block is None:  # one over-long line, dropped unread
            stats.lines += 1
            stats.skipped += 1
            continue
        text, bad = _clean(block)
        stats.skipped += bad
        for event in _scan_text(text, stats.lines, rules, device_for_pci):
            stats.severities[event.severity] += 1
            yield event
        stats.lines += text.count("\n") + (not text.endswith("\n"))


def _blocks(stream: BinaryIO) -> Iterator[bytes | None]:
    """Blocks of whole lines (a kmsg record is never split from its continuation lines); None for a line
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
    """Where to cut ``buffer[:end]`` so that a trailing kmsg record waits for more continuation lines."""
    start = buffer.rfind(b"\n", 0, end - 1) + 1
    while start > 0 and buffer.startswith(b" ", start):
        start = buffer.rfind(b"\n", 0, start - 1) + 1
    return start if _KMSG_HEAD_BYTES.match(buffer, start) else end


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


def _scan_text(text: str, lines_before: int, rules: RuleSet,
               device_for_pci: Callable[[str], str | None]) -> Iterator[KernelEvent]:
    counted_to, line_index, last_start = 0, lines_before, -1
    for hit in rules.hits(text):
        start = text.rfind("\n", 0, hit) + 1
        if start == last_start:
            continue
        last_start = start
        end = text.find("\n", hit)
        end = len(text) if end < 0 else end
        line_index += text.count("\n", counted_to, start)
        counted_to = start
        line = text[start:end]
        record = parse_line(line)
        if KMSG_HEAD_RE.match(line):
            record = _with_continuation(text, line, end)
        for match in rules.match(record.message):
            yield make_event(match, record, device_for_pci, line=line_index + 1)


def _with_continuation(text: str, line: str, end: int) -> Record:
    """The kmsg record at ``line`` with the DEVICE= of the continuation lines that follow it."""
    position = end + 1
    while text.startswith(" ", position):
        newline = text.find("\n", position)
        position = len(text) if newline < 0 else newline + 1
    parsed = parse_kmsg(line + "\n" + text[end + 1:position])
    return parsed.record if parsed is not None else parse_line(line)
