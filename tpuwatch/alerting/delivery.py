"""Deliver queued notifications: one thread per receiver, backoff with jitter, a circuit breaker.

Each receiver's messages go out one at a time, the most urgent first
(critical, then warning, then the rest; oldest first within a priority; a
group's own messages strictly in order), so a hanging receiver delays only
itself and a backlog starts with its pages.  A failed attempt is retried after
``retry_initial * 2**attempts`` (at most ``retry_max``, 30 s by default) times a
random factor in [0.5, 1); a 4xx other than 408/429 is a rejection and is not
retried.  After ``breaker_failures`` consecutive failures the receiver's
circuit opens: its queue is held and one trial, the most urgent message, goes
at most every ``breaker_trial`` (30 s; at least once per ``breaker_reset``).  A
trial that is answered closes the circuit and the whole queue is due at once;
while trials keep failing the receiver is reported again once per
``breaker_reset``.  So a receiver that comes back hears within 30 s, and one
that stays dead gets one request per 30 s.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Sequence

from tpuwatch.alerting.db import AlertDB, Message
from tpuwatch.alerting.template import human_duration
from tpuwatch.config import AlertingConfig
from tpuwatch.notifiers.base import Answer, Notifier

log = logging.getLogger(__name__)

IDLE_POLL_S = 1.0


class Breaker:
    """Consecutive-failure circuit breaker of one receiver, with half-open trials while open.

    ``record`` takes each attempt's start time and says what changed: ``"opened"`` (this failure opened a
    closed circuit), ``"closed"`` (an answer closed an open one), ``"still"`` (a failed trial after another
    ``reset`` seconds open), else None.
    """

    def __init__(self, failures: int, reset: float, trial: float | None = None) -> None:
        self.failures = failures
        self.reset = reset
        self.trial = reset if trial is None else min(trial, reset)
        self.consecutive = 0
        self.opened_at: float | None = None
        self.report_at: float | None = None  # when a trial that fails reports the receiver still down
        self.next_trial: float | None = None

    @property
    def is_open(self) -> bool:
        """Whether the circuit is open: the queue held, only trials go."""
        return self.opened_at is not None

    def blocked_until(self, now: float) -> float | None:
        """When the next attempt (a trial) may go, or None if it may go now."""
        return self.next_trial if self.next_trial is not None and now < self.next_trial else None

    def record(self, ok: bool, started: float) -> str | None:
        """Count an attempt that started at ``started``."""
        if ok:
            was_open = self.is_open
            self.consecutive, self.opened_at, self.report_at, self.next_trial = 0, None, None, None
            return "closed" if was_open else None
        self.consecutive += 1
        if self.consecutive < self.failures:
            return None
        self.next_trial = started + self.trial
        if self.opened_at is None:
            self.opened_at, self.report_at = started, started + self.reset
            return "opened"
        if self.report_at is not None and started >= self.report_at:
            self.report_at = started + self.reset
            return "still"
        return None


def backoff(config: AlertingConfig, attempts: int) -> float:
    """Seconds before retry number ``attempts + 1``: exponential, capped, with jitter."""
    ceiling: float = min(config.retry_max, config.retry_initial * 2.0 ** min(attempts, 60))
    return ceiling * random.uniform(0.5, 1.0)


class Delivery:
    """The delivery threads and their counters."""

    def __init__(self, db: AlertDB, config: AlertingConfig, notifiers: Sequence[Notifier]) -> None:
        self.db = db
        self.config = config
        self.notifiers = {n.name: n for n in notifiers}
        self.breakers = {n.name: Breaker(config.breaker_failures, config.breaker_reset, config.breaker_trial)
                         for n in notifiers}
        self.results: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = {name: threading.Event() for name in self.notifiers}
        self._failing: set[str] = set()
        self._threads: list[threading.Thread] = []

    def count(self, receiver: str, result: str, n: int = 1) -> None:
        """Add to tpuwatch_notifications_total{receiver, result}."""
        with self._lock:
            self.results[(receiver, result)] += n

    def totals(self) -> dict[tuple[str, str], int]:
        """A consistent copy of the counters."""
        with self._lock:
            return dict(self.results)

    def start(self) -> None:
        """One daemon thread per receiver."""
        for name in self.notifiers:
            thread = threading.Thread(target=self._run, args=(name,), name=f"notify-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the threads; one stuck in a request is left behind (its message stays queued)."""
        self._stop.set()
        for event in self._wake.values():
            event.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def wake(self) -> None:
        """New messages were queued."""
        for event in self._wake.values():
            event.set()

    def _run(self, name: str) -> None:
        event = self._wake[name]
        failing = False
        while not self._stop.is_set():
            try:
                wait = self.step(name, time.time())
                failing = False
            except Exception as exc:  # noqa: BLE001 - a delivery thread must outlive any one message (logged once)
                if not failing:
                    log.error("receiver %s: delivery step failed, retrying: %s: %s", name, type(exc).__name__, exc)
                    log.debug("receiver %s: delivery step failed", name, exc_info=True)
                failing, wait = True, IDLE_POLL_S
            if wait > 0:
                event.wait(min(wait, IDLE_POLL_S))
                event.clear()

    def step(self, name: str, now: float) -> float:
        """Try the receiver's most urgent due message (a trial while its circuit is open); seconds until it is
        worth trying again (0: at once)."""
        breaker = self.breakers[name]
        blocked = breaker.blocked_until(now)
        if blocked is not None:
            return blocked - now
        message, due = self.db.claim(name, now, self.config.send_timeout + 5.0, trial=breaker.is_open)
        if message is None:
            return IDLE_POLL_S if due is None else max(0.0, due - now)
        answer = self.notifiers[name].send(message.body, message.key)
        self.settle(name, message, answer, time.time(), started=now)
        return 0.0

    def settle(self, name: str, message: Message, answer: Answer, now: float, started: float | None = None) -> None:
        """Record an attempt's outcome (it started at ``started``, answered at ``now``) in the outbox, the
        counters, the breaker and the log."""
        breaker = self.breakers[name]
        if answer.ok:
            self.db.delete(message.id)
            self.count(name, "delivered")
        elif not answer.retry:
            self.db.delete(message.id)
            self.count(name, "rejected")
            log.error("receiver %s rejected notification %s, dropped: %s", name, message.key, answer.detail)
        else:
            delay = backoff(self.config, message.attempts)
            self.db.retry_later(message.id, now + delay)
            self.count(name, "failed")
            if name not in self._failing:
                self._failing.add(name)
                log.warning("receiver %s: delivery failed (%s); retrying with backoff, logged once per streak",
                            name, answer.detail)
        down_since = breaker.opened_at
        change = breaker.record(answer.ok or not answer.retry, now if started is None else started)
        if (answer.ok or not answer.retry) and name in self._failing:
            self._failing.discard(name)
            self.db.release(name, now)  # its backlog need not wait out backoffs earned while it was down
            if change == "closed":
                log.warning("receiver %s: circuit closed, delivering again after %s (%s); its %d queued "
                            "notification(s) go now, critical first", name, human_duration(now - (down_since or now)),
                            answer.detail, self._queued(name))
            else:
                log.info("receiver %s: delivering again (%s)", name, answer.detail)
        if change == "opened":
            log.error("receiver %s: circuit open after %d consecutive failures (%s); its %d queued notification(s) "
                      "are held, one trial every %gs", name, breaker.consecutive, answer.detail, self._queued(name),
                      breaker.trial)
        elif change == "still":
            log.error("receiver %s: still failing after %s (%s); circuit open, %d notification(s) held, one trial "
                      "every %gs", name, human_duration(now - (down_since or now)), answer.detail,
                      self._queued(name), breaker.trial)

    def _queued(self, name: str) -> int:
        return self.db.queue_stats().get(name, (0, 0.0))[0]

    def expire(self, now: float) -> None:
        """Drop messages older than ``max_age``; counted and logged."""
        for receiver, n in self.db.expire(now - self.config.max_age):
            self.count(receiver, "expired", n)
            log.error("receiver %s: %d notification(s) expired undelivered after %gs", receiver, n,
                      self.config.max_age)
