"""The slow scales' growth test: whether the last ``count`` floors of one floor history show a leak's growth.

``LeakDetector`` asks it at every analysis, per scale and floor, shortest scale
first (``LeakParams`` names the settings).  A scale shows growth on a floor
when

* the medians of its ``segments`` consecutive segments all rise, the smallest
  rise at least ``min_ratio`` of the largest (a step rises in one segment, a
  warm-up that levels off in the first ones only) and the newest at least
  ``newest_ratio`` of the largest (a warm-up slows down as it levels off, a
  leak does not);
* the rise is at least ``min_rise`` of the capacity (or of the level);
* the newest floor is within ``end_slack`` of the rise of the newest
  segment's median (periodic load has turned back down by then);
* the newest segment still climbs within itself: the median of its newer half
  tops that of its older half by ``newest_half`` of the rise per segment (a
  leak's by about two thirds of it; a warm-up or a load that has levelled off,
  whose earlier segments still rise in order, by nothing);
* the newest segment tops the segments of the ``lookback`` before the window
  by ``new_high`` of the rise (periodic load returns to levels already seen);
* no single one-minute jump of the floor carries more than ``max_jump`` of
  the rise (model swaps are a few big steps; a leaking staircase has more),
  ``max_jump_fast`` on the scales up to ``fast_scale`` tested on floors up to
  ``fast_floor``: those floors follow each step within minutes, and such a
  window rarely holds three swaps upward, where a staircase leaking every
  10-25 min shows three steps;
* the Theil-Sen slope is positive and its rise exceeds ``noise_factor`` times
  the robust scatter around it;
* on the floors up to ``beat_floor``, it is not two allocator sawtooths that
  beat (``beat.py``): the minutes' middles climbing under ``beat_middle`` of
  the slope while the high falls by over ``beat_high`` of it;
* against a known capacity, the time until the high reaches it at that slope
  is within ``max_eta``;
* Mann-Kendall, its variance corrected for the autocorrelation of the floor
  (Yue-Wang, significant lags), rejects "no upward trend" at ``alpha``.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING

from tpuwatch.analysis.floors import strided
from tpuwatch.analysis.params import LeakParams
from tpuwatch.analysis.robust import mann_kendall_p, median, theil_sen

if TYPE_CHECKING:
    from tpuwatch.analysis.beat import Beats


@dataclass(frozen=True)
class Growth:
    """Growth found at one analysis: robust slope, trend confidence, projected exhaustion."""

    slope: float
    confidence: float
    eta: float | None


def growth_at(p: LeakParams, times: memoryview, floors: memoryview, count: int, max_jump: float,
              capacity: float | None, high: float, beats: Beats | None) -> Growth | None:
    """Growth over the last ``count`` minutes of ``floors`` (``times``: when each closed), or None.

    ``times`` and ``floors`` are the histories' values (``History.values()``); ``max_jump``: the largest one-minute
    jump of the floor, as a share of the rise; ``capacity`` None when unknown; ``high``: what exhaustion is
    projected from; ``beats``: the minutes' middles, where a beat is told apart.
    """
    length = count // p.segments
    end = len(floors)
    levels = [median(floors[end - length:])]
    for k in range(1, p.segments):  # newest first, stopping at the first segment that does not rise
        levels.append(median(floors[end - (k + 1) * length:end - k * length]))
        if levels[-1] >= levels[-2]:
            return None
    rises = [levels[k] - levels[k + 1] for k in range(p.segments - 1)]
    if min(rises) < p.min_ratio * max(rises) or rises[0] < p.newest_ratio * max(rises):
        return None
    rise = levels[0] - levels[-1]
    if floors[-1] < levels[0] - p.end_slack * rise:
        return None
    # Still climbing within the newest segment: its newer half above its older one (a leak's by half a
    # segment's rise; a warm-up or a load that has levelled off, by nothing).
    half = length // 2
    if median(floors[end - half:]) - median(floors[end - length:end - half]) < p.newest_half * rise / p.segments:
        return None
    if rise < p.min_rise * (capacity if capacity is not None else levels[0]):
        return None
    oldest = max(0, end - p.segments * length - int(p.lookback / p.bucket))
    older = range(end - (p.segments + 1) * length, oldest - 1, -length)
    if levels[0] - max(median(floors[a:a + length]) for a in older) < p.new_high * rise:
        return None
    window = floors[-count:]
    if max(b - a for a, b in pairwise(window)) > max_jump * rise:
        return None
    points = p.points_per_scale
    values = strided(floors, count, points)
    at = strided(times, count, points)
    at = at - at[-1]
    slope = theil_sen(at, values)
    if slope <= 0 or beats is not None and beats.beating(count, at, slope, points):
        return None
    residual = values - slope * at
    center = median(residual)
    noise = 1.4826 * median(abs(residual - center))
    if slope * (at[-1] - at[0]) <= p.noise_factor * noise:
        return None
    eta = None
    if capacity is not None:
        eta = max(0.0, (capacity - high) / slope)
        if eta > p.max_eta:
            return None
    pvalue = mann_kendall_p(at, values, slope)
    if pvalue >= p.alpha:
        return None
    return Growth(slope, 1.0 - pvalue, eta)
