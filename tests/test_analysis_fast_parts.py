"""The fast check's pure parts on literal values: the least-squares weights its fits use, the precedent an
allocator's excursions set, the persistence and urgency tests exactly on their bounds, and the refusals of a
damaged snapshot (mutation testing found each of them unpinned by the tests on whole series)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from tpuwatch.analysis.fast import FastCheck, FastFinding, _fits, _precedent

CAPACITY = 16 * 1024.0**3
MINUTE = 60.0


@pytest.mark.parametrize("span", [4, 6, 15, 30, 87])
def test_the_fits_weights_give_back_a_quadratics_level_slope_and_curvature_and_a_lines_slope(span: int) -> None:
    ts = range(-span, 1)
    line, level, slope, curvature, norm = _fits.__wrapped__(span)  # not the cache: computed by this code
    assert _fits(span) == (line, level, slope, curvature, norm)
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
    with pytest.raises(ValueError, match="not finite"):
        FastCheck().restore({**snapshot, "fives": [math.inf] * len(snapshot["fives"])})
    with pytest.raises(ValueError, match="differ in length"):
        FastCheck().restore({**snapshot, "fives": snapshot["fives"][1:]})
