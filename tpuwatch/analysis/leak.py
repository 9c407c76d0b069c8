"""Online memory-leak detector for one series: robust to sawtooth, steps, warm-ups and spikes.

Per sample the detector only updates the two lowest and two highest values of
the current one-minute bucket (O(1)).  When a bucket closes it derives one
*floor* per ``floor_windows`` entry: a low quantile of that window's bucket
lows (``floor_outliers`` of them, at least the second-lowest), which ignores
allocator sawtooth cycles and periodic load shorter than the window and a few
downward spikes; and the *high*, the second-highest of the last
``high_window``, against which exhaustion is projected.  A short floor follows
a leak without a long one's lag; a long one sees through slow sawtooth and
periodic load.  Every ``analyze_every`` the floor histories (bounded: the
longest scale plus ``lookback``) are tested at several scales, 45 min to 6 h,
shortest first, each on the floors whose window is from 1/``floor_scales[1]``
to 1/``floor_scales[0]`` of the scale, cheapest checks first; the statistics
run on at most ``points_per_scale`` points, so the cost per analysis is
bounded.  A scale is tested only with ``min_prior`` of history before its
window, so that a periodic load has shown its earlier highs.  What growth at
one scale on one floor is: ``scales.py``.

Nothing fires before ``min_history`` of data (a full load cycle must be seen).

Every minute the fast-exhaustion check (``fast.py``) also reads the bucket's
lows and the 3 and 8 min floors (and keeps the raw readings of the last 10 min,
``teeth.py``): a steady climb that would fill the chip
within 20 min fires at once (critical), with its own slope and time to
exhaustion, and holds the finding while it lasts.
Growth found in ``persistence`` of the last ``persistence_of`` analyses fires a
warning, critical when the time to exhaustion is below ``critical_eta``; the
finding clears after ``clear_after`` analyses without growth.
"""

from __future__ import annotations

import dataclasses
import math
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass
from typing import Any

from tpuwatch import statefile
from tpuwatch.analysis.beat import Beats
from tpuwatch.analysis.fast import FastCheck, FastFinding
from tpuwatch.analysis.floors import SlidingValues, pack, strided, unpack
from tpuwatch.analysis.params import LeakParams
from tpuwatch.analysis.robust import theil_sen
from tpuwatch.analysis.scales import Growth, growth_at
from tpuwatch.store import History

TRIM_SLACK = 60  # floors (an hour) the arrays hold beyond what analyses read before they are trimmed
# numpy is imported on first use (in floors.py and robust.py), when a series first shows a rising floor worth
# testing: a healthy daemon never pays its ~11 MB.


@dataclass(frozen=True)
class LeakState:
    """What the detector says now; ``firing`` False means no finding."""

    firing: bool = False
    severity: str | None = None
    slope: float | None = None
    confidence: float | None = None
    eta: float | None = None
    since: float | None = None


@dataclass(frozen=True)
class LeakView:
    """What a status page draws of one series: its recent floor, the high, the capacity and the verdict.

    ``floor`` holds (bucket end, floor) over the shortest floor window (``floor_window`` seconds), oldest first;
    ``high`` is the value exhaustion is projected from (None before the first bucket closes).
    """

    floor: tuple[tuple[float, float], ...]
    floor_window: float
    high: float | None
    capacity: float | None
    state: LeakState


class LeakDetector:
    """Feed ``update(t, value, capacity)`` in time order; read ``state`` and ``first_alert_at``."""

    __slots__ = ("params", "state", "first_alert_at", "_bucket_end", "_lo1", "_lo2", "_hi1", "_hi2",
                 "_capacity", "_lows", "_highs", "_keep", "_floors", "_floor_times", "_next_analysis", "_recent",
                 "_quiet", "_high", "_plan", "_fast", "_beats")

    def __init__(self, params: LeakParams | None = None) -> None:
        self.params = params or LeakParams()
        self.state = LeakState()
        self.first_alert_at: float | None = None
        self._bucket_end = -math.inf
        self._lo1 = self._lo2 = math.inf
        self._hi1 = self._hi2 = -math.inf
        self._capacity: float | None = None
        self._lows = [SlidingValues(window) for window in self.params.floor_windows]
        self._highs = SlidingValues(self.params.high_window)  # negated, so that its low is the high
        # Floors per minute over the longest scale plus the lookback, allocated whole at the first floor and trimmed
        # to that length once they hold an hour more, so that analyses read them without copying them whole.
        self._keep = int((max(self.params.scales) + self.params.lookback) / self.params.bucket) + 1
        self._floors = [History(self._keep + TRIM_SLACK) for _ in self.params.floor_windows]
        self._floor_times = History(self._keep + TRIM_SLACK)
        self._next_analysis = -math.inf
        self._recent: deque[bool] = deque(maxlen=self.params.persistence_of)
        self._quiet = 0
        self._high = math.nan
        self._fast = FastCheck(self.params.fast) if self.params.fast is not None else None
        p = self.params
        beats = max((s for s in p.scales if s <= p.floor_scales[1] * p.beat_floor), default=p.bucket)
        self._beats = Beats(int(beats / p.bucket) + 1, p.beat_middle, p.beat_high)
        # What each analysis tests, shortest scale first: (history needed, buckets in the scale, which floor
        # history, largest jump as a share of the rise, the minutes' middles where a beat is told apart, else None,
        # and the oldest segment's start and length, counted back from the newest floor, for the first check).
        self._plan = [(count + max(count // p.segments, int(p.min_prior / p.bucket)), count, index,
                       p.max_jump_fast if scale <= p.fast_scale and window <= p.fast_floor else p.max_jump,
                       self._beats if window <= p.beat_floor else None,
                       p.segments * (count // p.segments), count // p.segments)
                      for scale in p.scales for count in (int(scale / p.bucket),)
                      for index, window in enumerate(p.floor_windows)
                      if p.floor_scales[0] * window <= count * p.bucket <= p.floor_scales[1] * window]

    def update(self, timestamp: float, value: float, capacity: float | None = None) -> None:
        """Add one reading (and the series' capacity when known); O(1) except at bucket ends."""
        if timestamp >= self._bucket_end:
            self._close_bucket(timestamp)
        if self._fast is not None:
            self._fast.sample(timestamp, value)
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
            lows = (self._lo1,) if self._lo2 == math.inf else (self._lo1, self._lo2)
            for window, floors in zip(self._lows, self._floors):
                window.add(end, lows)
                floors.append(window.low(p.floor_outliers))
            self._highs.add(end, (-self._hi1,) if self._hi2 == -math.inf else (-self._hi1, -self._hi2))
            self._high = -self._highs.low(0.0)
            self._floor_times.append(end)
            top = self._hi1 if self._hi2 == -math.inf else self._hi2
            self._beats.close((lows[-1] + top) / 2, self._high)  # the minute's middle, its second-lowest and -highest
            if self._fast is not None:
                found = self._fast.close(lows, [floors.values() for floors in self._floors[:2]], self._high,
                                         self._capacity, p.bucket)
                if found is not None:
                    self._fast_found(timestamp, found)
            if len(self._floor_times) >= self._keep + TRIM_SLACK:
                for history in (*self._floors, self._floor_times):
                    history.drop(len(history) - self._keep)
            if end >= self._next_analysis:
                self._next_analysis = end + p.analyze_every - p.bucket / 2
                self._judge(timestamp, self._growth())
        self._lo1 = self._lo2 = math.inf
        self._hi1 = self._hi2 = -math.inf
        self._bucket_end = (math.floor(timestamp / p.bucket) + 1) * p.bucket

    def _growth(self) -> Growth | None:
        """The shortest scale that shows growth, or None.

        A scale's floor is first asked to stand above the least floor of the scale's oldest segment (by
        ``1 - end_slack`` of the least rise): with ``end_slack`` <= 1 the rise, end and monotony checks of
        ``growth_at`` imply it, and most analyses of a series that does not leak end here, far cheaper than its
        medians.
        """
        p = self.params
        history = len(self._floor_times)
        if history < p.min_history / p.bucket:
            return None
        times = self._floor_times.values()
        views = [floors.values() for floors in self._floors]
        least = (1.0 - p.end_slack) * p.min_rise * (self._capacity or 0.0) if p.end_slack <= 1.0 else -math.inf
        for needed, count, index, max_jump, beats, oldest, length in self._plan:
            if history < needed:
                return None
            floors = views[index]
            if floors[-1] < min(floors[history - oldest:history - oldest + length]) + least:
                continue
            growth = growth_at(p, times, floors, count, max_jump, self._capacity, self._high, beats)
            if growth is not None:
                return growth
        return None

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

    def _fast_found(self, now: float, found: FastFinding) -> None:
        """The fast check sees a climb that fills the chip within its horizon: fire (critical under
        ``critical_eta``) with its slope and time to exhaustion, and hold the finding while it lasts."""
        self._quiet = 0
        since = self.state.since if self.state.firing else now
        severity = "critical" if found.eta < self.params.critical_eta else "warning"
        self.state = LeakState(True, severity, found.slope, None, found.eta, since)
        if self.first_alert_at is None:
            self.first_alert_at = now

    def snapshot(self) -> dict[str, Any]:
        """What the detector has learned, as JSON data (with inf and NaN, which Python's json reads back)."""
        return {
            "layout": _layout(self.params),
            "bucket": [self._bucket_end, self._lo1, self._lo2, self._hi1, self._hi2],
            "capacity": self._capacity,
            "lows": [window.snapshot() for window in self._lows],
            "highs": self._highs.snapshot(),
            "floors": [pack(floors[-self._keep:]) for floors in self._floors],  # all that analyses read
            "floor_times": pack(self._floor_times[-self._keep:]),
            "next_analysis": self._next_analysis,
            "recent": list(self._recent),
            "quiet": self._quiet,
            "high": self._high,
            "state": dataclasses.asdict(self.state),
            "first_alert_at": self.first_alert_at,
            "fast": self._fast.snapshot() if self._fast is not None else None,
            "beats": self._beats.snapshot(),
        }

    @classmethod
    def restore(cls, snapshot: dict[str, Any], params: LeakParams | None = None) -> LeakDetector:
        """A detector that carries on from ``snapshot()``; ValueError (or KeyError, TypeError) if it does not fit."""
        detector = cls(params)
        if snapshot["layout"] != _layout(detector.params):
            raise ValueError("saved with other floor settings")
        bucket = [float(v) for v in snapshot["bucket"]]
        if any(math.isnan(v) for v in bucket):
            raise ValueError("the open bucket holds NaN")
        detector._bucket_end, detector._lo1, detector._lo2, detector._hi1, detector._hi2 = bucket
        detector._capacity = None if snapshot["capacity"] is None else float(snapshot["capacity"])
        for window, buckets in zip(detector._lows, snapshot["lows"], strict=True):
            window.restore(buckets)
        detector._highs.restore(snapshot["highs"])
        for floors, packed in zip(detector._floors, snapshot["floors"], strict=True):
            floors.extend(unpack(packed))
        detector._floor_times.extend(unpack(snapshot["floor_times"]))
        if any(len(floors) != len(detector._floor_times) for floors in detector._floors):
            raise ValueError("floor histories of different lengths")
        detector._next_analysis = float(snapshot["next_analysis"])
        detector._recent.extend(bool(found) for found in snapshot["recent"])
        detector._quiet = int(snapshot["quiet"])
        detector._high = float(snapshot["high"])
        detector.state = statefile.restore_dataclass(LeakState, snapshot["state"])
        if detector.state.firing and detector.state.slope is None:
            raise ValueError("a firing state without a slope")
        first = snapshot["first_alert_at"]
        detector.first_alert_at = None if first is None else float(first)
        if detector._fast is not None and snapshot.get("fast") is not None:  # a snapshot from before it has none
            detector._fast.restore(snapshot["fast"])
        if snapshot.get("beats") is not None:  # a snapshot from before the middles were kept has none
            detector._beats.restore(snapshot["beats"])
        return detector

    @property
    def capacity(self) -> float | None:
        """The series' capacity as last given (None while none has been)."""
        return self._capacity

    def view(self, since: float) -> LeakView:
        """The floor since ``since`` (at most the kept history), the high, the capacity and the state; read-only."""
        times = self._floor_times.values()
        start = bisect_left(times, since)
        floors = self._floors[0].values()
        return LeakView(tuple(zip(times[start:], floors[start:])), self.params.floor_windows[0],
                        None if math.isnan(self._high) else self._high, self._capacity, self.state)

    def slope(self) -> float:
        """Theil-Sen slope of the floor over the longest scale the history covers (0.0 with too little)."""
        count = min(len(self._floor_times), int(max(self.params.scales) / self.params.bucket))
        if count < 2:
            return 0.0
        points = self.params.points_per_scale
        times, values = strided(self._floor_times, count, points), strided(self._floors[-1], count, points)
        return theil_sen(times - times[-1], values)


def _layout(params: LeakParams) -> list[Any]:
    """The settings a snapshot's floors depend on."""
    return [params.bucket, list(params.floor_windows), params.floor_outliers, params.high_window]
