"""Status documents of simulated hosts, for the views' tests: the simulator's own past (tpuwatch.devices.sim.history)
fed through the real store and trend analyzer, as the daemon feeds them."""

from __future__ import annotations

from typing import Any

from tpuwatch.analysis.trend import TrendAnalyzer
from tpuwatch.canary.judge import CanaryResult
from tpuwatch.config import SimConfig, TrendConfig
from tpuwatch.devices.base import DeviceReading, reading_samples
from tpuwatch.devices.sim import history
from tpuwatch.kernel_log.events import KernelEvent
from tpuwatch.store import SeriesStore
from tpuwatch.views.document import build_status
from tpuwatch.views.readers import StatusReaders

T0 = 1_000_000_000.0
GIB = float(1 << 30)
# What Alerting.active_alerts() returns (tpuwatch.alerting.state.Alert.to_json), written out.
ECC_ALERT = {"fingerprint": "0123456789abcdef", "state": "firing",
             "labels": {"alertname": "AcceleratorEccUncorrectable", "severity": "critical", "device": "1",
                        "host": "h"},
             "annotations": {"summary": "Uncorrectable ECC error(s) on device 1"}, "value": 1.0,
             "inhibited": False, "activeAt": "2001-09-09T01:46:40.000Z", "startsAt": "2001-09-09T01:46:40.000Z",
             "endsAt": None}


class SimHost:
    """A simulated host's past through the real store and trend analyzer: the sources of its status document."""

    def __init__(self, scenario: str, count: int = 4, fault_device: int = 1) -> None:
        config = SimConfig(count=count, scenario=scenario, fault_device=fault_device, fault_after=0.0)  # type: ignore[arg-type]
        self.store = SeriesStore(360, 10_000)
        self.trend = TrendAnalyzer(TrendConfig())
        self.readings: list[DeviceReading] = []
        for offset, readings in history(config, 3 * 3600, 10):
            samples = [s for r in readings for s in reading_samples(r, "sim")]
            self.store.replace("devices", samples, T0 + offset)
            self.trend.observe(samples, T0 + offset)
            self.readings = readings
        self.alerts: list[dict[str, Any]] = []
        self.events: list[KernelEvent] = []
        self.results: list[CanaryResult] = []

    def readers(self, **overrides: Any) -> StatusReaders:
        fields: dict[str, Any] = dict(
            current=self.store.current, history=self.store.history, readings=lambda: self.readings,
            window=lambda: 3600.0, health=lambda: None, leak=self.trend.leak_view, canary=lambda: self.results,
            kernel_events=lambda: self.events, alerts=lambda: self.alerts, interval=lambda: 10.0)
        return StatusReaders(**(fields | overrides))

    def document(self, **overrides: Any) -> dict[str, Any]:
        return build_status(self.readers(**overrides), T0, "host-a")
