"""Delivery as a receiver sees it: what it is sent and when, what the outbox keeps, what is counted and logged.

Most tests drive ``Delivery.step`` (what a delivery thread does once) on a clock of their own, so that backoff,
the circuit breaker and its trials are exact; the last ones run the threads themselves.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tpuwatch.alerting import delivery as delivery_module
from tpuwatch.alerting.db import AlertDB, Notification
from tpuwatch.alerting.delivery import Delivery
from tpuwatch.alerting.template import human_duration
from tpuwatch.config import AlertingConfig
from tpuwatch.notifiers.base import Answer

from conftest import wait_until

T0 = 1_800_000_000.0
OK = Answer(True, False, "HTTP 200")
DOWN = Answer(False, True, "connection refused")
REJECTED = Answer(False, False, "HTTP 400")
LOG = "tpuwatch.alerting.delivery"


class Clock:
    """The delivery module's ``time``: ``time()`` is this test's clock, ``monotonic()`` the real one."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def time(self) -> float:
        return self.now

    @staticmethod
    def monotonic() -> float:
        return time.monotonic()


@dataclass
class Receiver:
    """A notifier whose answers the test sets; it records each request's body, key and time."""

    name: str = "hook"
    answer: Answer = OK
    clock: Clock | None = None
    takes: float = 0.0  # seconds each request lasts on ``clock``
    requests: list[tuple[str, str, float]] = field(default_factory=list)
    hook: Callable[[], None] | None = None

    def send(self, body: str, key: str) -> Answer:
        if self.hook is not None:
            self.hook()
        self.requests.append((body, key, self.clock.now if self.clock else time.time()))
        if self.clock is not None:
            self.clock.now += self.takes
        return self.answer

    @property
    def bodies(self) -> list[str]:
        return [body for body, _, _ in self.requests]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(delivery_module, "time", clock)
    return clock


def config(**overrides: Any) -> AlertingConfig:
    """Backoff long enough that a message waiting on it is never due by accident, a breaker that opens on the
    second failure."""
    return AlertingConfig(**{"retry_initial": 100.0, "retry_max": 100.0, "breaker_failures": 2,
                             "breaker_reset": 300.0, "breaker_trial": 30.0, "send_timeout": 10.0, **overrides})


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., tuple[Delivery, AlertDB]]]:
    made: list[tuple[Delivery, AlertDB]] = []

    def make(*receivers: Receiver, **overrides: Any) -> tuple[Delivery, AlertDB]:
        db = AlertDB(str(tmp_path / f"alerts{len(made)}.db"), 1 << 24)
        delivery = Delivery(db, config(**overrides), receivers)  # type: ignore[arg-type]
        made.append((delivery, db))
        return delivery, db

    yield make
    for delivery, db in made:
        delivery.stop(1.0)
        db.close()


def queue(db: AlertDB, now: float, *bodies: str, receiver: str = "hook", priority: int = 1, group: str = "") -> None:
    db.enqueue([Notification(receiver, bodies, priority=priority, group=group)], now)


def queued(db: AlertDB, receiver: str = "hook") -> int:
    return db.queue_stats().get(receiver, (0, 0.0))[0]


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOG]


def test_delivered_removed_rejected_dropped_failed_kept_with_the_same_key(clock: Clock, make: Any,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    hook = Receiver(clock=clock)
    delivery, db = make(hook, breaker_failures=5)
    queue(db, T0, "a")
    assert delivery.step("hook", T0) == 0.0  # sent: the next one may go at once
    assert hook.bodies == ["a"] and queued(db) == 0 and delivery.totals() == {("hook", "delivered"): 1}
    hook.answer = REJECTED
    queue(db, T0, "b")
    with caplog.at_level(logging.INFO, LOG):
        delivery.step("hook", T0)
    assert queued(db) == 0 and delivery.totals()[("hook", "rejected")] == 1
    assert delivery.step("hook", T0 + 1000) == delivery_module.IDLE_POLL_S  # nothing left to send: not retried
    assert hook.bodies == ["a", "b"]
    key = hook.requests[1][1]
    assert messages(caplog) == [f"receiver hook rejected notification {key}, dropped: HTTP 400"]
    hook.answer = DOWN
    queue(db, T0, "c")
    delivery.step("hook", T0)
    assert queued(db) == 1 and delivery.totals()[("hook", "failed")] == 1
    clock.now = T0 + 100
    hook.answer = OK
    delivery.step("hook", T0 + 100)
    # The retry carries the first attempt's key (receivers drop duplicates by it); each message has its own.
    assert [b for b, _, _ in hook.requests] == ["a", "b", "c", "c"]
    assert hook.requests[2][1] == hook.requests[3][1] and len({k for _, k, _ in hook.requests}) == 3
    assert queued(db) == 0 and delivery.totals() == {("hook", "delivered"): 2, ("hook", "rejected"): 1,
                                                     ("hook", "failed"): 1}


def test_a_failed_message_waits_out_its_backoff_then_goes(clock: Clock, make: Any) -> None:
    hook = Receiver(answer=DOWN, clock=clock)
    delivery, db = make(hook, retry_initial=10.0, retry_max=10.0, breaker_failures=5)
    queue(db, T0, "a")
    delivery.step("hook", T0)
    due = delivery.step("hook", T0 + 1)  # jittered: 5 to 10 s after the failed attempt
    assert 4 <= due < 9 and hook.bodies == ["a"]
    assert delivery.step("hook", T0 + 1 + due - 0.25) == pytest.approx(0.25) and hook.bodies == ["a"]
    clock.now = T0 + 1 + due + 0.001
    assert delivery.step("hook", clock.now) == 0.0 and hook.bodies == ["a", "a"]


def test_an_open_circuit_holds_the_queue_and_tries_one_message_per_trial_period(clock: Clock, make: Any,
                                                                                caplog: pytest.LogCaptureFixture
                                                                                ) -> None:
    """Backoff alone would let the receiver be tried every second here: the open circuit allows one trial per
    30 s, measured from each attempt's start (a request that takes 10 s to fail does not stretch the period)."""
    hook = Receiver(answer=DOWN, clock=clock, takes=10.0)
    delivery, db = make(hook, retry_initial=1.0, retry_max=1.0, breaker_failures=1)
    queue(db, T0, "first", "second", "third")
    with caplog.at_level(logging.INFO, LOG):
        for _ in range(200):  # the thread's loop over a dead receiver, on this test's clock
            clock.now += delivery.step("hook", clock.now)
            if clock.now >= T0 + 1000:
                break
    starts = [at for _, _, at in hook.requests]
    assert starts == [T0 + 30 * n for n in range(34)]
    assert set(hook.bodies) == {"first"} and queued(db) == 3  # a group's messages go in order: the first is tried
    assert delivery.totals() == {("hook", "failed"): 34}
    log = messages(caplog)
    assert log[:2] == [
        "receiver hook: delivery failed (connection refused); retrying with backoff, logged once per streak",
        "receiver hook: circuit open after 1 consecutive failures (connection refused); its 3 queued "
        "notification(s) are held, one trial every 30s"]
    # Reported again once per breaker_reset (300 s) while trials keep failing, with how long it has been down.
    assert log[2:] == [f"receiver hook: still failing after {human_duration(300.0 * n + 10)} (connection refused); "
                       "circuit open, 3 notification(s) held, one trial every 30s" for n in (1, 2, 3)]


def test_a_trial_goes_whatever_its_backoff_and_its_answer_lets_the_whole_queue_go_critical_first(
        clock: Clock, make: Any, caplog: pytest.LogCaptureFixture) -> None:
    hook = Receiver(answer=DOWN, clock=clock)
    delivery, db = make(hook)  # backoff 50 to 100 s, open at the second failure in a row, a trial per 30 s
    queue(db, T0, "other", priority=2, group="o")
    queue(db, T0, "warning", priority=1, group="w")
    delivery.step("hook", T0)
    clock.now = T0 + 1
    queue(db, T0 + 1, "critical", priority=0, group="c")
    with caplog.at_level(logging.INFO, LOG):
        delivery.step("hook", T0 + 1)  # the circuit opens
        assert hook.bodies == ["warning", "critical"]
        assert delivery.step("hook", T0 + 2) == pytest.approx(29.0)  # until the trial
        assert delivery.step("hook", T0 + 30.9) > 0 and hook.bodies == ["warning", "critical"]
        hook.answer = OK
        clock.now = T0 + 31
        # The trial: the most urgent message, though its backoff runs for 20 s or more yet.
        assert delivery.step("hook", T0 + 31) == 0.0 and hook.bodies[2:] == ["critical"]
        for _ in range(2):  # answered: the rest goes at once, without waiting out the backoff it earned
            assert delivery.step("hook", T0 + 31) == 0.0
    assert hook.bodies == ["warning", "critical", "critical", "warning", "other"]
    assert queued(db) == 0 and delivery.step("hook", T0 + 31) == delivery_module.IDLE_POLL_S
    assert delivery.totals() == {("hook", "failed"): 2, ("hook", "delivered"): 3}
    assert messages(caplog)[-1] == ("receiver hook: circuit closed, delivering again after 30s (HTTP 200); its 2 "
                                    "queued notification(s) go now, critical first")


def test_a_streak_of_failures_is_logged_once_and_its_end_once(clock: Clock, make: Any,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    hook = Receiver(answer=DOWN, clock=clock)
    delivery, db = make(hook, retry_initial=1.0, retry_max=1.0, breaker_failures=5)
    queue(db, T0, "a", "b")
    with caplog.at_level(logging.INFO, LOG):
        for n in range(3):  # three failures: the circuit stays closed
            clock.now = T0 + 10 * n
            delivery.step("hook", clock.now)
        hook.answer = OK
        clock.now = T0 + 30
        delivery.step("hook", clock.now)
        hook.answer = DOWN
        clock.now = T0 + 40
        delivery.step("hook", clock.now)  # a new streak
    assert messages(caplog) == [
        "receiver hook: delivery failed (connection refused); retrying with backoff, logged once per streak",
        "receiver hook: delivering again (HTTP 200)",
        "receiver hook: delivery failed (connection refused); retrying with backoff, logged once per streak"]
    assert [r.levelname for r in caplog.records if r.name == LOG] == ["WARNING", "INFO", "WARNING"]
    assert hook.bodies == ["a", "a", "a", "a", "b"]


def test_a_rejection_is_an_answer_it_ends_a_streak_and_never_opens_the_circuit(clock: Clock, make: Any,
                                                                              caplog: pytest.LogCaptureFixture
                                                                              ) -> None:
    hook = Receiver(answer=DOWN, clock=clock)
    delivery, db = make(hook, retry_initial=1.0, retry_max=1.0)  # the second failure in a row would open it
    queue(db, T0, "a", "b", "c")
    with caplog.at_level(logging.INFO, LOG):
        for n, answer in enumerate((DOWN, REJECTED, DOWN, REJECTED, DOWN)):
            hook.answer = answer
            clock.now = T0 + 10 * n
            delivery.step("hook", clock.now)
    assert hook.bodies == ["a", "a", "b", "b", "c"] and queued(db) == 1
    log = messages(caplog)
    assert not any("circuit" in line for line in log), log
    assert log.count("receiver hook: delivering again (HTTP 400)") == 2
    assert delivery.step("hook", T0 + 50) == 0.0 and hook.bodies[-1] == "c"  # not held by a circuit


def test_an_answer_after_failures_lets_the_backlog_go_at_once_with_the_circuit_closed(clock: Clock,
                                                                                      make: Any) -> None:
    hook = Receiver(answer=DOWN, clock=clock)
    delivery, db = make(hook, breaker_failures=5)  # backoff 50 to 100 s
    queue(db, T0, "a", priority=2, group="a")
    delivery.step("hook", T0)
    queue(db, T0 + 1, "b", priority=1, group="b")
    delivery.step("hook", T0 + 1)
    assert hook.bodies == ["a", "b"] and delivery.step("hook", T0 + 2) > 40  # both back off
    hook.answer = OK
    queue(db, T0 + 2, "c", priority=0, group="c")
    assert delivery.step("hook", T0 + 2) == 0.0
    assert delivery.step("hook", T0 + 2) == 0.0 and delivery.step("hook", T0 + 2) == 0.0
    assert hook.bodies == ["a", "b", "c", "b", "a"] and queued(db) == 0


def test_expired_messages_are_counted_and_logged_per_receiver(make: Any, caplog: pytest.LogCaptureFixture) -> None:
    delivery, db = make(Receiver(), Receiver("pd"), max_age=60.0)
    queue(db, T0 - 61, "old", "older")
    queue(db, T0 - 59, "recent")
    queue(db, T0 - 61, "old", receiver="pd")
    with caplog.at_level(logging.ERROR, LOG):
        delivery.expire(T0)
        assert db.queue_stats() == {"hook": (1, T0 - 59)}
        queue(db, T0, "later")
        delivery.expire(T0 + 62)
    assert db.queue_stats() == {}
    assert delivery.totals() == {("hook", "expired"): 4, ("pd", "expired"): 1}
    assert sorted(messages(caplog)) == ["receiver hook: 2 notification(s) expired undelivered after 60s",
                                        "receiver hook: 2 notification(s) expired undelivered after 60s",
                                        "receiver pd: 1 notification(s) expired undelivered after 60s"]
    totals = delivery.totals()
    totals[("hook", "expired")] = 0  # a copy: the counters are not changed through it
    assert delivery.totals()[("hook", "expired")] == 4


def test_each_receiver_has_its_own_breaker_with_the_configured_settings(clock: Clock, make: Any,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    dead, alive = Receiver("dead", answer=DOWN, clock=clock), Receiver("alive", clock=clock)
    delivery, db = make(dead, alive, retry_initial=1.0, retry_max=1.0, breaker_failures=3, breaker_trial=20.0,
                        breaker_reset=50.0)
    queue(db, T0, "x", receiver="dead")
    with caplog.at_level(logging.WARNING, LOG):
        for n in range(3):
            clock.now = T0 + 2 * n
            delivery.step("dead", clock.now)
        assert len(dead.requests) == 3 and delivery.step("dead", T0 + 5) == pytest.approx(19.0)  # open at the third
        queue(db, T0 + 5, "y", receiver="alive")
        assert delivery.step("alive", T0 + 5) == 0.0 and alive.bodies == ["y"]
        for at in (T0 + 24, T0 + 44, T0 + 64):
            clock.now = at
            assert delivery.step("dead", at) == 0.0
        assert len(dead.requests) == 6 and delivery.step("dead", T0 + 64.5) == pytest.approx(19.5)
        dead.answer = OK
        clock.now = T0 + 84
        assert delivery.step("dead", T0 + 84) == 0.0 and queued(db, "dead") == 0
    assert [line.split(" (")[0] for line in messages(caplog)] == [
        "receiver dead: delivery failed", "receiver dead: circuit open after 3 consecutive failures",
        "receiver dead: still failing after 1m 0s", "receiver dead: circuit closed, delivering again after 1m 20s"]
    assert messages(caplog)[-1].endswith("(HTTP 200); its 0 queued notification(s) go now, critical first")


def test_a_message_in_flight_is_not_sent_again_until_its_claim_expires(clock: Clock, make: Any) -> None:
    """Another delivery of the receiver (the next one after a reload left a thread stuck in a request behind, or
    the daemon restarted after a kill) sends a message in flight again only once its claim expires,
    ``send_timeout`` + 5 s after the attempt began (docs/packaging.md): at least once, never twice at once."""
    seen: list[list[str]] = []
    after = Receiver(clock=clock)

    def meanwhile() -> None:  # while the first attempt is in flight
        for at in (T0 + 14.9, T0 + 15):
            clock.now = at
            later.step("hook", at)
            seen.append(after.bodies[:])

    first, db = make(Receiver(clock=clock, hook=meanwhile), send_timeout=10.0)
    later = Delivery(db, first.config, [after])  # type: ignore[list-item]
    queue(db, T0, "a")
    first.step("hook", T0)
    assert seen == [[], ["a"]]


# The threads.

@dataclass
class CountingClaims:
    """Counts the outbox claims a delivery thread makes, and can fail the first few."""

    db: AlertDB
    fail: int = 0
    calls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            self.calls += 1
            failing = self.calls <= self.fail
        if failing:
            raise OSError("disk I/O error")
        return AlertDB.claim(self.db, *args, **kwargs)


def test_a_delivery_thread_outlives_failing_steps_and_logs_each_streak_once(
        make: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(delivery_module, "IDLE_POLL_S", 0.05)
    hook = Receiver()
    delivery, db = make(hook)
    claims = CountingClaims(db, fail=3)
    monkeypatch.setattr(db, "claim", claims)
    queue(db, time.time(), "a")
    with caplog.at_level(logging.DEBUG, LOG):
        delivery.start()
        wait_until(lambda: hook.bodies == ["a"], 10, "the message, after three failed steps")
        claims.fail = claims.calls + 2  # a second streak
        queue(db, time.time(), "b")
        delivery.wake()
        wait_until(lambda: hook.bodies == ["a", "b"], 10, "the next message, after two more")
    failed = [r for r in caplog.records if r.name == LOG and r.levelno == logging.ERROR]
    assert [r.getMessage() for r in failed] == [
        "receiver hook: delivery step failed, retrying: OSError: disk I/O error"] * 2
    traced = [r for r in caplog.records if r.name == LOG and r.levelno == logging.DEBUG]  # the traceback, at debug
    assert [(r.getMessage(), r.exc_info[0] if r.exc_info else None) for r in traced] == [
        ("receiver hook: delivery step failed", OSError)] * 2


def test_an_idle_delivery_thread_waits_instead_of_spinning(make: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    delivery, db = make(Receiver())
    claims = CountingClaims(db)
    monkeypatch.setattr(db, "claim", claims)
    delivery.start()
    delivery.wake()
    wait_until(lambda: claims.calls >= 1, 10, "the thread's first look at the outbox")
    time.sleep(0.3)  # a window to count in, not a wait for anything: a spinning thread looks thousands of times
    assert claims.calls <= 3


def test_a_woken_thread_sends_at_once_an_idle_one_looks_again_within_its_poll(
        make: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(delivery_module, "IDLE_POLL_S", 60.0)  # an idle thread looks again only after a minute
    hook = Receiver()
    delivery, db = make(hook)
    claims = CountingClaims(db)
    monkeypatch.setattr(db, "claim", claims)
    delivery.start()
    wait_until(lambda: claims.calls >= 1, 10, "the thread idle")
    queue(db, time.time(), "a")
    delivery.wake()
    wait_until(lambda: hook.bodies == ["a"], 10, "the message, woken")
    queue(db, time.time(), "b")
    delivery.wake()
    wait_until(lambda: hook.bodies == ["a", "b"], 10, "the next message, woken again")


def test_a_message_made_due_without_a_wake_goes_within_the_idle_poll(make: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread waiting on a long backoff looks at the outbox again every IDLE_POLL_S: a message that becomes
    due meanwhile without a wake (here: released by hand; a wall-clock step does the same) is not left waiting
    for the backoff's whole length."""
    hook = Receiver(answer=DOWN)
    delivery, db = make(hook, breaker_failures=5)  # backoff 50 to 100 s
    queue(db, time.time(), "a")
    delivery.step("hook", time.time())
    hook.answer = OK
    claims = CountingClaims(db)
    monkeypatch.setattr(db, "claim", claims)
    delivery.start()
    wait_until(lambda: claims.calls >= 1, 10, "the thread waiting on the backoff")
    db.release("hook", time.time())
    wait_until(lambda: hook.bodies == ["a", "a"], 10, "the message, due again")


def test_stop_ends_every_thread_within_its_timeout_and_leaves_those_stuck_in_a_request_behind(make: Any) -> None:
    entered, release = threading.Semaphore(0), threading.Event()

    def hang() -> None:
        entered.release()
        release.wait(30)

    stuck = [Receiver(f"stuck{n}", hook=hang) for n in range(2)]
    delivery, db = make(*stuck, Receiver("idle"))
    for receiver in stuck:
        queue(db, time.time(), "a", receiver=receiver.name)
    delivery.start()
    names = ("notify-stuck0", "notify-stuck1", "notify-idle")
    threads = {t.name: t for t in threading.enumerate() if t.name in names}
    assert sorted(threads) == sorted(names) and all(t.daemon for t in threads.values())
    for _ in stuck:
        assert entered.acquire(timeout=5), "a request that hangs"
    started = time.monotonic()
    delivery.stop(0.3)  # the whole stop, however many threads are stuck
    assert time.monotonic() - started < 1.5
    assert not threads["notify-idle"].is_alive() and threads["notify-stuck0"].is_alive()
    release.set()
    for name in names:
        threads[name].join(5)
        assert not threads[name].is_alive()
