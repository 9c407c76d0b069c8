"""The kernel log collector: new records -> rule matches -> device events and counters.

In the daemon a thread of its own (``start()``) follows the log: every
``FOLLOW_S`` it reads what is new through the one path (``LogReader``),
spending at most ``WORK_SHARE`` of a core on average (thread CPU time, a
bucket of at most ``MAX_SPEND_S``), and hands what it read to the next
sampling cycle (``handoff.Handoff``): the follower never writes into the store,
``collect()`` takes what waits and returns it as samples, and logs and lists
the events.  When the log comes faster than that (a storm), the lines of
the storms it has learned are passed over unread and counted
(``reason="backlog"``), while every other line is still read and matched
(``sieve``): a storm costs one keyword pass over its bytes, and the first
line after it is read within a follow period or two.  Without the thread
(``tpuwatch check``, tests) each ``collect()`` reads for ``BUDGET_SHARE`` of
its deadline.  The counters are returned every cycle, whatever the source, a
record or the disk does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from pathlib import Path

from tpuwatch.config import Config
from tpuwatch.kernel_log.attribution import Attribution, as_attribution
from tpuwatch.kernel_log.events import KernelEvent, StormFilter
from tpuwatch.kernel_log.filesource import absent, open_regular
from tpuwatch.kernel_log.handoff import Handoff
from tpuwatch.kernel_log.opening import open_source
from tpuwatch.kernel_log.reader import LogReader
from tpuwatch.kernel_log.records import SKIP_REASONS
from tpuwatch.kernel_log.rulefile import load_rules
from tpuwatch.kernel_log.rules import RuleSet
from tpuwatch.kernel_log.sources import NoSource, Source, SourceError
from tpuwatch.samples import Sample, sample
from tpuwatch.schema import ConfigError

log = logging.getLogger(__name__)

MAX_RECENT_EVENTS = 50
MAX_LOGGED_EVENTS = 20  # per collection; the rest are counted in one line
BUDGET_SHARE = 0.4  # of the collector deadline, for reading and matching in collect() (no thread)
DEFAULT_DEADLINE = 5.0
FOLLOW_S = 0.25  # the follower looks for new records this often
WORK_SHARE = 0.25  # of a core, on average, for the follower
MAX_SPEND_S = 0.5  # what the follower may spend at once after a quiet time (a burst, the first read)
COMMIT_S = 1.0  # the follower saves its position at most this often
PASS_AFTER_S = 0.05  # reading for this long in one go with a storm known: pass its lines over
PASS_HOLD_S = 2.0  # and go on passing them over at once for this long after the last one
SETTLE_S = 1.0  # the follower lets waiting events out once nothing new was written for this long

DeviceLookup = Callable[[str], "str | int | None"]


class KernelLogCollector:
    """Reads what is new in the kernel log, within a budget of time, and counts rule matches.

    Samples: ``tpuwatch_kernel_events_total{rule,severity,device}`` (every
    occurrence read, storms included; ``device`` is "" when unattributed; an
    Xid naming a MIG instance adds ``gpu_instance``),
    ``tpuwatch_kernel_recovery_actions_total{device,action}`` (Xid 154 lines),
    ``tpuwatch_kernel_log_records_total``, ``tpuwatch_kernel_log_lost_total``,
    ``tpuwatch_kernel_log_skipped_total{reason}``,
    ``tpuwatch_kernel_log_events_dropped_total`` (events counted but pushed out
    of the handoff before a cycle took them) and
    ``tpuwatch_kernel_log_position_save_failures_total``.  Events pass through
    storm aggregation and the handoff into a bounded list of recent events
    (``recent_events()``).
    ``deadline`` is the time one ``collect()`` may take; without the follower it
    reads for ``BUDGET_SHARE`` of it (on ``timer``).  With a NoSource it returns
    no samples (nothing is read, so nothing is counted) and is ``degraded``.
    """

    name = "kernel_log"

    def __init__(self, source: Source, rules: RuleSet, device_for_pci: Attribution | DeviceLookup, storm_window: float,
                 clock: Callable[[], float] = time.monotonic, deadline: float = DEFAULT_DEADLINE,
                 timer: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self.reader = LogReader(source, rules, as_attribution(device_for_pci))
        self._budget = deadline * BUDGET_SHARE
        self._timer = timer
        self._storms = StormFilter(storm_window, clock=clock)
        self._counts: Counter[tuple[str, str, str, str]] = Counter(
            {(r.name, s, "", ""): 0 for r in rules.rules for s in r.severities()})
        self._actions: Counter[tuple[str, str]] = Counter()  # (device, recovery action) of Xid 154 lines
        self._dropped = 0  # events pushed out of the handoff before a cycle took them
        self._handoff = Handoff()  # what was read, for the next collect()
        self._logged_error = False
        self._read_problem: str | None = None
        self._passing = 0  # lines passed over in the current storms, for the log
        self._pass_until = 0.0  # when to stop passing storms' lines over at once (time.monotonic)
        self._settled = (0, 0.0)  # the records read, and when that count last changed
        self._lock = threading.Lock()  # the recent events, written by collect() and read by the endpoint
        self._work = threading.Lock()  # one reader at a time
        self._recent: deque[KernelEvent] = deque(maxlen=MAX_RECENT_EVENTS)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def degraded(self) -> str | None:
        """Why the kernel log is not fully seen (no source, a missing file, a failing read), or None."""
        return self._read_problem or self.source.degraded

    def start(self, after: threading.Event | None = None) -> None:
        """Follow the log from now on in a thread of its own (the daemon), once ``after`` is set (the daemon's first
        cycle, which tells the chips that events are attributed to); ``collect()`` then reads nothing itself."""
        if self._thread is not None or isinstance(self.source, NoSource):
            return
        self.source.start()
        self._thread = threading.Thread(target=self._follow, args=(after,), name="kernel-log", daemon=True)
        self._thread.start()

    def collect(self) -> list[Sample]:
        """The counters with what was read since the last call (the follower's, or, without it, what this call
        reads within the budget, the position saved first); its events logged and added to the recent ones."""
        if isinstance(self.source, NoSource):
            return []
        if self._thread is None:
            with self._work:
                self._cycle(self._budget, self._timer)
                self.source.commit()  # never raises: a failed save is counted and retried
        self._take()
        return self._samples()

    def _take(self) -> None:
        """Add what waits in the handoff to the counters; log its events (at most MAX_LOGGED_EVENTS) and keep them
        as the recent ones."""
        taken = self._handoff.take()
        self._counts.update(taken.counts)
        self._actions.update(taken.actions)
        self._dropped += taken.dropped
        for logged, event in enumerate(taken.events[:MAX_LOGGED_EVENTS + 1]):
            if logged == MAX_LOGGED_EVENTS:
                log.warning("kernel log: more than %d events since the last collection; the rest are counted, "
                            "not logged", MAX_LOGGED_EVENTS)
            else:
                log.log(logging.INFO if event.severity == "info" else logging.WARNING,
                        "kernel event %s (%s) on device %s, pci %s: %r", event.rule, event.severity,
                        event.device or "-", event.pci or "-", event.message)
        with self._lock:
            self._recent.extend(taken.events)

    def _follow(self, after: threading.Event | None) -> None:
        """The follower's loop: read what is new every FOLLOW_S, spending at most WORK_SHARE of a core."""
        if after is not None:
            while not after.wait(FOLLOW_S):
                if self._stop.is_set():
                    return
        bucket, last, committed = MAX_SPEND_S, time.monotonic(), 0.0
        while True:
            now = time.monotonic()
            bucket = min(MAX_SPEND_S, bucket + WORK_SHARE * (now - last))
            last = now
            if bucket > 0:
                spent = time.thread_time()
                with self._work:
                    self._cycle(bucket, time.thread_time)
                    if now - committed >= COMMIT_S:
                        self.source.commit()
                        committed = now
                bucket -= time.thread_time() - spent
            if self._stop.wait(FOLLOW_S):
                return

    def _cycle(self, budget: float, timer: Callable[[], float]) -> None:
        """Read for at most ``budget`` seconds of ``timer`` (``_read``); a failing read is said once, and retried."""
        try:
            self._read(budget, timer)
        except Exception as exc:  # noqa: BLE001 - an unreadable source must not stop the counters
            problem = f"reading the kernel log failed: {type(exc).__name__}: {exc}"
            if problem != self._read_problem:
                log.error("kernel log (%s): %s (retried every cycle)", self.source.name, problem)
            self._read_problem = problem
        else:
            if self._read_problem is not None:
                log.info("kernel log (%s): reading again", self.source.name)
            self._read_problem = None
        self._note_error()
        self._handoff.put((), self._storms.flush())

    def _read(self, budget: float, timer: Callable[[], float]) -> None:
        """Read until the log's end or ``budget`` seconds of ``timer``.  The storms' lines are passed over once
        reading has taken half the budget in one go (the follower: PASS_AFTER_S, if less), and for PASS_HOLD_S
        after lines were last passed over: a storm's lines keep coming."""
        started = timer()
        reader = self.reader
        pass_after = budget / 2 if self._thread is None else min(budget / 2, PASS_AFTER_S)
        while True:
            spent = timer() - started
            if spent >= budget:
                break
            passing = reader.storms > 0 and (time.monotonic() < self._pass_until or spent >= pass_after)
            before = self.source.skipped["backlog"]
            self._count(reader.read(passing))
            if passed := self.source.skipped["backlog"] - before:
                if not self._passing:
                    log.warning("kernel log (%s): the log comes faster than tpuwatch reads it: passing over the "
                                "lines of %d storms (each one rule on one device at one severity), reading every "
                                "other line; counted in tpuwatch_kernel_log_skipped_total{reason=\"backlog\"}",
                                self.source.name, reader.storms)
                self._passing += passed
                self._pass_until = time.monotonic() + PASS_HOLD_S
            if self.source.caught_up:
                break
        self._settle()
        if self._passing and time.monotonic() >= self._pass_until:
            log.warning("kernel log (%s): the storms are over: %d of their lines were passed over",
                        self.source.name, self._passing)
            self._passing = 0

    def _settle(self) -> None:
        """Events that wait for the records after them come out once the log's end is reached: at once without the
        follower (a collection reads what there is), else once nothing new was written for SETTLE_S (a block the
        writer is still writing line by line stays one event)."""
        now = time.monotonic()
        if self.reader.records != self._settled[0]:
            self._settled = (self.reader.records, now)
        if self.source.caught_up and (self._thread is None or now - self._settled[1] >= SETTLE_S):
            self._count(self.reader.finish())

    def _note_error(self) -> None:
        error = self.reader.matcher.error
        if error is not None and not self._logged_error:
            self._logged_error = True
            log.warning("kernel log (%s): a record could not be matched: %s: %s (logged once; counted in "
                        "tpuwatch_kernel_log_skipped_total{reason=\"error\"})", self.source.name,
                        type(error).__name__, error)

    def _samples(self) -> list[Sample]:
        source = self.source
        out = [sample("tpuwatch_kernel_events_total", n, rule=rule, severity=severity, device=device,
                      **({"gpu_instance": instance} if instance else {}))
               for (rule, severity, device, instance), n in sorted(self._counts.items())]
        out += [sample("tpuwatch_kernel_recovery_actions_total", n, device=device, action=action)
                for (device, action), n in sorted(self._actions.items())]
        out.append(sample("tpuwatch_kernel_log_records_total", self.reader.records, source=source.name))
        out.append(sample("tpuwatch_kernel_log_lost_total", source.lost, source=source.name))
        skipped = source.skipped + Counter(error=self.reader.errors)
        out.extend(sample("tpuwatch_kernel_log_skipped_total", skipped[reason], source=source.name, reason=reason)
                   for reason in SKIP_REASONS)
        out.append(sample("tpuwatch_kernel_log_events_dropped_total", self._dropped, source=source.name))
        out.append(sample("tpuwatch_kernel_log_position_save_failures_total", source.position.failures,
                          source=source.name))
        return out

    def _count(self, events: list[KernelEvent]) -> None:
        """Hand every event read to the cycle: each one counted, what storm aggregation passes queued."""
        self._handoff.put(events, [passed for event in events for passed in self._storms.offer(event)])

    def close(self) -> None:
        """Stop the follower, save the position and close the source (/dev/kmsg, the journal, the followed file)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10 * FOLLOW_S)
            if self._thread.is_alive():
                log.warning("kernel log: the follower did not stop within %.1fs; closing its source", 10 * FOLLOW_S)
        if self._work.acquire(timeout=10 * FOLLOW_S):  # a read that hangs keeps its lock: close without saving
            try:
                self.source.commit()
            finally:
                self._work.release()
        self.source.close()

    def recent_events(self) -> list[KernelEvent]:
        """The latest events (at most MAX_RECENT_EVENTS), oldest first: for /healthz and ``tpuwatch check``."""
        with self._lock:
            return list(self._recent)


def event_problems(events: Iterable[KernelEvent]) -> list[str]:
    """One sentence per critical event, for ``tpuwatch check``'s problems."""
    return [f"kernel: {e.rule} on device {e.device or '?'} (pci {e.pci or 'unknown'})"
            f"{' x' + str(e.count) if e.count != 1 else ''}: {e.message}"
            for e in events if e.severity == "critical"]


def build_collector(config: Config, device_for_pci: DeviceLookup,
                    persist: bool = True) -> tuple[KernelLogCollector | None, str]:
    """The kernel log collector for ``config`` and a sentence on the source chosen.

    The daemon uses ``persist=True``; ``tpuwatch check`` passes False so that it
    reads this boot's messages without moving the daemon's saved position.
    Events are attributed through ``paths.sysfs`` (the kernel's device tags and
    ``accel accelN:`` prefixes to PCI addresses), then ``device_for_pci``.
    Raises ConfigError (RuleError is one) for a broken rule file or an
    explicitly configured source that cannot be opened.
    """
    from tpuwatch.kernel_log.attribution import SysfsResolver

    rules = load_rules(config.kernel_log.rules_dirs)
    source, note = open_source(config, persist)
    log.log(logging.WARNING if isinstance(source, NoSource) else logging.INFO, "%s", note)
    if source is None:
        return None, note
    attribution = Attribution(device_for_pci, SysfsResolver(config.paths.sysfs))
    return KernelLogCollector(source, rules, attribution, config.kernel_log.storm_window,
                              deadline=config.collector_deadline), note


def config_warnings(config: Config) -> list[str]:
    """What ``tpuwatch config check`` warns about: a kernel-log file that does not exist, no usable source.

    Opens the sources as ``tpuwatch check`` would (no position read or saved) and closes them again.
    """
    settings = config.kernel_log
    if settings.source == "none":
        return []
    if settings.source == "file":
        if not Path(str(settings.path)).exists():
            return [f"kernel_log.path: {absent(str(settings.path))} (yet): it is followed once it appears"]
        try:
            open_regular(str(settings.path)).close()
        except SourceError as exc:
            return [f"kernel_log.path: {exc}"]
        return []
    try:
        source, note = open_source(config, persist=False)
    except ConfigError as exc:
        return [str(exc)]
    if source is None:
        return []
    source.close()
    return [f"kernel_log.source: auto: {source.degraded}"] if isinstance(source, NoSource) else []
