"""What rules need remembered about series: the last sample, increases over windows, the last change.

Per series a rule reads, the tracker keeps the last value and when it was
seen, so that a series missing from a cycle (its collector failed or timed
out) is still evaluated from what was last known (see :meth:`Tracker.held`).
For counters it also keeps a running total of increases (a drop is a counter
reset: the new value counts as the increase) and a downsampled log of that
total, at most 64 points per longest window, so a window may be longer than
the store's history.  The points are packed (two histories of doubles, 16
bytes a point) and allocated whole at the counter's first sight: about 1.3 KiB
a counter from then on.

What a counter's value at first sight means depends on who keeps it:

- ``tpuwatch``: tpuwatch's own counter (kernel events, canary runs), which
  starts from zero with the daemon: all it counts is new, so its first value
  counts in full, on every start.
- ``external``: kept by the driver or the chip since it loaded (ECC counts).
  Its last value is persisted with the boot it was seen in, so after a
  restart of tpuwatch alone only what was added meanwhile counts.  Seen first
  this boot (install, reboot) its value is the baseline, recorded as ``born``
  for rules that count it (``count_initial``).

Counter state (``Row``) is saved in the alerting database, so the increase
over a window carries across restarts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from tpuwatch.samples import Sample
from tpuwatch.store import History, SeriesKey

POINTS_PER_WINDOW = 64
CAPACITY = POINTS_PER_WINDOW + 16  # a window holds at most 65 points; the rest spares moving them at every append
SAVE_EVERY_S = 60.0  # an unchanged counter's row is rewritten this often (its last sighting)
MAX_SERIES = 100_000
Kind = Literal["gauge", "tpuwatch", "external"]


@dataclass(frozen=True)
class Track:
    """How one metric is tracked: its kind, its longest increase window, how long an absent series is kept."""

    kind: Kind
    window: float
    retention: float


@dataclass(slots=True)
class _Series:
    kind: Kind
    last: float
    seen_at: float
    times: History  # the points: (time, total), oldest first
    totals: History
    total: float = 0.0
    changed_at: float = 0.0
    born: float = 0.0
    born_at: float | None = None
    boot: str = ""
    restored: bool = False
    saved_at: float = 0.0


@dataclass(frozen=True)
class Row:
    """One counter's persisted state."""

    name: str
    labels: str
    boot: str
    last: float
    seen_at: float
    total: float
    changed_at: float
    points: str
    born: float
    born_at: float | None


class Tracker:
    """Per-series memory, fed once per evaluation."""

    def __init__(self, boot: str = "") -> None:
        self.boot = boot
        self._series: dict[SeriesKey, _Series] = {}
        self._dirty: set[SeriesKey] = set()
        self._forgotten: set[SeriesKey] = set()
        self.loaded = False

    def observe(self, samples: Iterable[Sample], tracks: dict[str, Track], now: float) -> None:
        """Record the current value of every series whose metric is in ``tracks``; forget what aged out."""
        for s in samples:
            track = tracks.get(s.name)
            if track is None:
                continue
            key = (s.name, s.labels)
            series = self._series.get(key)
            if series is None or series.kind != track.kind:
                series = self._series[key] = self._new(track.kind, s.value, now)
            elif series.restored:
                self._resume(series, s.value, now)
            else:
                self._update(series, s.value, now)
            before = (series.last, len(series.times))
            series.seen_at, series.last = now, s.value
            if series.kind != "gauge":
                self._prune(series, track.window, now)
                if before != (series.last, len(series.times)) or now - series.saved_at >= SAVE_EVERY_S:
                    self._dirty.add(key)
        for key, series in list(self._series.items()):
            track = tracks.get(key[0])
            if track is None or now - series.seen_at > track.retention:
                self._drop(key)
        if len(self._series) > MAX_SERIES:
            for key in sorted(self._series, key=lambda k: self._series[k].seen_at)[:len(self._series) - MAX_SERIES]:
                self._drop(key)

    def _drop(self, key: SeriesKey) -> None:
        series = self._series.pop(key)
        self._dirty.discard(key)
        if series.kind != "gauge":
            self._forgotten.add(key)

    def _new(self, kind: Kind, value: float, now: float) -> _Series:
        capacity = 1 if kind == "gauge" else CAPACITY  # a gauge keeps no points
        series = _Series(kind, value, now, History(capacity, [now]), History(capacity, [0.0]), changed_at=now,
                         boot=self.boot)
        if kind == "tpuwatch" and value:
            series.total = value
            series.times.append(now)
            series.totals.append(value)
        elif kind == "external":
            series.born, series.born_at = value, now
        return series

    def _resume(self, series: _Series, value: float, now: float) -> None:
        """The first sight in this process of a series restored from the database."""
        series.restored = False
        if series.kind == "tpuwatch":
            grown = value  # the counter started again from zero with this process
        elif series.boot == self.boot:
            grown = value - series.last if value >= series.last else value
        else:  # the driver loaded again since (a reboot): a first sight this boot
            grown, series.born, series.born_at = 0.0, value, now
        series.boot = self.boot
        if grown:
            series.total += grown
            series.changed_at = now

    @staticmethod
    def _update(series: _Series, value: float, now: float) -> None:
        if value == series.last:
            return
        series.changed_at = now
        if series.kind != "gauge":
            series.total += value - series.last if value >= series.last else value

    @staticmethod
    def _prune(series: _Series, window: float, now: float) -> None:
        times, totals = series.times, series.totals
        if now - times[-1] >= window / POINTS_PER_WINDOW:
            times.append(now)
            totals.append(series.total)
        start = now - window
        old = 0
        while len(times) - old > 2 and times[old + 1] <= start:
            old += 1
        times.drop(old)
        totals.drop(old)

    # --- what rules ask -----------------------------------------------------------

    def held(self, now: float) -> list[tuple[Sample, float]]:
        """Series not seen at ``now`` but still remembered: (their last sample, when it was seen)."""
        return [(Sample(key[0], key[1], s.last), s.seen_at) for key, s in self._series.items() if s.seen_at < now]

    def increase(self, key: SeriesKey, window: float, now: float, count_initial: bool = False) -> float | None:
        """How much the series grew over the last ``window`` seconds (resets handled), None if unknown.

        With ``count_initial`` an external counter's value at its first sight this
        boot counts as an increase at that moment.
        """
        series = self._series.get(key)
        if series is None:
            return None
        start = now - window
        baseline = series.totals[0]
        for t, total in zip(series.times, series.totals):
            if t > start:
                break
            baseline = total
        grown = series.total - baseline
        if count_initial and series.born_at is not None and series.born_at > start:
            grown += series.born
        return grown

    def unchanged_for(self, key: SeriesKey, now: float) -> float | None:
        """Seconds since the series' value last changed (or since it was first seen)."""
        series = self._series.get(key)
        return None if series is None else now - series.changed_at

    # --- persistence ---------------------------------------------------------------

    def changes(self, everything: bool = False) -> tuple[list[Row], list[tuple[str, str]]]:
        """Counter rows changed since the last call (``everything``: all), and (name, labels) of counters
        forgotten; clears both."""
        keys = [k for k, s in self._series.items() if s.kind != "gauge"] if everything else self._dirty
        rows = [self._row(key, self._series[key]) for key in keys]
        forgotten = [(name, json.dumps(labels)) for name, labels in self._forgotten]
        self._dirty.clear()
        self._forgotten.clear()
        return rows, forgotten

    @staticmethod
    def _row(key: SeriesKey, s: _Series) -> Row:
        s.saved_at = s.seen_at
        return Row(key[0], json.dumps(key[1]), s.boot, s.last, s.seen_at, s.total, s.changed_at,
                   json.dumps(list(zip(s.times, s.totals))), s.born, s.born_at)

    def restore(self, rows: Iterable[Row], tracks: dict[str, Track]) -> None:
        """Counter state saved by an earlier process; rows of metrics no rule counts now are ignored."""
        for row in rows:
            track = tracks.get(row.name)
            if track is None or track.kind == "gauge":
                continue
            try:
                labels = tuple((str(k), str(v)) for k, v in json.loads(row.labels))
                points = [(float(t), float(v)) for t, v in json.loads(row.points)] or [(row.seen_at, row.total)]
            except (ValueError, TypeError):
                continue
            points = _thin(points, track.window / POINTS_PER_WINDOW)
            self._series[(row.name, labels)] = _Series(
                track.kind, row.last, row.seen_at, History(CAPACITY, (t for t, _ in points)),
                History(CAPACITY, (v for _, v in points)), row.total, row.changed_at, row.born, row.born_at, row.boot,
                restored=True)
            self.loaded = True


def _thin(points: list[tuple[float, float]], spacing: float) -> list[tuple[float, float]]:
    """The points as the tracker would have logged them ``spacing`` apart (a saved log may be denser: a window
    since made longer), so that the newest ones fit its history."""
    kept = points[:1]
    for point in points[1:]:
        if point[0] - kept[-1][0] >= spacing:
            kept.append(point)
    return kept
