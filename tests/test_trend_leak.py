"""The online leak detector on constructed 12 h series of every leak-free and leaking kind."""

from __future__ import annotations

import math
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tpuwatch.analysis import analyze
from tpuwatch.analysis.fast import FastParams
from tpuwatch.analysis.inputs import csv_points
from tpuwatch.analysis.leak import LeakDetector, LeakParams
from tpuwatch.analysis.robust import mann_kendall_p, median, theil_sen

GIB = float(1 << 30)
CAPACITY = 16 * GIB
HOUR = 3600.0
T = np.arange(0.0, 12 * HOUR, 10.0)
LEAK_START = 4 * HOUR


def _noise(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.002 * CAPACITY, T.size)


def _sawtooth(period: float, height: float) -> np.ndarray:
    return height * ((T % period) / period)


def _leak(rate: float) -> np.ndarray:
    return rate * np.clip(T - LEAK_START, 0, None)


RATE = 0.5 * GIB / HOUR  # 8 GiB free fills in about 16 h

LEAK_FREE: dict[str, Callable[[], np.ndarray]] = {
    "flat": lambda: np.zeros_like(T),
    "regular sawtooth": lambda: _sawtooth(300.0, 3 * GIB),
    "irregular sawtooth": lambda: 3 * GIB * np.random.default_rng(1).uniform(0.3, 1, T.size // 60 + 1)[
        (T // 600).astype(int)] * ((T % 600) / 600),
    "steps up and down": lambda: np.select([T < 2 * HOUR, T < 5 * HOUR, T < 8 * HOUR], [0.0, 2 * GIB, -GIB],
                                           GIB),
    "one step up": lambda: np.where(T >= 5 * HOUR, 3 * GIB, 0.0),
    "warm-up plateau": lambda: 4 * GIB * (1 - np.exp(-np.clip(T - 3 * HOUR, 0, None) / 600.0)),
    "periodic load": lambda: 2 * GIB * np.sin(2 * np.pi * T / (1.5 * HOUR)),
    "one-sample spikes": lambda: np.where(np.arange(T.size) % 97 == 0, 4 * GIB, 0.0)
    - np.where(np.arange(T.size) % 89 == 0, 3 * GIB, 0.0),
    # Three equal model swaps upward an hour apart, then down: a staircase too short and slow for a leak.
    "three swaps up": lambda: np.select([T < 2 * HOUR, T < 3 * HOUR, T < 4 * HOUR, T < 5 * HOUR],
                                        [0.0, 1.2 * GIB, 2.4 * GIB, 3.6 * GIB], 1.5 * GIB),
}

LEAKING: dict[str, Callable[[], np.ndarray]] = {
    "linear": lambda: _leak(RATE),
    "under sawtooth": lambda: _sawtooth(300.0, 3 * GIB) + _leak(RATE),
    "staircase": lambda: _leak(RATE)[((T // 900) * 90).astype(int)],
    "accelerating": lambda: 0.15 * GIB * (np.clip(T - LEAK_START, 0, None) / HOUR) ** 2,
    "rising floor": lambda: np.maximum(_sawtooth(300.0, 3 * GIB), _leak(RATE * 2)),
    "periodic plus leak": lambda: 1 * GIB * np.sin(2 * np.pi * T / HOUR) + _leak(RATE * 2),
}


def replay(values: np.ndarray, capacity: float | None = CAPACITY, keep: np.ndarray | None = None,
           params: LeakParams | None = None) -> LeakDetector:
    detector = LeakDetector(params)
    mask = np.ones(T.size, bool) if keep is None else keep
    for t, v in zip(T[mask].tolist(), values[mask].tolist()):
        detector.update(t, v, capacity)
    return detector


def _missed(seed: int) -> np.ndarray:
    keep = np.random.default_rng(seed).random(T.size) > 0.02
    keep[(T > 6 * HOUR) & (T < 6 * HOUR + 240)] = False
    return keep


@pytest.mark.parametrize("kind", LEAK_FREE)
def test_no_alert_on_leak_free_series(kind: str) -> None:
    values = 5 * GIB + LEAK_FREE[kind]() + _noise(len(kind))
    detector = replay(values, keep=_missed(len(kind)))
    assert detector.first_alert_at is None
    assert not detector.state.firing


@pytest.mark.parametrize("kind", LEAKING)
def test_leaks_are_found_after_they_start_and_within_three_hours(kind: str) -> None:
    values = np.minimum(CAPACITY, 5 * GIB + LEAKING[kind]() + _noise(len(kind)))
    detector = replay(values, keep=_missed(len(kind)))
    assert detector.first_alert_at is not None
    assert LEAK_START < detector.first_alert_at <= LEAK_START + 3 * HOUR
    assert detector.state.firing and detector.state.slope > 0 and detector.state.confidence > 0.99


def _first_alert(name: str, params: LeakParams) -> float | None:
    """When the daemon's detector first fires on a captured trace (``tpuwatch analyze``'s replay)."""
    replay = analyze.Replay({"source": name}, params, None)
    replay.feed(csv_points((Path(__file__).parent / "testdata" / "trend" / name).read_text().splitlines(), name))
    return replay.result()["first_alert_at"]


def test_two_sawtooths_that_beat_are_not_a_leak_and_a_leak_under_them_is() -> None:
    # Allocators of 4 min and 4 min 4 s, 2 GiB each, drift out of phase and back in 4 h: for 2 h their releases part
    # and the floor climbs 2 GiB while the high falls as far (their tops part) and the mean holds.
    beat = 5 * GIB + _sawtooth(240.0, 2 * GIB) + _sawtooth(244.0, 2 * GIB) + _noise(7)
    assert replay(beat).first_alert_at is None
    assert replay(beat, params=LeakParams(beat_floor=0.0)).first_alert_at is not None  # the beat test holds it
    leaking = replay(np.minimum(CAPACITY, beat + _leak(RATE))).first_alert_at
    assert leaking is not None and LEAK_START < leaking <= LEAK_START + 3 * HOUR


def test_an_allocator_climb_that_has_dropped_back_is_not_a_leak() -> None:
    # A captured trace (see testdata/trend/make_fixtures.py): without the check that the newest floor has not fallen
    # back below its segment, the detector fired just after a long allocator climb was released.
    assert _first_alert("sawtooth_turning.csv", LeakParams()) is None
    assert _first_alert("sawtooth_turning.csv", LeakParams(end_slack=math.inf, newest_half=-math.inf)) is not None


def test_a_load_cycle_near_its_top_is_not_a_leak() -> None:
    # A captured trace: a load cycle of over 2 h whose rise slows near its top; without the check that the newest
    # segment rises at least half as much as the steepest, the detector fired there.
    assert _first_alert("periodic_turning.csv", LeakParams()) is None
    assert _first_alert("periodic_turning.csv", LeakParams(newest_ratio=0.0, newest_half=-math.inf)) is not None


def test_a_warm_up_in_steps_is_not_paged_short_of_its_persistence() -> None:
    # A captured trace: a cache warming up in steps under a sawtooth, its time to full closing in 14.7, 11.6, 10.8
    # min at its 7th-9th minute.  A page may come on three findings when the fourth would leave under 10 min, but
    # only if the raw readings show the climb straight at half their usual bar: these show it levelling off.
    assert _first_alert("warmup_steps_closing.csv", LeakParams()) is None
    assert _first_alert("warmup_steps_closing.csv", LeakParams(fast=FastParams(urgent_bar=1.0))) is not None


def test_a_warm_up_that_is_levelling_off_is_not_a_leak() -> None:
    # A captured trace: a 23 GiB warm-up that rose for 40 min, its rise slowing; without the same check, it fired.
    assert _first_alert("warmup_levelling.csv", LeakParams()) is None
    assert _first_alert("warmup_levelling.csv", LeakParams(newest_ratio=0.0, newest_half=-math.inf)) is not None


def test_a_staircase_with_three_steps_in_an_hour_is_found_without_waiting_for_a_fourth() -> None:
    steps = 1 * GIB / HOUR * 1200 * np.floor(np.clip(T - LEAK_START, 0, None) / 1200)  # a step every 20 min
    values = 5 * GIB + steps + _noise(3)
    fast = replay(values).first_alert_at
    assert fast is not None and LEAK_START < fast <= LEAK_START + 80 * 60
    slow = replay(values, params=LeakParams(max_jump_fast=0.3)).first_alert_at
    assert slow is not None and slow > LEAK_START + 90 * 60


def test_a_slow_leak_under_a_large_load_cycle_is_seen_through_the_hour_floor() -> None:
    # The load swings 6 GiB every 45 min; the leak adds 0.5 GiB an hour. The 15 min floor follows the load.
    cycle = 3 * GIB * np.sin(2 * np.pi * T / (0.75 * HOUR))
    detector = replay(5 * GIB + cycle + _leak(RATE) + _noise(3), keep=_missed(3))
    assert detector.first_alert_at is not None and LEAK_START < detector.first_alert_at <= LEAK_START + 4 * HOUR
    without_long_floor = LeakParams(floor_windows=(180.0, 900.0))
    assert replay(5 * GIB + cycle + _leak(RATE) + _noise(3), keep=_missed(3),
                  params=without_long_floor).first_alert_at is None


def test_slope_confidence_and_eta_of_a_linear_leak() -> None:
    detector = replay(5 * GIB + _sawtooth(300.0, 2 * GIB) + _leak(RATE) + _noise(3))
    state = detector.state
    assert state.slope == pytest.approx(RATE, rel=0.15)
    high = 5 * GIB + 2 * GIB + RATE * (T[-1] - LEAK_START)
    assert state.eta == pytest.approx((CAPACITY - high) / RATE, rel=0.2)
    assert state.severity == "warning"
    assert detector.slope() == pytest.approx(RATE, rel=0.15)


def test_critical_when_exhaustion_is_nearer_than_critical_eta() -> None:
    fast = 5 * GIB + _leak(1.5 * GIB / HOUR) + _noise(4)
    until = T < 6.5 * HOUR  # 9 GiB in use by then: 7 GiB left, about 4.7 h at 1.5 GiB/h
    warning = replay(fast, keep=until, params=LeakParams(critical_eta=3 * HOUR)).state
    assert warning.firing and warning.severity == "warning"
    assert 3 * HOUR < warning.eta < 6 * HOUR
    critical = replay(fast, keep=until, params=LeakParams(critical_eta=8 * HOUR)).state
    assert critical.firing and critical.severity == "critical"


def test_growth_exhausting_beyond_max_eta_is_ignored() -> None:
    slow = 5 * GIB + _leak(0.5 * GIB / HOUR) + _noise(5)
    assert replay(slow, params=LeakParams(max_eta=2 * HOUR)).first_alert_at is None
    assert replay(slow, params=LeakParams(max_eta=7 * 86400.0)).first_alert_at is not None
    assert replay(slow, capacity=None).first_alert_at is not None  # no capacity: no ETA, no filter
    assert replay(slow, capacity=None).state.eta is None


def test_finding_clears_once_growth_stops() -> None:
    stops = 5 * GIB + np.minimum(_leak(RATE), RATE * 3 * HOUR) + _noise(6)  # leaks from 4 h to 7 h
    detector = replay(stops)
    assert detector.first_alert_at is not None
    assert not detector.state.firing


def test_history_is_bounded_whatever_the_uptime() -> None:
    detector = LeakDetector()
    for t in np.arange(0.0, 3 * 86400.0, 10.0).tolist():
        detector.update(t, 5 * GIB, CAPACITY)
    keep = (6 + 4) * 60 + 1  # longest scale plus lookback, in minutes
    assert len(detector._floors) == len(detector.params.floor_windows)
    for history in (*detector._floors, detector._floor_times):
        assert keep <= len(history) < 2 * keep
    for window in (*detector._lows, detector._highs):
        assert len(window._buckets) <= window.window / 60 and len(window._sorted) <= 2 * len(window._buckets)
    assert len(detector._beats._middles) == len(detector._beats._tops) == 3 * 60 + 1  # the 15 min floor's longest scale


def test_a_detector_holds_after_two_hours_all_it_holds_after_three_days() -> None:
    """The floor histories are allocated whole at the first floor and the sliding windows fill in an hour, so a
    flat series costs no more at day 3 than at hour 2 (growing arrays added 6 x 8 bytes a minute for 11 h)."""
    detector = LeakDetector()
    times = np.arange(0.0, 3 * 86400.0, 10.0).tolist()
    own = [tracemalloc.Filter(True, "*/tpuwatch/analysis/*")]  # the detector's, not the test runner's threads'

    def held() -> int:
        return sum(stat.size for stat in tracemalloc.take_snapshot().filter_traces(own).statistics("filename"))

    tracemalloc.start()
    try:
        for t in times:
            detector.update(t, 5 * GIB, CAPACITY)
            if t == 2 * 3600:
                after_two_hours = held()
        grown = held() - after_two_hours
    finally:
        tracemalloc.stop()
    assert grown < 2048, grown


def test_theil_sen_ignores_outliers_and_mann_kendall_needs_a_trend() -> None:
    x = np.arange(30.0)
    y = 2 * x
    y[[3, 17]] = 1000.0
    assert theil_sen(x, y) == pytest.approx(2.0)
    assert mann_kendall_p(x, 2 * x, 2.0) < 1e-6
    flat = np.random.default_rng(0).normal(0, 1, 30)
    assert mann_kendall_p(x, flat, theil_sen(x, flat)) > 0.01


@pytest.mark.parametrize("values", [[3.0], [5.0, 1.0], [2.0, 9.0, 4.0], [7.0, 1.0, 3.0, 5.0], [1, 1, 2, 8, 8.0]])
def test_median_agrees_with_the_standard_librarys(values: list[float]) -> None:
    import statistics

    assert median(values) == statistics.median(values)


def test_the_daemon_does_not_import_statistics() -> None:
    """statistics (with decimal and fractions) would add 0.6 MiB to every daemon for two medians."""
    code = "import sys; import tpuwatch.daemon; print('statistics' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout
    assert out.strip() == "False"
