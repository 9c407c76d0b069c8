"""The leak detector's settings (``LeakParams``), read by ``leak.py`` and by the slow scales' test (``scales.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from tpuwatch.analysis.fast import FastParams

FAST_INTERVAL = 30.0
"""Seconds between readings beyond which the fast check pages fewer fast leaks in time and more warm-ups (at 60 s:
docs/trend.md, Limits); ``tpuwatch analyze`` and ``tpuwatch config check`` say so."""


@dataclass(frozen=True)
class LeakParams:
    """Tuning of the leak detector; the defaults suit sampling every 1-30 s (the fast check was tuned at 10 s)."""

    bucket: float = 60.0
    floor_windows: tuple[float, ...] = (180.0, 480.0, 900.0, 3600.0)
    floor_outliers: float = 0.05
    floor_scales: tuple[float, float] = (3.0, 20.0)
    high_window: float = 900.0
    analyze_every: float = 120.0
    scales: tuple[float, ...] = (2700.0, 3120.0, 3600.0, 4500.0, 5400.0, 7200.0, 10800.0, 21600.0)
    points_per_scale: int = 45
    lookback: float = 14400.0
    min_history: float = 7200.0
    min_prior: float = 3600.0
    segments: int = 4
    min_rise: float = 0.005
    new_high: float = 0.25
    max_jump: float = 0.3
    max_jump_fast: float = 0.4
    fast_scale: float = 5400.0
    fast_floor: float = 480.0
    end_slack: float = 0.1
    newest_half: float = 0.25
    alpha: float = 0.001
    min_ratio: float = 0.35
    newest_ratio: float = 0.5
    noise_factor: float = 4.0
    beat_floor: float = 900.0
    beat_middle: float = 0.3
    beat_high: float = 0.3
    persistence: int = 2
    persistence_of: int = 3
    clear_after: int = 6
    critical_eta: float = 4 * 3600.0
    max_eta: float = 7 * 86400.0
    fast: FastParams | None = FastParams()
