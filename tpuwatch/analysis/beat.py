"""Two allocator sawtooths that beat, told apart from growth by the minute means and the high.

Two allocators that climb and release, each with its own period, drift in and
out of phase: while their releases part, the floor (the lowest readings)
rises, for as long as half the beat, which two periods of a few minutes each
can stretch to hours; a leak's floor rises the same way.  But the two
sawtooths' mean stays put, and as their tops part the high falls.  A leak
raises the mean with the floor; a floor rising under a fixed top (an
allocator that keeps ever more of its memory) raises the mean less, but its
high holds.  ``Beats`` keeps, per one-minute bucket, the mean reading and the
detector's high, over the longest scale it is asked about; growth whose means
climb less than ``mean`` of the floor's slope while the high falls by more
than ``high`` of it is a beat.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tpuwatch.analysis.floors import pack, strided, unpack
from tpuwatch.analysis.robust import theil_sen
from tpuwatch.store import History

if TYPE_CHECKING:
    import numpy as np


class Beats:
    """Feed each closed bucket's mean reading and the detector's high then to ``close``; ask ``beating``."""

    __slots__ = ("mean", "high", "_means", "_tops")

    def __init__(self, minutes: int, mean: float, high: float) -> None:
        self.mean, self.high = mean, high
        self._means, self._tops = History(minutes), History(minutes)

    def close(self, mean: float, high: float) -> None:
        """A bucket closed: its mean reading, and the high then."""
        self._means.append(mean)
        self._tops.append(high)

    def beating(self, count: int, times: np.ndarray, slope: float, points: int) -> bool:
        """Whether a floor's growth at ``slope`` over its last ``count`` minutes (``times``, ``points`` of them at
        most, newest last) is a beat: the means climb under ``mean`` of it while the high falls by over ``high``."""
        if len(self._means) < count:  # restored from a snapshot that kept none: not yet
            return False
        return (theil_sen(times, strided(self._means, count, points)) < self.mean * slope
                and theil_sen(times, strided(self._tops, count, points)) < -self.high * slope)

    def snapshot(self) -> list[Any]:
        """The kept minutes, as JSON data."""
        return [pack(self._means.values()), pack(self._tops.values())]

    def restore(self, snapshot: list[Any]) -> None:
        """Carry on from ``snapshot()`` (into a fresh one); ValueError if it does not fit."""
        means, tops = snapshot
        self._means.extend(unpack(means))
        self._tops.extend(unpack(tops))
        if len(self._means) != len(self._tops):
            raise ValueError("the minute means and highs differ in length")
