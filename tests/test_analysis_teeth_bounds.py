"""The sawtooth-aware fit's bounds, each on the readings it names (``tpuwatch/analysis/teeth.py``): the least
readings a fit is made on, the singular matrices it refuses, the messages of a refused snapshot, a verdict that does
not depend on the unit the readings are in, two allocators' releases fitted stretch by stretch, the standard errors
a bend and a staircase's shrinking steps are judged by (the bar where a verdict turns, computed apart with numpy or
by hand), and a step told from the readings' own drift."""

from __future__ import annotations

import math
from array import array

import numpy as np
import pytest
from test_analysis_fast import CAPACITY, START, STEP

from tpuwatch.analysis.floors import pack
from tpuwatch.analysis.teeth import Teeth, _any_sawtooths, _invert, _one_sawtooth, _steps_shrink

TOOTH = 0.004  # of the chip a reading: the allocator's climb between two releases


def warm_up(i: int) -> float:
    """A quadratic warm-up from 30 % of the chip climbing 45 % in 18 min, at reading ``i`` (10 s apart)."""
    x = i * STEP / (18 * 60.0)
    return 0.3 + 0.45 * (1 - (1 - x) ** 2)


def released(first: int, second: int, scale: float = CAPACITY) -> Teeth:
    """61 readings 10 s apart, without noise: the warm-up under an allocator that climbs ``TOOTH`` a reading from
    the first and releases everything at readings ``first`` and ``second``; in units of ``scale``."""
    teeth = Teeth()
    for i in range(61):
        since = i if i < first else i - first if i < second else i - second
        teeth.add(START + i * STEP, (warm_up(i) + TOOTH * since) * scale)
    return teeth


def test_a_fit_after_the_first_release_needs_ten_readings() -> None:
    """Two releases, the first 10 readings before the newest (4 coefficients: 6 readings more than them): the
    warm-up is seen to level off, 9 readings of it are too few to judge."""
    assert released(51, 56).levels_off(0.7 * CAPACITY, CAPACITY)
    assert not released(52, 57).levels_off(0.7 * CAPACITY, CAPACITY)


def test_the_verdict_is_the_same_in_any_unit() -> None:
    """Readings and capacity as shares of the chip (a capacity of 1) say what the same readings in bytes say."""
    assert released(51, 56, scale=1.0).levels_off(0.7, 1.0)
    assert released(51, 56).levels_off(0.7 * CAPACITY, CAPACITY)


def test_a_pivot_under_a_millionth_of_a_millionth_of_its_row_is_singular() -> None:
    """The bar is 1e-12 times the row's largest value, at least 1e-12; a pivot at the bar is not singular."""
    assert _invert([[1.0, 0.0], [0.0, 1e-12]]) == [[1.0, 0.0], [0.0, 1e12]]
    assert _invert([[1.0, 0.0], [0.0, 1.5e-12]]) is not None
    assert _invert([[1.0, 0.0], [0.0, 0.9e-12]]) is None
    assert _invert([[4.0, 2.0], [2.0, 1.0 + 1e-12]]) is None  # a pivot of about 1e-12 in a row whose largest is 2


@pytest.mark.parametrize(("snapshot", "message"), [
    ({"times": [1.0, 2.0], "values": [1.0]}, "the sawtooth readings' times and values differ in number"),
    ({"times": [1.0], "values": [math.nan]}, "a sawtooth reading that is not finite"),
])
def test_a_refused_snapshot_says_why_in_so_many_words(snapshot: dict[str, list[float]], message: str) -> None:
    packed = {key: pack(memoryview(array("d", values))) for key, values in snapshot.items()}
    with pytest.raises(ValueError, match=f"^{message}$"):
        Teeth().restore(packed)


def two_allocators() -> Teeth:
    """61 readings 10 s apart, without noise: the warm-up under two allocators, one climbing 0.3 % of the chip a
    reading and releasing every 17 readings, the other 0.2 % every 37; both release at the 31st."""
    teeth = Teeth()
    for i in range(61):
        teeth.add(START + i * STEP, (warm_up(i) + 0.003 * ((i + 20) % 17) + 0.002 * ((i + 6) % 37)) * CAPACITY)
    return teeth


def test_three_releases_of_two_allocators_are_fitted_stretch_by_stretch() -> None:
    """Three releases in the window (two of one allocator's, one of both's): one sawtooth's fit cannot follow two
    allocators, the stretches' fit can, and from three releases on it is made."""
    teeth = two_allocators()
    readings = teeth.readings()
    now = readings[-1][0]
    points = [((t - now) / 60.0, v / CAPACITY) for t, v in readings if t > now - 600.0]
    breaks = [13, 30, 47]
    assert not _one_sawtooth(points, breaks, 0.3, 6.0)
    assert _any_sawtooths(points, breaks, 0.3, 6.0)
    assert teeth.levels_off(0.7 * CAPACITY, CAPACITY)


def stretches(count: int, breaks: list[int], wobble: float = 0.0) -> list[tuple[float, float]]:
    """``count`` readings 10 s apart (minutes before the newest, share of the chip) of the warm-up under one
    allocator climbing ``TOOTH`` a reading that releases at each of ``breaks``; ``wobble``: a repeatable noise."""
    points = []
    for i in range(count):
        since = i - max((b for b in breaks if b <= i), default=0)
        noise = wobble * math.sin(i * 1.7) * math.cos(i * 0.31)
        points.append(((i - count + 1) * STEP / 60.0, warm_up(i + 30) + TOOTH * since + noise))
    return points


def test_the_stretches_fit_needs_six_degrees_of_freedom() -> None:
    """Three stretches: 11 readings from the first release hold 6 degrees of freedom beyond the 3 stretches' levels
    and the slope and bend; 10 hold 5, too few."""
    assert _any_sawtooths(stretches(12, [1, 5, 9]), [1, 5, 9], 1.0, 6.0)
    assert not _any_sawtooths(stretches(12, [2, 6, 10]), [2, 6, 10], 1.0, 6.0)


def bend_t(points: list[tuple[float, float]], columns: list[list[float]]) -> float:
    """The least-squares bend's (t^2's coefficient's) significance, -c / its standard error, fitted with numpy on
    ``columns`` (the other regressors) and t^2: the bar at which a verdict turns."""
    design = np.array([*columns, [t * t for t, _ in points]]).T
    values = np.array([y for _, y in points])
    coefficients, residual, *_ = np.linalg.lstsq(design, values, rcond=None)
    freedom = len(points) - design.shape[1]
    variance = float(residual[0]) / freedom * float(np.linalg.inv(design.T @ design)[-1, -1])
    return float(-coefficients[-1] / math.sqrt(variance))


def test_a_rough_bend_is_judged_by_the_standard_error_of_all_the_stretches_levels() -> None:
    """With noise, the stretches' bend is significant by as many standard errors as numpy's fit of the same model
    (a level per stretch, the slope, the bend) says: the verdict turns at that bar, not a percent away."""
    breaks = [3, 13, 23, 33]
    points = stretches(44, breaks, wobble=0.0004)
    rows = points[breaks[0]:]
    levels = [[1.0 if start <= i < end else 0.0 for i in range(breaks[0], len(points))]
              for start, end in zip(breaks, [*breaks[1:], len(points)])]
    bar = bend_t(rows, [*levels, [t for t, _ in rows]])
    assert bar > 3.0
    assert _any_sawtooths(points, breaks, 1.0, 0.99 * bar)
    assert not _any_sawtooths(points, breaks, 1.0, 1.01 * bar)


def test_a_rough_bend_of_one_sawtooth_is_judged_by_its_own_standard_error() -> None:
    breaks = [3, 13, 23, 33]
    points = stretches(44, breaks, wobble=0.0004)
    rows = points[breaks[0]:]
    latest = [max(points[b][0] for b in breaks if b <= i) for i in range(breaks[0], len(points))]
    bar = bend_t(rows, [[1.0] * len(rows), [t for t, _ in rows], [t - at for (t, _), at in zip(rows, latest)]])
    assert bar > 3.0
    assert _one_sawtooth(points, breaks, 1.0, 0.99 * bar)
    assert not _one_sawtooth(points, breaks, 1.0, 1.01 * bar)


def test_steps_on_a_straight_line_are_judged_against_one_steps_own_noise() -> None:
    """Steps of 5, 4, 3 and 2 % of the chip 2 min apart, the newest now: their sizes fall 0.5 % a minute on a
    straight line (no scatter), so the bar is one step's own noise, two readings' (sqrt(2) times the changes' spread
    of 0.1 %) over the times' spread: 2 x 0.001^2 / 20 min^2, and 0.005 / sqrt(1e-7) = 15.8 standard errors."""
    levels = [0.3, 0.3, 0.35, 0.35, 0.39, 0.39, 0.42, 0.42, 0.44]
    points = [(i - 8.0, level) for i, level in enumerate(levels)]
    bar = 0.005 / math.sqrt(2 * 0.001**2 / 20)
    assert _steps_shrink(points, [2, 4, 6, 8], 1.0, 0.99 * bar, 0.001)
    assert not _steps_shrink(points, [2, 4, 6, 8], 1.0, 1.01 * bar, 0.001)


def test_a_step_is_told_from_the_readings_own_drift() -> None:
    """Chunks of 1.3, 1.2, 1.1, 1.0 and 0.9 % of the chip every 2 min on a chip that otherwise frees 0.2 % a
    reading: a step is its change less the typical change (the drift), so all five count, and they shrink."""
    teeth = Teeth()
    level = 0.5
    sizes = {12: 0.013, 24: 0.012, 36: 0.011, 48: 0.010, 60: 0.009}
    for i in range(61):
        level += -0.002 + sizes.get(i, 0.0)
        teeth.add(START + i * STEP, level * CAPACITY)
    assert teeth.levels_off(0.6 * CAPACITY, CAPACITY)
