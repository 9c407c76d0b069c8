"""One assembly for start and reload: the running parts built from a config and the parts running before.

``assemble(config, previous)`` keeps every part whose config did not change,
carries learned state into those that must be rebuilt (the trend detectors'
floors), and builds the rest; ``previous`` None is a start.  It raises
ConfigError, changing nothing, when the new config cannot run: alerting's
rules and secrets are taken last, as they apply whole or not at all.  The
caller switches to the new parts and then ``retire()``s what was replaced.

The pipeline the sampler runs, in order within each cycle:

    devices (this cycle's chips and their holders: the inventory every later part reads) -> store
    collectors (host, kernel log, canary results, the plugins') -> store
    analysis (trend detectors; tpuwatch's own metrics)   -> store
    alerting (rules over the store; delivery runs in its own threads)
    actions (the Kubernetes node agent, fed the alert state)

The exporter and the views read the store.
"""

from __future__ import annotations

import logging
import platform
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tpuwatch import __version__
from tpuwatch.alerting.service import Alerting
from tpuwatch.analysis.state import TrendStateFile
from tpuwatch.analysis.trend import TrendAnalyzer
from tpuwatch.canary.collector import CanaryCollector
from tpuwatch.collectors import Collector
from tpuwatch.config import Config
from tpuwatch.devices.base import DeviceReading
from tpuwatch.drills import history
from tpuwatch.drills.needs import drill_samples
from tpuwatch.drills.simulate import is_simulated
from tpuwatch.plugincontext import Context
from tpuwatch.registry import ACTIONS, Action, Collectors, build_canary, build_collectors, build_plugins
from tpuwatch.sampler import Sampler, Stage
from tpuwatch.samples import Sample, sample
from tpuwatch.store import PLOTTED, SeriesStore
from tpuwatch.webconfig import WebConfig, load_web_config

log = logging.getLogger(__name__)

SampleFeed = Callable[[], Iterable[Sample]]


class SelfMetrics:
    """tpuwatch's own metrics as a collector of the analysis stage: build, collectors, store, state, lifecycle."""

    name = "tpuwatch"

    def __init__(self, feeds: list[SampleFeed]) -> None:
        self.feeds = feeds

    def collect(self) -> list[Sample]:
        """The build and every feed's samples."""
        out = [sample("tpuwatch_build_info", 1, version=__version__, python=platform.python_version())]
        for feed in self.feeds:
            out.extend(feed())
        return out


@dataclass
class Parts:
    """Everything one config runs."""

    config: Config
    web: WebConfig
    store: SeriesStore
    trend: TrendAnalyzer
    trend_state: TrendStateFile | None
    collectors: Collectors
    canary: CanaryCollector | None
    plugins: dict[str, Collector]  # the registered plugins' collectors (tpuwatch/plugins.py), by name
    alerting: Alerting
    actions: dict[str, Action]  # those enabled, by name (ACTIONS)
    sampler: Sampler

    def device_readings(self) -> tuple[DeviceReading, ...]:
        """The chips of the latest cycle's inventory (none without a backend)."""
        return self.collectors.device_readings()


def _collectors_key(config: Config) -> tuple[Any, ...]:
    return (config.devices, config.paths, config.host, config.collector_deadline, config.kernel_log,
            config.state_dir)


def _trend_key(config: Config) -> tuple[Any, ...]:
    """What the trend analyzer is built from: a change means a new one (real chips keep their learned floors)."""
    return config.trend, config.devices.sim if is_simulated(config) else None


def _trend(config: Config, previous: Parts | None, store: SeriesStore) -> TrendAnalyzer:
    """The trend analyzer: the previous one if its settings held; with simulated chips, fed their past, which
    also goes into ``store``'s history as far back as it keeps (the status page plots what the detectors saw)."""
    if previous is not None and _trend_key(previous.config) == _trend_key(config):
        return previous.trend
    trend = TrendAnalyzer(config.trend)
    now = time.time()
    if is_simulated(config):
        history.replay(config, trend, store, now)
    elif previous is not None:  # real chips keep what their detectors learned
        try:
            trend.restore(previous.trend.snapshot(now), now)
        except Exception as exc:  # noqa: BLE001 - a reload must never fail on this
            log.warning("trend detectors learn afresh after the reload: %s", exc)
    return trend


def _trend_state(config: Config, previous: Parts | None, trend: TrendAnalyzer) -> TrendStateFile | None:
    """The learned state's file (the state_dir does not change while running); simulated chips have none."""
    if previous is not None:
        return previous.trend_state
    if is_simulated(config):
        return None
    state = TrendStateFile(config.state_dir)
    state.restore(trend, time.time())
    return state


def _actions(config: Config, previous: Parts | None) -> dict[str, Action]:
    """The enabled actions: the previous one of each whose config section did not change, else a new one."""
    out = {}
    for name, factory in ACTIONS.items():
        kept = _same(previous, config, factory.section)
        action = kept.actions.get(name) if kept is not None else factory.build(config)
        if action is not None:
            out[name] = action
    return out


def _same(previous: Parts | None, config: Config, key: Callable[[Config], Any]) -> Parts | None:
    """``previous`` when what ``key`` picks from the config did not change, else None."""
    return previous if previous is not None and key(previous.config) == key(config) else None


def _pipeline(config: Config, store: SeriesStore, trend: TrendAnalyzer, trend_state: TrendStateFile | None,
              collectors: Collectors, canary: CanaryCollector | None, plugins: dict[str, Collector],
              alerting: Alerting, actions: dict[str, Action], daemon_samples: SampleFeed) -> Sampler:
    """The stages of one cycle (module docstring), each part behind its guard."""
    own = SelfMetrics([store.samples, daemon_samples, drill_samples(config),
                       *([trend_state.samples] if trend_state else []),
                       *(action.samples for action in actions.values())])

    def evaluate() -> list[Sample]:
        alerting.evaluate(store.current())
        return alerting.samples()

    def act() -> list[Sample]:  # each hands over and returns at once: the actions work in their own threads
        alerts = alerting.active_alerts()
        pci = dict(collectors.inventory.current.pci_by_device)
        for action in actions.values():
            action.feed(alerts, pci)
        return []

    # The chips first: they publish the cycle's inventory, which every later part of the cycle (host holders,
    # kernel-log attribution, the canary's chips, the plugins, actions) reads, sealed once the stage is over.
    devices, others = collectors.stages()
    stages: list[list[Any]] = [devices, [*others, *([canary] if canary is not None else []), *plugins.values()],
                               [own, Stage("trend", lambda: trend.observe(store.current(), time.time()))],
                               [Stage("alerting", evaluate)]]
    if actions:
        stages.append([Stage("actions", act)])
    sampler = Sampler(stages, store, config.collector_deadline, collectors.inventory)
    own.feeds.insert(0, sampler.samples)
    return sampler


def assemble(config: Config, previous: Parts | None, daemon_samples: SampleFeed) -> Parts:
    """The parts ``config`` runs, reusing ``previous``'s where nothing they are built from changed.

    ``daemon_samples`` gives the daemon's own lifecycle metrics (scheduler, reloads, state, endpoint), which
    the self-metrics collector stores with the rest.  Raises ConfigError, leaving ``previous`` as it was,
    when the config cannot be used.
    """
    web = load_web_config(config.web_config)
    kept_store = _same(previous, config, lambda c: c.store)
    store = kept_store.store if kept_store else SeriesStore(config.store.points_per_series, config.store.max_series,
                                                            kept=PLOTTED)
    trend = _trend(config, previous, store)
    trend_state = _trend_state(config, previous, trend)
    kept_collectors = _same(previous, config, _collectors_key)
    collectors = kept_collectors.collectors if kept_collectors else build_collectors(config)
    try:
        kept_canary = _same(previous, config, lambda c: c.canary)
        canary = kept_canary.canary if kept_canary else build_canary(config, collectors.inventory)
        if canary is not None:
            canary.known_devices = lambda: collectors.inventory.current.devices
        actions = _actions(config, previous)
        if previous is None:
            alerting = Alerting(config, config.state_dir, web.ssl_context is not None)
        else:  # last: it applies whole or raises, changing nothing
            previous.alerting.reconfigure(config, web.ssl_context is not None)
            alerting = previous.alerting
    except BaseException:
        if kept_collectors is None:
            collectors.close()
        raise
    # Last, when nothing can fail any more: a plugin rebuilt closes its predecessor first (a socket path).
    host = collectors.by_name.get("host")
    plugins, _ = build_plugins(config, Context(collectors.inventory, canary, getattr(host, "pods", None)),
                                   previous.plugins if previous is not None else None,
                                   previous.config if previous is not None else None)
    sampler = None
    if previous is not None and previous.config.collector_deadline == config.collector_deadline and all(
            new is old for new, old in ((store, previous.store), (trend, previous.trend),
                                        (collectors, previous.collectors), (canary, previous.canary))) \
            and plugins == previous.plugins and actions == previous.actions:
        sampler = previous.sampler
    if sampler is None:
        sampler = _pipeline(config, store, trend, trend_state, collectors, canary, plugins, alerting, actions,
                            daemon_samples)
        if previous is not None:  # the last cycle ended when it did, whatever a reload rebuilt since
            sampler.last_cycle_end = previous.sampler.last_cycle_end
    return Parts(config, web, store, trend, trend_state, collectors, canary, plugins, alerting, actions, sampler)


def retire(old: Parts, new: Parts) -> None:
    """Release what ``old`` held that ``new`` does not reuse (collectors' descriptors, actions)."""
    kept = {id(c) for c in new.collectors}
    for collector in old.collectors:
        close = getattr(collector, "close", None)
        if id(collector) not in kept and close is not None:
            close()
    for name, action in old.actions.items():
        if new.actions.get(name) is not action:
            action.stop()
    if new.store is not old.store:
        return
    gone = {g.name for g in old.sampler.guards} - {g.name for g in new.sampler.guards}
    for name in gone:
        new.store.forget(name)
