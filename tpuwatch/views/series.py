"""Recent series cut to what a plot can show, and where a value falls on a plot's scale.

``decimate`` keeps each time bucket's lowest and highest point, so spikes stay (the page's plots and
``/api/series``); ``means`` averages each bucket (``tpuwatch top``'s sparklines, one character a bucket);
``extent`` and ``fraction`` place a value between a scale's ends (both).  A point whose value is None or not
finite (JSON from elsewhere) was not read: it leaves a gap.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

Point = tuple[float, float]


def decimate(points: Iterable[Point], start: float, end: float, buckets: int) -> list[Point]:
    """The points of ``points`` (oldest first) in [start, end], at most 2 x ``buckets`` of them, oldest first.

    Each of ``buckets`` equal spans keeps its lowest and its highest point (one point when they are the same).
    The points kept are those given, not copies: a plot's worth of series costs no new objects.
    """
    scale = buckets / (end - start) if end > start and buckets > 0 else 0.0
    last = buckets - 1
    out: list[Point] = []
    index = -1
    low = high = (0.0, 0.0)
    for point in points:
        t = point[0]
        if t < start or t > end:
            continue
        k = int((t - start) * scale)
        if k > last:
            k = last
        if k != index:
            if index >= 0:
                _flush(out, low, high)
            index, low, high = k, point, point
        elif point[1] < low[1]:
            low = point
        elif point[1] > high[1]:
            high = point
    if index >= 0:
        _flush(out, low, high)
    return out


def _flush(out: list[Point], low: Point, high: Point) -> None:
    if low is high:
        out.append(low)
    else:
        out += (low, high) if low[0] <= high[0] else (high, low)


def extent(points: Iterable[Sequence[Any]], start: float, end: float) -> tuple[float, float] | None:
    """The lowest and the highest value read in [start, end]; None when none was."""
    values = [v for t, v in points if start <= t <= end and v is not None and math.isfinite(v)]
    return (min(values), max(values)) if values else None


def fraction(value: float, lo: float, hi: float) -> float:
    """Where ``value`` lies from ``lo`` (0) to ``hi`` (1), kept inside; 0 when ``hi`` is not above ``lo``: a series
    that does not move sits at the bottom of its scale."""
    return min(1.0, max(0.0, (value - lo) / (hi - lo))) if hi > lo else 0.0


def means(points: Iterable[Sequence[Any]], start: float, end: float, buckets: int) -> list[float | None]:
    """The mean of the values read in each of ``buckets`` equal spans of [start, end], oldest first; None for a
    span where none was."""
    sums, counts = [0.0] * buckets, [0] * buckets
    scale = buckets / (end - start) if end > start else 0.0
    for t, value in points:
        if start <= t <= end and value is not None and math.isfinite(value):
            k = min(buckets - 1, int((t - start) * scale))
            sums[k] += value
            counts[k] += 1
    return [total / n if n else None for total, n in zip(sums, counts, strict=True)]
