"""The ``Alerting`` facade the daemon drives: evaluate after each sampling cycle, deliver in the background."""

from __future__ import annotations

import ipaddress
import logging
import operator
import socket
import threading
import time
from collections.abc import Iterable
from typing import Any

from tpuwatch.alerting import runbooks
from tpuwatch.alerting.database import OutboxFull
from tpuwatch.alerting.dbopen import open_db
from tpuwatch.alerting.delivery import Delivery
from tpuwatch.alerting.dispatch import Dispatcher
from tpuwatch.alerting.rules import (
    LOOKBACK_S,
    THRESHOLD_SETTINGS,
    CompiledRule,
    Rule,
    load_rules,
    tracks,
)
from tpuwatch.alerting.state import Alert, AlertBook, Changes
from tpuwatch.alerting.template import human_duration
from tpuwatch.alerting.tracker import Tracker
from tpuwatch.config import Config
from tpuwatch.hw.procfs import read_boot_id
from tpuwatch.logsetup import redact_data
from tpuwatch.notifiers import Notifier, build_notifiers
from tpuwatch.samples import Sample, sample
from tpuwatch.syntax import parse_listen_address

log = logging.getLogger(__name__)

MAX_PCI_ENTRIES = 4096
# alerting.runbook_base_url's default before the endpoint served runbooks, written out in the .deb's
# /etc/tpuwatch/config.yaml: the docs there have no page per alert name, so it stands for the default now.
OLD_DEFAULT_RUNBOOK_BASE = "file:///usr/share/doc/tpuwatch/"
_SEVERITY_LEVEL = {"critical": logging.ERROR}


def own_url(config: Config, tls: bool) -> str:
    """The endpoint's URL as others reach it: ``listen``'s address, or the host's name where it listens on every
    address (``0.0.0.0``, ``::``)."""
    host, port = parse_listen_address(config.listen)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # a name
        address = None
    if not host or (address is not None and address.is_unspecified):
        host = socket.gethostname()
    elif address is not None and address.version == 6:
        host = f"[{host}]"
    return f"{'https' if tls else 'http'}://{host}:{port}"


def runbook_base(config: Config, tls: bool) -> str:
    """Where runbook links point: ``alerting.runbook_base_url``, or the endpoint's own /runbooks/."""
    base = config.alerting.runbook_base_url
    return own_url(config, tls) + runbooks.PREFIX if base in (None, OLD_DEFAULT_RUNBOOK_BASE) else base


def rules_and_notifiers(config: Config, tls: bool = False) -> tuple[list[Rule], list[Notifier]]:
    """The alert rules and notifiers ``config`` asks for, reading rule and secret files; ConfigError on a problem.

    ``tls``: whether the endpoint serves https, for the runbook links to the endpoint itself.
    """
    section = config.alerting
    if not section.enabled:
        return [], []
    settings = {name: float(operator.attrgetter(name)(config)) for name in THRESHOLD_SETTINGS}
    return (load_rules(section.default_rules, section.rule_files, settings, runbook_base(config, tls)),
            build_notifiers(config.notify, section.send_timeout))


def boot_id(procfs: str) -> str:
    """This boot's id (a driver's counters start again at every boot); "" when it cannot be read."""
    try:
        return read_boot_id(procfs)
    except (OSError, ValueError):
        return ""


def describe(alert: Alert) -> str:
    """``AcceleratorLost (critical) on device 3, pci 0000:13:00.0``: what and where, for log lines."""
    labels = alert.labels
    where = f" on device {labels['device']}" if labels.get("device") else f" on host {labels.get('host', '?')}"
    if labels.get("pci"):
        where += f", pci {labels['pci']}"
    return f"{labels.get('alertname', '?')} ({labels.get('severity', '?')}){where}"


def _inventory(samples: list[Sample]) -> set[str] | None:
    """The chips the device backend reported this cycle, or None when it did not answer in full."""
    answered = any(s.name == "tpuwatch_collector_success" and s.labels == (("collector", "devices"),) and s.value == 1
                   for s in samples)
    if not answered:
        return None
    return {dict(s.labels).get("device", "") for s in samples if s.name == "tpuwatch_device_info"}


class Alerting:
    """Rules, alert state and durable delivery.

    ``evaluate()`` only computes and writes SQLite (never the network); a
    dispatcher thread queues due notifications and one thread per receiver
    delivers them, between ``start()`` and ``stop()``.  Construction raises
    ConfigError for a bad rule file or an unreadable secret; a corrupt
    database is moved aside and one that cannot be written is kept in memory
    (``state_problem`` says why).  ``tls`` says whether the endpoint serves
    https, for the links to it (runbooks, the notifications' externalURL).
    """

    def __init__(self, config: Config, state_dir: str, tls: bool = False) -> None:
        self.host = socket.gethostname()
        self.db = open_db(state_dir, config.alerting.outbox_max_bytes, repair=True)
        self.book = AlertBook(self.db.load_alerts())
        self.tracker = Tracker(boot_id(config.paths.procfs))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._refusing = False
        self._unsaved = False
        self._unsaved_moves: list[tuple[str, str]] = []
        # Chips' PCI addresses, first from the alerts that name them, so that held alerts keep their labels.
        self._pci = {a.labels["device"]: a.labels["pci"] for a in self.book.alerts.values()
                     if a.labels.get("device") and a.labels.get("pci")}
        self._install(config, tls, None, *rules_and_notifiers(config, tls))
        self.tracker.restore(self.db.load_counters(), self._tracks)
        started = time.time()
        self._retire(started)
        if self.tracker.loaded:
            return
        # No counter memory (a first start, or one after an upgrade from a tpuwatch that kept none): hold firing
        # alerts of rules that remember for one window rather than resolve them for want of history.
        for alert in self.book.alerts.values():
            windows = [r.rule.window for r in self._rules if r.rule.function in ("increase", "unchanged")
                       and r.rule.alert == alert.labels.get("alertname")
                       and r.rule.severity == alert.labels.get("severity")]
            if alert.state == "firing" and windows:
                alert.hold_until = started + max(windows)

    def _install(self, config: Config, tls: bool, previous: Delivery | None, rules: list[Rule],
                 notifiers: list[Notifier]) -> None:
        """Switch to ``config``'s rules, notifiers and delivery."""
        section = config.alerting
        tracked = tracks(rules)
        delivery = Delivery(self.db, section, notifiers)
        if previous is not None:
            delivery.results.update(previous.totals())
        self.config, self._tracks, self.delivery = config, tracked, delivery
        self._rules = [CompiledRule(r) for r in rules]
        self.dispatcher = Dispatcher(section, notifiers, config.interval, own_url(config, tls))
        names = {n.name for n in notifiers}
        for alert in self.book.alerts.values():
            for receiver in [r for r in alert.notified if r not in names]:
                del alert.notified[receiver]
        self.db.forget_receivers(names)

    def _retire(self, now: float) -> None:
        """Resolve the active alerts of rules that are no longer loaded (removed, renamed, or alerting off)."""
        known = {(r.rule.alert, r.rule.severity) for r in self._rules}
        changes = Changes()
        for fp, alert in list(self.book.alerts.items()):
            if alert.state != "resolved" and (alert.labels.get("alertname"), alert.labels.get("severity")) not in known:
                self.book.resolve(fp, now, changes)
        for alert in changes.resolved:
            log.warning("%s resolved: its rule is no longer loaded", describe(alert))
        self._save(changes)

    # --- the daemon's hooks ------------------------------------------------------

    def evaluate(self, samples: Iterable[Sample], now: float | None = None) -> None:
        """Run every rule over the current samples (readings plus tpuwatch's own metrics)."""
        now = time.time() if now is None else now
        current = list(samples)
        chips = _inventory(current)
        with self._lock:
            self._learn_pci(current)
            self.tracker.observe(current, self._tracks, now)
            held = [(s, seen) for s, seen in self.tracker.held(now)
                    if chips is None or not dict(s.labels).get("device") or dict(s.labels)["device"] in chips]
            # A chip is down by this cycle's reading, or by its last one when the devices collector missed a cycle.
            down = {dict(s.labels).get("device", "") for s in (*current, *(s for s, seen in held
                                                                          if now - seen <= LOOKBACK_S))
                    if s.name == "tpuwatch_device_up" and s.value == 0}
            candidates = [c for rule in self._rules for c in rule.evaluate(current, self.tracker, now,
                                                                          {"host": self.host}, held, self._pci)]
            if chips is not None:  # alerts about chips the backend no longer reports are not held
                for alert in self.book.alerts.values():
                    if alert.labels.get("device") and alert.labels["device"] not in chips:
                        alert.hold_until = 0.0
            changes = self.book.apply(candidates, down, now)
            self._log(changes, now)
            self._save(changes)
        self._wake.set()

    def _learn_pci(self, samples: list[Sample]) -> None:
        for s in samples:
            if s.name == "tpuwatch_device_info":
                labels = dict(s.labels)
                if labels.get("device") and labels.get("pci"):
                    if len(self._pci) >= MAX_PCI_ENTRIES and labels["device"] not in self._pci:
                        self._pci.clear()
                    self._pci[labels["device"]] = labels["pci"]

    @staticmethod
    def _log(changes: Changes, now: float) -> None:
        """One line per alert that fires or resolves: WARNING, ERROR for critical ones."""
        for alert in changes.fired:
            level = _SEVERITY_LEVEL.get(alert.labels.get("severity", ""), logging.WARNING)
            inhibited = " (inhibited: its chip is down)" if alert.inhibited else ""
            log.log(level, "%s firing%s: %s", describe(alert), inhibited, alert.annotations.get("summary", ""))
        for alert in changes.resolved:
            level = _SEVERITY_LEVEL.get(alert.labels.get("severity", ""), logging.WARNING)
            lasted = human_duration(now - (alert.fired_at or alert.active_at))
            log.log(level, "%s resolved after %s: %s", describe(alert), lasted, alert.annotations.get("summary", ""))

    def _save(self, changes: Changes) -> None:
        """Persist alert state and counter memory; a failure is logged once per streak, the state kept in memory
        and written whole at the next success."""
        alerts = changes.saved
        if self.db.recovered:  # the file was replaced while in use: everything held is written to the new one
            self.db.recovered, self._unsaved = False, True
        if self._unsaved:
            saved = {id(a) for a in alerts}
            alerts = [*alerts, *(a for a in self.book.alerts.values() if id(a) not in saved)]
        moves = [*self._unsaved_moves, *changes.rekeyed]
        try:
            self.db.save_alerts(alerts, moves)
            self.db.save_counters(*self.tracker.changes(everything=self._unsaved))
        except OutboxFull as exc:
            if not self._unsaved:
                log.error("cannot persist alert state (%s); kept in memory, retried every cycle", exc)
            self._unsaved, self._unsaved_moves = True, moves
            return
        if self._unsaved:
            log.info("alert state persisted again")
        self._unsaved, self._unsaved_moves = False, []

    def flush(self, now: float | None = None) -> float:
        """Queue every notification that is due; seconds until the next may be due."""
        now = time.time() if now is None else now
        with self._lock:
            notifications, wake = self.dispatcher.due(list(self.book.alerts.values()), now)
            if notifications:
                self._queue(notifications, now)
            self.db.delete_alerts(self.book.forget_resolved(now - self.config.alerting.resolved_retention))
        self.delivery.expire(now)
        return 1.0 if wake is None else max(0.0, wake - now)

    def _queue(self, notifications: list[Any], now: float) -> None:
        try:
            self.db.enqueue(notifications, now)
        except OutboxFull as exc:
            for n in notifications:
                self.delivery.count(n.receiver, "refused", len(n.bodies))
            if not self._refusing:
                log.error("outbox full (%s): refusing new notifications, keeping the %d queued; "
                          "free disk space or raise alerting.outbox_max_bytes",
                          exc, sum(n for n, _ in self.db.queue_stats().values()))
            self._refusing = True
            return
        if self._refusing:
            log.info("outbox accepts notifications again")
            self._refusing = False
        for n in notifications:
            for fp in n.told_firing:
                self.book.alerts[fp].notified[n.receiver] = now
            for fp in n.told_resolved:
                self.book.alerts[fp].notified.pop(n.receiver, None)
        self.delivery.wake()

    def start(self) -> None:
        """Start the dispatcher and the delivery threads."""
        self._stop.clear()
        self.delivery.start()
        self._thread = threading.Thread(target=self._dispatch_loop, name="alert-dispatch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop all threads within about 2 s; queued notifications stay in the outbox."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(1.0)
            self._thread = None
        self.delivery.stop(1.0)

    def _dispatch_loop(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                wait = self.flush()
                failing = False
            except Exception as exc:  # noqa: BLE001 - keep dispatching; the next round retries (logged once)
                if not failing:
                    log.error("alert dispatch failed, retried every second: %s: %s", type(exc).__name__, exc)
                    log.debug("alert dispatch failed", exc_info=True)
                failing, wait = True, 1.0
            self._wake.wait(min(wait, 1.0))
            self._wake.clear()

    def reconfigure(self, config: Config, tls: bool = False) -> None:
        """Apply a reloaded config (``tls``: whether the endpoint now serves https); raises ConfigError, keeping
        the old one, for bad rules or secrets.

        The rule and secret files are read before the lock is taken, so evaluation goes on meanwhile.
        """
        rules, notifiers = rules_and_notifiers(config, tls)
        with self._lock:
            old = self.delivery
            self._install(config, tls, old, rules, notifiers)
            self._retire(time.time())
        old.stop(0.0)
        if self._thread is not None:
            self.delivery.start()
        self._wake.set()

    # --- views ---------------------------------------------------------------------

    @property
    def state_problem(self) -> str | None:
        """Why alert state and the outbox are kept in memory only; None while they are in state_dir."""
        return self.db.problem

    def active_alerts(self) -> list[dict[str, Any]]:
        """Pending and firing alerts as JSON objects, oldest first."""
        with self._lock:
            return [a.to_json() for a in self.book.active()]

    def api_payload(self) -> dict[str, Any]:
        """What the daemon's ``GET /api/alerts`` answers (``tpuwatch alerts`` reads it)."""
        return {"status": "success", "alerts": redact_data(self.active_alerts())}

    def samples(self) -> list[Sample]:
        """tpuwatch_alerts, notification counters, queue length and age, circuit state."""
        now = time.time()
        with self._lock:
            firing: dict[tuple[str, str], int] = {(r.rule.alert, r.rule.severity): 0 for r in self._rules}
            for alert in self.book.alerts.values():
                if alert.state == "firing":
                    key = (alert.labels.get("alertname", ""), alert.labels.get("severity", ""))
                    firing[key] = firing.get(key, 0) + 1
            delivery = self.delivery
        out = [sample("tpuwatch_alerts", n, alertname=name, severity=sev) for (name, sev), n in firing.items()]
        out += [sample("tpuwatch_notifications_total", n, receiver=r, result=res)
                for (r, res), n in sorted(delivery.totals().items())]
        stats = self.db.queue_stats()
        for name, breaker in delivery.breakers.items():
            queued, oldest = stats.get(name, (0, now))
            out.append(sample("tpuwatch_notification_queue_length", queued, receiver=name))
            out.append(sample("tpuwatch_notification_queue_oldest_age_seconds", max(0.0, now - oldest), receiver=name))
            out.append(sample("tpuwatch_notifier_circuit_open",
                              1 if breaker.is_open else 0, receiver=name))
        return out
