"""Recent series cut to what a plot can show: each time bucket's lowest and highest point, so spikes stay."""

from __future__ import annotations

from collections.abc import Iterable


def decimate(points: Iterable[tuple[float, float]], start: float, end: float, buckets: int) -> list[list[float]]:
    """The points of ``points`` (oldest first) in [start, end], at most 2 x ``buckets`` of them, oldest first.

    Each of ``buckets`` equal spans keeps its lowest and its highest point (one point when they are the same).
    """
    width = (end - start) / buckets if end > start and buckets > 0 else 0.0
    out: list[list[float]] = []
    index = -1
    low: tuple[float, float] | None = None
    high: tuple[float, float] | None = None
    for point in points:
        t, value = point
        if t < start or t > end:
            continue
        k = min(buckets - 1, int((t - start) / width)) if width else 0
        if k != index:
            _flush(out, low, high)
            index, low, high = k, point, point
            continue
        assert low is not None and high is not None
        if value < low[1]:
            low = point
        if value > high[1]:
            high = point
    _flush(out, low, high)
    return out


def _flush(out: list[list[float]], low: tuple[float, float] | None, high: tuple[float, float] | None) -> None:
    if low is None or high is None:
        return
    first, second = (low, high) if low[0] <= high[0] else (high, low)
    out.append([round(first[0], 3), first[1]])
    if second is not first:
        out.append([round(second[0], 3), second[1]])
