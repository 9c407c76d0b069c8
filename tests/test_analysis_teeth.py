"""The sawtooth-aware fit (``tpuwatch/analysis/teeth.py``) and the fast check's use of it: a warm-up under an
allocator's sawtooth or in steps, whose floors climb in steps, is seen to level off on the raw readings and does not
page; a straight climb under the same sawtooth or in the same steps is not."""

from __future__ import annotations

import json
import math

import pytest
from test_analysis_fast import BEFORE, CAPACITY, MINUTE, START, STEP, first_page, jitter, sawtooth

from tpuwatch.analysis.fast import FastParams
from tpuwatch.analysis.leak import LeakDetector, LeakParams
from tpuwatch.analysis.teeth import Teeth, TeethParams


def climb(minutes: float, rise: float, warmup: bool, period: float, height: float, level: float = 0.3,
          until: float = 120.0, every: float = 0.0) -> list[tuple[float, float]]:
    """3 h at ``level`` of the chip under a sawtooth (``height`` of the chip every ``period`` s; 0: none), then a
    climb of ``rise`` of the chip over ``minutes``: a quadratic ease-out that stops there (``warmup``), or a
    straight one that goes on (clipped at capacity); ``until`` minutes after it began; in steps ``every`` s apart
    (0: none)."""
    points = []
    for i in range(int((BEFORE + until * MINUTE) / STEP)):
        t = i * STEP
        since = max(t - BEFORE, 0.0)
        x = (math.ceil(since / every) * every if every else since) / (minutes * MINUTE)
        shape = 1.0 - (1.0 - min(x, 1.0)) ** 2 if warmup else x
        saw = sawtooth(t, period, height) if period else 0.0
        points.append((START + t, min(CAPACITY, (level + rise * shape) * CAPACITY + saw + jitter(i))))
    return points


def teeth_after(points: list[tuple[float, float]], minutes: float, params: TeethParams | None = None) -> Teeth:
    teeth = Teeth(params)
    for t, v in points:
        if t > START + BEFORE + minutes * MINUTE:
            break
        teeth.add(t, v)
    return teeth


def high_of(teeth: Teeth) -> float:
    return max(v for _, v in teeth.readings())


@pytest.mark.parametrize("period", [150.0, 260.0])
def test_a_warm_up_under_a_sawtooth_levels_off_and_a_straight_climb_under_it_does_not(period: float) -> None:
    warm = teeth_after(climb(18, 0.45, True, period, 0.1), 9)
    assert warm.levels_off(high_of(warm), CAPACITY)
    # A straight climb of the warm-up's first slope (5 % of the chip a minute), at the same minute.
    leak = teeth_after(climb(18, 0.9, False, period, 0.1), 9)
    assert not leak.levels_off(high_of(leak), CAPACITY)


def two_sawtooths(points: list[tuple[float, float]], period: float, height: float) -> list[tuple[float, float]]:
    """``points`` under a second allocator's sawtooth, of its own period and height."""
    return [(t, min(CAPACITY, v + sawtooth(t - START + 37.0, period, height))) for t, v in points]


def test_a_warm_up_under_two_sawtooths_levels_off_and_a_straight_climb_under_them_does_not() -> None:
    """Two allocators release each in its own time: between two releases both climb, so the fit takes each
    stretch's level out and the sawtooths' climb from what their releases gave back."""
    warm = teeth_after(two_sawtooths(climb(18, 0.45, True, 150.0, 0.09), 200.0, 0.08), 9)
    assert warm.levels_off(high_of(warm), CAPACITY)
    leak = teeth_after(two_sawtooths(climb(18, 0.9, False, 150.0, 0.09), 200.0, 0.08), 9)
    assert not leak.levels_off(high_of(leak), CAPACITY)


def test_a_warm_up_without_a_sawtooth_levels_off_too() -> None:
    warm = teeth_after(climb(18, 0.45, True, 0.0, 0.0), 9)
    assert warm.levels_off(high_of(warm), CAPACITY)
    assert not teeth_after(climb(18, 0.9, False, 0.0, 0.0), 9).levels_off(high_of(warm), CAPACITY)


@pytest.mark.parametrize("every", [60.0, 90.0, 120.0])
def test_a_warm_up_in_steps_levels_off_and_a_staircase_leak_does_not(every: float) -> None:
    """A cache that grows in chunks: its steps are breaks as a sawtooth's releases are, and the climb between them
    (flat) is set aside the same way; the steps' levels slow down, a staircase leak's do not."""
    warm = teeth_after(climb(18, 0.45, True, 0.0, 0.0, every=every), 8)
    assert warm.levels_off(high_of(warm), CAPACITY)
    leak = teeth_after(climb(18, 0.9, False, 0.0, 0.0, every=every), 8)
    assert not leak.levels_off(high_of(leak), CAPACITY)


@pytest.mark.parametrize(("every", "period"), [(60.0, 150.0), (120.0, 260.0)])
def test_a_warm_up_in_steps_under_a_sawtooth_levels_off_by_its_shrinking_steps(every: float, period: float) -> None:
    """Steps and releases both break the climb; between them it is straight (flats, ramps), so neither fit sees a
    bend.  The steps' sizes do: a warm-up's shrink, a staircase leak's do not."""
    warm = climb(18, 0.45, True, period, 0.1, every=every)
    assert teeth_after(warm, 9).levels_off(high_of(teeth_after(warm, 9)), CAPACITY)
    blind = teeth_after(warm, 9, TeethParams(step_significance=math.inf))
    assert not blind.levels_off(high_of(blind), CAPACITY)
    leak = teeth_after(climb(18, 0.9, False, period, 0.1, every=every), 9)
    assert not leak.levels_off(high_of(leak), CAPACITY)


def test_a_staircase_leak_of_uneven_steps_does_not_level_off() -> None:
    """Chunks of 0.6-1.4 times the mean size, each minute: the sizes scatter, their trend does not fall."""
    sizes = [1.4, 0.6, 1.1, 0.9, 1.3, 0.7, 1.0, 0.8, 1.2, 1.0]
    teeth = Teeth()
    level = 0.3
    for i in range(61):
        if i and i % 6 == 0:
            level += 0.03 * sizes[(i // 6) % len(sizes)]
        teeth.add(START + i * STEP, (level + 0.001 * math.sin(i * 1.7)) * CAPACITY)
    assert not teeth.levels_off(level * CAPACITY, CAPACITY)


def test_shrinking_steps_are_projected_to_where_they_stop() -> None:
    """Steps of 5, 4, 3 and 2 % of the chip 2 min apart, the newest now: shrinking 0.5 % a minute, a^2 / 2|d| a
    minute of steps, one step in two minutes, is 2 % still to come (the newest step counted again: a top a little
    high, never low)."""
    teeth = Teeth(TeethParams(significance=math.inf))  # the steps' sizes alone
    level = 0.3
    for i in range(61):
        if i in (24, 36, 48, 60):
            level += (5 - (i - 24) // 12) / 100.0
        teeth.add(START + i * STEP, level * CAPACITY)
    assert teeth.levels_off((1 - 0.021) * CAPACITY, CAPACITY)
    assert not teeth.levels_off((1 - 0.019) * CAPACITY, CAPACITY)


def steps_of(sizes: list[float], at: list[int]) -> Teeth:
    """61 readings 10 s apart at 30 % of the chip, without noise, stepping up by ``sizes`` (% of the chip) at the
    readings ``at``; judged on the steps' sizes alone."""
    teeth = Teeth(TeethParams(significance=math.inf))
    level = 0.3
    for i in range(61):
        if i in at:
            level += sizes[at.index(i)] / 100.0
        teeth.add(START + i * STEP, level * CAPACITY)
    return teeth


def test_shrinking_steps_are_judged_against_their_own_scatter() -> None:
    """Four steps 2 min apart shrinking by about 1.2 % each: by 5.7 standard errors of their scatter when they
    scatter a little (it levels off), by 3.4 when they scatter more (no verdict)."""
    at = [24, 36, 48, 60]
    assert steps_of([5.4, 3.6, 3.3, 1.7], at).levels_off(0.5 * CAPACITY, CAPACITY)
    assert not steps_of([5.7, 3.3, 3.6, 1.4], at).levels_off(0.5 * CAPACITY, CAPACITY)


def test_steps_that_shrank_to_nothing_have_levelled_off() -> None:
    """Steps of 4, 3, 2 and 1 % a minute apart, the last 4 min ago: at their trend, the next would be nothing."""
    assert steps_of([4.0, 3.0, 2.0, 1.0], [12, 18, 24, 30]).levels_off(0.99 * CAPACITY, CAPACITY)


def test_a_slowing_climb_that_tops_out_above_capacity_does_not_level_off() -> None:
    warm = teeth_after(climb(18, 0.45, True, 150.0, 0.1), 9)
    assert warm.levels_off(high_of(warm), CAPACITY)
    # It has about 11 % of the chip left to climb: from a high of 95 % its top is past full.
    assert not warm.levels_off(0.95 * CAPACITY, CAPACITY)


def test_too_few_readings_or_no_capacity_say_nothing() -> None:
    warm = climb(18, 0.45, True, 150.0, 0.1)
    few = teeth_after(warm[-11:], 200)  # 11 readings
    assert not few.levels_off(0.5 * CAPACITY, CAPACITY)
    assert not teeth_after(warm, 9).levels_off(0.5 * CAPACITY, 0.0)
    assert not Teeth().levels_off(0.5 * CAPACITY, CAPACITY)


def test_readings_are_kept_at_most_keep_and_spaced_by_window_over_keep() -> None:
    teeth = Teeth(TeethParams(window=600.0, keep=120))
    for i in range(30 * 60):  # one reading a second for 30 min
        teeth.add(START + i, float(i))
    kept = teeth.readings()
    assert len(kept) == 120
    assert all(b[0] - a[0] >= 5.0 for a, b in zip(kept, kept[1:]))
    assert kept[-1][0] >= START + 30 * 60 - 6 and kept[0][0] >= START + 30 * 60 - 6 - 119 * 5


def test_a_snapshot_restores_the_same_verdict_and_a_bad_one_is_refused() -> None:
    warm = teeth_after(climb(18, 0.45, True, 260.0, 0.1), 9)
    again = Teeth()
    again.restore(warm.snapshot())
    assert again.readings() == warm.readings()
    assert again.levels_off(high_of(warm), CAPACITY)
    unfit = Teeth()
    unfit.add(START, math.nan)
    with pytest.raises(ValueError):
        Teeth().restore(unfit.snapshot())
    with pytest.raises(ValueError):
        Teeth().restore({"times": warm.snapshot()["times"], "values": unfit.snapshot()["values"]})


def test_the_fast_check_stays_quiet_on_a_warm_up_under_a_sawtooth_that_its_floors_alone_would_page() -> None:
    warm = climb(18, 0.45, True, 260.0, 0.1)
    blind = LeakParams(fast=FastParams(teeth=TeethParams(significance=math.inf)))  # the fit never says "levels"
    assert first_page(warm, blind) is not None
    assert first_page(warm) is None


def test_a_straight_leak_under_the_same_sawtooth_is_still_paged_10_minutes_before_full() -> None:
    leak = climb(25, 0.6, False, 260.0, 0.1)  # tops full after about 25 min
    full = next(t for t, v in leak if v >= CAPACITY)
    page = first_page(leak)
    assert page is not None and full - page >= 10 * MINUTE


@pytest.mark.parametrize("every", [90.0, 120.0])
def test_the_fast_check_stays_quiet_on_a_warm_up_in_steps_and_pages_a_staircase_leak_in_time(every: float) -> None:
    """From 30 % to 90 % of the chip in 25 min in steps: the floors alone page it; seen on the raw readings, its
    steps slow down.  A staircase of the same steps that goes on is paged 10 min before full."""
    warm = climb(25, 0.6, True, 0.0, 0.0, every=every)
    blind = LeakParams(fast=FastParams(teeth=TeethParams(significance=math.inf, step_significance=math.inf)))
    assert first_page(warm, blind) is not None
    assert first_page(warm) is None
    leak = climb(25, 0.6, False, 0.0, 0.0, every=every)
    full = next(t for t, v in leak if v >= CAPACITY)
    page = first_page(leak)
    assert page is not None and full - page >= 10 * MINUTE


def test_the_raw_readings_survive_a_restart() -> None:
    warm = climb(18, 0.45, True, 260.0, 0.1)
    cut = next(i for i, (t, _) in enumerate(warm) if t >= START + BEFORE + 9 * MINUTE)
    detector = LeakDetector()
    for t, v in warm[:cut]:
        detector.update(t, v, CAPACITY)
    restored = LeakDetector.restore(json.loads(json.dumps(detector.snapshot())))
    assert restored._fast is not None and detector._fast is not None
    assert restored._fast._teeth.readings() == detector._fast._teeth.readings() != []
    for t, v in warm[cut:]:
        restored.update(t, v, CAPACITY)
    assert restored.first_alert_at is None


def parabola(count: int, start: float = 0.0) -> Teeth:
    """``count`` readings 10 s apart, without noise, on a quadratic warm-up from 30 % climbing 45 % of the chip in
    18 min, from ``start`` s after it began."""
    teeth = Teeth()
    for i in range(count):
        x = (start + i * STEP) / (18 * MINUTE)
        teeth.add(START + start + i * STEP, (0.3 + 0.45 * (1 - (1 - x) ** 2)) * CAPACITY)
    return teeth


def test_the_top_is_where_the_parabola_turns_and_twelve_readings_are_the_least_judged() -> None:
    warm = parabola(61)  # at 10 min, 66.1 % of the chip with 8.9 % still to climb
    assert warm.levels_off((1 - 0.095) * CAPACITY, CAPACITY)
    assert not warm.levels_off((1 - 0.085) * CAPACITY, CAPACITY)
    assert parabola(12).levels_off(0.5 * CAPACITY, CAPACITY)
    assert not parabola(11).levels_off(0.5 * CAPACITY, CAPACITY)


def test_one_release_is_one_tooth_and_gives_no_verdict() -> None:
    """After a single release the climb of the allocator and the chip's are one slope; a release among the last
    readings leaves too few to judge."""
    for at in (30, 58):
        teeth = parabola(61)
        shifted = Teeth()
        for i, (t, v) in enumerate(teeth.readings()):
            shifted.add(t, v + (0.05 * CAPACITY if i < at else 0.0))  # everything before ``at`` 5 % higher
        assert not shifted.levels_off(0.5 * CAPACITY, CAPACITY)


def test_a_fresh_ring_holds_nothing_and_spaces_its_first_readings_too() -> None:
    teeth = Teeth(TeethParams(window=600.0, keep=120))
    assert teeth.readings() == []
    for i in range(21):
        teeth.add(START + i, float(i))
    assert teeth.readings() == [(START + i, float(i)) for i in (0, 5, 10, 15, 20)]


def test_an_unfit_snapshot_says_why() -> None:
    warm = parabola(20)
    unfit = Teeth()
    unfit.add(START, math.nan)
    with pytest.raises(ValueError, match="not finite"):
        Teeth().restore(unfit.snapshot())
    with pytest.raises(ValueError, match="differ in number"):
        Teeth().restore({"times": warm.snapshot()["times"], "values": unfit.snapshot()["values"]})
