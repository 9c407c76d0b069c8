"""A climb seen through an allocator's sawtooth or a staircase, on the raw readings: does it level off?

The fast check's floors hold a sawtooth's troughs for minutes, so under one
they climb in steps a period long and cannot show a warm-up slowing down in
its first minutes; a cache that grows in chunks climbs in steps too.  The raw
readings can: between two breaks (a sawtooth's release, a staircase's step)
the series climbs at one steady rate (the allocator's ramp, a step's flat),
and each break falls or jumps back onto the climb beneath.  Over the last
``window`` seconds of readings this fits, by least squares,
``y = a + b t + c t^2 + s tau`` (t in minutes before now, tau the minutes
since the latest break): the ramps or flats share the slope s, the troughs or
steps lie on the quadratic.  A break is a change between two readings that
departs from their median change by more than ``drop_sd`` robust standard
deviations of the changes and than ``drop_share`` of the capacity, downward
(a release) or upward (a step); the readings before the first break in the
window are left out (their tooth or step began before it).  With no break in
the window it is the quadratic alone.  Two allocators, each releasing in its
own time, do not fit that; with three breaks or more the fit is also made
within the stretches between breaks (each stretch's level taken out:
``y = e_k + (b + s) t + c t^2``), s being what the breaks gave back (a
release) or added (a step) over the time from the first to the last.  Either
fit may say it levels off.  A staircase also levels off when its steps shrink
(``_steps_shrink``): a cache warming up in chunks, under a sawtooth or not,
whose flats and ramps between breaks hide the bend from both fits.

A climb levels off when it decelerates by more than ``significance`` standard
errors (a straight climb under an allocator whose releases fall between two
readings leaves the fit a little rough, hence a high bar) while still rising,
and its top, ``b^2 / 4|c|`` above now, added to the high, stays below
capacity.  Readings are kept at least ``window / keep`` s apart, at most
``keep`` of them, in two fixed arrays: bounded whatever the sampling rate.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Any

from tpuwatch.analysis.floors import pack, unpack
from tpuwatch.analysis.robust import median


@dataclass(frozen=True)
class TeethParams:
    """Tuning of the sawtooth-aware fit."""

    window: float = 600.0
    keep: int = 120
    drop_sd: float = 5.0
    drop_share: float = 0.01
    significance: float = 6.0
    steps: int = 4
    step_significance: float = 4.0


class Teeth:
    """Feed ``add(t, value)`` with every reading; ask ``levels_off(high, capacity)``."""

    __slots__ = ("params", "_times", "_values", "_start", "_count")

    def __init__(self, params: TeethParams | None = None) -> None:
        self.params = params or TeethParams()
        self._times = array("d", bytes(8 * self.params.keep))
        self._values = array("d", bytes(8 * self.params.keep))
        self._start = 0  # the oldest reading's slot
        self._count = 0

    def add(self, timestamp: float, value: float) -> None:
        """Keep a reading if it comes at least ``window / keep`` s after the last one kept; O(1)."""
        keep = self.params.keep
        if self._count:
            last = (self._start + self._count - 1) % keep
            if timestamp - self._times[last] < self.params.window / keep:
                return
        if self._count == keep:
            slot = self._start
            self._start = (self._start + 1) % keep
        else:
            slot = (self._start + self._count) % keep
            self._count += 1
        self._times[slot] = timestamp
        self._values[slot] = value

    def readings(self) -> list[tuple[float, float]]:
        """The readings kept, oldest first."""
        keep = self.params.keep
        return [(self._times[(self._start + i) % keep], self._values[(self._start + i) % keep])
                for i in range(self._count)]

    def levels_off(self, high: float, capacity: float, bar: float = 1.0) -> bool:
        """True if the climb of the last ``window`` s, its sawtooth set aside, slows down significantly and, from
        ``high``, tops out below ``capacity``; ``bar`` scales the significance asked (below 1: a surer straight
        climb is needed for this to be False)."""
        p = self.params
        readings = self.readings()
        if not readings or capacity <= 0:
            return False
        now = readings[-1][0]
        points = [((t - now) / 60.0, v / capacity) for t, v in readings if t > now - p.window]
        if len(points) < 12:
            return False
        changes = [b - a for (_, a), (_, b) in zip(points, points[1:])]
        center = median(changes)
        spread = 1.4826 * median([abs(d - center) for d in changes])
        drop = max(p.drop_sd * spread, p.drop_share)
        breaks = [i + 1 for i, change in enumerate(changes)  # the first reading after each
                  if change < -drop or change - center > drop]
        room = 1.0 - high / capacity
        steps = [i for i in breaks if changes[i - 1] - center > drop]
        if len(steps) >= p.steps and _steps_shrink(points, steps, room, bar * p.step_significance, spread):
            return True
        significance = bar * p.significance
        return _one_sawtooth(points, breaks, room, significance) or (
            len(breaks) >= 3 and _any_sawtooths(points, breaks, room, significance))

    def snapshot(self) -> dict[str, str]:
        """The readings kept, as JSON data (their times and values as packed doubles)."""
        readings = self.readings()
        return {"times": pack(memoryview(array("d", [t for t, _ in readings]))),
                "values": pack(memoryview(array("d", [v for _, v in readings])))}

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Carry on from ``snapshot()`` (into a fresh one); ValueError for readings that do not pair up or are not
        finite."""
        times, values = unpack(snapshot["times"]), unpack(snapshot["values"])
        if len(times) != len(values):
            raise ValueError("the sawtooth readings' times and values differ in number")
        if not all(math.isfinite(t) and math.isfinite(v) for t, v in zip(times, values)):
            raise ValueError("a sawtooth reading that is not finite")
        keep = self.params.keep
        for t, v in zip(times[-keep:], values[-keep:]):
            self.add(t, v)


def _one_sawtooth(points: list[tuple[float, float]], breaks: list[int], room: float, significance: float) -> bool:
    """One sawtooth or staircase: ``y = a + b t + c t^2 + s tau`` from the first break on (the quadratic alone
    without one); True if c is negative by ``significance`` standard errors, b positive, and the top b^2 / 4|c|
    within ``room``.  After a single break the window holds one tooth or step, whose climb and the allocator's are
    one slope: no verdict."""
    if len(breaks) == 1:
        return False
    rows: list[tuple[float, ...]]
    if breaks:
        rows = []
        latest, starts = points[breaks[0]][0], set(breaks)
        for i, (t, y) in enumerate(points[breaks[0]:], breaks[0]):
            if i in starts:
                latest = t
            rows.append((1.0, t, t * t, t - latest, y))
    else:
        rows = [(1.0, t, t * t, y) for t, y in points]
    if len(rows) < len(rows[0]) - 1 + 6:
        return False
    fit = _least_squares(rows)
    if fit is None:
        return False
    (_, slope, curvature, *_), variance = fit
    return _tops_out(slope, curvature, variance, room, significance)


def _any_sawtooths(points: list[tuple[float, float]], breaks: list[int], room: float, significance: float) -> bool:
    """Any number of sawtooths (two allocators, each releasing in its own time) or steps: between two breaks every
    one of them climbs at its steady rate, so within each stretch ``y = e_k + (b + s) t + c t^2`` (fitted within
    the stretches: each stretch's means taken out).  Their climb s is what the breaks gave back (a release) or
    added (a step, counted negative) over the time between the first and the last: b = (b + s) - s; judged as
    ``_one_sawtooth``."""
    stretches: list[list[tuple[float, float]]] = []
    starts = set(breaks)
    for i, point in enumerate(points[breaks[0]:], breaks[0]):
        if i in starts:
            stretches.append([])
        stretches[-1].append(point)
    centred = []
    for stretch in stretches:
        n = len(stretch)
        mean_t = sum(t for t, _ in stretch) / n
        mean_t2 = sum(t * t for t, _ in stretch) / n
        mean_y = sum(y for _, y in stretch) / n
        centred += [(t - mean_t, t * t - mean_t2, y - mean_y) for t, y in stretch]
    freedom = len(centred) - len(stretches) - 2
    if freedom < 6:
        return False
    fit = _least_squares([(1.0, *row) for row in centred], variance_of=2, offsets=len(stretches) - 1)
    if fit is None:
        return False
    (_, climb, curvature), variance = fit
    given_back = sum(points[i - 1][1] - points[i][1] for i in breaks[1:])
    ramps = given_back / (points[breaks[-1]][0] - points[breaks[0]][0])
    return _tops_out(climb - ramps, curvature, variance, room, significance)


def _steps_shrink(points: list[tuple[float, float]], steps: list[int], room: float, significance: float,
                  spread: float) -> bool:
    """A staircase's steps (``steps``: the first reading after each), each the climb of one interval: a cache
    warming up in chunks takes ever smaller ones, a leak's stay the same size on average (under a sawtooth too,
    where the fits above see no bend: the flats and ramps between breaks are straight).  Fits size = a + d t (t in
    minutes before now); its noise is the larger of the residuals' and one step's own (two readings': sqrt(2) times
    ``spread``, the changes' robust standard deviation).  True if d is negative by ``significance`` standard errors
    and the steps still to come, a^2 / 2|d| a minute of steps at their median interval, fit within ``room``."""
    times = [points[i][0] for i in steps]
    fit = _least_squares([(1.0, t, points[i][1] - points[i - 1][1]) for t, i in zip(times, steps)], variance_of=1)
    if fit is None:
        return False
    (now, shrink), variance = fit
    mean_t = sum(times) / len(times)
    floor = 2.0 * spread * spread / sum((t - mean_t) ** 2 for t in times)  # a step's own noise, on the slope
    if shrink >= -significance * math.sqrt(max(variance, floor)):
        return False
    if now <= 0:
        return True  # the steps have shrunk to nothing
    every = median([b - a for a, b in zip(times, times[1:])])
    return now * now / (2.0 * -shrink) / every < room


def _tops_out(slope: float, curvature: float, variance: float, room: float, significance: float) -> bool:
    """Rising, slowing down by over ``significance`` standard errors, and topping out (b^2 / 4|c|) within room."""
    if slope <= 0 or curvature >= -significance * math.sqrt(variance):
        return False
    return slope * slope / (4.0 * -curvature) < room


def _least_squares(rows: list[tuple[float, ...]], variance_of: int = 2,
                   offsets: int = 0) -> tuple[list[float], float] | None:
    """Rows of (x..., y): the coefficients and the variance of the one at ``variance_of``; None if singular.
    ``offsets``: parameters already taken out of the rows (their means, per stretch), which the residual's degrees
    of freedom count too."""
    n = len(rows[0]) - 1
    gram = [[sum(r[i] * r[j] for r in rows) for j in range(n)] for i in range(n)]
    moments = [sum(r[i] * r[n] for r in rows) for i in range(n)]
    inverse = _invert(gram)
    if inverse is None:
        return None
    coefficients = [sum(inverse[i][j] * moments[j] for j in range(n)) for i in range(n)]
    residual = sum((r[n] - sum(c * x for c, x in zip(coefficients, r))) ** 2 for r in rows)
    return coefficients, residual / (len(rows) - n - offsets) * inverse[variance_of][variance_of]


def _invert(matrix: list[list[float]]) -> list[list[float]] | None:
    """Gauss-Jordan with partial pivoting; None for a singular matrix."""
    n = len(matrix)
    work = [[*row, *(1.0 if i == j else 0.0 for j in range(n))] for i, row in enumerate(matrix)]
    for column in range(n):
        pivot = max(range(column, n), key=lambda r: abs(work[r][column]))
        if abs(work[pivot][column]) < 1e-12 * max(1.0, max(abs(v) for v in matrix[column])):
            return None
        work[column], work[pivot] = work[pivot], work[column]
        lead = work[column][column]
        work[column] = [v / lead for v in work[column]]
        for r in range(n):
            if r != column and work[r][column]:
                factor = work[r][column]
                work[r] = [a - factor * b for a, b in zip(work[r], work[column])]
    return [row[n:] for row in work]
