"""``tpuwatch run``: wire collectors, store, scheduler and endpoint; handle signals and reload."""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import math
import os
import platform
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED, JobExecutionEvent
from apscheduler.schedulers.background import BackgroundScheduler

from tpuwatch import __version__, logsetup, sdnotify, statefile
from tpuwatch import config as config_module
from tpuwatch.alerting.service import Alerting
from tpuwatch.analysis.state import SAVE_EVERY_S, TrendStateFile
from tpuwatch.analysis.trend import TrendAnalyzer
from tpuwatch.canary.collector import CanaryCollector
from tpuwatch.canary.runner import kill_running_workers
from tpuwatch.collectors import build_collectors
from tpuwatch.config import Config, Scenario
from tpuwatch.devices import DeviceCollector, sim
from tpuwatch.devices.base import reading_samples
from tpuwatch.exporter import build_registry
from tpuwatch.health import collector_problems, collector_warnings, device_problems, state_warnings
from tpuwatch.kernel_log.collector import KernelLogCollector, event_problems
from tpuwatch.kubernetes import agent as kubernetes_agent
from tpuwatch.sampler import Sampler, Stage
from tpuwatch.samples import Sample, sample
from tpuwatch.schema import ConfigError
from tpuwatch.statedir import StateDir, is_simulated, namespaced, probe_every
from tpuwatch.store import SeriesStore
from tpuwatch.views.page import StatusPage
from tpuwatch.views.sources import StatusSources
from tpuwatch.web import Endpoint, Route
from tpuwatch.webconfig import load_web_config

log = logging.getLogger(__name__)

# Simulated chips come with this much past, so that the leak detector, which
# learns for 2 h, judges the hbm-leak drill from the first minute.
SIM_HISTORY_S = 3 * 3600.0
SIM_HISTORY_STEP_S = 10.0

_SCHEDULER_EVENTS = {EVENT_JOB_ERROR: "error", EVENT_JOB_MISSED: "missed", EVENT_JOB_MAX_INSTANCES: "max_instances"}


def _build_sampler(config: Config, store: SeriesStore, canary: CanaryCollector | None, trend: TrendAnalyzer,
                   alerts: Stage) -> Sampler:
    collectors, _ = build_collectors(config)
    derived = [Stage("trend", lambda samples: trend.observe(samples, time.time()), store.current), alerts]
    return Sampler([*collectors, *([canary] if canary else [])], store, config.collector_deadline, derived)


def _trend(config: Config, store: SeriesStore | None = None) -> TrendAnalyzer:
    """The trend analyzer; with simulated chips, already fed with their simulated history, which also goes into
    ``store``'s history as far back as it keeps (the status page plots what the detectors judged)."""
    trend = TrendAnalyzer(config.trend)
    if is_simulated(config):
        now = time.time()
        kept = config.store.points_per_series * config.interval
        for offset, readings in sim.history(config.devices.sim, SIM_HISTORY_S, SIM_HISTORY_STEP_S):
            samples = [s for r in readings for s in reading_samples(r, sim.SimBackend.name)]
            trend.observe(samples, now + offset)
            if store is not None and -offset <= kept:
                store.replace("devices", samples, now + offset)
        if store is not None:
            store.forget("devices")  # the past is history only: current readings are the first cycle's
    return trend


def _carry_over(old: TrendAnalyzer, new: TrendAnalyzer) -> None:
    """Hand what ``old``'s detectors learned to ``new``; if that fails, ``new`` learns afresh (logged)."""
    now = time.time()
    try:
        new.restore(old.snapshot(now), now)
    except Exception as exc:  # a reload must never fail on this
        log.warning("trend detectors learn afresh after the reload: %s", exc)


def _trend_key(config: Config) -> tuple[Any, ...]:
    """What the trend analyzer is built from: a change means a new one (real chips keep their learned floors)."""
    return config.trend, config.devices.sim if is_simulated(config) else None


def _evaluate(alerting: Alerting, samples: list[Sample]) -> list[Sample]:
    alerting.evaluate(samples)
    return alerting.samples()


def _sampling_section(config: Config) -> tuple[Any, ...]:
    return (config.devices, config.paths, config.host, config.collector_deadline, config.canary,
            config.kernel_log, config.state_dir)


def _canary(config: Config, store: Callable[[], SeriesStore]) -> CanaryCollector | None:
    if not config.canary.enabled:
        return None
    if config.canary.python is None and importlib.util.find_spec("jax") is None:
        log.warning("canary off: jax is not installed for %s (pip install 'tpuwatch[canary]', or point "
                    "canary.python at an interpreter with jax)", sys.executable)
        return None
    return CanaryCollector(config, lambda: {dict(s.labels)["device"] for s in store().current()
                                            if s.name == "tpuwatch_device_up"})


def _canary_drill(config: Config) -> dict[str, Any]:
    """With simulated chips: as many CPU devices as chips, and the sdc scenario's corruption on its chip."""
    if config.devices.backend != "sim":
        return {}
    sim = config.devices.sim
    drill: dict[str, Any] = {"env": {"XLA_FLAGS": f"--xla_force_host_platform_device_count={sim.count}"}}
    if sim.scenario == "sdc":
        drill |= {"inject": "scale", "inject_device": sim.fault_device}
    return drill


class Daemon:
    """The long-running service.  ``start()``, then ``wait()`` until a signal stops it.

    It holds its state directory's lock (``statedir.InUse`` if another daemon has it) and keeps monitoring
    whatever the state's condition: a state_dir that cannot be written means state kept in memory (degraded).
    Simulated chips keep their state in ``state_dir/simulated``.
    """

    def __init__(self, config: Config, config_path: str | None, simulate: Scenario | None = None) -> None:
        config = namespaced(config)
        self.state = StateDir(config.state_dir)
        self.state.open()  # before anything reads state
        self.config = config
        self.config_path = config_path
        self.simulate = simulate  # ``--simulate``: applied again to every reloaded config
        self.started_at = time.time()
        self.store = SeriesStore(config.store.points_per_series, config.store.max_series)
        self.canary = _canary(config, self._current_store)
        self.trend = _trend(config, self.store)
        # Simulated chips neither read nor write the learned state of the host's real ones.
        self.trend_state = None if is_simulated(config) else TrendStateFile(config.state_dir)
        if self.trend_state is not None:
            self.trend_state.restore(self.trend, time.time())
        self.alerting = Alerting(config, config.state_dir)
        self._keep_state_where_it_can_be()
        self.kubernetes = kubernetes_agent.build(config)
        # The alert rules also see tpuwatch's own metrics (collector_success, for one).
        self._alert_stage = Stage("alerting", self._evaluate_alerts,
                                  lambda: [*self.store.current(), *self.self_samples()])
        self.sampler = _build_sampler(config, self.store, self.canary, self.trend, self._alert_stage)
        self.scheduler_events: Counter[str] = Counter()
        self.reload_ok = True
        self.reload_success_at = self.started_at
        self._stop = threading.Event()
        self._reload_requested = threading.Event()
        # Before anything is served: a signal that comes during start-up is honoured, not fatal.
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        signal.signal(signal.SIGHUP, self._on_reload_signal)
        self._scheduler = BackgroundScheduler(timezone="UTC")
        self._scheduler.add_listener(self._on_job_event, EVENT_JOB_ERROR | EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES)
        self.registry = build_registry(lambda: self.store.current(), self.self_samples,
                                       lambda: self.endpoint.samples())
        self.status_page = StatusPage(StatusSources(
            current=lambda: self.store.current(), history=lambda name, labels: self.store.history(name, labels),
            readings=self._device_readings, window=lambda: self.config.store.points_per_series * self.config.interval,
            health=self.health, leak=lambda labels, since: self.trend.leak_view(labels, since),
            canary=lambda: self.canary.results() if self.canary else [],
            kernel_events=lambda: kernel_log.recent_events() if (kernel_log := self._kernel_log()) else [],
            alerts=self.alerting.active_alerts, interval=lambda: self.config.interval),
            cycle=lambda: self.sampler.last_cycle_end)
        self.endpoint = Endpoint(config.listen, self.registry, self._routes(), load_web_config(config.web_config))

    # --- lifecycle -------------------------------------------------------

    def start(self) -> None:
        """First sample, then the schedule; tells systemd READY=1."""
        self._sample()
        self._schedule()
        self._scheduler.start()
        self.alerting.start()
        if self.kubernetes is not None:
            self.kubernetes.start()
        log.info("tpuwatch %s serving %s://%s/metrics, sampling every %ss",
                 __version__, self.endpoint.scheme, self.config.listen, f"{self.config.interval:g}")
        sdnotify.notify("READY=1", f"STATUS={self._status_line()}")

    def wait(self) -> None:
        """Block until SIGTERM/SIGINT, performing reloads on SIGHUP."""
        while not self._stop.is_set():
            self._stop.wait(1.0)
            if self._reload_requested.is_set():
                self._reload_requested.clear()
                self.reload()

    def stop(self) -> None:
        """Stop sampling and serving; does not wait for hung collectors."""
        sdnotify.notify("STOPPING=1")
        self._scheduler.shutdown(wait=False)
        self._save_trend()
        kill_running_workers()
        self.alerting.stop()
        if self.kubernetes is not None:
            self.kubernetes.stop()
        self.endpoint.close()
        self.state.close()
        log.info("tpuwatch stopped")

    def reload(self) -> bool:
        """Re-read the config file; a bad one is refused and the running config kept."""
        sdnotify.notify("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")
        try:
            new = config_module.load(self.config_path)
            if self.simulate:
                new = config_module.simulated(new, self.simulate)
            new = self._pin_state_dir(namespaced(new))
            web = load_web_config(new.web_config)
            canary = _canary(new, self._current_store) if new.canary != self.config.canary else self.canary
            trend = self.trend
            if _trend_key(new) != _trend_key(self.config):
                trend = _trend(new)
                if not is_simulated(new) and not is_simulated(self.config):  # real chips keep what they have learned
                    _carry_over(self.trend, trend)
            store = self.store
            if new.store != self.config.store:
                store = SeriesStore(new.store.points_per_series, new.store.max_series)
            sampler = self.sampler
            if (store is not self.store or trend is not self.trend
                    or _sampling_section(new) != _sampling_section(self.config)):
                sampler = _build_sampler(new, store, canary, trend, self._alert_stage)
            endpoint = self.endpoint
            if new.listen != self.config.listen:
                endpoint = Endpoint(new.listen, self.registry, self._routes(), web)
            kubernetes = self.kubernetes
            if new.kubernetes != self.config.kubernetes or new.state_dir != self.config.state_dir:
                kubernetes = kubernetes_agent.build(dataclasses.replace(new, state_dir=self.config.state_dir))
            try:
                self.alerting.reconfigure(new)  # last: it either applies whole or raises, changing nothing
            except ConfigError:
                if endpoint is not self.endpoint:
                    endpoint.close()
                raise
        except (ConfigError, RuntimeError) as exc:
            self.reload_ok = False
            log.error("reload refused, keeping the running config: %s", exc)
            sdnotify.notify("READY=1", "STATUS=reload refused: keeping the running config")
            return False
        if endpoint is not self.endpoint:
            self.endpoint.close()
            self.endpoint = endpoint
        else:
            self.endpoint.set_web_config(web)
        logsetup.configure(new.log_level)
        if sampler is not self.sampler:
            self.sampler.close()
            if store is self.store:
                for guard in self.sampler.guards:
                    store.forget(guard.name)
        self.canary, self.trend, self.store, self.sampler = canary, trend, store, sampler
        if kubernetes is not self.kubernetes:
            if self.kubernetes is not None:
                self.kubernetes.stop()
            self.kubernetes = kubernetes
            if kubernetes is not None:
                kubernetes.start()
        self.config = new
        self._schedule()
        self.reload_ok, self.reload_success_at = True, time.time()
        log.info("config reloaded from %s", self.config_path or "defaults")
        sdnotify.notify("READY=1", f"STATUS={self._status_line()}")
        return True

    def _pin_state_dir(self, new: Config) -> Config:
        """``new`` with the running state_dir: it changes at the next start; refused across simulated and real."""
        if is_simulated(new) != is_simulated(self.config):
            raise ConfigError("devices.backend", "switching between simulated and real chips needs a restart "
                                                 "(they keep their state apart)")
        if new.state_dir != self.config.state_dir:
            log.warning("state_dir %s takes effect at the next start; state stays in %s", new.state_dir,
                        self.config.state_dir)
        return dataclasses.replace(new, state_dir=self.config.state_dir)

    # --- jobs ------------------------------------------------------------

    def _schedule(self) -> None:
        grace = math.ceil(self.config.interval)
        self._scheduler.add_job(self._sample, "interval", seconds=self.config.interval, id="sample",
                                replace_existing=True, coalesce=True, max_instances=1, misfire_grace_time=grace)
        self._schedule_canary()
        self._scheduler.add_job(self._probe_state, "interval", seconds=probe_every(self.config.interval),
                                id="state-probe", replace_existing=True, coalesce=True, max_instances=1)
        if self.trend_state is not None and self._scheduler.get_job("trend-save") is None:  # a reload keeps its pace
            self._scheduler.add_job(self._save_trend, "interval", seconds=SAVE_EVERY_S, id="trend-save",
                                    coalesce=True, max_instances=1)
        ping = sdnotify.watchdog_interval()
        if ping is not None:
            self._scheduler.add_job(self._watchdog, "interval", seconds=ping, id="watchdog", replace_existing=True,
                                    coalesce=True, max_instances=1, misfire_grace_time=math.ceil(ping))

    def _schedule_canary(self) -> None:
        existing = self._scheduler.get_job("canary")
        if self.canary is None or self.sampler.guard("devices") is None:
            if existing:
                existing.remove()
            if self.canary is not None:
                log.info("canary not scheduled: no accelerator (`tpuwatch canary` runs it by hand on the CPU)")
            return
        every = self.config.canary.every
        first = None if existing else datetime.now(timezone.utc)  # the first run right away, then every period
        self._scheduler.add_job(self._run_canary, "interval", seconds=every, jitter=self.config.canary.jitter,
                                id="canary", replace_existing=True, coalesce=True, max_instances=1,
                                misfire_grace_time=math.ceil(every), **({"next_run_time": first} if first else {}))

    def _run_canary(self) -> None:
        canary = self.canary
        if canary is not None:
            canary.run_once(**_canary_drill(self.config))

    def _sample(self) -> None:
        self.sampler.run_once()
        self.registry.render()

    def _evaluate_alerts(self, samples: list[Sample]) -> list[Sample]:
        out = _evaluate(self.alerting, samples)
        if self.kubernetes is not None:  # hands over and returns at once; the agent's thread does the calls
            self.kubernetes.feed(self.alerting.active_alerts(), kubernetes_agent.pci_map(self._device_readings()))
        return out

    def _current_store(self) -> SeriesStore:
        return self.store

    def _save_trend(self) -> None:
        if self.trend_state is not None and not is_simulated(self.config):
            self.trend_state.save(self.trend, time.time())

    def _probe_state(self) -> None:
        was_writable = self.state.writable
        self.state.refresh()
        if self.state.writable and not was_writable:
            statefile.LEDGER.forget_failures()
        self._keep_state_where_it_can_be()

    def _keep_state_where_it_can_be(self) -> None:
        """The alerting database in memory while state_dir cannot be written, back in its file once it can."""
        db = self.alerting.db
        if not self.state.writable:
            db.use_memory(f"state_dir {self.state.path} cannot be written: {self.state.reason}")
        elif db.in_memory and db.use_file():
            log.info("alert state and outbox written back to %s", db.path)

    def _watchdog(self) -> None:
        if self._sampling_fresh():
            sdnotify.notify("WATCHDOG=1", f"STATUS={self._status_line()}")

    def _on_job_event(self, event: JobExecutionEvent) -> None:
        name = _SCHEDULER_EVENTS.get(event.code, "other")
        self.scheduler_events[name] += 1
        if event.code == EVENT_JOB_ERROR:
            log.error("job %s failed: %s", event.job_id, event.exception)
        else:
            log.warning("job %s %s", event.job_id, name.replace("_", " "))

    def _on_stop_signal(self, signum: int, frame: object) -> None:
        self._stop.set()

    def _on_reload_signal(self, signum: int, frame: object) -> None:
        self._reload_requested.set()

    # --- views -----------------------------------------------------------

    def _sampling_fresh(self) -> bool:
        last = self.sampler.last_cycle_end
        return last is not None and time.time() - last <= 3 * self.config.interval + self.config.collector_deadline

    def _device_readings(self) -> list[Any]:
        guard = self.sampler.guard("devices")
        return guard.collector.last_readings if guard and isinstance(guard.collector, DeviceCollector) else []

    def _kernel_log(self) -> KernelLogCollector | None:
        guard = self.sampler.guard("kernel_log")
        return guard.collector if guard and isinstance(guard.collector, KernelLogCollector) else None

    def _status_line(self) -> str:
        devices = self._device_readings()
        up = sum(1 for r in devices if r.up)
        problems = device_problems(devices) + collector_problems(self.sampler.guards)
        state = f"{len(problems)} problem(s)" if problems else "healthy"
        return f"{up}/{len(devices)} devices up, {state}"

    def _routes(self) -> dict[str, Route]:
        return {"/healthz": self._health_route, "/api/alerts": lambda: (200, self.alerting.api_payload()),
                "/api/kubernetes": self._kubernetes_route, **self.status_page.routes()}

    def _kubernetes_route(self) -> tuple[int, dict[str, Any]]:
        if self.kubernetes is None:
            return 404, {"status": "error", "error": "kubernetes.node_conditions is off"}
        return 200, self.kubernetes.api_payload()

    def _health_route(self) -> tuple[int, dict[str, Any]]:
        healthy, report = self.health()
        return (200 if healthy else 503), report

    def health(self) -> tuple[bool, dict[str, Any]]:
        """(healthy, report) for /healthz: healthy means tpuwatch itself can monitor."""
        last = self.sampler.last_cycle_end
        checks: dict[str, Any] = {
            "sampling": {"status": "ok" if self._sampling_fresh() else "stale",
                         "last_sample_age_seconds": round(time.time() - last, 3) if last else None},
            "config": {"status": "ok" if self.reload_ok else "reload_failed"},
        }
        for guard in self.sampler.guards:
            status = {True: "ok", False: "failing", None: "pending"}[guard.status.success]
            checks[f"collector:{guard.name}"] = {
                "status": "degraded" if status == "ok" and guard.status.degraded else status,
                "duration_seconds": round(guard.status.duration_seconds, 6),
                "error": guard.status.last_error,
                **({"degraded": guard.status.degraded} if guard.status.degraded else {}),
            }
        problems = device_problems(self._device_readings())
        checks["devices"] = {"status": "problems" if problems else "ok", "problems": problems}
        kernel_log = self._kernel_log()
        if kernel_log is not None:
            events = kernel_log.recent_events()
            critical = event_problems(events)
            checks["kernel_log"] = {"status": "critical_events" if critical else "ok",
                                    "recent_events": [e.to_json() for e in events]}
        checks["state"] = self._state_check()
        healthy = self._sampling_fresh() and all(g.status.success for g in self.sampler.guards)
        warnings = collector_warnings(self.sampler.guards) + checks["state"]["warnings"]
        report = {"status": ("degraded" if warnings else "healthy") if healthy else "unhealthy",
                  "warnings": warnings,
                  "uptime_seconds": round(time.time() - self.started_at, 3),
                  "version": __version__, "checks": checks}
        return healthy, report

    def _state_check(self) -> dict[str, Any]:
        failing, discarded, _ = statefile.LEDGER.view()
        warnings = state_warnings(self.state.path, self.state.reason, self.alerting.state_problem, failing,
                                  discarded, time.time())
        return {"status": "degraded" if warnings else "ok", "dir": self.state.path,
                "writable": self._state_writable(), "reason": self.state.reason,
                "alerting_db": "memory" if self.alerting.db.in_memory else "file", "warnings": warnings,
                "discarded": [{"file": path, "at": at, "reason": why} for at, path, why in discarded]}

    def _state_writable(self) -> bool:
        return self.state.writable and not self.alerting.db.in_memory

    def self_samples(self) -> list[Sample]:
        """tpuwatch's own metrics: collectors, scheduler, store, config, build."""
        out = [sample("tpuwatch_build_info", 1, version=__version__, python=platform.python_version())]
        for guard in self.sampler.guards:
            status, name = guard.status, guard.name
            if status.success is not None:
                out.append(sample("tpuwatch_collector_success", 1 if status.success else 0, collector=name))
                out.append(sample("tpuwatch_collector_duration_seconds", status.duration_seconds, collector=name))
                out.append(sample("tpuwatch_collector_samples", status.samples, collector=name))
            out += [sample("tpuwatch_collector_errors_total", n, collector=name, reason=r)
                    for r, n in status.errors.items()]
            out += [sample("tpuwatch_readings_dropped_total", n, collector=name, reason=r)
                    for r, n in status.dropped.items()]
        out += [sample("tpuwatch_scheduler_events_total", self.scheduler_events[e], event=e)
                for e in _SCHEDULER_EVENTS.values()]
        if self.sampler.last_cycle_end is not None:
            out.append(sample("tpuwatch_last_sample_timestamp_seconds", self.sampler.last_cycle_end))
        out.append(sample("tpuwatch_store_series", self.store.series_count()))
        out.append(sample("tpuwatch_store_evicted_series_total", self.store.evicted_total))
        if self.trend_state is not None:
            out.append(sample("tpuwatch_trend_state_save_failures_total", self.trend_state.save_failures))
        out.append(sample("tpuwatch_state_writable", 1 if self._state_writable() else 0))
        discarded = statefile.LEDGER.view()[2]
        out += [sample("tpuwatch_state_files_discarded_total", n, file=os.path.relpath(path, self.state.path))
                for path, n in sorted(discarded.items())]
        out += self.kubernetes.samples() if self.kubernetes is not None else []
        out.append(sample("tpuwatch_config_last_reload_successful", 1 if self.reload_ok else 0))
        out.append(sample("tpuwatch_config_last_reload_success_timestamp_seconds", self.reload_success_at))
        return out
