"""The chip kinds tpuwatch knows, in one table: published capacity, TPU layout, the simulator's power range.

TPU facts follow tpu-info's ``device.TpuChip`` table (AI-Hypercomputer/cloud-accelerator-diagnostics,
``tpu_info/device.py``): PCI device ids, HBM per chip, TensorCores the libtpu runtime reports as separate
devices, and whether the chip is bound to vfio-pci (/dev/vfio/GROUP) or to the gasket/accel driver
(/dev/accelN).  docs/devices.md says where each one comes from.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpuwatch.hw.pci import VENDOR_GOOGLE, VENDOR_NVIDIA, PciDevice
from tpuwatch.hw.units import GIB


@dataclass(frozen=True)
class Chip:
    """One chip kind.  ``None`` means "not published"; the TPU layout fields mean nothing for a GPU."""

    name: str
    hbm_gib: int | None
    devices_per_chip: int = 1  # TensorCores the runtime reports as separate devices
    vfio: bool = False  # device file is /dev/vfio/GROUP (else /dev/accelN, the gasket/accel driver)
    duty_cycle_per_chip: bool = False  # v2/v3 runtimes answer duty cycle once per chip, 7x once per core
    # Idle and full-load power the simulator draws between: plausible figures for fire drills (no TPU exposes
    # its power), on the chips ``devices.sim.chip`` may name.
    idle_watts: float | None = None
    max_watts: float | None = None

    @property
    def hbm_bytes(self) -> int | None:
        """Published HBM capacity of one chip."""
        return self.hbm_gib * GIB if self.hbm_gib is not None else None


CHIPS: dict[str, Chip] = {chip.name: chip for chip in (
    Chip("v2", 8, 2, duty_cycle_per_chip=True),
    Chip("v3", 16, 2, duty_cycle_per_chip=True),
    Chip("v4", 32, idle_watts=90, max_watts=192),
    # No public name: jax's hardware_utils.py lists it as "plc"; capacity and layout unpublished.
    Chip("plc", None),
    Chip("v5e", 16, vfio=True, idle_watts=60, max_watts=170),
    Chip("v5p", 95, vfio=True, idle_watts=120, max_watts=350),
    Chip("v6e", 32, vfio=True, idle_watts=80, max_watts=250),
    Chip("7x", 192, 2, vfio=True),
    Chip("h100", 80, idle_watts=70, max_watts=700),
    Chip("h200", 141, idle_watts=75, max_watts=700),
)}

# The chips the simulator can play (it needs a power range); config.SimChip lists the same names.
SIMULATED = tuple(name for name, chip in CHIPS.items() if chip.idle_watts is not None and chip.max_watts is not None)

VENDOR_AMD = "0x1002"  # the kernel's include/linux/pci_ids.h: PCI_VENDOR_ID_ATI
PROCESSING_ACCELERATOR = "0x12"  # PCI base class of the MI300 series (0x1200); earlier Instincts are 0x0380
# AMD PCI device id -> Instinct product.  MI100 and MI200: amdgpu_drv.c ``pciidlist`` (CHIP_ARCTURUS 0x738C,
# 0x738E; CHIP_ALDEBARAN 0x7408, 0x740C, 0x740F); MI300 series (bound by class, IP discovery) and the product of
# every id: the PCI ID Repository (pci.ids, https://pci-ids.ucw.cz/read/PC/1002).
INSTINCT = {"0x738c": "MI100", "0x738e": "MI100", "0x740f": "MI210", "0x740c": "MI250", "0x7408": "MI250X",
            "0x74a0": "MI300A", "0x74a1": "MI300X", "0x74a5": "MI325X"}

# Google PCI device id -> TPU chip.  v2 and v3 share 0x0027; their subsystem device tells them apart.
TPU_DEVICE_IDS = {"0x005e": "v4", "0x0056": "plc", "0x0063": "v5e", "0x0062": "v5p", "0x006f": "v6e",
                  "0x0076": "7x"}
_SHARED_ID = "0x0027"
_BY_SUBSYSTEM = {"0x004e": "v2", "0x004f": "v3"}


def tpu_chip(device: PciDevice) -> Chip | None:
    """The TPU chip kind of a PCI function, or None if it is not a known TPU."""
    if device.vendor != VENDOR_GOOGLE:
        return None
    name = _BY_SUBSYSTEM.get(device.subsystem_device) if device.device == _SHARED_ID else \
        TPU_DEVICE_IDS.get(device.device)
    return CHIPS[name] if name is not None else None


def instinct_product(device: PciDevice) -> str | None:
    """The AMD Instinct product of a PCI function, or None when it is not one."""
    if device.vendor != VENDOR_AMD:
        return None
    if device.device in INSTINCT:
        return INSTINCT[device.device]
    return f"Instinct {device.device}" if device.pci_class.startswith(PROCESSING_ACCELERATOR) else None


def accelerators(devices: list[PciDevice]) -> dict[str, list[PciDevice]]:
    """The PCI functions that are accelerators, by kind: TPU chips tpu-info knows, NVIDIA display-class
    functions (3D or VGA controllers) and AMD Instinct GPUs.  Google's vendor id also covers its gVNIC network
    card (0x0042), NVIDIA's its NVSwitch bridges, AMD's its Radeon display cards: none is an accelerator."""
    return {"tpu": [d for d in devices if tpu_chip(d) is not None],
            "nvidia": [d for d in devices if d.vendor == VENDOR_NVIDIA and d.pci_class.startswith("0x03")],
            "amd": [d for d in devices if instinct_product(d) is not None]}
