"""The leak detector's bounded building blocks: sorted sliding windows of bucket values, and packed histories.

``SlidingValues`` keeps the values of the one-minute buckets that ended within
a window, sorted, so that a floor (a low quantile of the window) costs a
bisect per bucket instead of a sort; ``pack``/``unpack`` carry a floor history
in a snapshot as base64 doubles; ``strided`` reads a history's newest values
for the statistics, at most so many.
"""

from __future__ import annotations

import base64
import math
from array import array
from bisect import bisect_left, insort
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from tpuwatch.store import History


class SlidingValues:
    """The values of the buckets that ended within the last ``window`` seconds, kept sorted."""

    __slots__ = ("window", "_buckets", "_sorted")

    def __init__(self, window: float) -> None:
        self.window = window
        self._buckets: deque[tuple[float, tuple[float, ...]]] = deque()
        self._sorted: list[float] = []

    def add(self, end: float, values: tuple[float, ...]) -> None:
        """Add a bucket's values and forget the buckets older than the window (O(log n) each, plus a memmove)."""
        self._buckets.append((end, values))
        for value in values:
            insort(self._sorted, value)
        while self._buckets[0][0] <= end - self.window:
            for value in self._buckets.popleft()[1]:
                del self._sorted[bisect_left(self._sorted, value)]

    def snapshot(self) -> list[list[Any]]:
        """The buckets in the window: ``[[end, [values]], ...]``."""
        return [[end, list(values)] for end, values in self._buckets]

    def restore(self, buckets: list[list[Any]]) -> None:
        """Refill an empty window from ``snapshot()``; ValueError for a value that is not finite (never stored)."""
        for end, values in buckets:
            self._buckets.append((float(end), tuple(float(v) for v in values)))
            if not all(math.isfinite(v) for v in self._buckets[-1][1]):
                raise ValueError("a window holds a value that is not finite")
            self._sorted.extend(self._buckets[-1][1])
        self._sorted.sort()

    def low(self, share: float) -> float:
        """The k-th lowest value, k being ``share`` of the values and at least 2 (one outlier ignored)."""
        k = min(len(self._sorted), max(2, round(share * len(self._sorted))))
        return self._sorted[k - 1]


def pack(values: memoryview) -> str:
    """Doubles as base64 text, for a JSON snapshot."""
    return base64.b64encode(values.tobytes()).decode("ascii")


def unpack(packed: str) -> array[float]:
    """The doubles of ``pack()``."""
    values = array("d")
    values.frombytes(base64.b64decode(packed))
    return values


def strided(history: History | memoryview, count: int, points: int) -> np.ndarray:
    """Of the last ``count`` values of ``history`` (or of its ``values()``), every stride-th one back from the newest,
    at most ``points``."""
    import numpy as np

    stride = max(1, math.ceil(count / points))
    return np.array(history[len(history) - 1 - (count - 1) // stride * stride::stride])
