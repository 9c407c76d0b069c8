"""PCI discovery under a sysfs root: accelerators, Cloud TPU chips, their device files and sensors.

Everything here reads files under ``paths.sysfs`` and nothing else, so the
same code reads /sys and a tree built by a test.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

VENDOR_GOOGLE = "0x1ae0"
VENDOR_NVIDIA = "0x10de"
GIB = 1 << 30


@dataclass(frozen=True)
class PciDevice:
    """One function under /sys/bus/pci/devices."""

    address: str
    vendor: str
    device: str
    pci_class: str
    subsystem_device: str = ""


def pci_root(sysfs: str) -> Path:
    """The directory holding one entry per PCI function."""
    return Path(sysfs, "bus", "pci", "devices")


def scan_pci(sysfs: str) -> list[PciDevice]:
    """PCI functions under ``sysfs``/bus/pci/devices (an empty list where there is none)."""
    found = []
    for entry in sorted(pci_root(sysfs).glob("*")):
        try:
            vendor, device, pci_class = [(entry / name).read_text().strip().lower()
                                         for name in ("vendor", "device", "class")]
        except OSError:
            continue
        found.append(PciDevice(entry.name, vendor, device, pci_class, _read(entry / "subsystem_device").lower()))
    return found


@dataclass(frozen=True)
class TpuGeneration:
    """Published facts of one TPU generation (tpu-info's ``device.TpuChip`` table)."""

    name: str
    hbm_gib: int | None
    devices_per_chip: int  # TensorCores the runtime reports as separate devices
    vfio: bool  # device file is /dev/vfio/GROUP (else /dev/accelN, the gasket/accel driver)
    duty_cycle_per_chip: bool = False  # v2/v3 runtimes answer duty cycle once per chip, 7x once per core


_V2 = TpuGeneration("v2", 8, 2, vfio=False, duty_cycle_per_chip=True)
_V3 = TpuGeneration("v3", 16, 2, vfio=False, duty_cycle_per_chip=True)
TPU_GENERATIONS: dict[str, TpuGeneration] = {
    "0x005e": TpuGeneration("v4", 32, 1, vfio=False),
    # No public name: jax's hardware_utils.py lists it as "plc"; capacity and layout unpublished.
    "0x0056": TpuGeneration("plc", None, 1, vfio=False),
    "0x0063": TpuGeneration("v5e", 16, 1, vfio=True),
    "0x0062": TpuGeneration("v5p", 95, 1, vfio=True),
    "0x006f": TpuGeneration("v6e", 32, 1, vfio=True),
    "0x0076": TpuGeneration("7x", 192, 2, vfio=True),
}


def tpu_generation(device: PciDevice) -> TpuGeneration | None:
    """The TPU generation of a Google PCI function, or None if it is not a known TPU."""
    if device.vendor != VENDOR_GOOGLE:
        return None
    if device.device == "0x0027":  # v2 and v3 share the device id; the subsystem tells them apart
        return {"0x004e": _V2, "0x004f": _V3}.get(device.subsystem_device)
    return TPU_GENERATIONS.get(device.device)


@dataclass(frozen=True)
class TpuChip:
    """One TPU chip found under sysfs: its PCI functions and device files."""

    generation: TpuGeneration
    pci: str                      # the chip's first PCI function
    functions: tuple[str, ...]    # every PCI function of the chip
    device_files: tuple[str, ...]  # relative to the dev root: "accel0", "vfio/12"
    accel_dirs: tuple[str, ...]   # sysfs class dirs of the accel driver (v2-v4), for status/reset_count

    @property
    def hbm_bytes(self) -> int | None:
        """Published HBM capacity of the chip."""
        return self.generation.hbm_gib * GIB if self.generation.hbm_gib is not None else None


def discover_tpus(sysfs: str) -> list[TpuChip]:
    """TPU chips under ``sysfs``, functions grouped by PCI domain:bus:device, sorted by device file."""
    grouped: dict[str, list[tuple[PciDevice, TpuGeneration]]] = {}
    for device in scan_pci(sysfs):
        generation = tpu_generation(device)
        if generation is not None:
            grouped.setdefault(device.address.rsplit(".", 1)[0], []).append((device, generation))
    chips = []
    for functions in grouped.values():
        files: list[str] = []
        accel_dirs: list[str] = []
        for device, generation in functions:
            entry = pci_root(sysfs) / device.address
            if generation.vfio:
                group = _iommu_group(entry)
                files += [f"vfio/{group}"] if group else []
            else:
                found = sorted((entry / "accel").glob("accel[0-9]*"), key=lambda p: _natural(p.name))
                files += [p.name for p in found]
                accel_dirs += [str(p) for p in found]
        chips.append(TpuChip(functions[0][1], functions[0][0].address, tuple(d.address for d, _ in functions),
                             tuple(files), tuple(accel_dirs)))
    return sorted(chips, key=lambda c: (_natural(c.device_files[0]) if c.device_files else [], c.pci))


def _iommu_group(entry: Path) -> str | None:
    try:
        return os.path.basename(os.readlink(entry / "iommu_group"))
    except OSError:
        return None


def _natural(text: str) -> list[int | str]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _read(path: Path | str) -> str:
    try:
        return Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


@dataclass(frozen=True)
class DriverState:
    """The accel/gasket driver's view of a v2-v4 chip."""

    status: str | None
    reset_count: int | None
    status_source: str


def read_driver_state(accel_dir: str) -> DriverState:
    """``status`` and ``reset_count`` of an accel class directory; None where a file is absent."""
    status = _read(Path(accel_dir, "status")) or None
    resets = _read(Path(accel_dir, "reset_count"))
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
        temperature = _milli(_read(hwmon / "temp1_input"), 1e3)
        power = _milli(_read(hwmon / "power1_average") or _read(hwmon / "power1_input"), 1e6)
        if temperature is not None or power is not None:
            return HwmonReading(temperature, power, f"hwmon:{hwmon}")
    return None


def _milli(text: str, per_unit: float) -> float | None:
    return int(text) / per_unit if re.fullmatch(r"-?\d+", text) else None
