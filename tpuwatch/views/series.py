"""Recent series cut to what a plot can show: each time bucket's lowest and highest point, so spikes stay."""

from __future__ import annotations

from collections.abc import Iterable

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
