"""Online memory-leak detector for one series: robust to sawtooth, steps, warm-ups and spikes.

Per sample the detector only updates the two lowest and two highest values of
the current one-minute bucket (O(1)).  When a bucket closes it derives the
*floor*: the second-lowest value of the last ``floor_window`` of buckets, which
ignores allocator sawtooth cycles shorter than that window and one downward
spike; and the *high*, the second-highest, against which exhaustion is
projected.  Every ``analyze_every`` the floor history (bounded: the longest
scale plus ``lookback``) is tested at several scales, 45 min to 6 h, cheapest
checks first; the statistics run on at most ``points_per_scale`` points, so
the cost per analysis is bounded.  A scale shows growth when

* the medians of its ``segments`` consecutive segments all rise, the smallest
  rise at least ``min_ratio`` of the largest (a step rises in one segment, a
  warm-up that levels off in the first ones only);
* the rise is at least ``min_rise`` of the capacity (or of the level);
* the newest segment tops the segments of the ``lookback`` before the window
  by ``new_high`` of the rise (periodic load returns to levels already seen);
* no single one-minute jump of the floor carries more than ``max_jump`` of
  the rise (model swaps are a few big steps);
* the Theil-Sen slope is positive and its rise exceeds ``noise_factor`` times
  the robust scatter around it;
* against a known capacity, the time until the high reaches it at that slope
  is within ``max_eta``;
* Mann-Kendall, its variance corrected for the autocorrelation of the floor
  (Yue-Wang, significant lags), rejects "no upward trend" at ``alpha``.

Nothing fires before ``min_history`` of data (a full load cycle must be seen).
Growth found in ``persistence`` of the last ``persistence_of`` analyses fires a
warning, critical when the time to exhaustion is below ``critical_eta``; the
finding clears after ``clear_after`` analyses without growth.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

# numpy is imported on first use, when a series first shows a rising floor worth
# testing: a healthy daemon never pays its ~11 MB.


@dataclass(frozen=True)
class LeakParams:
    """Tuning of the leak detector; the defaults suit sampling every 1-30 s."""

    bucket: float = 60.0
    floor_window: float = 900.0
    analyze_every: float = 150.0
    scales: tuple[float, ...] = (2700.0, 4500.0, 7200.0, 10800.0, 21600.0)
    points_per_scale: int = 45
    lookback: float = 14400.0
    min_history: float = 7200.0
    segments: int = 4
    min_rise: float = 0.005
    new_high: float = 0.25
    max_jump: float = 0.34
    alpha: float = 0.001
    min_ratio: float = 0.35
    noise_factor: float = 4.0
    persistence: int = 3
    persistence_of: int = 5
    clear_after: int = 6
    critical_eta: float = 4 * 3600.0
    max_eta: float = 7 * 86400.0


@dataclass(frozen=True)
class Growth:
    """Growth found at one analysis: robust slope, trend confidence, projected exhaustion."""

    slope: float
    confidence: float
    eta: float | None


@dataclass(frozen=True)
class LeakState:
    """What the detector says now; ``firing`` False means no finding."""

    firing: bool = False
    severity: str | None = None
    slope: float | None = None
    confidence: float | None = None
    eta: float | None = None
    since: float | None = None


@lru_cache(maxsize=16)
def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    import numpy as np

    return np.triu_indices(n, 1)


def theil_sen(times: np.ndarray, values: np.ndarray) -> float:
    """Median of the pairwise slopes (O(n^2): callers bound n)."""
    import numpy as np

    i, j = _pairs(len(times))
    dt = times[j] - times[i]
    keep = dt > 0
    return float(np.median((values[j] - values[i])[keep] / dt[keep])) if keep.any() else 0.0


def mann_kendall_p(times: np.ndarray, values: np.ndarray, slope: float) -> float:
    """One-sided p-value of "no upward trend" by Mann-Kendall, variance corrected after Yue and Wang.

    The effective sample size comes from the significant autocorrelations of
    the series detrended with ``slope``; ties are accounted for.
    """
    import numpy as np

    n = len(values)
    i, j = _pairs(n)
    s = float(np.sign(values[j] - values[i]).sum())
    _, ties = np.unique(values, return_counts=True)
    variance = (n * (n - 1) * (2 * n + 5) - float((ties * (ties - 1) * (2 * ties + 5)).sum())) / 18.0
    if variance <= 0 or s <= 0:
        return 1.0
    residual = values - slope * times
    residual = residual - residual.mean()
    denominator = float(residual @ residual)
    if denominator > 0:
        acf = np.correlate(residual, residual, "full")[n:] / denominator
        lags = np.arange(1, n)
        significant = np.abs(acf) > 1.96 / math.sqrt(n)
        variance *= max(1.0, 1.0 + 2.0 * float(((1.0 - lags / n) * acf)[significant].sum()))
    z = (s - 1.0) / math.sqrt(variance)
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _second_lowest(buckets: deque[tuple[float, float, float, float, float]], first: int) -> float:
    """Second-lowest value of the buckets, each holding its two lowest at ``first`` and ``first + 1``."""
    lowest = sorted(b[first] for b in buckets)
    second = min(b[first + 1] for b in buckets)
    if len(lowest) > 1 and lowest[1] < second:
        second = lowest[1]
    return second if second != math.inf else lowest[0]


class LeakDetector:
    """Feed ``update(t, value, capacity)`` in time order; read ``state`` and ``first_alert_at``."""

    __slots__ = ("params", "state", "first_alert_at", "_bucket_end", "_lo1", "_lo2", "_hi1", "_hi2",
                 "_capacity", "_buckets", "_floors", "_floor_times", "_next_analysis", "_recent", "_quiet",
                 "_high")

    def __init__(self, params: LeakParams | None = None) -> None:
        self.params = params or LeakParams()
        self.state = LeakState()
        self.first_alert_at: float | None = None
        self._bucket_end = -math.inf
        self._lo1 = self._lo2 = math.inf
        self._hi1 = self._hi2 = -math.inf
        self._capacity: float | None = None
        self._buckets: deque[tuple[float, float, float, float, float]] = deque()
        keep = int((max(self.params.scales) + self.params.lookback) / self.params.bucket) + 1
        self._floors: deque[float] = deque(maxlen=keep)
        self._floor_times: deque[float] = deque(maxlen=keep)
        self._next_analysis = -math.inf
        self._recent: deque[bool] = deque(maxlen=self.params.persistence_of)
        self._quiet = 0
        self._high = math.nan

    def update(self, timestamp: float, value: float, capacity: float | None = None) -> None:
        """Add one reading (and the series' capacity when known); O(1) except at bucket ends."""
        if timestamp >= self._bucket_end:
            self._close_bucket(timestamp)
        if value < self._lo2:
            if value < self._lo1:
                self._lo2, self._lo1 = self._lo1, value
            else:
                self._lo2 = value
        if value > self._hi2:
            if value > self._hi1:
                self._hi2, self._hi1 = self._hi1, value
            else:
                self._hi2 = value
        if capacity is not None:
            self._capacity = capacity

    def _close_bucket(self, timestamp: float) -> None:
        p = self.params
        if self._lo1 != math.inf:
            end = self._bucket_end
            buckets = self._buckets
            buckets.append((end, self._lo1, self._lo2, -self._hi1, -self._hi2))
            while buckets[0][0] <= end - p.floor_window:
                buckets.popleft()
            self._floors.append(_second_lowest(buckets, 1))
            self._floor_times.append(end)
            self._high = -_second_lowest(buckets, 3)
            if end >= self._next_analysis:
                self._next_analysis = end + p.analyze_every - p.bucket / 2
                self._judge(timestamp, self._growth())
        self._lo1 = self._lo2 = math.inf
        self._hi1 = self._hi2 = -math.inf
        self._bucket_end = (math.floor(timestamp / p.bucket) + 1) * p.bucket

    def _growth(self) -> Growth | None:
        """The shortest scale that shows growth, or None."""
        p = self.params
        if len(self._floors) < p.min_history / p.bucket:
            return None
        floors = list(self._floors)
        for scale in p.scales:
            count = int(scale / p.bucket)
            if len(floors) < count + count // p.segments:
                return None
            growth = self._growth_at(count, floors)
            if growth is not None:
                return growth
        return None

    def _window(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        import numpy as np

        stride = max(1, math.ceil(count / self.params.points_per_scale))
        start = len(self._floors) - count
        index = range(len(self._floors) - 1, start - 1, -stride)
        times = np.fromiter((self._floor_times[k] for k in reversed(index)), float)
        values = np.fromiter((self._floors[k] for k in reversed(index)), float)
        return times, values

    def _growth_at(self, count: int, floors: list[float]) -> Growth | None:
        p = self.params
        length = count // p.segments
        end = len(floors)
        levels = [_median(floors[end - (k + 1) * length:end - k * length]) for k in range(p.segments)]
        rises = [levels[k] - levels[k + 1] for k in range(p.segments - 1)]
        if min(rises) <= 0 or min(rises) < p.min_ratio * max(rises):
            return None
        rise = levels[0] - levels[-1]
        if rise < p.min_rise * (self._capacity if self._capacity is not None else levels[0]):
            return None
        oldest = max(0, end - p.segments * length - int(p.lookback / p.bucket))
        older = range(end - (p.segments + 1) * length, oldest - 1, -length)
        if levels[0] - max(_median(floors[a:a + length]) for a in older) < p.new_high * rise:
            return None
        window = floors[-count:]
        if max(b - a for a, b in pairwise(window)) > p.max_jump * rise:
            return None
        times, values = self._window(count)
        times = times - times[-1]
        slope = theil_sen(times, values)
        if slope <= 0:
            return None
        residual = values - slope * times
        center = _median(list(residual))
        noise = 1.4826 * _median([abs(r - center) for r in residual])
        if slope * (times[-1] - times[0]) <= p.noise_factor * noise:
            return None
        eta = None
        if self._capacity is not None:
            eta = max(0.0, (self._capacity - self._high) / slope)
            if eta > p.max_eta:
                return None
        pvalue = mann_kendall_p(times, values, slope)
        if pvalue >= p.alpha:
            return None
        return Growth(slope, 1.0 - pvalue, eta)

    def _judge(self, now: float, growth: Growth | None) -> None:
        p = self.params
        self._recent.append(growth is not None)
        if growth is None:
            self._quiet += 1
            if self.state.firing and self._quiet >= p.clear_after:
                self.state = LeakState()
            return
        self._quiet = 0
        if not self.state.firing and sum(self._recent) < p.persistence:
            return
        since = self.state.since if self.state.firing else now
        severity = "critical" if growth.eta is not None and growth.eta < p.critical_eta else "warning"
        self.state = LeakState(True, severity, growth.slope, growth.confidence, growth.eta, since)
        if self.first_alert_at is None:
            self.first_alert_at = now

    def slope(self) -> float:
        """Theil-Sen slope of the floor over the longest scale the history covers (0.0 with too little)."""
        count = min(len(self._floors), int(max(self.params.scales) / self.params.bucket))
        if count < 2:
            return 0.0
        times, values = self._window(count)
        return theil_sen(times - times[-1], values)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else 0.5 * (ordered[middle - 1] + ordered[middle])
