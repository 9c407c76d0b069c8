"""Fast leaks and their look-alikes at the daemon's own scale (1 min buckets, 3 h of normal use first), crafted
from the cases `benchmarks/fastleaks.py` showed: a leak under a tall allocator sawtooth, whose floors bend for a
minute between teeth, is paged 10 min before the chip is full; a second model loaded in a few steps 30 min after a
first is a load that has levelled off, not a staircase, and does not page; a 20 min leak is paged without waiting
out its persistence when waiting would leave under 10 min."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from tpuwatch.analysis.fast import FastParams
from tpuwatch.analysis.leak import LeakDetector, LeakParams

GIB = 1024.0**3
CAPACITY = 16 * GIB
START = 1_700_000_000.0
STEP = 10.0
BEFORE = 3 * 3600.0
MINUTE = 60.0


def jitter(i: int) -> float:
    """A small, repeatable wobble (0.1 % of the chip at most)."""
    return 0.001 * CAPACITY * math.sin(i * 1.7) * math.cos(i * 0.31)


def sawtooth(t: float, period: float, height: float) -> float:
    """An allocator's sawtooth: a climb of ``height`` of the chip over ``period`` s, then a release."""
    return height * CAPACITY * ((t % period) / period)


def first_page(points: list[tuple[float, float]], params: LeakParams | None = None) -> float | None:
    detector = LeakDetector(params)
    for t, v in points:
        detector.update(t, v, CAPACITY)
    return detector.first_alert_at


def leak_under_sawtooth(minutes_to_full: float, period: float, height: float) -> list[tuple[float, float]]:
    """3 h at 30 % under the sawtooth, then a leak that brings its tops to full in ``minutes_to_full``; ends 5 min
    after the first reading at capacity."""
    room = (1.0 - 0.3 - height) * CAPACITY
    points = []
    for i in range(int((BEFORE + (minutes_to_full + 5) * MINUTE) / STEP)):
        t = i * STEP
        leaked = room * max(0.0, t - BEFORE) / (minutes_to_full * MINUTE)
        points.append((START + t, min(CAPACITY, 0.3 * CAPACITY + sawtooth(t, period, height) + leaked + jitter(i))))
    return points


def test_a_leak_under_a_tall_sawtooth_is_paged_10_minutes_before_full_though_a_floor_bends_between_teeth() -> None:
    # Before: the minute's lows or the 3 min floor, between two teeth, bent for a minute and vetoed the climb that
    # the other floors saw steady; the streak started again and the page came 9.7 min before full.
    points = leak_under_sawtooth(27.0, 2.5 * MINUTE, 0.15)
    full = next(t for t, v in points if v >= CAPACITY)
    page = first_page(points)
    assert page is not None and page >= START + BEFORE
    assert full - page >= 10 * MINUTE


def second_model(first: float, steps: int, within: float, level: float) -> list[tuple[float, float]]:
    """3 h at 30 % under a 3 min sawtooth 5 % tall; ``first`` of the chip loaded 30 min before the event; at the
    event a second model in ``steps`` equal steps within ``within`` s to ``level``; then 2 h flat."""
    points = []
    for i in range(int((BEFORE + 120 * MINUTE) / STEP)):
        t = i * STEP
        value = 0.3 * CAPACITY + sawtooth(t, 3 * MINUTE, 0.05) + jitter(i)
        if t >= BEFORE - 30 * MINUTE:
            value += first * CAPACITY
        if t >= BEFORE:
            done = min(math.floor((t - BEFORE) / (within / steps)) + 1, steps)
            value += (level - 0.3 - first) * CAPACITY * done / steps
        points.append((START + t, value))
    return points


def test_a_second_model_loaded_in_steps_after_a_first_does_not_page() -> None:
    # Before: the two loads, one in three steps over 2 min, passed as a staircase at the 60-90 min scales (their
    # segments' medians rose in order) and paged 35 min after the second, though the floor had been flat since.
    points = second_model(0.2, 3, 2 * MINUTE, 0.7)
    assert first_page(points) is None
    # Without the check that the floor still climbs within the newest segment, they page.
    assert first_page(points, dataclasses.replace(LeakParams(), newest_half=0.0)) is not None


def test_a_leaking_staircase_that_steps_every_few_minutes_still_pages() -> None:
    # The 3 min jump does not take a leak's staircase for a load: a step every 4 min, a 60 min leak.
    room = 0.7 * CAPACITY
    points = []
    for i in range(int((BEFORE + 65 * MINUTE) / STEP)):
        t = i * STEP
        since = math.floor(max(0.0, t - BEFORE) / (4 * MINUTE)) * 4 * MINUTE
        points.append((START + t, min(CAPACITY, 0.3 * CAPACITY + room * since / (60 * MINUTE) + jitter(i))))
    full = next(t for t, v in points if v >= CAPACITY)
    page = first_page(points)
    assert page is not None and full - page >= 10 * MINUTE


def test_an_uneven_staircase_is_projected_from_its_high_plus_its_largest_step() -> None:
    """Chunks of 1.6 and 0.4 times the mean every 90 s under a 200 s sawtooth: the chip fills at the big step
    that crosses capacity, a step's time before a straight line through the steps says.  Projected from the high
    alone, the page came 10.8 min before full; with the step, 13.8."""
    rate = 0.6 / 26  # of the chip a minute: 30 % to 90 %, then the sawtooth's 10 % on top
    points = []
    for i in range(int((BEFORE + 60 * MINUTE) / STEP)):
        t = i * STEP
        steps = int(max(0.0, t - BEFORE) // 90.0)
        climbed = sum((1.6, 0.4)[k % 2] for k in range(steps)) * rate * 1.5
        points.append((START + t, min(CAPACITY, (0.3 + climbed) * CAPACITY + sawtooth(t, 200.0, 0.1) + jitter(i))))
    full = next(t for t, v in points if v >= CAPACITY)
    page = first_page(points)
    assert page is not None and full - page >= 12.5 * MINUTE


def test_a_20_minute_leak_is_paged_on_three_findings_when_a_fourth_would_leave_under_10_minutes() -> None:
    # 30 % to full in 20 min through readings 0.4 % of the chip noisy: the fourth minute of persistence would page it
    # 9.5 min before full; its time to full closing in minute by minute and the raw readings straight, the third does.
    rng = random.Random(0)
    points = []
    for i in range(int((BEFORE + 25 * MINUTE) / STEP)):
        t = i * STEP
        leaked = 0.7 * CAPACITY * max(0.0, t - BEFORE) / (20 * MINUTE)
        points.append((START + t, min(CAPACITY, 0.3 * CAPACITY + leaked + rng.gauss(0, 0.004 * CAPACITY))))
    full = next(t for t, v in points if v >= CAPACITY)
    page = first_page(points)
    assert page is not None and full - page >= 10 * MINUTE
    waited = first_page(points, dataclasses.replace(LeakParams(), fast=FastParams(urgent=4)))
    assert waited is not None and 9 * MINUTE <= full - waited < 10 * MINUTE


def s_curve(steepness: float, within_min: float, level: float) -> list[tuple[float, float]]:
    """3 h at 30 %, then a cache that warms up along a logistic S over ``within_min`` minutes (slow, then fast,
    then slow) to ``level`` of the chip, and stays there for an hour."""
    low, high = 1 / (1 + math.exp(steepness / 2)), 1 / (1 + math.exp(-steepness / 2))
    points = []
    for i in range(int((BEFORE + 60 * MINUTE) / STEP)):
        t = i * STEP
        x = min(1.0, max(0.0, t - BEFORE) / (within_min * MINUTE))
        share = (1 / (1 + math.exp(-steepness * (x - 0.5))) - low) / (high - low) if 0 < x < 1 else x
        points.append((START + t, (0.3 + (level - 0.3) * share) * CAPACITY + jitter(i)))
    return points


@pytest.mark.parametrize(("steepness", "within_min", "level"),
                         [(6, 20, 0.7), (8, 15, 0.6), (10, 25, 0.7), (12, 20, 0.6)])
def test_an_s_shaped_warm_up_past_its_steepest_is_seen_slowing_down_on_its_newest_minutes(
        steepness: float, within_min: float, level: float) -> None:
    # Over its whole climb an S bends by little (it sped up first); each of these paged, late in its climb, before
    # the newest half of the climb was judged on its own.
    points = s_curve(steepness, within_min, level)
    assert first_page(points) is None
    whole_only = dataclasses.replace(LeakParams(), fast=dataclasses.replace(FastParams(), newest=10**6))
    assert first_page(points, whole_only) is not None
