"""The kernel log collector: new records -> rule matches -> device events and counters.

A cycle's work is bounded by time as well as by count, well inside the
collector deadline: the collector reads for half its budget; if the source
has not caught up by then, it skips ahead, passing over (and counting) the
middle of the backlog so that what the other half of the budget can read
ends at the newest record.  A storm therefore never makes a cycle time out,
and a record written after it is counted in the next cycle.  The counters
are returned every cycle, whatever the source, a record or the disk does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tpuwatch.config import Config
from tpuwatch.kernel_log.events import KernelEvent, StormFilter, make_event
from tpuwatch.kernel_log.filesource import FileSource, absent, open_regular
from tpuwatch.kernel_log.records import SKIP_REASONS, Record
from tpuwatch.kernel_log.rulefile import MAX_WITHIN, load_rules
from tpuwatch.kernel_log.rules import RuleSet
from tpuwatch.kernel_log.sieve import MAX_PICKED, BacklogSieve
from tpuwatch.kernel_log.sources import (
    JournalSource,
    KmsgSource,
    NoSource,
    Source,
    SourceError,
    read_boot_id,
)
from tpuwatch.samples import Sample, sample
from tpuwatch.schema import ConfigError

log = logging.getLogger(__name__)
# Records counted between two lines picked from a backlog: more than any rule's follow window or hold, so that
# they share no fault.
APART = MAX_WITHIN + 1

MAX_RECORDS_PER_CYCLE = 2_000_000
MAX_RECENT_EVENTS = 50
MAX_LOGGED_EVENTS = 20  # per cycle; the rest are counted in one line
BATCH_RECORDS = 2048
BUDGET_SHARE = 0.4  # of the collector deadline, for reading and matching
SIEVE_SHARE = 0.25  # of what is left of the budget when a cycle skips ahead, for sieving what it passes over
DEFAULT_DEADLINE = 5.0

DeviceLookup = Callable[[str], "str | int | None"]


class KernelLogCollector:
    """Reads what is new in the kernel log each cycle, within a time and record budget, and counts rule matches.

    Samples: ``tpuwatch_kernel_events_total{rule,severity,device}`` (every
    occurrence read, storms included; ``device`` is "" when unattributed),
    ``tpuwatch_kernel_log_records_total``, ``tpuwatch_kernel_log_lost_total``,
    ``tpuwatch_kernel_log_skipped_total{reason}`` and
    ``tpuwatch_kernel_log_position_save_failures_total``.  Events pass through
    storm aggregation into a bounded list of recent events (``recent_events()``).
    ``deadline`` is the time one ``collect()`` may take; it works for
    ``BUDGET_SHARE`` of it.  With a NoSource it returns no samples (nothing is
    read, so nothing is counted) and is ``degraded``.
    """

    name = "kernel_log"

    def __init__(self, source: Source, rules: RuleSet, device_for_pci: DeviceLookup, storm_window: float,
                 max_records: int = MAX_RECORDS_PER_CYCLE, clock: Callable[[], float] = time.monotonic,
                 deadline: float = DEFAULT_DEADLINE, timer: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self._matcher = rules.stream()
        self._sieve = BacklogSieve(rules)
        self._device_for_pci = device_for_pci
        self._max_records = max_records
        self._budget = deadline * BUDGET_SHARE
        self._timer = timer
        self._storms = StormFilter(storm_window, clock=clock)
        self._counts: Counter[tuple[str, str, str]] = Counter(
            {(r.name, s, ""): 0 for r in rules.rules for s in r.severities()})
        self._records = 0
        self._errors = 0
        self._logged_error = False
        self._read_problem: str | None = None
        self._skipping = 0  # records passed over in the current storm, for its log lines
        self._lock = threading.Lock()
        self._recent: deque[KernelEvent] = deque(maxlen=MAX_RECENT_EVENTS)
        self._logged_this_cycle = 0

    @property
    def degraded(self) -> str | None:
        """Why the kernel log is not fully seen (no source, a missing file, a failing read), or None."""
        return self._read_problem or self.source.degraded

    def collect(self) -> list[Sample]:
        """Process new records within the budget, save the source position, return the counters."""
        if isinstance(self.source, NoSource):
            return []
        self._logged_this_cycle = 0
        try:
            self._read_cycle()
        except Exception as exc:  # noqa: BLE001 - an unreadable source must not stop the counters
            problem = f"reading the kernel log failed: {type(exc).__name__}: {exc}"
            if problem != self._read_problem:
                log.error("kernel log (%s): %s (retried every cycle)", self.source.name, problem)
            self._read_problem = problem
        else:
            if self._read_problem is not None:
                log.info("kernel log (%s): reading again", self.source.name)
            self._read_problem = None
        self._publish(self._storms.flush())
        self.source.commit()  # never raises: a failed save is counted and retried
        return self._samples()

    def _read_cycle(self) -> None:
        """Read for half the budget; if not caught up, skip ahead to what the other half can read."""
        started = self._timer()
        end = started + self._budget
        done = self._process(started + self._budget / 2, self._max_records // 2)
        if self.source.caught_up:
            if self._skipping:
                log.warning("kernel log (%s): caught up after passing over %d records of a backlog",
                            self.source.name, self._skipping)
                self._skipping = 0
            return
        now = self._timer()
        rate = done / (now - started) if now > started else float("inf")
        keep = int(min(rate * max(0.0, end - now), self._max_records - done) / 2)  # half: a margin for the estimate
        sieve_end = now + max(0.0, end - now) * SIEVE_SHARE
        self._sieve.start(lambda: self._timer() < sieve_end)
        passed = self.source.skip_ahead(keep, lambda: self._timer() < end, self._sieve)
        self._match(self.source.take_picked(), apart=True)
        if (self._sieve.full or self._sieve.unsieved) and not self._skipping:
            log.warning("kernel log (%s): %s: the rest of this backlog is passed over unsieved",
                        self.source.name, f"more than {MAX_PICKED} different lines that may be critical"
                        if self._sieve.full else "no time left to sieve it for lines that may be critical")
        if passed and not self._skipping:
            log.warning("kernel log (%s): a backlog larger than one cycle can read (%d records read in %.2fs): "
                        "passing over %d records to read the newest; counted in "
                        "tpuwatch_kernel_log_skipped_total{reason=\"backlog\"}",
                        self.source.name, done, now - started, passed)
        self._skipping += passed
        self._process(end, self._max_records - done)

    def _process(self, deadline: float, limit: int) -> int:
        """Read and match batches until ``deadline``, ``limit`` records, or the end of the log."""
        done = 0
        while done < limit:
            batch = self.source.read(min(BATCH_RECORDS, limit - done))
            done += len(batch)
            self._match(batch)
            if self.source.caught_up or self._timer() >= deadline:
                break
        return done

    def _match(self, records: list[Record], apart: bool = False) -> None:
        """Match ``records`` in order; ``apart``: each on its own (lines picked from a backlog, not neighbours)."""
        self._records += len(records)
        now = time.time()
        passed: list[KernelEvent] = []
        for record in records:
            try:
                matches = self._matcher.skip(APART) if apart else []
                for match in matches:
                    if match.record is not None:
                        self._count(make_event(match, match.record, self._device_for_pci, when=now), passed)
                for match in self._matcher.feed(record):
                    self._count(make_event(match, record, self._device_for_pci, when=now), passed)
            except Exception as exc:  # noqa: BLE001 - no record may stop the counting
                self._note_error(exc)
        try:  # what waited for the records after it (a CPER block, a machine-check summary) is due now
            for match in self._matcher.flush():
                if match.record is not None:
                    self._count(make_event(match, match.record, self._device_for_pci, when=now), passed)
        except Exception as exc:  # noqa: BLE001 - no record may stop the counting
            self._note_error(exc)
        self._publish(passed)

    def _note_error(self, exc: Exception) -> None:
        self._errors += 1
        if not self._logged_error:
            self._logged_error = True
            log.warning("kernel log (%s): a record could not be matched: %s: %s (logged once; counted in "
                        "tpuwatch_kernel_log_skipped_total{reason=\"error\"})", self.source.name,
                        type(exc).__name__, exc)

    def _samples(self) -> list[Sample]:
        source = self.source
        out = [sample("tpuwatch_kernel_events_total", n, rule=rule, severity=severity, device=device)
               for (rule, severity, device), n in sorted(self._counts.items())]
        out.append(sample("tpuwatch_kernel_log_records_total", self._records, source=source.name))
        out.append(sample("tpuwatch_kernel_log_lost_total", source.lost, source=source.name))
        skipped = source.skipped + Counter(error=self._errors)
        out.extend(sample("tpuwatch_kernel_log_skipped_total", skipped[reason], source=source.name, reason=reason)
                   for reason in SKIP_REASONS)
        out.append(sample("tpuwatch_kernel_log_position_save_failures_total", source.position.failures,
                          source=source.name))
        return out

    def _count(self, event: KernelEvent, passed: list[KernelEvent]) -> None:
        self._counts[(event.rule, event.severity, event.device or "")] += 1
        passed.extend(self._storms.offer(event))

    def _publish(self, events: list[KernelEvent]) -> None:
        with self._lock:
            for event in events:
                self._log_event(event)
                self._recent.append(event)

    def _log_event(self, event: KernelEvent) -> None:
        """Log the event; past MAX_LOGGED_EVENTS in one cycle (many devices in a storm), only one line more."""
        self._logged_this_cycle += 1
        if self._logged_this_cycle > MAX_LOGGED_EVENTS + 1:
            return
        if self._logged_this_cycle == MAX_LOGGED_EVENTS + 1:
            log.warning("kernel log: more than %d events this cycle; the rest are counted, not logged",
                        MAX_LOGGED_EVENTS)
            return
        log.log(logging.INFO if event.severity == "info" else logging.WARNING,
                "kernel event %s (%s) on device %s, pci %s: %r", event.rule, event.severity,
                event.device or "-", event.pci or "-", event.message)

    def close(self) -> None:
        """Close the source (/dev/kmsg, the journal, the followed file)."""
        self.source.close()

    def recent_events(self) -> list[KernelEvent]:
        """The latest events (at most MAX_RECENT_EVENTS), oldest first: for /healthz and ``tpuwatch check``."""
        with self._lock:
            return list(self._recent)


def event_problems(events: Iterable[KernelEvent]) -> list[str]:
    """One sentence per critical event, for ``tpuwatch check``'s problems."""
    return [f"kernel: {e.rule} on device {e.device or '?'} (pci {e.pci or 'unknown'})"
            f"{' x' + str(e.count) if e.count != 1 else ''}: {e.message}"
            for e in events if e.severity == "critical"]


# Opens a source: (config, kernel_log.path when this source is the one named, the position file, the lookback).
Opener = Callable[[Config, str | None, Path | None, float | None], tuple[Source, str]]


def _kmsg(config: Config, path: str | None, state: Path | None, lookback: float | None) -> tuple[Source, str]:
    path = path or f"{config.paths.dev}/kmsg"
    return KmsgSource(path, state, _boot_id(config.paths.procfs), lookback), f"reading {path}"


def _journal(config: Config, path: str | None, state: Path | None, lookback: float | None) -> tuple[Source, str]:
    return (JournalSource(state, path, lookback),
            f"reading the journal's kernel messages{' in ' + path if path else ''}")


def _file(config: Config, path: str | None, state: Path | None, lookback: float | None) -> tuple[Source, str]:
    assert path is not None  # KernelLogConfig.validate
    return FileSource(path, state), f"following file {path}"


@dataclass(frozen=True)
class SourceType:
    """A kernel-log source by name (``kernel_log.source``): how it opens, and whether ``auto`` tries it."""

    open: Opener
    auto: bool = False


# Registered by name; ``auto`` tries the ones that say so in this order.  The names are also the choices of
# KernelLogConfig.source (tpuwatch/config.py, which cannot import this; a test keeps the two equal).
SOURCES: dict[str, SourceType] = {
    "kmsg": SourceType(_kmsg, auto=True),
    "journal": SourceType(_journal, auto=True),
    "file": SourceType(_file),
}


def open_source(config: Config, persist: bool = True) -> tuple[Source | None, str]:
    """The source ``kernel_log.source`` names (``auto``: /dev/kmsg, else the journal), and why.

    With ``persist`` the position is kept under ``state_dir``/kernel_log, and a
    first start this boot reads back only ``kernel_log.lookback``; without, the
    position is neither read nor saved and the whole boot is read.  Raises
    ConfigError when an explicitly chosen source cannot be opened; ``auto``
    with none usable gives a NoSource that says why.
    """
    settings = config.kernel_log
    state_dir = Path(config.state_dir, "kernel_log")
    lookback = settings.lookback if persist else None

    def opened(name: str) -> tuple[Source, str]:
        path = settings.path if settings.source == name else None  # auto reads each source where it lives
        return SOURCES[name].open(config, path, state_dir / f"{name}.json" if persist else None, lookback)

    if settings.source == "none":
        return None, "kernel_log.source is none: kernel log not read"
    if settings.source != "auto":
        try:
            source, what = opened(settings.source)
        except SourceError as exc:
            raise ConfigError("kernel_log.source", f"{settings.source}: {exc}") from None
        return source, f"kernel log: {what}"
    reasons = []
    for name in (name for name, kind in SOURCES.items() if kind.auto):
        try:
            source, what = opened(name)
        except SourceError as exc:
            reasons.append(f"{name}: {exc}")
            continue
        return source, f"kernel log: auto chose {name}, {what}" + (f" ({reasons[0]})" if reasons else "")
    return NoSource(f"no kernel-log source usable ({'; '.join(reasons)})"), \
        f"kernel log: no source usable ({'; '.join(reasons)})"


def _boot_id(procfs: str) -> str:
    try:
        return read_boot_id(procfs)
    except OSError as exc:
        raise SourceError(f"cannot read this boot's id under {procfs}: {exc.strerror}") from None


def build_collector(config: Config, device_for_pci: DeviceLookup,
                    persist: bool = True) -> tuple[KernelLogCollector | None, str]:
    """The kernel log collector for ``config`` and a sentence on the source chosen.

    The daemon uses ``persist=True``; ``tpuwatch check`` passes False so that it
    reads this boot's messages without moving the daemon's saved position.
    Events are attributed through ``paths.sysfs`` (the kernel's device tags and
    ``accel accelN:`` prefixes to PCI addresses), then ``device_for_pci``.
    Raises ConfigError (RuleError is one) for a broken rule file or an
    explicitly configured source that cannot be opened.
    """
    from tpuwatch.kernel_log.attribution import Attribution, SysfsResolver

    rules = load_rules(config.kernel_log.rules_dirs)
    source, note = open_source(config, persist)
    log.log(logging.WARNING if isinstance(source, NoSource) else logging.INFO, "%s", note)
    if source is None:
        return None, note
    attribution = Attribution(device_for_pci, SysfsResolver(config.paths.sysfs))
    return KernelLogCollector(source, rules, attribution, config.kernel_log.storm_window,
                              deadline=config.collector_deadline), note


def config_warnings(config: Config) -> list[str]:
    """What ``tpuwatch config check`` warns about: a kernel-log file that does not exist, no usable source.

    Opens the sources as ``tpuwatch check`` would (no position read or saved) and closes them again.
    """
    settings = config.kernel_log
    if settings.source == "none":
        return []
    if settings.source == "file":
        if not Path(str(settings.path)).exists():
            return [f"kernel_log.path: {absent(str(settings.path))} (yet): it is followed once it appears"]
        try:
            open_regular(str(settings.path)).close()
        except SourceError as exc:
            return [f"kernel_log.path: {exc}"]
        return []
    try:
        source, note = open_source(config, persist=False)
    except ConfigError as exc:
        return [str(exc)]
    if source is None:
        return []
    source.close()
    return [f"kernel_log.source: auto: {source.degraded}"] if isinstance(source, NoSource) else []
