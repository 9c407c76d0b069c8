"""PCI functions under a sysfs root, and the vendor ids of the accelerators tpuwatch knows.

Everything here reads files under the given sysfs root and nothing else, so
the same code reads /sys and a tree built by a test.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# PCI vendor ids as sysfs writes them (the kernel's include/linux/pci_ids.h: PCI_VENDOR_ID_GOOGLE,
# PCI_VENDOR_ID_NVIDIA).  Google's also covers its other devices, such as the gVNIC network card.
VENDOR_GOOGLE = "0x1ae0"
VENDOR_NVIDIA = "0x10de"


@dataclass(frozen=True)
class PciDevice:
    """One function under /sys/bus/pci/devices; an attribute sysfs does not show is ""."""

    address: str
    vendor: str
    device: str
    pci_class: str
    subsystem_device: str = ""


def pci_root(sysfs: str) -> Path:
    """The directory holding one entry per PCI function."""
    return Path(sysfs, "bus", "pci", "devices")


def read_attribute(path: Path | str) -> str:
    """A sysfs attribute's text, stripped; "" when it cannot be read."""
    try:
        return Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def scan_pci(sysfs: str) -> list[PciDevice]:
    """PCI functions under ``sysfs``/bus/pci/devices sorted by address (none where there is no such tree).

    A function whose vendor cannot be read is left out.
    """
    found = []
    for entry in sorted(pci_root(sysfs).glob("*")):
        vendor = read_attribute(entry / "vendor").lower()
        if vendor:
            found.append(PciDevice(entry.name, vendor, *(read_attribute(entry / name).lower()
                                                         for name in ("device", "class", "subsystem_device"))))
    return found


def iommu_group(sysfs: str, address: str) -> str | None:
    """The IOMMU group of a PCI function (the name of its /dev/vfio/GROUP file), or None."""
    try:
        return os.path.basename(os.readlink(pci_root(sysfs) / address / "iommu_group"))
    except OSError:
        return None
