"""Device backends, registered by name, and the choice made by ``devices.backend: auto``."""

from __future__ import annotations

import logging
from collections.abc import Callable

from tpuwatch.config import Config
from tpuwatch.devices.base import DeviceBackend, DeviceReading
from tpuwatch.hw.chips import accelerators
from tpuwatch.hw.pci import VENDOR_GOOGLE, VENDOR_NVIDIA, pci_root, scan_pci

log = logging.getLogger(__name__)

__all__ = ["BACKENDS", "DeviceBackend", "DeviceReading", "select_backend"]


def _tpu(config: Config) -> DeviceBackend:
    from tpuwatch.devices.tpu import TpuBackend

    return TpuBackend(config)


def _nvidia(config: Config) -> DeviceBackend:
    from tpuwatch.devices.nvidia import NvidiaBackend

    return NvidiaBackend(config)


def _sim(config: Config) -> DeviceBackend:
    from tpuwatch.devices.sim import SimBackend

    return SimBackend(config.devices.sim)


# A backend's module is imported when it is chosen: a command that needs none (logscan on a host without
# accelerators) does not pay for the others' imports.
BACKENDS: dict[str, Callable[[Config], DeviceBackend]] = {"tpu": _tpu, "nvidia": _nvidia, "sim": _sim}


def select_backend(config: Config) -> tuple[DeviceBackend | None, str]:
    """The configured backend (None for host-only) and a sentence saying why; the choice is logged."""
    backend, why = _choose(config)
    log.info("device backend: %s", why)
    return backend, why


def _choose(config: Config) -> tuple[DeviceBackend | None, str]:
    choice = config.devices.backend
    if choice == "none":
        return None, "devices.backend is none: host metrics only"
    if choice != "auto":
        backend = BACKENDS[choice](config)
        detail = f" (scenario {config.devices.sim.scenario})" if choice == "sim" else ""
        return backend, f"devices.backend is {choice}{detail}"
    found = accelerators(scan_pci(config.paths.sysfs))
    for kind, devices in found.items():
        if devices:
            addresses = ", ".join(d.address for d in devices)
            return BACKENDS[kind](config), f"auto: {len(devices)} {kind} PCI device(s) at {addresses}"
    return None, (f"auto: no accelerator under {pci_root(config.paths.sysfs)} (no PCI vendor {VENDOR_GOOGLE} TPU "
                  f"or {VENDOR_NVIDIA} GPU): host metrics only")
