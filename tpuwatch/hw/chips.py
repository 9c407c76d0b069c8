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


def accelerators(devices: list[PciDevice]) -> dict[str, list[PciDevice]]:
    """The PCI functions that are accelerators, by kind: TPU chips tpu-info knows, and NVIDIA display-class
    functions (3D or VGA controllers).  Google's vendor id also covers its gVNIC network card (0x0042), and
    NVIDIA's its NVSwitch bridges: neither is an accelerator."""
    return {"tpu": [d for d in devices if tpu_chip(d) is not None],
            "nvidia": [d for d in devices if d.vendor == VENDOR_NVIDIA and d.pci_class.startswith("0x03")]}
