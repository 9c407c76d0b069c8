"""Run collectors isolated from each other: a deadline, a status, and counted failures.

Every call runs in its own daemon thread.  A call that raises or outlives its
deadline marks the collector failed for that cycle and drops its readings; a
call that never returns keeps its one thread and blocks only its own
collector (later cycles count ``still_running`` instead of piling up threads).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tpuwatch.catalog import spec_of
from tpuwatch.hw.deadline import Call
from tpuwatch.samples import INVALID_REASONS, Sample, invalid_reason

log = logging.getLogger(__name__)


class Collector(Protocol):
    """A source of readings.  ``collect()`` returns [] for "no data" and raises on failure.

    A collector that holds resources (a file descriptor, a channel) may also
    define ``close()``; it is called when the collector is replaced on reload.
    One that works but cannot see everything it should (a log file that does
    not exist yet) says why in a ``degraded`` attribute (None when all is well).
    """

    name: str

    def collect(self) -> list[Sample]: ...


ERROR_REASONS = ("error", "timeout", "still_running")


@dataclass
class CollectorStatus:
    """What the last run of one collector did, plus running totals."""

    success: bool | None = None
    duration_seconds: float = 0.0
    samples: int = 0
    last_error: str | None = None
    degraded: str | None = None
    # Every reason at 0 from the start, so that the counters exist before the first failure.
    errors: Counter[str] = field(default_factory=lambda: Counter(dict.fromkeys(ERROR_REASONS, 0)))
    dropped: Counter[str] = field(default_factory=lambda: Counter(dict.fromkeys(INVALID_REASONS, 0)))


# A reading the guard dropped: metric name, labels, and why (an INVALID_REASONS entry).
_Drop = tuple[str, dict[str, str], str]


def checked(readings: Sequence[Any]) -> tuple[list[Sample], list[_Drop]]:
    """The readings worth keeping and those dropped as invalid (nan, inf, negative).

    Raises ValueError for output no collector may give: something that is not a Sample, or a metric the
    catalogue does not list.  It runs in the collector's own call, so that it fails that collector alone.
    """
    kept: list[Sample] = []
    dropped: list[_Drop] = []
    for reading in readings:
        if not isinstance(reading, Sample):
            raise ValueError(f"returned {type(reading).__name__}, not a Sample")
        try:
            spec = spec_of(reading.name)
        except KeyError:
            raise ValueError(f"metric {reading.name[:100]!r} is not in the catalogue (tpuwatch/catalog.py)") from None
        reason = invalid_reason(reading.value, spec.allow_negative)
        if reason is None:
            kept.append(reading)
        else:
            dropped.append((reading.name, dict(reading.labels), reason))
    return kept, dropped


class GuardedCollector:
    """A collector behind a guard that records success, duration and failures."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self.name = collector.name
        self.status = CollectorStatus()
        self._call: Call | None = None
        self._hung = False
        self._failing = False
        self._logged_drops: set[tuple[str, str]] = set()

    def start(self) -> None:
        """Begin a run unless the previous one is still hung."""
        self._hung = self._call is not None and not self._call.done.is_set()
        if not self._hung:
            self._call = Call(f"collect-{self.name}", lambda: checked(list(self.collector.collect())))

    def finish(self, deadline: float) -> list[Sample] | None:
        """Wait until ``deadline`` (monotonic) for the run; valid readings, or None on failure."""
        call = self._call
        if call is None:
            return None
        self.status.degraded = getattr(self.collector, "degraded", None)
        if not call.wait(deadline):
            hung_for = time.monotonic() - call.started
            self._fail("still_running" if self._hung else "timeout", f"no answer after {hung_for:.1f}s", hung_for)
            return None
        if call.error is not None:
            self._fail("error", f"{type(call.error).__name__}: {call.error}", call.finished - call.started)
            return None
        readings, dropped = call.result
        self._count_drops(dropped)
        self.status.success = True
        self.status.duration_seconds = call.finished - call.started
        self.status.samples = len(readings)
        self.status.last_error = None
        if self._failing:
            log.info("collector %s recovered", self.name)
            self._failing = False
        return readings

    def _fail(self, reason: str, detail: str, duration: float) -> None:
        self.status.success = False
        self.status.duration_seconds = duration
        self.status.samples = 0
        self.status.last_error = detail
        self.status.errors[reason] += 1
        if not self._failing:
            log.error("collector %s failed (%s): %s", self.name, reason, detail)
            self._failing = True

    def _count_drops(self, dropped: list[_Drop]) -> None:
        for name, labels, reason in dropped:
            self.status.dropped[reason] += 1
            if (name, reason) not in self._logged_drops:
                self._logged_drops.add((name, reason))
                log.warning("collector %s: dropped %s reading of %s %s (logged once)", self.name, reason, name, labels)
