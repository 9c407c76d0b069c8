"""The series store: bounded history, eviction, absent-not-stale current readings."""

from __future__ import annotations

import tracemalloc

from tpuwatch.samples import sample
from tpuwatch.store import PLOTTED, History, Ring, SeriesStore


def test_ring_keeps_the_newest_points_in_order() -> None:
    ring = Ring(3)
    for i in range(5):
        ring.append(float(i), i * 10.0)
    assert ring.points() == [(2.0, 20.0), (3.0, 30.0), (4.0, 40.0)]
    assert len(ring) == 3


def test_a_partly_filled_ring_returns_only_what_was_added() -> None:
    ring = Ring(5)
    assert ring.points() == [] and len(ring) == 0
    ring.append(1.0, 10.0)
    ring.append(2.0, 20.0)
    assert ring.points() == [(1.0, 10.0), (2.0, 20.0)]


def test_a_history_keeps_the_newest_values_and_drops_the_oldest_on_request() -> None:
    history = History(4, [1.0, 2.0])
    history.extend([3.0, 4.0, 5.0])  # full: the oldest goes
    assert list(history) == [2.0, 3.0, 4.0, 5.0] and history[-1] == 5.0 and history[1:3].tolist() == [3.0, 4.0]
    history.drop(3)
    assert list(history) == [5.0]
    history.extend([6.0, 7.0])  # moved to the front to make room
    assert list(history) == [5.0, 6.0, 7.0] and len(history) == 3
    history.drop(10)
    assert len(history) == 0 and list(History(2, range(5))) == [3.0, 4.0]


def test_a_history_costs_the_same_from_its_first_value_to_its_millionth() -> None:
    history = History(600)
    own = [tracemalloc.Filter(True, "*/tpuwatch/store.py")]  # the history's, not the test runner's threads'

    def held() -> int:
        return sum(stat.size for stat in tracemalloc.take_snapshot().filter_traces(own).statistics("filename"))

    tracemalloc.start()
    try:
        history.append(0.0)
        first = held()
        for k in range(1, 100_000):
            history.append(float(k))
            if k % 500 == 0:
                history.drop(len(history) - 100)
        assert held() - first < 512
    finally:
        tracemalloc.stop()
    assert list(history)[-1] == 99_999.0


def test_current_replaces_an_owners_readings() -> None:
    store = SeriesStore(points_per_series=4, max_series=100)
    store.replace("devices", [sample("tpuwatch_device_up", 1, device="0"),
                              sample("tpuwatch_device_up", 1, device="1")], 1.0)
    store.replace("host", [sample("tpuwatch_host_memory_total_bytes", 8)], 1.0)
    store.replace("devices", [sample("tpuwatch_device_up", 1, device="0")], 2.0)
    current = store.current()
    assert sample("tpuwatch_device_up", 1, device="1") not in current
    assert len(current) == 2
    store.forget("host")
    assert [s.name for s in store.current()] == ["tpuwatch_device_up"]


def test_history_is_bounded_per_series() -> None:
    store = SeriesStore(points_per_series=5, max_series=100)
    for t in range(100):
        store.replace("devices", [sample("tpuwatch_device_up", t, device="0")], float(t))
    points = store.history("tpuwatch_device_up", (("device", "0"),))
    assert points == [(float(t), float(t)) for t in range(95, 100)]


def test_series_beyond_the_limit_evict_the_least_recently_updated() -> None:
    store = SeriesStore(points_per_series=2, max_series=16)
    for pid in range(40):
        store.replace("host", [sample("tpuwatch_holder_process_resident_memory_bytes", 1, pid=str(pid),
                                      command="x")], float(pid))
    assert store.series_count() == 16
    assert store.evicted_total == 24
    assert store.history("tpuwatch_holder_process_resident_memory_bytes", (("command", "x"), ("pid", "39")))
    assert not store.history("tpuwatch_holder_process_resident_memory_bytes", (("command", "x"), ("pid", "0")))


def test_memory_is_fixed_by_config_not_by_uptime() -> None:
    store = SeriesStore(points_per_series=50, max_series=200)
    batch = [sample("tpuwatch_device_memory_used_bytes", 1, device=str(d)) for d in range(100)]

    def run(cycles: int, start: int) -> None:
        for t in range(start, start + cycles):
            store.replace("devices", batch, float(t))

    run(100, 0)  # fill every ring
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    run(2000, 100)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert grown < 16_384, f"store grew by {grown} bytes after its rings were full"


def test_a_store_with_kept_names_keeps_history_of_those_only_and_every_latest_sample() -> None:
    store = SeriesStore(points_per_series=4, max_series=100, kept=frozenset({"plotted"}))
    store.replace("devices", [sample("plotted", 1.0, device="0"), sample("other", 2.0, device="0")], 10.0)
    assert store.history("plotted", (("device", "0"),)) == [(10.0, 1.0)]
    assert store.history("other", (("device", "0"),)) == []
    assert {s.name for s in store.current()} == {"plotted", "other"}
    assert store.series_count() == 1


def test_the_daemon_store_keeps_history_of_every_series_the_status_page_plots() -> None:
    from tpuwatch.views.document import SERIES

    assert set(SERIES.values()) <= PLOTTED
