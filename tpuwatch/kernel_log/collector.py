"""The kernel log collector: new records -> rule matches -> device events and counters."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from pathlib import Path

from tpuwatch.config import Config
from tpuwatch.devices.base import DeviceReading
from tpuwatch.kernel_log.events import KernelEvent, StormFilter, make_event
from tpuwatch.kernel_log.records import normalise_pci
from tpuwatch.kernel_log.rules import RuleSet, load_rules
from tpuwatch.kernel_log.sources import (
    FileSource,
    JournalSource,
    KmsgSource,
    Source,
    SourceError,
    read_boot_id,
)
from tpuwatch.samples import Sample, sample
from tpuwatch.schema import ConfigError

log = logging.getLogger(__name__)

MAX_RECORDS_PER_CYCLE = 20_000
MAX_RECENT_EVENTS = 50
MAX_PENDING_EVENTS = 1000

DeviceLookup = Callable[[str], "str | int | None"]


class KernelLogCollector:
    """Reads what is new in the kernel log each cycle (at most ``max_records``) and counts rule matches.

    Samples: ``tpuwatch_kernel_events_total{rule,severity,device}`` (every
    occurrence, storms included; ``device`` is "" when unattributed),
    ``tpuwatch_kernel_log_records_total`` and ``tpuwatch_kernel_log_lost_total``.
    Events pass through storm aggregation into a bounded list of recent events
    (``recent_events()``) and a bounded queue for alerting (``drain_events()``).
    """

    name = "kernel_log"

    def __init__(self, source: Source, rules: RuleSet, device_for_pci: DeviceLookup, storm_window: float,
                 max_records: int = MAX_RECORDS_PER_CYCLE, clock: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self._matcher = rules.stream()
        self._device_for_pci = device_for_pci
        self._max_records = max_records
        self._storms = StormFilter(storm_window, clock=clock)
        self._counts: Counter[tuple[str, str, str]] = Counter(
            {(r.name, s, ""): 0 for r in rules.rules for s in r.severities()})
        self._records = 0
        self._lock = threading.Lock()
        self._recent: deque[KernelEvent] = deque(maxlen=MAX_RECENT_EVENTS)
        self._pending: deque[KernelEvent] = deque(maxlen=MAX_PENDING_EVENTS)
        self.dropped_events = 0

    def collect(self) -> list[Sample]:
        """Process new records, save the source position, return the counters."""
        records = self.source.read(self._max_records)
        self._records += len(records)
        now = time.time()
        passed: list[KernelEvent] = []
        for record in records:
            for match in self._matcher.feed(record):
                event = make_event(match, record, self._device_for_pci, when=now)
                self._counts[(event.rule, event.severity, event.device or "")] += 1
                passed.extend(self._storms.offer(event))
        passed.extend(self._storms.flush())
        self._publish(passed)
        self.source.commit()
        out = [sample("tpuwatch_kernel_events_total", n, rule=rule, severity=severity, device=device)
               for (rule, severity, device), n in sorted(self._counts.items())]
        out.append(sample("tpuwatch_kernel_log_records_total", self._records, source=self.source.name))
        out.append(sample("tpuwatch_kernel_log_lost_total", self.source.lost, source=self.source.name))
        return out

    def _device(self, pci: str) -> str | None:
        device = self._device_for_pci(pci)
        return None if device is None else str(device)

    def _publish(self, events: list[KernelEvent]) -> None:
        with self._lock:
            for event in events:  # storm aggregation bounds how many there are
                log.log(logging.INFO if event.severity == "info" else logging.WARNING,
                        "kernel event %s (%s) on device %s, pci %s: %s", event.rule, event.severity,
                        event.device or "-", event.pci or "-", event.message)
                self._recent.append(event)
                if len(self._pending) == self._pending.maxlen:
                    self.dropped_events += 1
                self._pending.append(event)

    def close(self) -> None:
        """Close the source (/dev/kmsg, the journal, the followed file)."""
        self.source.close()

    def recent_events(self) -> list[KernelEvent]:
        """The latest events (at most MAX_RECENT_EVENTS), oldest first: for /healthz and ``tpuwatch check``."""
        with self._lock:
            return list(self._recent)

    def drain_events(self, limit: int = MAX_PENDING_EVENTS) -> list[KernelEvent]:
        """Take up to ``limit`` events not handed out yet, oldest first: for alerting."""
        with self._lock:
            return [self._pending.popleft() for _ in range(min(limit, len(self._pending)))]


def event_problems(events: Iterable[KernelEvent]) -> list[str]:
    """One sentence per critical event, for ``tpuwatch check``'s problems."""
    return [f"kernel: {e.rule} on device {e.device or '?'} (pci {e.pci or 'unknown'})"
            f"{' x' + str(e.count) if e.count != 1 else ''}: {e.message}"
            for e in events if e.severity == "critical"]


def device_lookup(readings: Callable[[], Iterable[DeviceReading]]) -> Callable[[str], str | None]:
    """A PCI-address -> chip-index lookup over the device backend's latest readings.

    ``readings`` is called on every lookup, e.g. ``lambda: device_collector.last_readings``.
    """
    from functools import lru_cache

    normalise = lru_cache(maxsize=256)(normalise_pci)  # the backend's addresses, asked again on every event

    def lookup(pci: str) -> str | None:
        for reading in readings():
            if reading.pci and normalise(reading.pci) == pci:
                return reading.device
        return None
    return lookup


def open_source(config: Config, persist: bool = True) -> tuple[Source | None, str]:
    """The source ``kernel_log.source`` names (``auto``: /dev/kmsg, else the journal), and why.

    With ``persist`` the position is kept under ``state_dir``/kernel_log, and a
    first start this boot reads back only ``kernel_log.lookback``; without, the
    position is neither read nor saved and the whole boot is read.  Raises
    ConfigError when an explicitly chosen kmsg or journal cannot be opened.
    """
    settings = config.kernel_log
    state_dir = Path(config.state_dir, "kernel_log")

    def state(name: str) -> Path | None:
        return state_dir / f"{name}.json" if persist else None

    kmsg_path = settings.path if settings.source == "kmsg" and settings.path else f"{config.paths.dev}/kmsg"
    journal_path = settings.path if settings.source == "journal" else None
    lookback = settings.lookback if persist else None
    openers: dict[str, Callable[[], tuple[Source, str]]] = {
        "kmsg": lambda: (KmsgSource(kmsg_path, state("kmsg"), _boot_id(config.paths.procfs), lookback),
                         f"reading {kmsg_path}"),
        "journal": lambda: (JournalSource(state("journal"), journal_path, lookback),
                            f"reading the journal's kernel messages{' in ' + journal_path if journal_path else ''}"),
    }
    if settings.source == "none":
        return None, "kernel_log.source is none: kernel log not read"
    if settings.source == "file":
        assert settings.path is not None  # KernelLogConfig.validate
        return FileSource(settings.path, state("file")), f"kernel log: following file {settings.path}"
    if settings.source != "auto":
        try:
            source, what = openers[settings.source]()
        except SourceError as exc:
            raise ConfigError("kernel_log.source", f"{settings.source}: {exc}") from None
        return source, f"kernel log: {what}"
    reasons = []
    for name, opener in openers.items():
        try:
            source, what = opener()
        except SourceError as exc:
            reasons.append(f"{name}: {exc}")
            continue
        return source, f"kernel log: auto chose {name}, {what}" + (f" ({reasons[0]})" if reasons else "")
    return None, f"kernel log: no source usable ({'; '.join(reasons)})"


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
    log.info("%s", note)
    if source is None:
        return None, note
    attribution = Attribution(device_for_pci, SysfsResolver(config.paths.sysfs))
    return KernelLogCollector(source, rules, attribution, config.kernel_log.storm_window), note
