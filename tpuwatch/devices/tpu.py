"""``devices.backend: tpu``: Cloud TPU chips from sysfs, owners from procfs, load from libtpu's runtime.

What each chip reports, and where it comes from:

- presence, generation, PCI address, device file: PCI sysfs (vendor 0x1ae0);
- driver status and reset count (v2-v4, accel/gasket driver): the accel class
  directory; status DEAD marks the chip down;
- owners: processes holding its device file (/proc/*/fd);
- HBM used/total, duty cycle, HBM bandwidth, TensorCore idle time, HLO queue
  and execution time: libtpu's runtime metric service, only while a workload
  runs; without it the HBM capacity is the published figure for the chip;
- temperature and power: only from a hwmon device bound to the chip's PCI
  function.  TPUs expose no ECC counters.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from tpuwatch.config import Config
from tpuwatch.devices.base import DeviceReading
from tpuwatch.devices.libtpu import RUNTIME_METRICS, AddressAnswer, RuntimeClient, values_by_chip
from tpuwatch.devices.pci import TpuChip, discover_tpus, read_driver_state, read_hwmon

log = logging.getLogger(__name__)


class TpuBackend:
    """Cloud TPU chips: sysfs discovery plus libtpu runtime metrics."""

    name = "tpu"

    def __init__(self, config: Config, clock: Callable[[], float] = time.monotonic) -> None:
        self.paths = config.paths
        self.runtime = RuntimeClient(config.devices.tpu.metrics_addr, config.devices.tpu.call_timeout)
        self.holder_scan_interval = config.host.holder_scan_interval
        self._clock = clock
        self._indices: dict[str, int] = {}  # PCI address -> chip index, kept for the life of the backend
        self._owners: dict[str, list[str]] = {}
        self._owners_at: float | None = None

    def close(self) -> None:
        """Release the runtime client's channels."""
        self.runtime.close()

    def read(self) -> list[DeviceReading]:
        """One reading per chip present under sysfs."""
        chips = discover_tpus(self.paths.sysfs)
        for chip in chips:  # first come, first numbered: a vanished chip keeps its number
            self._indices.setdefault(chip.pci, len(self._indices))
        owners = self._scan_owners(chips)
        runtime = self.runtime.fetch()
        per_chip = _runtime_by_chip(runtime, chips[0].generation.devices_per_chip if chips else 1)
        readings = []
        for chip in chips:
            index = self._indices[chip.pci]
            reading = self._sysfs_reading(str(index), chip, owners)
            fields, source = per_chip.get(index, ({}, _runtime_status(runtime)))
            reading = _with_runtime(reading, fields, source, bool(fields))
            if reading.memory_total_bytes is None and chip.hbm_bytes is not None:
                published = f"published capacity of {chip.generation.name}"
                reading = dataclasses.replace(reading, memory_total_bytes=float(chip.hbm_bytes),
                                              sources={**reading.sources, "memory_total_bytes": published})
            readings.append(reading)
        return readings

    def _sysfs_reading(self, device: str, chip: TpuChip, owners: dict[str, list[str]]) -> DeviceReading:
        sources = {"presence": f"sysfs:{self.paths.sysfs}/bus/pci/devices/{chip.pci}"}
        if chip.device_files:
            sources["device_file"] = ", ".join(f"{self.paths.dev}/{f}" for f in chip.device_files)
        status, resets, up, problem = None, None, True, None
        for accel_dir in chip.accel_dirs:
            state = read_driver_state(accel_dir)
            if state.status is not None and status in (None, "ALIVE"):
                status = state.status
                sources["status"] = state.status_source
            if state.reset_count is not None:
                resets = (resets or 0) + state.reset_count
        if status == "DEAD":
            up, problem = False, f"driver reports the chip DEAD ({sources['status']})"
        hwmon = read_hwmon(self.paths.sysfs, chip.pci)
        if hwmon is not None:
            sources["sensors"] = hwmon.source
        return DeviceReading(
            device=device, chip=chip.generation.name, pci=chip.pci, up=up, problem=problem, status=status,
            reset_count=resets, temperature_celsius=hwmon.temperature_celsius if hwmon else None,
            power_watts=hwmon.power_watts if hwmon else None,
            owners=tuple(o for f in chip.device_files for o in owners.get(f, [])), sources=sources,
        )

    def _scan_owners(self, chips: list[TpuChip]) -> dict[str, list[str]]:
        """Device file -> "PID (command)" of its holders, rescanned every holder_scan_interval."""
        from tpuwatch.collectors.host import scan_holders  # here: tpuwatch.collectors imports this package

        now = self._clock()
        if self._owners_at is None or now - self._owners_at >= self.holder_scan_interval:
            files = [f for chip in chips for f in chip.device_files]
            holders = scan_holders(self.paths.procfs, self.paths.dev, files) if files else {}
            self._owners = {}
            for pid, holder in sorted(holders.items()):
                for device_file in holder.device_files:
                    self._owners.setdefault(device_file, []).append(f"{pid} ({holder.command})")
            self._owners_at = now
        return self._owners


def _runtime_status(answers: list[AddressAnswer]) -> str:
    return "; ".join(f"libtpu:{a.address}: {a.status}" for a in answers)


def _runtime_by_chip(answers: list[AddressAnswer], cores_per_chip: int) -> dict[int, tuple[dict[str, float], str]]:
    """Runtime fields per chip index, and the address they came from.

    Each address serves the chips of one process, numbered from 0; addresses
    are taken in configured order, each one's chips after the previous one's.
    """
    per_chip: dict[int, tuple[dict[str, float], str]] = {}
    offset = 0
    for answer in answers:
        if not answer.has_data:
            continue
        served = 0
        for spec in RUNTIME_METRICS:
            for chip, value in values_by_chip(answer.values.get(spec.name, {}), spec, cores_per_chip).items():
                per_chip.setdefault(offset + chip, ({}, f"libtpu:{answer.address}"))[0][spec.attribute] = value
                served = max(served, chip + 1)
        offset += served
    return per_chip


def _with_runtime(reading: DeviceReading, fields: dict[str, Any], source: str, available: bool) -> DeviceReading:
    sources = {**reading.sources, **{name: source for name in fields}}
    if not available:
        sources["runtime"] = source
    return dataclasses.replace(reading, runtime_metrics=available, sources=sources, **fields)
