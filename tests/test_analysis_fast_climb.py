"""The fast check's judgement of one floor's climb (``FastCheck._climb``) on literal floors, each test on the bound
it names: where a new high and a climb begin, a jump against a climb, the thirds' rates, a climb that turned, the
noise a finding's confidence reads (from the reference, and from what a quadratic leaves of the climb) and the
step a staircase is projected with.  Mutation testing found each of them unpinned by the tests on whole series;
the expected values are worked out here from the definitions in ``fast.py``'s docstring (the noise with numpy's
own fit), not by running the check."""

from __future__ import annotations

import dataclasses
import math
import statistics

import numpy as np
import pytest

from tpuwatch.analysis.fast import LEVELS, STEADY, TURNED, FastCheck, FastFinding, FastParams

MINUTE = 60.0
CAPACITY = 100.0  # a new high must rise 3 (min_rise); a climb starts over 0.99 above the reference's top


def judge(reference: list[float], values: list[float], high: float, capacity: float = CAPACITY,
          params: FastParams | None = None, shortest: int = 6, highs: tuple[float, ...] = ()) -> FastFinding | None:
    """``_climb`` on ``reference`` then ``values``; ``highs`` are the detector's highs the check has kept."""
    check = FastCheck(params)
    check._highs.extend(highs)
    return check._climb(reference + values, len(reference), shortest, -math.inf, high, capacity, MINUTE)


def thirds(*rates: float, per: int = 4) -> list[float]:
    """A climb from 0 whose thirds, ``per`` buckets each, rise at ``rates`` a bucket."""
    values = [0.0]
    for rate in rates:
        start = values[-1]
        values += [start + rate * (i + 1) for i in range(per)]
    return values


def test_a_floor_exactly_the_margin_above_its_reference_is_a_new_high() -> None:
    values = [0.25 * (i + 1) for i in range(12)]  # to 3.0: the margin, min_rise of the capacity
    assert judge([0.0] * 3, values, 3.0) is STEADY  # judged (due beyond the horizon)
    assert judge([0.0] * 3, values[:-1] + [2.999], 3.0) is None


def test_a_climb_starts_after_the_last_floor_not_over_a_third_of_the_margin() -> None:
    params = FastParams()
    onset = params.onset * (params.min_rise * CAPACITY)  # 0.99 over the reference's top
    rising = [onset + 0.5 * (i + 1) for i in range(7)]
    assert judge([0.0] * 3, [onset, *rising[:6]], 4.0) is None  # 5 minutes after the floor at the onset: too short
    assert judge([0.0] * 3, [onset, *rising], 4.0) is STEADY  # 6 minutes: judged
    assert judge([0.0] * 3, [onset + 1e-9, *rising[:6]], 4.0) is STEADY  # a floor over it starts the climb


@pytest.mark.parametrize(("jump", "judged"), [(11.0, True), (12.0, False)])
def test_a_one_minute_rise_of_half_the_climb_is_part_of_it_a_larger_one_a_jump(jump: float, judged: bool) -> None:
    # From 41 (over 40.99) a bucket at a time, one step of ``jump`` in the middle third: the climb rises
    # 11 + jump in all; a step over half of that is a model load, not a climb.
    steps = [1.0] * 12
    steps[5] = jump
    values = [41.0]
    for step in steps:
        values.append(values[-1] + step)
    found = judge([40.0] * 3, values, values[-1])
    assert (found is not None) == judged


@pytest.mark.parametrize(("rates", "judged"), [((0.5, 2.0, 2.0), True), ((0.375, 2.0, 2.0), False)])
def test_the_slowest_third_must_rise_min_ratio_as_steep_as_the_steepest(rates: tuple[float, ...],
                                                                      judged: bool) -> None:
    params = dataclasses.replace(FastParams(), min_ratio=0.25)
    values = thirds(*rates)
    assert (judge([-20.0] * 3, values, values[-1], params=params) is not None) == judged


@pytest.mark.parametrize(("rates", "turned"), [
    ((1.0, 0.5, -0.125), True),  # ever slower, the newest third falling: it turned
    ((0.5, 0.5, -0.125), True),  # as steep, then falling
    ((1.0, -0.125, -0.125), True),  # falling as fast in the last two thirds
    ((0.125, 0.5, -0.125), False),  # faster in the middle: no steady slowing
    ((1.0, -0.5, -0.125), False),  # falling slower in the newest third than in the middle
    ((1.0, 0.5, 0.0), False),  # flat in the newest third: not falling
])
def test_a_climb_turned_when_its_thirds_rose_ever_slower_and_its_newest_fell(rates: tuple[float, ...],
                                                                            turned: bool) -> None:
    values = thirds(*rates)
    found = judge([-20.0] * 3, values, max(values))
    assert (found is TURNED) == turned
    assert turned or found is None


def boundary(climb: list[float], noise: float, params: FastParams) -> float:
    """The room over the high at which the faster end of a straight climb's slope fills the chip in ``near``:
    room / (slope + confidence x noise x the slope's standard error per unit noise) = near."""
    t = np.arange(len(climb), dtype=float)
    slope = np.polyfit(t, climb, 1)[0]
    error = params.confidence * noise / math.sqrt(float(((t - t.mean()) ** 2).sum()))
    return params.near * (slope + error) / MINUTE


@pytest.mark.parametrize("reference", [[10.0, 10.6, 10.1, 10.9, 10.2, 10.4, 11.1, 10.3],
                                       [10.0, 10.9, 10.5, 11.6, 11.0, 11.3, 12.2, 11.5]])
def test_a_findings_confidence_reads_the_noise_of_the_references_minute_to_minute_changes(
        reference: list[float]) -> None:
    # The reference's minute-to-minute changes: their median absolute deviation, scaled to a standard deviation
    # (x 1.4826) of one floor (/ sqrt 2); a straight climb leaves nothing to add to it.
    changes = [b - a for a, b in zip(reference, reference[1:])]
    middle = statistics.median(changes)
    noise = 1.4826 * statistics.median(abs(d - middle) for d in changes) / math.sqrt(2.0)
    climb = [max(reference) + 1.3 + 0.5 * i for i in range(13)]
    params = dataclasses.replace(FastParams(), horizon=1e9)
    room = boundary(climb, noise, params)
    assert room > 1.1 * boundary(climb, 0.0, params)  # the noise matters here
    inside = judge(reference, climb, climb[-1], climb[-1] + 0.99 * room, params)
    assert inside is not None and inside is not STEADY
    assert judge(reference, climb, climb[-1], climb[-1] + 1.01 * room, params) is STEADY


@pytest.mark.parametrize(("span", "zigzag", "residual"), [(12, 0.5, True), (4, 0.05, True), (3, 0.05, False)])
def test_a_findings_confidence_reads_what_a_quadratic_leaves_of_a_climb_over_three_minutes(
        span: int, zigzag: float, residual: bool) -> None:
    # A straight climb with alternate floors ``zigzag`` above and below: the noise is the quadratic's residuals'
    # standard deviation (their squares over the span less 2, the degrees of freedom left); a climb of 3 minutes
    # leaves 1 and its residuals are not read: the reference's noise stands (flat: 1e-4 of a capacity of about 6,
    # too little to move the bound by a thousandth).
    climb = [1.5 + 0.75 * i + zigzag * (-1) ** i for i in range(span + 1)]
    t = np.arange(span + 1, dtype=float)
    left = np.asarray(climb) - np.polyval(np.polyfit(t, climb, 2), t)
    noise = math.sqrt(float((left**2).sum()) / (span - 2)) if residual else 0.0
    params = dataclasses.replace(FastParams(), horizon=1e9, min_rise=0.01)
    room = boundary(climb, noise, params)
    assert room > 1.03 * boundary(climb, 0.0, params) or not residual
    capacity = climb[-1] + 0.99 * room
    inside = judge([0.0] * 3, climb, climb[-1], capacity, params, shortest=span)
    assert inside is not None and inside is not STEADY
    capacity = climb[-1] + 1.01 * room
    assert judge([0.0] * 3, climb, climb[-1], capacity, params, shortest=span) is STEADY


def straight() -> list[float]:
    return [1.5 + 0.5 * i for i in range(13)]  # 12 minutes at 0.5 a bucket


@pytest.mark.parametrize(("highs", "step"), [
    ([0.0] * 20 + [3.0] * 12, 2.5),  # the high's rise of 3 at the first minute of the climb's span: a step
    ([0.0] * 19 + [3.0] * 13, 0.0),  # a minute before it: not this climb's
    ([0.0] + [3.0] * 12, 2.5),  # the highs kept start with the climb's span
])
def test_a_staircase_is_projected_from_the_high_plus_the_largest_rise_the_high_took_in_the_climb(
        highs: list[float], step: float) -> None:
    # The step is that rise less a minute's climb at the slope (0.5): a straight climb's rises add nothing.
    climb, capacity = straight(), 14.0
    found = judge([0.0] * 3, climb, 7.5, capacity, highs=tuple(highs))
    assert found is not None and found.slope == pytest.approx(0.5 / MINUTE)
    assert found.eta == pytest.approx((capacity - 7.5 - step) / found.slope)
    assert found.track == pytest.approx((capacity - 7.5) / found.slope)


def test_a_step_counts_for_at_most_half_the_room() -> None:
    climb, capacity = straight(), 14.0
    found = judge([0.0] * 3, climb, 7.5, capacity, highs=(0.0, 10.0, *[10.0] * 11))  # a rise of 10: over half
    assert found is not None and found.eta == pytest.approx(0.5 * (capacity - 7.5) / found.slope)


def quadratic_with(pattern: list[float], noise: float, slope: float, curvature: float) -> tuple[list[float], float]:
    """10 + slope t + curvature t^2 at t = -12..0 plus ``pattern`` with the quadratic taken out of it, scaled to
    ``noise`` (its squares over 10 degrees of freedom): what a quadratic fit leaves is that pattern.  Also the
    pattern's lag-one autocorrelation."""
    t = np.arange(-12, 1, dtype=float)
    basis = np.vander(t, 3)
    left = np.asarray(pattern) - basis @ np.linalg.lstsq(basis, np.asarray(pattern, dtype=float), rcond=None)[0]
    left *= noise / math.sqrt(float((left**2).sum()) / 10)
    lag = float((left[:-1] * left[1:]).sum() / (left**2).sum())
    return list(10.0 + slope * t + curvature * t * t + left), lag


def test_a_bend_significant_only_if_its_minutes_were_independent_waits() -> None:
    # The least curvature told from noise: decelerating (3) x the noise x the curvature's standard error per unit
    # noise.  Residuals that follow each other (steps of 3 minutes) hold fewer independent values: the bound
    # widens by sqrt((1 + lag) / (1 - lag)), and a curvature between the two bounds is neither a bend nor none.
    params = FastParams()
    t = np.arange(-12, 1, dtype=float)
    error = math.sqrt(float(np.linalg.inv(np.vander(t, 3).T @ np.vander(t, 3))[0, 0]))
    noise = 0.6
    least = params.decelerating * noise * error
    steps = [1.0, 1.0, 1.0, -1.0, -1.0, -1.0] * 2 + [1.0]
    _, lag = quadratic_with(steps, noise, 1.0, 0.0)
    widened = least * math.sqrt((1 + lag) / (1 - lag))
    assert 0.2 < lag < params.max_lag and widened > 1.3 * least
    curvature = -(least + widened) / 2
    stepped, _ = quadratic_with(steps, noise, 1.0, curvature)
    assert judge([-40.0] * 3, stepped, stepped[-1], 1000.0) is None
    alternate, alternate_lag = quadratic_with([(-1.0) ** i for i in range(13)], noise, 1.0, curvature)
    assert alternate_lag < 0  # taken as independent: a bend, to 1 / (4 x -curvature) over the high
    assert judge([-40.0] * 3, alternate, alternate[-1], 1000.0) is LEVELS
    beyond, _ = quadratic_with(steps, noise, 1.0, -1.1 * widened)  # past the widened bound: a bend
    assert judge([-40.0] * 3, beyond, beyond[-1], 1000.0) is LEVELS


def test_a_climb_too_rough_to_show_a_bend_yet_waits() -> None:
    # Judged only while the least curvature told from noise is under bend (1.5) x the slope spread over the span:
    # here 1.5 x 1 / 12 a bucket; the noise that puts it there is that over 3 x the curvature's standard error.
    t = np.arange(-12, 1, dtype=float)
    error = math.sqrt(float(np.linalg.inv(np.vander(t, 3).T @ np.vander(t, 3))[0, 0]))
    rough = FastParams().bend * 1.0 / 12 / (FastParams().decelerating * error)
    zigzag = [(-1.0) ** i for i in range(13)]
    smooth, _ = quadratic_with(zigzag, 0.9 * rough, 1.0, 0.0)
    assert judge([-40.0] * 3, smooth, smooth[-1], 1000.0) is STEADY
    noisy, _ = quadratic_with(zigzag, 1.1 * rough, 1.0, 0.0)
    assert judge([-40.0] * 3, noisy, noisy[-1], 1000.0) is None


def test_a_bend_levels_off_at_the_nearer_of_its_two_projections_scaled() -> None:
    # As test_analysis_fast_parts' two, at another scale: slope 2 a bucket falling by 0.08 a bucket levels off
    # 2^2 / (4 x 0.04) = 25 above the high; thirds rising 2, 2, 0.8 a bucket, 3.2 x 0.4 / 0.6 above it.
    values = [40.0 + 2.0 * t - 0.04 * t * t for t in range(-12, 1)]
    assert judge([8.0] * 3, values, 40.0, 40.0 + 26.0) is LEVELS
    assert judge([8.0] * 3, values, 40.0, 40.0 + 24.0) not in (LEVELS, STEADY, None)
    values = thirds(2.0, 2.0, 0.8)
    left = 3.2 * 0.4 / 0.6
    assert judge([-40.0] * 3, values, values[-1], values[-1] + left + 0.1) is LEVELS
    assert judge([-40.0] * 3, values, values[-1], values[-1] + left - 0.1) not in (LEVELS, STEADY, None)


def test_thirds_that_stopped_slowing_leave_the_level_to_the_quadratics_slope() -> None:
    # Thirds rising 3, 1 and 1 a bucket: the last two as steep (q = 1), no geometric series to sum; the quadratic's
    # slope now (0.11 a bucket) falling linearly levels off a little above the high: between 0.01 and 0.2.
    values = thirds(3.0, 1.0, 1.0)
    found = judge([-40.0] * 3, values, values[-1], values[-1] + 0.01)
    assert found is not None and found not in (LEVELS, STEADY) and found.slope > 0
    assert judge([-40.0] * 3, values, values[-1], values[-1] + 0.2) is LEVELS
    # Thirds rising 2, 0.5 and 0.5: the quadratic's slope now is already down to nothing: it levels off where it is.
    values = thirds(2.0, 0.5, 0.5)
    assert judge([-40.0] * 3, values, values[-1], values[-1] + 1e-6) is LEVELS


def curvature_error(span: int) -> float:
    """The standard error of a quadratic fit's t^2 coefficient over t = -span..0, per unit of noise."""
    basis = np.vander(np.arange(-span, 1, dtype=float), 3)
    return math.sqrt(float(np.linalg.inv(basis.T @ basis)[0, 0]))


def test_a_curvature_under_what_the_noise_floor_can_tell_is_no_bend() -> None:
    # A flat reference: the noise is the floor, 1e-4 of the capacity (100 of 1e6); the least curvature told from
    # it, 3 x 100 x the curvature's standard error.  A climb bending by half that is projected straight, at its
    # line's slope, not at the quadratic's slope now.
    capacity, span = 1e6, 30
    least = FastParams().decelerating * 1e-4 * capacity * curvature_error(span)
    t = np.arange(-span, 1, dtype=float)
    climb = list(975_000.0 + 2000.0 * t - 0.5 * least * t * t)
    found = judge([900_000.0] * 3, climb, climb[-1], capacity)
    assert found is not None and found not in (LEVELS, STEADY)
    assert found.slope == pytest.approx(np.polyfit(t, climb, 1)[0] / MINUTE, rel=1e-9)


def test_a_climb_of_three_minutes_bends_at_the_least_curvature_unwidened() -> None:
    # Three minutes leave no residuals to read their autocorrelation on: a bend by 1.5 times the least curvature
    # told from noise (the floor's, 1e-4 of the capacity) is a bend, here to well below capacity.
    capacity = 1000.0
    least = FastParams().decelerating * 1e-4 * capacity * curvature_error(3)
    climb = [100.0 + 12.0 * t - 1.5 * least * t * t for t in range(-3, 1)]
    assert judge([0.0] * 3, climb, climb[-1], capacity, shortest=3) is LEVELS


def test_a_climb_that_sped_up_and_now_slows_down_levels_off_on_its_newest_half() -> None:
    # An S over 16 minutes, 500 + 3u - 0.01u^3 for u = -8..8, point-symmetric about its middle: the quadratic over
    # the whole climb bends by nothing.  Its newest half (u = 0..8, span 8 >= 2 x newest) fits a quadratic whose
    # slope now falls fast enough to show through its own residuals: it tops out b^2 / 4|c| above the high.
    u = np.arange(-16, 1, dtype=float) + 8
    climb = list(500.0 + 3.0 * u - 0.01 * u**3)
    curvature, slope, _ = np.polyfit(np.arange(-8, 1, dtype=float), climb[-9:], 2)
    top = slope * slope / (4.0 * -curvature)
    assert judge([400.0] * 3, climb, climb[-1], climb[-1] + top + 0.2) is LEVELS
    found = judge([400.0] * 3, climb, climb[-1], climb[-1] + top - 0.2)  # would top out above capacity
    assert found is not None and found not in (LEVELS, STEADY)
    assert found.slope == pytest.approx(np.polyfit(u, climb, 1)[0] / MINUTE, rel=1e-9)  # projected straight
    whole_only = dataclasses.replace(FastParams(), newest=10**6)
    found = judge([400.0] * 3, climb, climb[-1], climb[-1] + top + 0.2, params=whole_only)
    assert found is not None and found not in (LEVELS, STEADY)


def test_a_climb_of_exactly_twice_newest_minutes_is_judged_on_its_newest_half() -> None:
    # Span 8 = 2 x newest: 50 + 0.3u - 0.004u^3 for u = -4..4, at a scale where the slope now is under 1 a bucket.
    # The whole climb bends by nothing; its newest half (5 values) tops out within the room given.  With newest 5
    # (a span under twice it) the newest half is not judged and the climb is projected.
    u = np.arange(-8, 1, dtype=float) + 4
    climb = list(50.0 + 0.3 * u - 0.004 * u**3)
    curvature, slope, _ = np.polyfit(np.arange(-4, 1, dtype=float), climb[-5:], 2)
    room = slope * slope / (4.0 * -curvature) + 0.05
    assert 0 < slope < 1
    assert judge([40.0] * 3, climb, climb[-1], climb[-1] + room) is LEVELS
    found = judge([40.0] * 3, climb, climb[-1], climb[-1] + room, params=dataclasses.replace(FastParams(), newest=5))
    assert found is not None and found not in (LEVELS, STEADY)
