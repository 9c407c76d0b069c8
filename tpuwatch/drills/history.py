"""The simulated chips' past: what a drill's detectors have already seen when the daemon starts.

The leak detector learns for 2 h, so simulated chips come with ``SIM_HISTORY_S`` of past (the simulated
backend's ``history()``, its readings before start), which ``replay`` hands to a new trend analyzer and, as far
back as it keeps, to the store's plotted history: the ``hbm-leak`` drill is judged from the first minute, and the
status page plots what the detectors saw.
"""

from __future__ import annotations

from tpuwatch.analysis.trend import TrendAnalyzer
from tpuwatch.config import Config
from tpuwatch.devices import sim
from tpuwatch.devices.base import reading_samples
from tpuwatch.store import SeriesStore

SIM_HISTORY_S = 3 * 3600.0
SIM_HISTORY_STEP_S = 10.0


def replay(config: Config, trend: TrendAnalyzer, store: SeriesStore, now: float) -> None:
    """Feed the simulated chips' past before ``now`` to ``trend``, and what ``store`` keeps of it to its history
    (the devices' current readings stay the first cycle's)."""
    kept = config.store.points_per_series * config.interval
    for offset, readings in sim.history(config.devices.sim, SIM_HISTORY_S, SIM_HISTORY_STEP_S):
        samples = [s for r in readings for s in reading_samples(r, sim.SimBackend.name)]
        trend.observe(samples, now + offset)
        if -offset <= kept:
            store.replace("devices", samples, now + offset)
    store.forget("devices")  # the past is history only: current readings are the first cycle's
