"""What a config makes: the collectors, the plugins' and the actions, registered by name, and the canary.

A collector is built by a factory from the config, the collectors built before it
and the cycle's inventory board: the devices stage publishes the chips and
their holders there, and the later parts (the host's holders, the kernel
log's attribution, the canary's chips) read only that; each says in one
sentence what it chose.  ``run`` and ``check`` build the same
collectors.  A plugin (``tpuwatch.pluginspec``: a folder of its own plus one line
in ``tpuwatch/plugins.py``) is built by its hooks module after the canary,
with what it may use (``tpuwatch.plugincontext``).  An action (the
Kubernetes node agent) is handed the alert state after every cycle and acts
in its own thread.  Adding a core collector or an action is one factory and one
entry in ``COLLECTORS`` or ``ACTIONS``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psutil

from tpuwatch.canary.collector import CanaryCollector
from tpuwatch.canary.needs import jax_missing_here
from tpuwatch.canary.record import record_path
from tpuwatch.collectors import Collector
from tpuwatch.config import Config
from tpuwatch.devices import DeviceBackend, DeviceReading, select_backend
from tpuwatch.devices.collector import DeviceCollector
from tpuwatch.devices.expected import expect
from tpuwatch.devices.inventory import Board, Inventory, holder_scan
from tpuwatch.devices.seen import SeenThisBoot
from tpuwatch.host.collector import HostCollector
from tpuwatch.hw.procfs import HolderScan, read_boot_id
from tpuwatch.kernel_log.attribution import device_lookup
from tpuwatch.kernel_log.collector import BUDGET_SHARE, KernelLogCollector
from tpuwatch.kernel_log.collector import build_collector as build_kernel_log
from tpuwatch.kernel_log.lastboot import PreviousBootCollector
from tpuwatch.kubernetes.conditions import offered
from tpuwatch.plugincontext import Context
from tpuwatch.plugins import PLUGINS
from tpuwatch.pluginspec import Plugin
from tpuwatch.pods import PodLookup
from tpuwatch.samples import Sample

log = logging.getLogger(__name__)

# A factory gets the config, the collectors built before it (by name), the cycle's inventory board and whether it
# may save state.
Factory = Callable[[Config, dict[str, Collector], Board, bool], tuple[Collector | None, str]]


def _host(config: Config, built: dict[str, Collector], board: Board, persist: bool) -> tuple[Collector | None, str]:
    psutil.PROCFS_PATH = config.paths.procfs
    pods = PodLookup(config.paths.procfs, config.host.pod_resources_socket)
    own = holder_scan(config)

    def inventory() -> Inventory:  # the devices source is built after this one; without it, holders alone
        return board.current if "devices" in built else Inventory(holders=own.scan())

    collector = HostCollector(config.paths.procfs, inventory, pods)
    socket = config.host.pod_resources_socket
    note = (f"host: memory, CPU and device holders from {config.paths.procfs}, pods from their cgroups"
            + (f" and the kubelet's PodResources at {socket}" if socket else ""))
    log.info("%s", note)
    return collector, note


def _devices(config: Config, built: dict[str, Collector], board: Board,
             persist: bool) -> tuple[Collector | None, str]:
    backend, why = select_backend(config)
    if backend is None:
        return None, f"device backend: {why}"
    host = built.get("host")
    expected = expect(config, backend.name)
    holders = getattr(backend, "holders", None)  # the backend's own, where it reads holders
    collector = DeviceCollector(backend, expected, host.pods if isinstance(host, HostCollector) else None,
                                config.host.max_processes_per_device, _seen_this_boot(config, backend, persist),
                                config.devices.hang,
                                holders if isinstance(holders, HolderScan) else holder_scan(config), board)
    return collector, f"device backend: {why}" + (f"; expecting {expected.count} chip(s): {expected.why}"
                                                  if expected else "; no chip count expected")


def _seen_this_boot(config: Config, chosen: DeviceBackend, persist: bool) -> SeenThisBoot:
    """The chips and links seen this boot, kept under state_dir/devices by the daemon (not by one-shot commands).

    They belong to the backend (and the simulator's settings): a chip that vanished because the config changed
    (fewer simulated chips, another backend) is not remembered as down."""
    settings = repr(config.devices.sim) if chosen.name == "sim" else ""
    backend = f"{chosen.name}:{hashlib.sha256(settings.encode()).hexdigest()[:12]}"
    if not persist:
        return SeenThisBoot(backend)
    try:
        boot_id = read_boot_id(config.paths.procfs)
    except OSError:
        return SeenThisBoot(backend)  # no boot id: remembered in memory only, as a saved one could not be told stale
    return SeenThisBoot(backend, Path(config.state_dir, "devices", "seen.json"), boot_id)


def _kernel_log(config: Config, built: dict[str, Collector], board: Board,
                persist: bool) -> tuple[Collector | None, str]:
    return build_kernel_log(config, device_lookup(lambda: board.current.readings), persist)


def _previous_boot(config: Config, built: dict[str, Collector], board: Board,
                   persist: bool) -> tuple[Collector | None, str]:
    settings = config.kernel_log
    if not settings.previous_boot:
        return None, "previous boot: kernel_log.previous_boot is off"
    try:
        boot_id = read_boot_id(config.paths.procfs)
    except OSError as exc:
        return None, f"previous boot: not looked at (cannot read this boot's id: {exc.strerror})"
    journal = settings.path if settings.source == "journal" else None
    state = Path(config.state_dir, "kernel_log", "previous_boot.json") if persist else None
    pstore = Path(config.paths.sysfs, "fs", "pstore")
    archive = Path(settings.pstore_archive) if settings.pstore_archive else None
    collector = PreviousBootCollector(pstore, archive, journal, boot_id, state,
                                      journal_enabled=settings.source in ("auto", "journal"),
                                      wait=config.collector_deadline * BUDGET_SHARE)
    return collector, f"previous boot: looking for its crash in {pstore}" + (f", {archive}" if archive else "") + (
        " and the journal" if settings.source in ("auto", "journal") else "")


COLLECTORS: dict[str, Factory] = {
    "host": _host,
    "devices": _devices,
    "kernel_log": _kernel_log,
    "previous_boot": _previous_boot,
}


@dataclass
class Collectors:
    """The collectors a config enables, by name in pipeline order, what was chosen for each, and the
    board their devices stage publishes each cycle's inventory on."""

    by_name: dict[str, Collector]
    notes: list[str]
    inventory: Board

    @property
    def devices(self) -> DeviceCollector | None:
        """The device collector, if a backend was chosen."""
        found = self.by_name.get("devices")
        return found if isinstance(found, DeviceCollector) else None

    @property
    def kernel_log(self) -> KernelLogCollector | None:
        """The kernel log collector, if a kernel-log source is read."""
        found = self.by_name.get("kernel_log")
        return found if isinstance(found, KernelLogCollector) else None

    @property
    def previous_boot(self) -> PreviousBootCollector | None:
        """The previous boot's crash check, if on."""
        found = self.by_name.get("previous_boot")
        return found if isinstance(found, PreviousBootCollector) else None

    def device_readings(self) -> tuple[DeviceReading, ...]:
        """The chips of the latest cycle's inventory (none without a backend)."""
        return self.inventory.current.readings

    def stages(self) -> list[list[Collector]]:
        """The collectors as the sampler's first stages: the devices (which publish the inventory), then the rest."""
        devices = self.devices
        return [[devices] if devices is not None else [], [c for c in self if c is not devices]]

    def __iter__(self) -> Iterator[Collector]:
        return iter(self.by_name.values())

    def close(self) -> None:
        """Release what the collectors hold (file descriptors, channels)."""
        for collector in self:
            close(collector)


def build_collectors(config: Config, persist: bool = True) -> Collectors:
    """The collectors this config enables (each choice logged).

    Raises ConfigError when a collector's configuration cannot be used (a broken rule file, say).
    ``persist=False`` (one-shot commands) keeps collectors from moving the daemon's saved positions.
    """
    built: dict[str, Collector] = {}
    board = Board()
    notes = []
    for name, factory in COLLECTORS.items():
        collector, note = factory(config, built, board, persist)
        notes.append(note)
        if collector is not None:
            built[name] = collector
    return Collectors(built, notes, board)


@dataclass(frozen=True)
class Hooks:
    """A plugin's hooks module (``Plugin.hooks``) as the rest of tpuwatch calls it: ``build`` is required, the
    rest optional (None where the module defines none)."""

    # (config, context) -> (its collector or None, one sentence on what was chosen)
    build: Callable[[Config, Context], tuple[Collector | None, str]]
    # (collector, new context) -> whether it keeps running across a reload that left its settings alone
    keep: Callable[[Any, Context], bool] | None = None
    # (collector, now) -> its /healthz check
    healthz: Callable[[Any, float], dict[str, Any]] | None = None
    # (collector, now) -> (its value in ``check --json``, its warnings)
    report: Callable[[Any, float], tuple[Any, list[str]]] | None = None
    # (the store's current samples, now) -> (headline, details) per line on the status page and in ``top``
    notices: Callable[[list[Sample], float], list[tuple[str, str]]] | None = None


@functools.cache
def hooks(plugin: Plugin) -> Hooks:
    """``plugin``'s hooks (its hooks module is imported on first use)."""
    module = importlib.import_module(plugin.hooks)
    return Hooks(module.build, *(getattr(module, name, None) for name in ("keep", "healthz", "report", "notices")))


def plugin_key(plugin: Plugin, config: Config) -> tuple[Any, ...]:
    """What ``plugin`` is built from: its section and the config keys it names; a change rebuilds it."""
    return config.sections[plugin.name], *(getattr(config, key) for key in plugin.rebuild_on)


def build_plugins(config: Config, context: Context, running: dict[str, Collector] | None = None,
                  before: Config | None = None) -> tuple[dict[str, Collector], list[str]]:
    """The registered plugins' collectors ``config`` enables, by name, and what was chosen for each.

    A running one (``running``, built from ``before``) whose key did not change and whose hooks keep it is
    reused; any other running one is closed before its successor is built (it may hold what the new one needs,
    a socket path)."""
    built: dict[str, Collector] = {}
    notes = []
    for plugin in PLUGINS:
        old = (running or {}).get(plugin.name)
        keep = hooks(plugin).keep
        if old is not None and before is not None and plugin_key(plugin, before) == plugin_key(plugin, config) \
                and keep is not None and keep(old, context):
            built[plugin.name] = old
            continue
        if old is not None:
            close(old)
        collector, note = hooks(plugin).build(config, context)
        notes.append(note)
        if collector is not None:
            built[plugin.name] = collector
    return built, notes


def close(collector: Collector) -> None:
    """Release what ``collector`` holds, if it holds anything (its ``close()``)."""
    release = getattr(collector, "close", None)
    if release is not None:
        release()


def build_canary(config: Config, inventory: Board) -> CanaryCollector | None:
    """The daemon's canary book, or None when neither the canary nor a plugin that records into it is on.

    Its scheduled runs need jax where the worker runs: without it, ``runnable`` says why (once at WARNING), and
    the book keeps only what in-job probes report."""
    if not config.canary.enabled and not any(p.uses_canary_book(config.sections[p.name]) for p in PLUGINS
                                             if p.uses_canary_book is not None):
        return None
    canary = CanaryCollector(config, lambda: inventory.current.devices, record_path(config.state_dir))
    if not config.canary.enabled:
        canary.runnable = "canary.enabled is false"
    elif (missing := jax_missing_here() if config.canary.python is None else None) is not None:
        log.warning("canary off: %s", missing)
        canary.runnable = missing
    return canary


class Action(Protocol):
    """What is done about the alerts: fed once per cycle after alerting, never blocking it."""

    name: str

    def feed(self, alerts: list[dict[str, Any]], pci_by_device: dict[str, str]) -> None:
        """Hand over the active alerts (``Alerting.active_alerts()``) and the chips' PCI addresses; returns at
        once."""

    def start(self) -> None:
        """Start acting (its own thread)."""

    def stop(self) -> None:
        """Stop within a few seconds."""

    def samples(self) -> list[Sample]:
        """Its metrics (stored by the self-metrics collector)."""

    def api_payload(self) -> dict[str, Any]:
        """What ``GET /api/NAME`` answers."""


@dataclass(frozen=True)
class ActionFactory:
    """How an action is built: from the config section ``section`` picks (None when the action is off)."""

    section: Callable[[Config], Any]
    build: Callable[[Config], Action | None]
    off: str  # what /api/NAME says while it is off


def _kubernetes(config: Config) -> Action | None:
    if not config.kubernetes.node_conditions:
        return None
    from tpuwatch.kubernetes import agent  # its modules are imported only when it is on

    return agent.build(config)


ACTIONS: dict[str, ActionFactory] = {
    "kubernetes": ActionFactory(lambda c: (c.kubernetes, offered(c)), _kubernetes, "kubernetes.node_conditions is off"),
}
