"""Sustained-shift (drift) detection by two-sided tabular CUSUM, O(1) per sample.

The first ``warmup`` values learn the baseline mean and standard deviation
(Welford).  After that every value is standardised against the baseline and
accumulated into an upper and a lower CUSUM with allowance ``k`` (in standard
deviations); a sum above ``h`` is a drift.  The sums are capped at ``2 h`` so a
signal that returns to its baseline clears within about ``2 h / k`` samples.
The shift reported is the mean deviation from the baseline since the firing
sum last left zero.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from tpuwatch import statefile


@dataclass(frozen=True)
class DriftState:
    """What the detector says now; ``baseline`` is None while it is still learning."""

    drifting: bool = False
    direction: str | None = None
    baseline: float | None = None
    shift: float | None = None


class DriftDetector:
    """Feed ``update(value)``; read ``state``."""

    __slots__ = ("k", "h", "warmup", "min_sigma", "_n", "_mean", "_m2", "_sigma", "_up", "_down",
                 "_up_sum", "_up_count", "_down_sum", "_down_count", "state")

    def __init__(self, k: float = 0.5, h: float = 8.0, warmup: int = 30, min_sigma: float = 1e-9) -> None:
        self.k = k
        self.h = h
        self.warmup = warmup
        self.min_sigma = min_sigma
        self._n = 0
        self._mean = 0.0
        self._m2 = 0.0
        self._sigma = 0.0
        self._up = self._down = 0.0
        self._up_sum = self._down_sum = 0.0
        self._up_count = self._down_count = 0
        self.state = DriftState()

    def update(self, value: float) -> DriftState:
        """Add one value and return the new state."""
        if self._n < self.warmup:
            self._n += 1
            delta = value - self._mean
            self._mean += delta / self._n
            self._m2 += delta * (value - self._mean)
            if self._n == self.warmup:
                spread = math.sqrt(self._m2 / max(1, self._n - 1))
                self._sigma = max(spread, self.min_sigma, 1e-3 * abs(self._mean))
                self.state = DriftState(baseline=self._mean)
            return self.state
        deviation = value - self._mean
        z = deviation / self._sigma
        cap = 2 * self.h
        self._up, self._up_sum, self._up_count = _step(self._up, z - self.k, cap, self._up_sum,
                                                       self._up_count, deviation)
        self._down, self._down_sum, self._down_count = _step(self._down, -z - self.k, cap, self._down_sum,
                                                             self._down_count, deviation)
        if self._up > self.h:
            self.state = DriftState(True, "up", self._mean, self._up_sum / self._up_count)
        elif self._down > self.h:
            self.state = DriftState(True, "down", self._mean, self._down_sum / self._down_count)
        else:
            self.state = DriftState(baseline=self._mean)
        return self.state

    def snapshot(self) -> dict[str, Any]:
        """What the detector has learned, as JSON data."""
        return {"learned": [self._n, self._mean, self._m2, self._sigma],
                "sums": [self._up, self._down, self._up_sum, self._up_count, self._down_sum, self._down_count],
                "state": dataclasses.asdict(self.state)}

    @classmethod
    def restore(cls, snapshot: dict[str, Any]) -> DriftDetector:
        """A detector that carries on from ``snapshot()``; KeyError, TypeError or ValueError if it does not fit."""
        detector = cls()
        detector._n = int(snapshot["learned"][0])
        detector._mean, detector._m2, detector._sigma = map(float, snapshot["learned"][1:])
        up, down, up_sum, up_count, down_sum, down_count = snapshot["sums"]
        detector._up, detector._down, detector._up_sum, detector._down_sum = map(float, (up, down, up_sum, down_sum))
        detector._up_count, detector._down_count = int(up_count), int(down_count)
        detector.state = statefile.restore_dataclass(DriftState, snapshot["state"])
        if detector.state.drifting and detector.state.shift is None:
            raise ValueError("a drifting state without a shift")
        return detector


def _step(total: float, increment: float, cap: float, deviations: float, count: int,
          deviation: float) -> tuple[float, float, int]:
    """One CUSUM step; the deviations are summed while the sum is above zero."""
    total = min(cap, max(0.0, total + increment))
    if total == 0.0:
        return 0.0, 0.0, 0
    return total, deviations + deviation, count + 1
