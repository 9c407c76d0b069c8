"""``tpuwatch run``: the lifecycle: the state directory, the parts, the schedule, the endpoint, signals, reload.

What runs is built by ``tpuwatch.assembly`` (the same function at start and
on reload); what /healthz says comes from ``tpuwatch.health``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED, JobExecutionEvent
from apscheduler.schedulers.background import BackgroundScheduler

from tpuwatch import __version__, health, logsetup, sdnotify, statefile
from tpuwatch import config as config_module
from tpuwatch.analysis.state import SAVE_EVERY_S
from tpuwatch.assembly import Parts, assemble, retire
from tpuwatch.canary.runner import kill_running_workers
from tpuwatch.config import Config
from tpuwatch.drills.needs import blocked_drills
from tpuwatch.drills.simulate import canary_drill, is_simulated, namespaced
from tpuwatch.exporter import build_registry
from tpuwatch.malloc import Trimmer
from tpuwatch.registry import ACTIONS, close
from tpuwatch.samples import Sample, sample
from tpuwatch.schema import ConfigError
from tpuwatch.statedir import StateDir, probe_every
from tpuwatch.views.page import StatusPage
from tpuwatch.views.readers import StatusReaders
from tpuwatch.web import Endpoint, Route

log = logging.getLogger(__name__)

JOB_EVENT_LOG_EVERY_S = 600.0  # a repeating missed, skipped or failed run is logged at most this often
_SCHEDULER_EVENTS = {EVENT_JOB_ERROR: "error", EVENT_JOB_MISSED: "missed", EVENT_JOB_MAX_INSTANCES: "max_instances"}


class Daemon:
    """The long-running service.  ``start()``, then ``wait()`` until a signal stops it.

    It holds its state directory's lock (``statedir.InUse`` if another daemon has it) and keeps monitoring
    whatever the state's condition: a state_dir that cannot be written means state kept in memory (degraded).
    Simulated chips keep their state in ``state_dir/simulated``.
    """

    def __init__(self, config: Config, config_path: str | None,
                 flags: Callable[[Config], Config] = lambda config: config) -> None:
        config = namespaced(config)
        self.state = StateDir(config.state_dir)
        self.state.open()  # before anything reads state
        self.config_path = config_path
        self.flags = flags  # what the command line changes (--simulate, --listen...): applied to every reload
        self.started_at = time.time()
        self.scheduler_events: Counter[str] = Counter()
        self._job_events_logged = logsetup.Sparse(JOB_EVENT_LOG_EVERY_S)
        self.reload_ok = True
        self.reload_error: str | None = None  # why the last reload was refused
        self.reload_success_at = self.started_at
        self.parts: Parts = assemble(config, None, self._lifecycle_samples)
        self._keep_state_where_it_can_be()
        self._stop = threading.Event()
        self._reload_requested = threading.Event()
        # Before anything is served: a signal that comes during start-up is honoured, not fatal.
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        signal.signal(signal.SIGHUP, self._on_reload_signal)
        self._scheduler = BackgroundScheduler(timezone="UTC")
        self._scheduler.add_listener(self._on_job_event, EVENT_JOB_ERROR | EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES)
        self.registry = build_registry(lambda: self.parts.store.current())
        self._trim = Trimmer()  # freed memory back to the system after cycles and page builds: RSS follows what is held
        self.status_page = StatusPage(self._status_readers(), cycle=lambda: self.parts.sampler.last_cycle_end,
                                      after_build=self._trim)
        self.endpoint = Endpoint(config.listen, self.registry, self._routes(), self.parts.web)
        self._first_cycle = threading.Event()
        self._wire_kernel_log()

    @property
    def config(self) -> Config:
        """The running config."""
        return self.parts.config

    # --- lifecycle -------------------------------------------------------

    def start(self) -> None:
        """First sample, then the schedule; tells systemd READY=1."""
        self._sample()
        for drill in blocked_drills(self.parts.store.current()):
            log.warning("%s", drill.sentence())
        self._first_cycle.set()  # the kernel log's follower reads from here: the chips to attribute events to known
        self._schedule()
        self._scheduler.start()
        self.parts.alerting.start()
        for action in self.parts.actions.values():
            action.start()
        log.info("tpuwatch %s serving %s://%s/metrics, sampling every %ss",
                 __version__, self.endpoint.scheme, self.config.listen, f"{self.config.interval:g}")
        sdnotify.notify("READY=1", f"STATUS={health.status_line(self.parts)}")

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
        self.parts.alerting.stop()
        for action in self.parts.actions.values():
            action.stop()
        if (kernel_log := self.parts.collectors.kernel_log) is not None:
            kernel_log.close()  # its follower stops and saves its position
        for plugin in self.parts.plugins.values():
            close(plugin)  # its threads stop, its socket is removed
        self.endpoint.close()
        self.state.close()
        log.info("tpuwatch stopped")

    def reload(self) -> bool:
        """Re-read the config file; a bad one is refused and the running config kept."""
        sdnotify.notify("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")
        try:
            new = self._pin_state_dir(namespaced(self.flags(config_module.load(self.config_path))))
            endpoint = self.endpoint
            if new.listen != self.config.listen:  # before anything else changes: a taken port refuses the reload
                endpoint = Endpoint(new.listen, self.registry, self._routes(), self.parts.web)
            try:
                parts = assemble(new, self.parts, self._lifecycle_samples)
            except BaseException:
                if endpoint is not self.endpoint:
                    endpoint.close()
                raise
        except (ConfigError, RuntimeError) as exc:
            self.reload_ok, self.reload_error = False, str(exc)
            log.error("reload refused, keeping the running config: %s", exc)
            sdnotify.notify("READY=1", "STATUS=reload refused: keeping the running config")
            return False
        old, self.parts = self.parts, parts
        retire(old, parts)
        self._wire_kernel_log()
        for name, action in parts.actions.items():
            if old.actions.get(name) is not action:
                action.start()
        if endpoint is not self.endpoint:
            self.endpoint.close()
            self.endpoint = endpoint
        self.endpoint.set_web_config(parts.web)
        logsetup.configure(new.log_level)
        self._schedule()
        self.reload_ok, self.reload_error, self.reload_success_at = True, None, time.time()
        log.info("config reloaded from %s", self.config_path or "defaults")
        sdnotify.notify("READY=1", f"STATUS={health.status_line(self.parts)}")
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

    def _every(self, job: Callable[[], None], seconds: float, job_id: str, **options: Any) -> None:
        """Run ``job`` every ``seconds``; a job already scheduled keeps its next run (at most ``seconds`` away), so
        that reloads coming faster than the interval never postpone it (sampling, the watchdog's ping)."""
        existing = self._scheduler.get_job(job_id)
        if existing is not None and existing.next_run_time is not None:
            options["next_run_time"] = min(existing.next_run_time,
                                           datetime.now(timezone.utc) + timedelta(seconds=seconds))
        self._scheduler.add_job(job, "interval", seconds=seconds, id=job_id, replace_existing=True, coalesce=True,
                                max_instances=1, **options)

    def _schedule(self) -> None:
        self._every(self._sample, self.config.interval, "sample", misfire_grace_time=math.ceil(self.config.interval))
        self._schedule_canary()
        self._every(self._probe_state, probe_every(self.config.interval), "state-probe")
        if self.parts.trend_state is not None and self._scheduler.get_job("trend-save") is None:  # keeps its pace
            self._scheduler.add_job(self._save_trend, "interval", seconds=SAVE_EVERY_S, id="trend-save",
                                    coalesce=True, max_instances=1)
        ping = sdnotify.watchdog_interval()
        if ping is not None:
            self._every(self._watchdog, ping, "watchdog", misfire_grace_time=math.ceil(ping))

    def _schedule_canary(self) -> None:
        existing = self._scheduler.get_job("canary")
        canary = self.parts.canary
        if canary is None or canary.runnable is not None or self.parts.collectors.devices is None:
            if existing:
                existing.remove()
            if canary is not None and canary.runnable is None:
                log.info("canary not scheduled: no accelerator (`tpuwatch canary` runs it by hand on the CPU)")
            return
        every = self.config.canary.every
        first = None if existing else datetime.now(timezone.utc)  # the first run right away, then every period
        self._scheduler.add_job(self._run_canary, "interval", seconds=every, jitter=self.config.canary.jitter,
                                id="canary", replace_existing=True, coalesce=True, max_instances=1,
                                misfire_grace_time=math.ceil(every), **({"next_run_time": first} if first else {}))

    def _run_canary(self) -> None:
        canary = self.parts.canary
        if canary is not None:
            canary.run_once(**canary_drill(self.config))

    def _sample(self) -> None:
        self.parts.sampler.run_once()
        self.registry.render()
        self._trim()

    def _wire_kernel_log(self) -> None:
        """Start the kernel log's follower (from the first cycle on); each cycle's collection takes what it read."""
        kernel_log = self.parts.collectors.kernel_log
        if kernel_log is not None:
            kernel_log.start(after=self._first_cycle)

    def _save_trend(self) -> None:
        parts = self.parts
        if parts.trend_state is not None:
            parts.trend_state.save(parts.trend, time.time())

    def _probe_state(self) -> None:
        was_writable = self.state.writable
        self.state.refresh()
        if self.state.writable and not was_writable:
            statefile.LEDGER.forget_failures()
        self._keep_state_where_it_can_be()

    def _keep_state_where_it_can_be(self) -> None:
        """The alerting database in memory while state_dir cannot be written, back in its file once it can."""
        db = self.parts.alerting.db
        if not self.state.writable:
            db.use_memory(f"state_dir {self.state.path} cannot be written: {self.state.reason}")
        elif db.in_memory and db.use_file():
            log.info("alert state and outbox written back to %s", db.path)

    def _watchdog(self) -> None:
        if health.sampling_fresh(self.parts, time.time()):
            sdnotify.notify("WATCHDOG=1", f"STATUS={health.status_line(self.parts)}")

    def _on_job_event(self, event: JobExecutionEvent) -> None:
        name = _SCHEDULER_EVENTS.get(event.code, "other")
        self.scheduler_events[name] += 1
        count = self._job_events_logged((event.job_id, name), time.monotonic())
        if count is None:
            return
        times = "" if count == 1 else f" ({count} times in the last {JOB_EVENT_LOG_EVERY_S / 60:g} min)"
        if event.code == EVENT_JOB_ERROR:
            log.error("job %s failed: %s%s", event.job_id, event.exception, times)
        else:
            log.warning("job %s %s%s; tpuwatch_scheduler_events_total counts them", event.job_id,
                        name.replace("_", " "), times)

    def _on_stop_signal(self, signum: int, frame: object) -> None:
        self._stop.set()

    def _on_reload_signal(self, signum: int, frame: object) -> None:
        self._reload_requested.set()

    # --- what the endpoint serves ------------------------------------------

    def _status_readers(self) -> StatusReaders:
        """What the status page reads, always of the running parts."""
        parts = lambda: self.parts  # noqa: E731 - a reload replaces the parts: read them at each call

        def kernel_events() -> list[Any]:
            kernel_log = parts().collectors.kernel_log
            return kernel_log.recent_events() if kernel_log is not None else []

        return StatusReaders(
            current=lambda: parts().store.current(), history=lambda name, labels: parts().store.history(name, labels),
            readings=lambda: parts().device_readings(),
            window=lambda: parts().config.store.points_per_series * parts().config.interval,
            health=lambda: health.health_report(parts(), self.state, self.reload_ok, self.started_at,
                                                self.reload_error),
            leak=lambda labels, since: parts().trend.leak_view(labels, since),
            canary=lambda: canary.results() if (canary := parts().canary) is not None else [],
            kernel_events=kernel_events, alerts=lambda: parts().alerting.active_alerts(),
            interval=lambda: parts().config.interval)

    def _routes(self) -> dict[str, Route]:
        routes: dict[str, Route] = {"/healthz": self._health_route,
                                    "/api/alerts": lambda: (200, self.parts.alerting.api_payload()),
                                    **self.status_page.routes()}
        for name in ACTIONS:
            routes[f"/api/{name}"] = functools.partial(self._action_route, name)
        return routes

    def _action_route(self, name: str) -> tuple[int, dict[str, Any]]:
        action = self.parts.actions.get(name)
        if action is None:
            return 404, {"status": "error", "error": ACTIONS[name].off}
        return 200, action.api_payload()

    def _health_route(self) -> tuple[int, dict[str, Any]]:
        healthy, report = health.health_report(self.parts, self.state, self.reload_ok, self.started_at,
                                               self.reload_error)
        return (200 if healthy else 503), report

    def _lifecycle_samples(self) -> list[Sample]:
        """The daemon's own metrics (scheduler, state, endpoint, reloads), stored by the self-metrics collector."""
        out = [sample("tpuwatch_scheduler_events_total", self.scheduler_events[e], event=e)
               for e in _SCHEDULER_EVENTS.values()]
        out.append(sample("tpuwatch_state_writable", 1 if health.state_writable(self.parts, self.state) else 0))
        discarded = statefile.LEDGER.view()[2]
        out += [sample("tpuwatch_state_files_discarded_total", n, file=os.path.relpath(path, self.state.path))
                for path, n in sorted(discarded.items())]
        out += self.endpoint.samples()
        out.append(sample("tpuwatch_config_last_reload_successful", 1 if self.reload_ok else 0))
        out.append(sample("tpuwatch_config_last_reload_success_timestamp_seconds", self.reload_success_at))
        return out
