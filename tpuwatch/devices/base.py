"""The device backend interface and the collector that turns its readings into samples."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from tpuwatch.samples import Sample, sample

log = logging.getLogger(__name__)

MAX_REMEMBERED_DEVICES = 1024


@dataclass(frozen=True)
class DeviceReading:
    """What a backend read from one chip.  None means "not exposed by this hardware"."""

    device: str
    chip: str
    pci: str | None = None
    up: bool = True
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    utilization_ratio: float | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    ecc_corrected_total: float | None = None
    ecc_uncorrected_total: float | None = None


class DeviceBackend(Protocol):
    """One kind of accelerator.  ``read()`` returns a reading per chip it can see."""

    name: str

    def read(self) -> list[DeviceReading]: ...


_GAUGES = (
    ("memory_used_bytes", "tpuwatch_device_memory_used_bytes"),
    ("memory_total_bytes", "tpuwatch_device_memory_total_bytes"),
    ("utilization_ratio", "tpuwatch_device_utilization_ratio"),
    ("temperature_celsius", "tpuwatch_device_temperature_celsius"),
    ("power_watts", "tpuwatch_device_power_watts"),
)


def reading_samples(reading: DeviceReading, backend: str) -> list[Sample]:
    """The samples of one chip's reading; fields the hardware does not expose are absent."""
    device = reading.device
    out = [
        sample("tpuwatch_device_info", 1, device=device, chip=reading.chip, pci=reading.pci or "",
               backend=backend),
        sample("tpuwatch_device_up", 1 if reading.up else 0, device=device),
    ]
    for attribute, metric in _GAUGES:
        value = getattr(reading, attribute)
        if value is not None:
            out.append(sample(metric, value, device=device))
    for kind in ("corrected", "uncorrected"):
        value = getattr(reading, f"ecc_{kind}_total")
        if value is not None:
            out.append(sample("tpuwatch_device_ecc_errors_total", value, device=device, kind=kind))
    return out


class DeviceCollector:
    """Collects a backend's chips; a chip seen before and now missing is reported down."""

    name = "devices"

    def __init__(self, backend: DeviceBackend) -> None:
        self.backend = backend
        self.last_readings: list[DeviceReading] = []
        self._known: dict[str, DeviceReading] = {}

    def collect(self) -> list[Sample]:
        """Read every chip; remember identities so a vanished chip stays visible as down."""
        readings = {r.device: r for r in self.backend.read()}
        for device, previous in self._known.items():
            if device not in readings:
                readings[device] = DeviceReading(device=device, chip=previous.chip, pci=previous.pci, up=False)
                if previous.up:
                    log.error("device %s (%s, pci %s) is lost", device, previous.chip, previous.pci or "unknown")
        for device, reading in readings.items():
            if device not in self._known and len(self._known) < MAX_REMEMBERED_DEVICES:
                log.info("device %s found: %s, pci %s", device, reading.chip, reading.pci or "unknown")
            if device in self._known or len(self._known) < MAX_REMEMBERED_DEVICES:
                self._known[device] = reading
        self.last_readings = sorted(readings.values(), key=lambda r: _device_order(r.device))
        return [s for r in self.last_readings for s in reading_samples(r, self.backend.name)]


def _device_order(device: str) -> tuple[int, str]:
    return (int(device), "") if device.isdigit() else (1 << 30, device)
