"""The collector guard: deadlines, isolation, counted failures, dropped readings, logged once."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest

from tpuwatch.collectors import GuardedCollector
from tpuwatch.sampler import Sampler
from tpuwatch.samples import Sample, sample
from tpuwatch.store import SeriesStore


class Fixed:
    """Returns fixed readings."""

    def __init__(self, name: str, readings: list[Sample]) -> None:
        self.name, self.readings = name, readings

    def collect(self) -> list[Sample]:
        return list(self.readings)


class Raising:
    name = "raising"

    def collect(self) -> list[Sample]:
        raise OSError("driver said no")


class Hanging:
    """Blocks until released, like a driver call stuck in D state."""

    name = "hanging"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def collect(self) -> list[Sample]:
        self.calls += 1
        self.release.wait()
        return [sample("tpuwatch_host_memory_total_bytes", 1)]


@pytest.fixture
def hanging() -> Iterator[Hanging]:
    collector = Hanging()
    yield collector
    collector.release.set()


def test_one_failing_and_one_hung_collector_leave_the_others_untouched(hanging: Hanging) -> None:
    good = Fixed("good", [sample("tpuwatch_host_memory_total_bytes", 42)])
    store = SeriesStore(10, 100)
    sampler = Sampler([[Raising(), hanging, good]], store, timeout=0.2)
    started = time.monotonic()
    sampler.run_once()
    assert time.monotonic() - started < 1.0
    assert store.current() == [sample("tpuwatch_host_memory_total_bytes", 42)]
    statuses = {g.name: g.status for g in sampler.guards}
    assert statuses["good"].success is True and statuses["good"].samples == 1
    assert statuses["raising"].success is False and +statuses["raising"].errors == {"error": 1}
    assert "driver said no" in statuses["raising"].last_error
    assert statuses["hanging"].success is False and +statuses["hanging"].errors == {"timeout": 1}


def test_a_hung_call_is_not_started_again_until_it_returns(hanging: Hanging) -> None:
    guard = GuardedCollector(hanging)
    for _ in range(3):
        guard.start()
        assert guard.finish(time.monotonic() + 0.05) is None
    assert hanging.calls == 1
    assert +guard.status.errors == {"timeout": 1, "still_running": 2}
    hanging.release.set()
    guard.start()
    assert guard.finish(time.monotonic() + 2.0) == [sample("tpuwatch_host_memory_total_bytes", 1)]
    assert guard.status.success is True


def test_no_data_is_success_with_zero_samples() -> None:
    guard = GuardedCollector(Fixed("empty", []))
    guard.start()
    assert guard.finish(time.monotonic() + 1) == []
    assert guard.status.success is True and guard.status.samples == 0


def test_invalid_readings_are_dropped_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    readings = [
        sample("tpuwatch_device_memory_used_bytes", float("nan"), device="0"),
        sample("tpuwatch_device_power_watts", float("inf"), device="0"),
        sample("tpuwatch_device_memory_used_bytes", -5, device="1"),
        sample("tpuwatch_device_temperature_celsius", -3, device="1"),  # cold, but possible
        sample("tpuwatch_device_memory_used_bytes", 7, device="2"),
    ]
    guard = GuardedCollector(Fixed("devices", readings))
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            guard.start()
            kept = guard.finish(time.monotonic() + 1)
    assert kept == readings[3:]
    assert guard.status.dropped == {"nan": 3, "inf": 3, "negative": 3}
    assert len([r for r in caplog.records if "dropped" in r.getMessage()]) == 3


def test_failures_are_logged_once_per_streak(caplog: pytest.LogCaptureFixture) -> None:
    guard = GuardedCollector(Raising())
    with caplog.at_level(logging.INFO):
        for _ in range(5):
            guard.start()
            guard.finish(time.monotonic() + 1)
    assert len([r for r in caplog.records if "failed" in r.getMessage()]) == 1
    assert +guard.status.errors == {"error": 5}


def test_a_later_stage_sees_the_same_cycles_readings() -> None:
    store = SeriesStore(10, 100)

    class Doubler:
        name = "doubler"

        def collect(self) -> list[Sample]:
            total = next(s.value for s in store.current() if s.name == "tpuwatch_host_memory_total_bytes")
            return [sample("tpuwatch_host_memory_available_bytes", total * 2)]

    source = Fixed("source", [sample("tpuwatch_host_memory_total_bytes", 21)])
    sampler = Sampler([[source], [Doubler()]], store, timeout=1.0)
    sampler.run_once()
    assert sample("tpuwatch_host_memory_available_bytes", 42) in store.current()
    source.readings = [sample("tpuwatch_host_memory_total_bytes", 50)]
    sampler.run_once()
    assert sample("tpuwatch_host_memory_available_bytes", 100) in store.current()
