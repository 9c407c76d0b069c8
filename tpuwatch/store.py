"""Bounded in-memory series store: the latest readings and a fixed-size history per series."""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Any

from tpuwatch.samples import Labels, Sample, sample

SeriesKey = tuple[str, Labels]

PLOTTED = frozenset({"tpuwatch_device_memory_used_bytes", "tpuwatch_device_utilization_ratio",
                     "tpuwatch_device_temperature_celsius"})
"""The series the status page plots: the daemon's store keeps history for these only."""


class Ring:
    """A fixed-capacity ring of (timestamp, value) pairs stored as packed doubles.

    Both arrays are allocated whole up front, so a series costs the same
    memory from its first point to its millionth.
    """

    __slots__ = ("_capacity", "_times", "_values", "_next", "_count")

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._times = array("d", bytes(8 * capacity))
        self._values = array("d", bytes(8 * capacity))
        self._next = 0
        self._count = 0

    def append(self, timestamp: float, value: float) -> None:
        """Add a point, overwriting the oldest once full."""
        self._times[self._next] = timestamp
        self._values[self._next] = value
        self._next = (self._next + 1) % self._capacity
        self._count = min(self._count + 1, self._capacity)

    def points(self) -> list[tuple[float, float]]:
        """All points, oldest first."""
        start = (self._next - self._count) % self._capacity
        order = [(start + i) % self._capacity for i in range(self._count)]
        return [(self._times[i], self._values[i]) for i in order]

    def __len__(self) -> int:
        return self._count


class History:
    """The newest values appended, at most ``capacity`` of them, as packed doubles, oldest first.

    The buffer is allocated whole at the first append, so a history costs the
    same memory from its first value to its millionth.  ``drop`` only moves
    the start; the kept values are moved to the front when an append finds the
    buffer's end, and when it is full the oldest value goes.  Read it by index
    or slice (a ``memoryview`` of the values, valid until the next change).
    """

    __slots__ = ("_capacity", "_data", "_start", "_end")

    def __init__(self, capacity: int, values: Iterable[float] = ()) -> None:
        if capacity < 1:
            raise ValueError("a history holds at least one value")
        self._capacity = capacity
        self._data = array("d")
        self._start = self._end = 0
        self.extend(values)

    def append(self, value: float) -> None:
        """Add the newest value."""
        if not self._data:
            self._data = array("d", bytes(8 * self._capacity))
        if self._end == self._capacity:
            self._start = max(self._start, 1)
            kept = self._end - self._start
            self._data[:kept] = self._data[self._start:self._end]
            self._start, self._end = 0, kept
        self._data[self._end] = value
        self._end += 1

    def extend(self, values: Iterable[float]) -> None:
        """Append each value; of more than ``capacity`` only the newest are kept."""
        for value in list(values)[-self._capacity:]:
            self.append(value)

    def drop(self, count: int) -> None:
        """Forget the ``count`` oldest values."""
        self._start = min(self._end, self._start + max(0, count))

    def values(self) -> memoryview:
        """The values, oldest first, without copying them."""
        return memoryview(self._data)[self._start:self._end]

    def __getitem__(self, index: int | slice) -> Any:
        return self.values()[index]

    def __len__(self) -> int:
        return self._end - self._start

    def __iter__(self) -> Iterator[float]:
        return iter(self.values())


class SeriesStore:
    """Latest samples per owner (a collector) plus bounded history per series.

    Memory is fixed by ``points_per_series`` x ``max_series``: when a new series
    would exceed ``max_series`` the least recently updated one is evicted.
    With ``kept``, only series of those names get history; the others have
    their latest sample only.
    """

    def __init__(self, points_per_series: int, max_series: int, kept: frozenset[str] | None = None) -> None:
        self._points = points_per_series
        self._max_series = max_series
        self._kept = kept
        self._current: dict[str, tuple[Sample, ...]] = {}
        self._history: OrderedDict[SeriesKey, Ring] = OrderedDict()
        self._lock = threading.Lock()
        self.evicted_total = 0

    def replace(self, owner: str, samples: Iterable[Sample], timestamp: float) -> None:
        """Make ``samples`` the owner's current readings and append them to history.

        Series the owner no longer reports disappear from ``current()`` at once
        (a vanished chip is absent, not stale); their history ages out.
        """
        batch = tuple(samples)
        with self._lock:
            self._current[owner] = batch
            for name, labels, value in batch:
                if self._kept is not None and name not in self._kept:
                    continue
                key = (name, labels)
                ring = self._history.get(key)
                if ring is None:
                    ring = self._history[key] = Ring(self._points)
                    if len(self._history) > self._max_series:
                        self._history.popitem(last=False)
                        self.evicted_total += 1
                else:
                    self._history.move_to_end(key)
                ring.append(timestamp, value)

    def forget(self, owner: str) -> None:
        """Drop an owner's current readings (its collector was removed)."""
        with self._lock:
            self._current.pop(owner, None)

    def current(self) -> list[Sample]:
        """Every owner's latest samples."""
        with self._lock:
            batches = list(self._current.values())
        return [s for batch in batches for s in batch]

    def history(self, name: str, labels: Labels) -> list[tuple[float, float]]:
        """Recorded (timestamp, value) points of one series, oldest first."""
        with self._lock:
            ring = self._history.get((name, labels))
            return ring.points() if ring is not None else []

    def series_count(self) -> int:
        """Number of series with history."""
        with self._lock:
            return len(self._history)

    def samples(self) -> list[Sample]:
        """The store's own metrics: series held and series evicted."""
        return [sample("tpuwatch_store_series", self.series_count()),
                sample("tpuwatch_store_evicted_series_total", self.evicted_total)]
