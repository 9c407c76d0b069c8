"""The fast check's pure parts on literal values: the least-squares weights its fits use, the precedent an
allocator's excursions set, the persistence and urgency tests exactly on their bounds, and the refusals of a
damaged snapshot (mutation testing found each of them unpinned by the tests on whole series)."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence

import numpy as np
import pytest

from tpuwatch.analysis.fast import LEVELS, STEADY, FastCheck, FastFinding, FastParams, _levels_now, _precedent
from tpuwatch.analysis.quadratic import fits

CAPACITY = 16 * 1024.0**3
MINUTE = 60.0


@pytest.mark.parametrize("span", [4, 6, 15, 30, 87])
def test_the_fits_weights_give_back_a_quadratics_level_slope_and_curvature_and_a_lines_slope(span: int) -> None:
    ts = range(-span, 1)
    line, level, slope, curvature, norm = fits.__wrapped__(span)  # not the cache: computed by this code
    assert fits(span) == (line, level, slope, curvature, norm)
    quadratic = [3.0 - 0.7 * t + 0.05 * t * t for t in ts]  # at t = 0: 3.0, slope -0.7, half the acceleration 0.05
    assert sum(w * y for w, y in zip(level, quadratic)) == pytest.approx(3.0, abs=1e-9)
    assert sum(w * y for w, y in zip(slope, quadratic)) == pytest.approx(-0.7, abs=1e-9)
    assert sum(w * y for w, y in zip(curvature, quadratic)) == pytest.approx(0.05, abs=1e-9)
    assert sum(w * (2.5 * t + 9.0) for w, t in zip(line, ts)) == pytest.approx(2.5, abs=1e-9)
    assert sum(line) == pytest.approx(0.0, abs=1e-12)  # a constant has no slope
    assert norm == pytest.approx(math.sqrt(sum(w * w for w in curvature)))


@pytest.mark.parametrize(("values", "precedent"), [
    ([], -math.inf),                       # nothing before the climb
    ([0, 5, 0], -math.inf),                # one excursion: a job that ran higher and was replaced
    ([0, 5, 0, 7, 0], 5),                  # the second-highest of two that fell back
    ([0, 5, 0, 3, 0], 3),
    ([0, 5, 0, 7, 0, 9], 5),               # the last has not fallen back: not one yet
    ([0, 1, 0, 1, 0], -math.inf),          # no higher than the lowest plus the tolerance: no excursion
    ([0, 3, 0.5, 3, 0.5], 3),              # back within the tolerance of the lowest counts as fallen back
])
def test_the_precedent_is_the_second_highest_excursion_that_fell_back(values: list[float], precedent: float) -> None:
    assert _precedent(values, 1.0) == precedent


class Scripted(FastCheck):
    """A fast check whose findings' times to full (minutes) are scripted."""

    def __init__(self, etas: Sequence[float]) -> None:
        super().__init__()
        self.script = iter(etas)

    def _find(self, floors, high, capacity, bucket):  # type: ignore[no-untyped-def]
        eta = next(self.script) * MINUTE
        return FastFinding(1.0, eta, eta)


def reported(etas: Sequence[float]) -> list[bool]:
    check = Scripted(etas)
    return [check.close((1.0, 2.0), [], 2.0, CAPACITY, MINUTE) is not None for _ in etas]


def test_a_time_to_full_closing_exactly_half_a_minute_a_minute_is_closing_in() -> None:
    # Persistence: 14 -> 12.5 over three minutes is exactly `closing` (0.5) of the time passed.
    assert reported([14.0, 13.5, 13.0, 12.5]) == [False, False, False, True]
    assert reported([14.0, 13.5, 13.0, 12.6]) == [False, False, False, False]
    # Urgency: each of three findings exactly half a minute nearer, a fourth would leave 9.5 min.
    assert reported([11.5, 11.0, 10.5]) == [False, False, True]
    assert reported([11.5, 11.1, 10.5]) == [False, False, False]


def test_a_damaged_snapshot_is_refused_with_what_is_wrong() -> None:
    check = Scripted([12.0] * 3)
    for _ in range(3):
        check.close((1.0, 2.0), [], 2.0, CAPACITY, MINUTE)
    snapshot = check.snapshot()
    with pytest.raises(ValueError, match="^the fast check holds a value that is not finite$"):
        FastCheck().restore({**snapshot, "fives": [math.inf] * len(snapshot["fives"])})
    with pytest.raises(ValueError, match="^the fast check's floors differ in length$"):
        FastCheck().restore({**snapshot, "fives": snapshot["fives"][1:]})


def climb(values: list[float], high: float, capacity: float, reference: list[float] | None = None,
          params: FastParams | None = None) -> FastFinding | None:
    """One floor's climb judged by ``_climb``: ``reference`` (3 values, default 0.0) then ``values``."""
    check = FastCheck(params)
    ref = reference or [0.0, 0.0, 0.0]
    return check._climb(ref + values, len(ref), 6, -math.inf, high, capacity, MINUTE)


def quadratic(slope: float, curvature: float, span: int, level: float) -> list[float]:
    """level + slope t + curvature t^2 at t = -span..0 (per bucket): ``slope`` now, slowing down when negative."""
    return [level + slope * t + curvature * t * t for t in range(-span, 1)]


def test_a_slowing_climb_levels_off_where_its_slope_falling_linearly_reaches_nothing() -> None:
    # Slope 1 a bucket, falling by 0.04 a bucket: it rises 1 / (4 x 0.02) = 12.5 more (the thirds' rises, shrinking
    # slower, would say 29).  Levels off under a capacity 13 above the high; 12 above, it is projected straight.
    values = quadratic(1.0, -0.02, 12, 20.0)
    reference = [4.0, 4.0, 4.0]
    assert climb(values, 20.0, 33.0, reference) is LEVELS
    found = climb(values, 20.0, 32.0, reference)
    assert found is not None and found.slope == pytest.approx(1.0 / MINUTE)  # the slope now, not the line's
    assert found.eta == pytest.approx(12.0 / (1.0 / MINUTE))


def test_a_climb_whose_newest_third_rises_far_less_levels_off_where_that_series_sums_to() -> None:
    # Thirds of 4 buckets rising 1, 1 and 0.4 a bucket: the newest third rose 1.6, q = 0.4 / 1 of the one before;
    # shrinking so, 1.6 x 0.4 / 0.6 = 1.07 is left (the quadratic's projection says more).
    values = [0.0]
    for rate in (1.0, 1.0, 0.4):
        values += [values[-1] + rate * (i + 1) for i in range(4)]
    high, left = values[-1], 1.6 * 0.4 / 0.6
    assert climb(values, high, high + left + 0.05, [-20.0] * 3) is LEVELS
    assert climb(values, high, high + left - 0.05, [-20.0] * 3) not in (LEVELS, STEADY, None)


def test_a_finding_projects_from_the_high_and_its_time_to_full_straight() -> None:
    values = [0.5 * (i + 1) for i in range(12)]
    found = climb(values, 6.0, 10.0)
    assert found is not None and found.slope == pytest.approx(0.5 / MINUTE)
    assert found.eta == pytest.approx(4.0 / found.slope) and found.track == pytest.approx(4.0 / found.slope)
    close = climb(values, 6.0, 6.5)  # half a unit of room: the track is that, not a floor of 1
    assert close is not None and close.track == pytest.approx(0.5 / close.slope)
    over = climb(values, 6.0, 5.5)  # past capacity already: no room left
    assert over is not None and over.eta == 0.0


def test_a_climb_due_beyond_the_horizon_is_steady_whatever_near_says() -> None:
    values = [0.5 * (i + 1) for i in range(12)]
    room = 1300.0 * 0.5 / MINUTE  # 1300 s at the slope: beyond the 1200 s horizon
    wide = dataclasses.replace(FastParams(), near=2000.0)
    assert climb(values, 6.0, 6.0 + room, params=wide) is STEADY
    assert climb(values, 6.0, 6.0 + room, params=dataclasses.replace(wide, horizon=1400.0)) not in (STEADY, None)


def test_the_five_minute_floor_is_the_second_lowest_of_the_last_five_buckets_lows() -> None:
    check = FastCheck()
    lows = [(5.0, 6.0), (3.0, 9.0), (7.0, 8.0), (4.0, 4.5), (8.0, 9.0), (9.0, 9.5), (10.0, 11.0)]
    for low in lows:
        check.close(low, [], 10.0, None, MINUTE)
    # The first bucket alone: its own second-lowest; then the second-lowest of everything the last five held.
    assert check.snapshot()["fives"] == [6.0, 5.0, 5.0, 4.0, 4.0, 4.0, 4.5]


def test_a_first_bucket_of_one_reading_is_its_own_five_minute_floor() -> None:
    check = FastCheck()
    check.close((5.0,), [], 10.0, None, MINUTE)
    check.close((7.0,), [], 10.0, None, MINUTE)
    assert check.snapshot()["fives"] == [5.0, 7.0]


def test_the_check_keeps_a_reference_and_the_longest_climb_of_minutes_and_the_newest() -> None:
    check = FastCheck()
    for v in range(200):
        check.close((float(v), v + 0.5), [], v + 1.0, None, MINUTE)
    kept = check.snapshot()
    params = FastParams()
    assert len(kept["lows"]) == len(kept["fives"]) == len(kept["highs"]) == params.reference + params.longest + 1
    assert kept["lows"][0] == 200 - 91 + 0.5


def test_without_a_capacity_or_with_none_there_is_no_finding_and_no_error() -> None:
    for capacity in (None, 0.0):
        check = FastCheck()
        found = [check.close((v, v + 0.5), [], v + 1.0, capacity, MINUTE) for v in range(200)]
        assert found == [None] * 200


def test_the_streak_of_times_to_full_kept_is_bounded() -> None:
    check = Scripted([30.0] * 50)
    for _ in range(50):
        check.close((1.0, 2.0), [], 2.0, CAPACITY, MINUTE)
    assert len(check.snapshot()["etas"]) == max(FastParams().persistence, FastParams().streak)


class Recording(FastCheck):
    """A fast check that records which series' climbs it judges (and judges none)."""

    def __init__(self) -> None:
        super().__init__()
        self.judged: list[float] = []

    def _climb(self, values, ref, shortest, precedent, high, capacity, bucket):  # type: ignore[no-untyped-def]
        self.judged.append(values[-1])
        return None


def test_a_climb_is_judged_exactly_when_its_series_tops_its_whole_reference_as_the_reference_moves_on() -> None:
    # The first test looks first where the reference peaked a minute ago; a peak that has left the reference, or
    # a reference that changed as a young series came of age, must not hide a new high.  Brute force decides.
    rng = random.Random(7)
    params = FastParams()
    least = params.min_rise * CAPACITY
    floors: list[float] = []
    check = Recording()
    judged = 0
    level = 0.1
    for minute in range(600):
        if rng.random() < 0.05:  # a job of its own size now and then; a spike a minute long sometimes
            level = rng.uniform(0.1, 0.5)
        value = (level + rng.uniform(0.0, 0.02) + (0.3 if rng.random() < 0.02 else 0.0)) * CAPACITY
        floors.append(value)
        check.judged.clear()
        check.close((value, value), [floors, floors], value, CAPACITY, MINUTE)
        kept = check.snapshot()
        size = len(kept["lows"])
        young = len(floors) < params.young_until
        ref = params.least_reference if young else params.reference
        shortest = params.young_shortest if young else params.shortest
        expected = [series[-1] for series in (kept["lows"], floors, kept["fives"], floors, kept["highs"])
                    if size > ref + shortest and series[-1] - max(series[len(series) - size:][:ref]) >= least]
        assert check.judged == expected, minute
        judged += bool(expected) and not young
    assert judged > 40  # the jobs and spikes made new highs, after the series came of age too


def test_a_series_exactly_min_rise_above_where_its_reference_peaked_is_judged() -> None:
    # The look where the reference peaked a minute ago ends the minute only below the bar, as the full max does:
    # a newest value exactly `min_rise` of the capacity above it is a new high, and its climb is judged.
    least = FastParams().min_rise * CAPACITY
    floors = [0.0] * 130  # not young
    check = Recording()
    for _ in range(90):
        floors.append(0.0)
        check.close((0.0, 0.0), [floors, floors], 0.0, CAPACITY, MINUTE)
    assert check.judged == []
    floors.append(least)
    check.close((least, least), [floors, floors], least, CAPACITY, MINUTE)
    # The minute's own floor, the two floor histories and the high; not the five-minute floor (the second-lowest
    # of five minutes' lows is still 0).
    assert check.judged == [least] * 4


def test_a_newest_half_whose_residuals_follow_each_other_needs_a_bend_past_its_widened_bar() -> None:
    # Newest values: a line, a bend and a small cubic wobble (what a quadratic leaves of it runs in blocks: its
    # lag-one autocorrelation is positive).  Worked out with numpy: the residuals' noise (span - 2 degrees of
    # freedom), their AR(1) factor and the bar, newest_bar x decelerating x noise x the curvature's standard error.
    # A bend between the bar and the bar widened by the factor is no levelling off; one past the widened bar is.
    params = FastParams()
    t = np.arange(-8, 1, dtype=float)
    wobble = 0.0005 * (t + 4) ** 3
    basis = np.vander(t, 3)
    own = np.linalg.lstsq(basis, wobble, rcond=None)[0]
    residuals = wobble - basis @ own
    noise = math.sqrt(float((residuals**2).sum()) / 6)
    lag = float((residuals[:-1] * residuals[1:]).sum() / (residuals**2).sum())
    factor = math.sqrt((1 + lag) / (1 - lag))
    assert 0 < lag < params.max_lag
    bar = params.newest_bar * params.decelerating * noise * math.sqrt(float(np.linalg.inv(basis.T @ basis)[0, 0]))

    def newest(bend: float) -> list[float]:
        return list(5.0 + 0.5 * t + (bend - own[0]) * t * t + wobble)

    assert not _levels_now(newest(-bar * (1 + factor) / 2), 1e-6, params, 100.0)
    assert _levels_now(newest(-bar * factor * 1.05), 1e-6, params, 100.0)
