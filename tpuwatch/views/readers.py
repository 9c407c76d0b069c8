"""What the status document is built from: a few read-only callables, each answering from its part."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tpuwatch.analysis.leak import LeakView
from tpuwatch.canary.judge import CanaryResult
from tpuwatch.devices.base import DeviceReading
from tpuwatch.kernel_log.events import KernelEvent
from tpuwatch.samples import Labels, Sample

Points = list[tuple[float, float]]


def _none(labels: Labels, since: float) -> LeakView | None:
    return None


def _empty() -> list[Any]:
    return []


@dataclass(frozen=True)
class StatusReaders:
    """Where the status document reads from; every callable only reads, and may be called from any thread.

    * ``current``: the store's latest samples (``SeriesStore.current``);
    * ``history``: one series' recorded points, oldest first (``SeriesStore.history``);
    * ``readings``: the latest cycle's reading per chip (the devices' inventory, ``Collectors.device_readings``);
    * ``window``: seconds of history the store keeps (points per series x interval);
    * ``health``: (healthy, report) as ``/healthz`` answers it, or None where there is no daemon;
    * ``leak``: the leak detector's view of a memory series since a time (``TrendAnalyzer.leak_view``);
    * ``canary``: the kept canary results, oldest first (``CanaryCollector.results``);
    * ``kernel_events``: the latest kernel events, oldest first (``KernelLogCollector.recent_events``);
    * ``alerts``: pending and firing alerts as ``/api/alerts`` lists them (``Alerting.active_alerts``);
    * ``interval``: the sampling interval in seconds (how often the page refreshes).
    """

    current: Callable[[], list[Sample]]
    history: Callable[[str, Labels], Points]
    readings: Callable[[], Sequence[DeviceReading]]
    window: Callable[[], float]
    health: Callable[[], tuple[bool, dict[str, Any]] | None]
    leak: Callable[[Labels, float], LeakView | None] = _none
    canary: Callable[[], list[CanaryResult]] = _empty
    kernel_events: Callable[[], list[KernelEvent]] = _empty
    alerts: Callable[[], list[dict[str, Any]]] = _empty
    interval: Callable[[], float] = lambda: 10.0
