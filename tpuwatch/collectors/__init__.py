"""Collectors, registered by name, and the guard that runs them."""

from __future__ import annotations

from collections.abc import Callable

import psutil

from tpuwatch.collectors.guard import Collector, CollectorStatus, GuardedCollector
from tpuwatch.collectors.host import HostCollector
from tpuwatch.config import Config
from tpuwatch.devices import DeviceCollector, select_backend

__all__ = ["COLLECTORS", "Collector", "CollectorStatus", "GuardedCollector", "build_collectors"]


def _host(config: Config) -> tuple[Collector | None, str]:
    psutil.PROCFS_PATH = config.paths.procfs
    collector = HostCollector(config.paths.procfs, config.paths.dev, config.host.device_files,
                              config.host.holder_scan_interval)
    return collector, f"host: memory, CPU and device holders from {config.paths.procfs}"


def _devices(config: Config) -> tuple[Collector | None, str]:
    backend, why = select_backend(config)
    return (DeviceCollector(backend) if backend is not None else None), why


COLLECTORS: dict[str, Callable[[Config], tuple[Collector | None, str]]] = {
    "host": _host,
    "devices": _devices,
}


def build_collectors(config: Config) -> tuple[list[Collector], list[str]]:
    """The collectors this config enables, and one sentence per collector on what was chosen."""
    collectors, notes = [], []
    for factory in COLLECTORS.values():
        collector, note = factory(config)
        notes.append(note)
        if collector is not None:
            collectors.append(collector)
    return collectors, notes
