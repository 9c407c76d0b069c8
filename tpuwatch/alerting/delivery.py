"""Deliver queued notifications: one thread per receiver, backoff with jitter, a circuit breaker.

Each receiver's messages go out in order, one at a time, so a hanging
receiver delays only itself.  A failed attempt is retried after
``retry_initial * 2**attempts`` (at most ``retry_max``) times a random factor
in [0.5, 1); a 4xx other than 408/429 is a rejection and is not retried.
After ``breaker_failures`` consecutive failures the receiver's circuit opens
for ``breaker_reset`` seconds, then one trial decides.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Sequence

from tpuwatch.alerting.db import AlertDB, Message
from tpuwatch.config import AlertingConfig
from tpuwatch.notifiers.base import Answer, Notifier

log = logging.getLogger(__name__)

IDLE_POLL_S = 1.0


class Breaker:
    """Consecutive-failure circuit breaker of one receiver."""

    def __init__(self, failures: int, reset: float) -> None:
        self.failures = failures
        self.reset = reset
        self.consecutive = 0
        self.open_until: float | None = None

    def blocked_until(self, now: float) -> float | None:
        """When the next attempt may go, or None if it may go now."""
        return self.open_until if self.open_until is not None and now < self.open_until else None

    def record(self, ok: bool, now: float) -> bool:
        """Count an attempt; True when this failure opens a closed circuit (a failed trial re-opens it quietly)."""
        if ok:
            self.consecutive, self.open_until = 0, None
            return False
        self.consecutive += 1
        if self.consecutive < self.failures:
            return False
        opened = self.open_until is None
        self.open_until = now + self.reset
        return opened


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
        self.breakers = {n.name: Breaker(config.breaker_failures, config.breaker_reset) for n in notifiers}
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
        """Try the receiver's next due message; seconds until it is worth trying again (0: at once)."""
        breaker = self.breakers[name]
        blocked = breaker.blocked_until(now)
        if blocked is not None:
            return blocked - now
        message, due = self.db.claim(name, now, self.config.send_timeout + 5.0)
        if message is None:
            return IDLE_POLL_S if due is None else max(0.0, due - now)
        answer = self.notifiers[name].send(message.body, message.key)
        self.settle(name, message, answer, time.time())
        return 0.0

    def settle(self, name: str, message: Message, answer: Answer, now: float) -> None:
        """Record an attempt's outcome in the outbox, the counters, the breaker and the log."""
        if answer.ok:
            self.db.delete(message.id)
            self.count(name, "delivered")
            if name in self._failing:
                self._failing.discard(name)
                log.info("receiver %s: delivering again (%s)", name, answer.detail)
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
        if self.breakers[name].record(answer.ok or not answer.retry, now):
            log.error("receiver %s: circuit open after %d consecutive failures; next try in %gs",
                      name, self.breakers[name].consecutive, self.config.breaker_reset)

    def expire(self, now: float) -> None:
        """Drop messages older than ``max_age``; counted and logged."""
        for receiver, n in self.db.expire(now - self.config.max_age):
            self.count(receiver, "expired", n)
            log.error("receiver %s: %d notification(s) expired undelivered after %gs", receiver, n,
                      self.config.max_age)
