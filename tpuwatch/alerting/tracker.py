"""What rules need to remember about counters: increases over windows and the time of the last change.

The tracker keeps, per series a rule uses, a running total of increases
(a drop is a counter reset: the new value counts as the increase) and a
downsampled log of that total, at most 64 points per longest window, so a
window may be longer than the store's history.  A series first seen after the
first evaluation was born while tpuwatch watched: its whole value counts as an
increase (a kernel-event counter appears at 1 with its first event).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from tpuwatch.samples import Sample
from tpuwatch.store import SeriesKey

POINTS_PER_WINDOW = 64


@dataclass
class _Series:
    last: float
    total: float
    changed_at: float
    points: list[tuple[float, float]] = field(default_factory=list)


class Tracker:
    """Per-series increase totals and last-change times, fed once per evaluation."""

    def __init__(self) -> None:
        self._series: dict[SeriesKey, _Series] = {}
        self._last_now: float | None = None

    def observe(self, samples: Iterable[Sample], windows: dict[str, float], now: float) -> None:
        """Record the current value of every series whose metric is in ``windows`` (name -> longest window)."""
        seen: dict[SeriesKey, _Series] = {}
        for s in samples:
            window = windows.get(s.name)
            if window is None:
                continue
            key = (s.name, s.labels)
            series = self._series.get(key)
            if series is None:
                series = self._new(s.value, now)
            else:
                self._update(series, s.value, window, now)
            seen[key] = series
        self._series = seen
        self._last_now = now

    def _new(self, value: float, now: float) -> _Series:
        if self._last_now is None:
            return _Series(last=value, total=0.0, changed_at=now, points=[(now, 0.0)])
        return _Series(last=value, total=value, changed_at=now, points=[(self._last_now, 0.0), (now, value)])

    @staticmethod
    def _update(series: _Series, value: float, window: float, now: float) -> None:
        if value != series.last:
            series.total += value - series.last if value >= series.last else value
            series.changed_at = now
            series.last = value
        if now - series.points[-1][0] >= window / POINTS_PER_WINDOW:
            series.points.append((now, series.total))
        start = now - window
        while len(series.points) > 2 and series.points[1][0] <= start:
            series.points.pop(0)

    def increase(self, key: SeriesKey, window: float, now: float) -> float | None:
        """How much the series grew over the last ``window`` seconds (resets handled), None if unknown."""
        series = self._series.get(key)
        if series is None:
            return None
        start = now - window
        baseline = series.points[0][1]
        for t, total in series.points:
            if t > start:
                break
            baseline = total
        return series.total - baseline

    def unchanged_for(self, key: SeriesKey, now: float) -> float | None:
        """Seconds since the series' value last changed (or since it was first seen)."""
        series = self._series.get(key)
        return None if series is None else now - series.changed_at
