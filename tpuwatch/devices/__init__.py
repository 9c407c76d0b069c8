"""Device backends, registered by name, and the choice made by ``devices.backend: auto``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tpuwatch.config import Config
from tpuwatch.devices.base import DeviceBackend, DeviceCollector, DeviceReading
from tpuwatch.devices.sim import SimBackend

log = logging.getLogger(__name__)

__all__ = ["BACKENDS", "DeviceBackend", "DeviceCollector", "DeviceReading", "PciDevice", "scan_pci",
           "select_backend"]

BACKENDS: dict[str, Callable[[Config], DeviceBackend]] = {
    "sim": lambda config: SimBackend(config.devices.sim),
}

VENDOR_GOOGLE = "0x1ae0"
VENDOR_NVIDIA = "0x10de"


@dataclass(frozen=True)
class PciDevice:
    """One function under /sys/bus/pci/devices."""

    address: str
    vendor: str
    device: str
    pci_class: str


def scan_pci(sysfs: str) -> list[PciDevice]:
    """PCI functions under ``sysfs``/bus/pci/devices (an empty list where there is none)."""
    found = []
    root = Path(sysfs, "bus", "pci", "devices")
    for entry in sorted(root.glob("*")):
        try:
            ids = [(entry / name).read_text().strip().lower() for name in ("vendor", "device", "class")]
        except OSError:
            continue
        found.append(PciDevice(entry.name, *ids))
    return found


def _accelerators(pci: list[PciDevice]) -> dict[str, list[PciDevice]]:
    return {
        "tpu": [d for d in pci if d.vendor == VENDOR_GOOGLE],
        "nvidia": [d for d in pci if d.vendor == VENDOR_NVIDIA and d.pci_class.startswith("0x03")],
    }


def select_backend(config: Config) -> tuple[DeviceBackend | None, str]:
    """The configured backend (None for host-only) and a sentence saying why."""
    choice = config.devices.backend
    if choice == "none":
        return None, "devices.backend is none: host metrics only"
    if choice != "auto":
        backend = BACKENDS[choice](config)
        detail = f" (scenario {config.devices.sim.scenario})" if choice == "sim" else ""
        return backend, f"devices.backend is {choice}{detail}"
    pci_root = Path(config.paths.sysfs, "bus", "pci", "devices")
    found = _accelerators(scan_pci(config.paths.sysfs))
    for kind, devices in found.items():
        if not devices:
            continue
        addresses = ", ".join(d.address for d in devices)
        if kind in BACKENDS:
            return BACKENDS[kind](config), f"auto: {len(devices)} {kind} PCI device(s) at {addresses}"
        return None, (f"auto: {len(devices)} {kind} PCI device(s) at {addresses}, but this build has no "
                      f"{kind} backend: host metrics only")
    return None, (f"auto: no accelerator under {pci_root} (no PCI vendor {VENDOR_GOOGLE} TPU or "
                  f"{VENDOR_NVIDIA} GPU): host metrics only")
