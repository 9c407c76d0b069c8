"""Cloud TPU chips under a sysfs root: their PCI functions, device files, driver state and sensors.

Everything here reads files under ``paths.sysfs`` and nothing else, so the
same code reads /sys and a tree built by a test.  The PCI scan and the chip
table are ``tpuwatch.hw.pci`` and ``tpuwatch.hw.chips``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tpuwatch.hw.chips import Chip, tpu_chip
from tpuwatch.hw.pci import PciDevice, iommu_group, pci_root, read_attribute, scan_pci


@dataclass(frozen=True)
class TpuChip:
    """One TPU chip found under sysfs: its PCI functions and device files."""

    generation: Chip
    pci: str                      # the chip's first PCI function
    functions: tuple[str, ...]    # every PCI function of the chip
    device_files: tuple[str, ...]  # relative to the dev root: "accel0", "vfio/12"
    accel_dirs: tuple[str, ...]   # sysfs class dirs of the accel driver (v2-v4), for status/reset_count

    @property
    def hbm_bytes(self) -> int | None:
        """Published HBM capacity of the chip."""
        return self.generation.hbm_bytes


def discover_tpus(sysfs: str) -> list[TpuChip]:
    """TPU chips under ``sysfs``, functions grouped by PCI domain:bus:device, sorted by device file."""
    grouped: dict[str, list[tuple[PciDevice, Chip]]] = {}
    for device in scan_pci(sysfs):
        generation = tpu_chip(device)
        if generation is not None:
            grouped.setdefault(device.address.rsplit(".", 1)[0], []).append((device, generation))
    chips = []
    for functions in grouped.values():
        files: list[str] = []
        accel_dirs: list[str] = []
        for device, generation in functions:
            if generation.vfio:
                group = iommu_group(sysfs, device.address)
                files += [f"vfio/{group}"] if group else []
            else:
                found = sorted((pci_root(sysfs) / device.address / "accel").glob("accel[0-9]*"),
                               key=lambda p: _natural(p.name))
                files += [p.name for p in found]
                accel_dirs += [str(p) for p in found]
        chips.append(TpuChip(functions[0][1], functions[0][0].address, tuple(d.address for d, _ in functions),
                             tuple(files), tuple(accel_dirs)))
    return sorted(chips, key=lambda c: (_natural(c.device_files[0]) if c.device_files else [], c.pci))


def _natural(text: str) -> list[int | str]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


@dataclass(frozen=True)
class DriverState:
    """The accel/gasket driver's view of a v2-v4 chip."""

    status: str | None
    reset_count: int | None
    status_source: str


def read_driver_state(accel_dir: str) -> DriverState:
    """``status`` and ``reset_count`` of an accel class directory; None where a file is absent."""
    status = read_attribute(Path(accel_dir, "status")) or None
    resets = read_attribute(Path(accel_dir, "reset_count"))
    return DriverState(status, int(resets) if resets.isdigit() else None, f"sysfs:{accel_dir}")


@dataclass(frozen=True)
class HwmonReading:
    """Sensors of a hwmon device bound to a PCI function."""

    temperature_celsius: float | None
    power_watts: float | None
    source: str


def read_hwmon(sysfs: str, address: str) -> HwmonReading | None:
    """temp1_input and power1_average/power1_input of the first hwmon under a PCI function, if any."""
    for hwmon in sorted((pci_root(sysfs) / address / "hwmon").glob("hwmon[0-9]*"), key=lambda p: _natural(p.name)):
        temperature = _milli(read_attribute(hwmon / "temp1_input"), 1e3)
        power = _milli(read_attribute(hwmon / "power1_average") or read_attribute(hwmon / "power1_input"), 1e6)
        if temperature is not None or power is not None:
            return HwmonReading(temperature, power, f"hwmon:{hwmon}")
    return None


def _milli(text: str, per_unit: float) -> float | None:
    return int(text) / per_unit if re.fullmatch(r"-?\d+", text) else None
