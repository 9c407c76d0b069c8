"""Two allocator sawtooths that beat, told apart from growth by the minutes' middles and the high.

Two allocators that climb and release, each with its own period, drift in and
out of phase: while their releases part, the floor (the lowest readings)
rises, for as long as half the beat, which two periods of a few minutes each
can stretch to hours; a leak's floor rises the same way.  But the middle of
the two sawtooths' range stays put, and as their tops part the high falls.
A leak raises the middle with the floor; a floor rising under a fixed top (an
allocator that keeps ever more of its memory) raises it half as much, and
its high holds.  ``Beats`` keeps, per one-minute bucket, the middle of its
readings (halfway between the second-lowest and the second-highest) and the
detector's high, over the longest scale it is asked about; growth whose
middles climb less than ``middle`` of the floor's slope while the high falls
by more than ``high`` of it is a beat.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tpuwatch.analysis.floors import pack, strided, unpack
from tpuwatch.analysis.robust import theil_sen
from tpuwatch.store import History

if TYPE_CHECKING:
    import numpy as np


class Beats:
    """Feed each closed bucket's middle and the detector's high then to ``close``; ask ``beating``."""

    __slots__ = ("middle", "high", "_middles", "_tops")

    def __init__(self, minutes: int, middle: float, high: float) -> None:
        self.middle, self.high = middle, high
        self._middles, self._tops = History(minutes), History(minutes)

    def close(self, middle: float, high: float) -> None:
        """A bucket closed: the middle of its readings, and the high then."""
        self._middles.append(middle)
        self._tops.append(high)

    def beating(self, count: int, times: np.ndarray, slope: float, points: int) -> bool:
        """Whether a floor's growth at ``slope`` over its last ``count`` minutes (``times``, ``points`` of them at
        most, newest last) is a beat: the middles climb under ``middle`` of it while the high falls by over
        ``high``."""
        if len(self._middles) < count:  # restored from a snapshot that kept none: not yet
            return False
        return (theil_sen(times, strided(self._middles, count, points)) < self.middle * slope
                and theil_sen(times, strided(self._tops, count, points)) < -self.high * slope)

    def snapshot(self) -> list[Any]:
        """The kept minutes, as JSON data."""
        return [pack(self._middles.values()), pack(self._tops.values())]

    def restore(self, snapshot: list[Any]) -> None:
        """Carry on from ``snapshot()`` (into a fresh one); ValueError if it does not fit."""
        middles, tops = snapshot
        self._middles.extend(unpack(middles))
        self._tops.extend(unpack(tops))
        if len(self._middles) != len(self._tops):
            raise ValueError("the minutes' middles and highs differ in length")
