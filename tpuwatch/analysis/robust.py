"""Robust trend statistics on small samples: the Theil-Sen slope and Mann-Kendall's trend test.

Both are O(n^2) in time and memory over the pairs of points: callers bound n.
numpy is imported on first use, so that a daemon whose series never show a
rising floor does not load it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


def median(values: Iterable[float]) -> float:
    """The median of a non-empty sequence (as ``statistics.median``, which costs the daemon 0.6 MiB to import)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


@lru_cache(maxsize=16)
def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    import numpy as np

    return np.triu_indices(n, 1)


def theil_sen(times: np.ndarray, values: np.ndarray) -> float:
    """Median of the pairwise slopes (O(n^2): callers bound n)."""
    import numpy as np

    i, j = _pairs(len(times))
    dt = times[j] - times[i]
    keep = dt > 0
    return float(np.median((values[j] - values[i])[keep] / dt[keep])) if keep.any() else 0.0


def mann_kendall_p(times: np.ndarray, values: np.ndarray, slope: float) -> float:
    """One-sided p-value of "no upward trend" by Mann-Kendall, variance corrected after Yue and Wang.

    The effective sample size comes from the significant autocorrelations of
    the series detrended with ``slope``; ties are accounted for.
    """
    import numpy as np

    n = len(values)
    i, j = _pairs(n)
    s = float(np.sign(values[j] - values[i]).sum())
    _, ties = np.unique(values, return_counts=True)
    variance = (n * (n - 1) * (2 * n + 5) - float((ties * (ties - 1) * (2 * ties + 5)).sum())) / 18.0
    if variance <= 0 or s <= 0:
        return 1.0
    residual = values - slope * times
    residual = residual - residual.mean()
    denominator = float(residual @ residual)
    if denominator > 0:
        acf = np.correlate(residual, residual, "full")[n:] / denominator
        lags = np.arange(1, n)
        significant = np.abs(acf) > 1.96 / math.sqrt(n)
        variance *= max(1.0, 1.0 + 2.0 * float(((1.0 - lags / n) * acf)[significant].sum()))
    z = (s - 1.0) / math.sqrt(variance)
    return 0.5 * math.erfc(z / math.sqrt(2.0))
