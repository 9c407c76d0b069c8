"""The one path from a kernel log source to events: the daemon's collector, ``tpuwatch check`` and ``tpuwatch
logscan`` all read through a ``LogReader``.

Each batch the source gives (a ``Block`` of a text log, or the journal's
records) goes through one ``StreamMatcher``; each match becomes an event,
attributed to its chip.  Events that wait for the records after them (a CPER
block, a machine-check summary) come out with a later batch, or from
``finish()``: at the end of logscan's input, and in the daemon once nothing
new was written for a second.  The reader also learns the storms: a rule on one
device at one severity that gives ``STORM_MIN`` events or follow lines (a
fault's lines that are no events of their own) within ``STORM_PERIOD`` is
one, and ``read(passing=True)`` passes its lines over unread (``BacklogSieve``),
counted in the source's ``skipped["backlog"]``.
"""

from __future__ import annotations

import time

from tpuwatch.kernel_log.attribution import Attribution
from tpuwatch.kernel_log.blocks import Block
from tpuwatch.kernel_log.events import KernelEvent, make_event
from tpuwatch.kernel_log.matcher import StreamMatcher
from tpuwatch.kernel_log.records import Record
from tpuwatch.kernel_log.rule import Match
from tpuwatch.kernel_log.rules import RuleSet
from tpuwatch.kernel_log.sieve import MAX_STORMS, BacklogSieve, Storm
from tpuwatch.kernel_log.sources import Source

STORM_MIN = 64  # events of one (rule, device, severity) within STORM_PERIOD: a storm
STORM_PERIOD = 4096  # events and lines passed over, after which storms that went quiet are let go


class LogReader:
    """Reads ``source`` batch by batch through one stream matcher (see the module docstring).

    ``records`` counts the records read (matched, or holding no keyword), ``errors`` and ``error`` the records
    whose matching failed (passed over).  With ``line_numbers`` (a file read whole: logscan) events carry the line
    they start on, else the time they were read.
    """

    def __init__(self, source: Source, rules: RuleSet, attribution: Attribution, line_numbers: bool = False) -> None:
        self.source = source
        self.matcher = StreamMatcher(rules)
        self.sieve = BacklogSieve(rules)
        self._attribution = attribution
        self._lines = line_numbers
        self.records = 0
        self._heat: dict[tuple[object, ...], int] = {}  # lines per storm key in this period (BacklogSieve.key)
        self._storms: dict[tuple[object, ...], Storm] = {}
        self._seen = 0  # events and lines passed over in this period

    @property
    def errors(self) -> int:
        """Records whose matching failed."""
        return self.matcher.errors

    @property
    def storms(self) -> int:
        """The storms whose lines ``read(passing=True)`` passes over."""
        return len(self._storms)

    def read(self, passing: bool = False) -> list[KernelEvent]:
        """The events of the source's next batch (an event that waits for the records after it comes with a later
        batch, or from ``finish()``)."""
        batch = self.source.read()
        before = self.sieve.passed
        matches = self.matcher.feed(batch, self.sieve if passing else None)
        passed = self.sieve.passed - before
        if passed:
            self.source.skip("backlog", "", passed)
        self.records += len(batch) - passed - (sum(batch.skipped.values()) if isinstance(batch, Block) else 0)
        return self._events(matches, passed)

    def finish(self) -> list[KernelEvent]:
        """The events that still wait for the records after them, now (the end of the input, or of what was
        written for a while)."""
        return self._events(self.matcher.flush(), 0)

    def _events(self, matches: list[Match], passed: int) -> list[KernelEvent]:
        now = time.time()
        events = []
        for match in matches:
            record = match.record
            assert record is not None  # the matcher gives every match its record
            event = make_event(match, record, self._attribution, line=record.line if self._lines else None,
                               when=None if self._lines else now)
            self._learn(match, record, event.pci)
            events.append(event)
        absorbed = self.matcher.take_absorbed()
        for line, record in absorbed:
            self._learn(line, record, line.pci)
        self._cool(len(events) + len(absorbed) + passed)
        return events

    def _learn(self, match: Match, record: Record, pci: str | None) -> None:
        """Count a line of (rule, device, severity): the STORM_MIN-th in a period makes it a storm."""
        key = self.sieve.key(match, pci)
        heat = self._heat[key] = self._heat.get(key, 0) + 1
        if heat == STORM_MIN and key not in self._storms and len(self._storms) < MAX_STORMS:
            storm = self.sieve.storm(match, record)
            if storm is not None:
                self._storms[key] = storm
                self.sieve.use(self._storms.values())

    def _cool(self, seen: int) -> None:
        """At the end of each period, the storms that neither gave STORM_MIN events nor had STORM_MIN lines passed
        over are let go."""
        self._seen += seen
        if self._seen < STORM_PERIOD:
            return
        passed = self.sieve.take_counts()
        self._storms = {key: storm for key, storm in self._storms.items()
                        if self._heat.get(key, 0) >= STORM_MIN or passed.get(storm, 0) >= STORM_MIN}
        self.sieve.use(self._storms.values())
        self._heat.clear()
        self._seen = 0
