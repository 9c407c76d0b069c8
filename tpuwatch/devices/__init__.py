"""Device backends, registered by name, and the choice made by ``devices.backend: auto``."""

from __future__ import annotations

import importlib
import logging

from tpuwatch.backends import BACKENDS
from tpuwatch.config import Config
from tpuwatch.devices.base import DeviceBackend, DeviceReading
from tpuwatch.hw.pci import pci_root

log = logging.getLogger(__name__)

__all__ = ["BACKENDS", "DeviceBackend", "DeviceReading", "chips_of", "select_backend"]



def chips_of(name: str, sysfs: str) -> list[str]:
    """The PCI address of each chip backend ``name`` finds under ``sysfs`` (none for a backend without chips)."""
    find = getattr(importlib.import_module(BACKENDS[name]), "chips", None)
    return list(find(sysfs)) if find is not None else []


def select_backend(config: Config) -> tuple[DeviceBackend | None, str]:
    """The configured backend (None for host-only) and a sentence saying why; the choice is logged."""
    backend, why = _choose(config)
    log.info("device backend: %s", why)
    return backend, why


def _build(name: str, config: Config) -> DeviceBackend:
    backend: DeviceBackend = importlib.import_module(BACKENDS[name]).build(config)
    return backend


def _choose(config: Config) -> tuple[DeviceBackend | None, str]:
    choice = config.devices.backend
    if choice == "none":
        return None, "devices.backend is none: host metrics only"
    if choice != "auto":
        detail = f" (scenario {config.devices.sim.scenario})" if choice == "sim" else ""
        return _build(choice, config), f"devices.backend is {choice}{detail}"
    for name in BACKENDS:
        found = chips_of(name, config.paths.sysfs)
        if found:
            return _build(name, config), f"auto: {len(found)} {name} PCI device(s) at {', '.join(found)}"
    return None, (f"auto: no accelerator under {pci_root(config.paths.sysfs)} that a backend knows "
                  f"({', '.join(BACKENDS)}): host metrics only")
