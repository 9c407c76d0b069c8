"""Helpers for the kernel log tests: the one path (``LogReader``) over bytes, as logscan reads a file, and a stream
matcher fed records one by one."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tpuwatch.kernel_log.attribution import Attribution
from tpuwatch.kernel_log.blocks import Block
from tpuwatch.kernel_log.events import KernelEvent
from tpuwatch.kernel_log.filesource import StreamSource
from tpuwatch.kernel_log.matcher import StreamMatcher
from tpuwatch.kernel_log.reader import LogReader
from tpuwatch.kernel_log.records import Record
from tpuwatch.kernel_log.rule import Match
from tpuwatch.kernel_log.rules import RuleSet
from tpuwatch.kernel_log.sources import Source

Lookup = Attribution | Callable[[str], "str | int | None"]


@dataclass
class Scanned:
    """What reading a whole file gave: its events (with their lines), its lines and those that were no records."""

    events: list[KernelEvent] = field(default_factory=list)
    lines: int = 0
    skipped: int = 0


def scan(data: bytes | io.RawIOBase | io.BufferedIOBase, rules: RuleSet, lookup: Lookup = lambda pci: None
         ) -> Scanned:
    """``data`` read from its start through the daemon's path, as ``tpuwatch logscan`` reads a file."""
    stream = io.BytesIO(data) if isinstance(data, bytes) else data
    source = StreamSource(stream.read)  # type: ignore[arg-type]
    reader = LogReader(source, rules, lookup, line_numbers=True)  # type: ignore[arg-type]
    out = Scanned()
    while True:
        out.events += reader.read()
        if source.caught_up:
            out.events += reader.finish()
            break
    out.lines = source.lines
    out.skipped = source.skipped["not_text"] + source.skipped["too_long"]
    return out


def feed(rules: RuleSet, records: Sequence[str | Record], flush: bool = True) -> list[Match]:
    """The matches of ``records`` fed one by one to one stream matcher (then flushed)."""
    matcher = StreamMatcher(rules)
    out: list[Match] = []
    for record in records:
        out += matcher.feed([record if isinstance(record, Record) else Record(record)])
    if flush:
        out += matcher.flush()
    return out


def records(batch: Block | Sequence[Record]) -> list[Record]:
    """The records of what a source's ``read()`` gave."""
    return batch.records() if isinstance(batch, Block) else list(batch)


def drain(source: Source) -> list[Record]:
    """Every record a source has now, however many reads that takes."""
    out = records(source.read())
    while not source.caught_up:
        out += records(source.read())
    return out
