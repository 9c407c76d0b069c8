"""Collectors, registered by name, and the guard that runs them."""

from __future__ import annotations

import logging
from collections.abc import Callable

import psutil

from tpuwatch.collectors.guard import Collector, CollectorStatus, GuardedCollector
from tpuwatch.collectors.host import HostCollector
from tpuwatch.config import Config
from tpuwatch.devices import DeviceCollector, select_backend
from tpuwatch.kernel_log.collector import build_collector as build_kernel_log
from tpuwatch.kernel_log.collector import device_lookup

log = logging.getLogger(__name__)

__all__ = ["COLLECTORS", "Collector", "CollectorStatus", "GuardedCollector", "build_collectors"]

# A factory gets the config, the collectors built before it (by name) and whether it may save state.
Factory = Callable[[Config, dict[str, Collector], bool], tuple[Collector | None, str]]


def _host(config: Config, built: dict[str, Collector], persist: bool) -> tuple[Collector | None, str]:
    psutil.PROCFS_PATH = config.paths.procfs
    collector = HostCollector(config.paths.procfs, config.paths.dev, config.host.device_files,
                              config.host.holder_scan_interval)
    note = f"host: memory, CPU and device holders from {config.paths.procfs}"
    log.info("%s", note)
    return collector, note


def _devices(config: Config, built: dict[str, Collector], persist: bool) -> tuple[Collector | None, str]:
    backend, why = select_backend(config)
    return (DeviceCollector(backend) if backend is not None else None), f"device backend: {why}"


def _kernel_log(config: Config, built: dict[str, Collector], persist: bool) -> tuple[Collector | None, str]:
    devices = built.get("devices")
    readings = (lambda: devices.last_readings) if isinstance(devices, DeviceCollector) else (lambda: [])
    return build_kernel_log(config, device_lookup(readings), persist)


COLLECTORS: dict[str, Factory] = {
    "host": _host,
    "devices": _devices,
    "kernel_log": _kernel_log,
}


def build_collectors(config: Config, persist: bool = True) -> tuple[list[Collector], list[str]]:
    """The collectors this config enables, and one sentence per collector on what was chosen (also logged).

    Raises ConfigError when a collector's configuration cannot be used (a broken rule file, say).
    ``persist=False`` (one-shot commands) keeps collectors from moving the daemon's saved positions.
    """
    built: dict[str, Collector] = {}
    notes = []
    for name, factory in COLLECTORS.items():
        collector, note = factory(config, built, persist)
        notes.append(note)
        if collector is not None:
            built[name] = collector
    return list(built.values()), notes
