"""How the fast check combines its five series' verdicts (``FastCheck._find``): the minute's floor, the 3 min
floor, the 5 min floor, the 8 min floor and the high, each judged by ``_climb``, here scripted, so that each rule
of the vote in ``fast.py``'s docstring is tested on its own; and which series are judged (a new high), with which
precedent (the allocator's excursions on the 3 or 8 min floor's history, in the hours before the climb).

The vote: the first finding is reported with the latest time to full any series found; the high levelling off or
turning vetoes alone; a floor that turned or bends is a vote against, outnumbered by more findings; a bend with no
climb on the high vetoes; a high due a page overrules the floors' bends; a floor that held still before it bends
vetoes alone."""

from __future__ import annotations

import math
from collections import deque

import pytest

from tpuwatch.analysis.fast import LEVELS, STEADY, TURNED, FastCheck, FastFinding, FastParams

MINUTE = 60.0
CAPACITY = 1000.0  # a new high must rise 30 over the reference's top (min_rise)
SIZE = 91  # the reference (60) and the longest climb (30) and now: what an old series is judged on


def found(eta: float) -> FastFinding:
    return FastFinding(1.0, eta, eta)


Verdict = FastFinding | None


class Scripted(FastCheck):
    """A fast check whose series' verdicts are given, in the order they are judged."""

    def __init__(self, verdicts: list[Verdict]) -> None:
        super().__init__()
        self.verdicts = list(verdicts)
        self.asked: list[tuple[float, float]] = []  # per series judged: its newest value and its precedent
        self.shapes: list[tuple[int, int, int]] = []  # and the minutes it was given, its reference and least climb

    def _climb(self, values: list[float], ref: int, shortest: int, precedent: float, high: float, capacity: float,
               bucket: float) -> FastFinding | None:
        self.asked.append((values[-1], precedent))
        self.shapes.append((len(values), ref, shortest))
        return self.verdicts.pop(0) if self.verdicts else None


def vote(lows: Verdict, three: Verdict, fives: Verdict, eight: Verdict, high: Verdict | str = "absent",
         still: bool = False, reference: list[float] | None = None) -> FastFinding | None:
    """``_find`` with each series rising 1 a minute for 150 minutes (an old series: its 91 newest are judged), a
    new high on each; ``still``: the 3 min floor held still before its climb; ``high`` "absent": no highs kept
    (a snapshot from before they were); ``reference``: the 3 min floor's 60 minutes before its climb."""
    verdicts = [lows, three, fives, eight] + ([] if high == "absent" else [high])
    check = Scripted(verdicts)  # type: ignore[arg-type]
    rising = [float(v) for v in range(150)]
    check._lows = deque(rising[-SIZE:], maxlen=SIZE)
    check._fives = deque(rising[-SIZE:], maxlen=SIZE)
    check._highs = deque([] if high == "absent" else rising[-SIZE:], maxlen=SIZE)
    three_floor = [0.0] * 119 + [30.0 + v for v in range(31)] if still else rising
    if reference is not None:
        three_floor = [0.0] * 59 + reference + [max(reference) + 30.0 + v for v in range(31)]
    return check._find([three_floor, rising], 149.0, CAPACITY, MINUTE)


def test_the_first_finding_is_reported_with_the_latest_time_to_full_any_series_found() -> None:
    assert vote(found(500.0), found(700.0), None, None, found(600.0)) == FastFinding(1.0, 500.0, 500.0, 700.0)
    assert vote(None, None, found(0.5), None, STEADY) == FastFinding(1.0, 0.5, 0.5, 0.5)
    assert vote(None, None, None, None, None) is None


@pytest.mark.parametrize("high", [LEVELS, TURNED])
def test_a_high_that_levels_off_or_turned_vetoes_alone(high: FastFinding) -> None:
    assert vote(found(500.0), found(500.0), found(500.0), found(500.0), high) is None


@pytest.mark.parametrize(("verdicts", "reported"), [
    ((found(500.0), TURNED, None, None, STEADY), False),  # one against one
    ((found(500.0), found(500.0), TURNED, None, STEADY), True),  # outnumbered
    ((found(500.0), found(500.0), TURNED, TURNED, STEADY), False),
    ((found(500.0), LEVELS, None, None, STEADY), False),  # a bend votes as a turn does
    ((found(500.0), found(500.0), LEVELS, None, STEADY), True),
    ((found(500.0), found(500.0), LEVELS, LEVELS, STEADY), False),
    ((found(500.0), found(500.0), LEVELS, TURNED, STEADY), False),
])
def test_floors_that_turned_or_bend_vote_against_and_more_findings_outvote_them(
        verdicts: tuple[Verdict, ...], reported: bool) -> None:
    assert (vote(*verdicts) is not None) == reported


def test_a_bend_with_no_climb_on_the_high_vetoes_and_a_high_due_a_page_overrules_the_bends() -> None:
    assert vote(found(500.0), found(500.0), LEVELS, None, None) is None  # the high does not climb
    assert vote(found(500.0), found(500.0), None, None, None) is not None  # no bend: the floors alone
    assert vote(found(500.0), found(500.0), LEVELS, None, STEADY) is not None  # the high climbs on
    # The high due a page: the floors' bends were a sawtooth's troughs held, and count for nothing.
    assert vote(LEVELS, LEVELS, LEVELS, None, found(500.0)) == FastFinding(1.0, 500.0, 500.0, 500.0)


def test_a_floor_that_held_still_before_it_bends_vetoes_alone() -> None:
    assert vote(found(500.0), LEVELS, found(500.0), found(500.0), found(500.0), still=True) is None
    assert vote(found(500.0), LEVELS, found(500.0), found(500.0), found(500.0)) is not None
    # Still: its reference's range under min_rise (30) of the capacity, wherever it lies; 30 is not still.
    verdicts = (found(500.0), LEVELS, found(500.0), found(500.0), found(500.0))
    assert vote(*verdicts, reference=[20.0, 25.0] * 30) is None
    assert vote(*verdicts, reference=[0.0, 30.0] * 30) is not None


def test_with_no_highs_kept_the_floors_are_judged_alone() -> None:
    assert vote(found(500.0), found(500.0), None, None) == FastFinding(1.0, 500.0, 500.0, 500.0)
    assert vote(found(500.0), TURNED, None, None) is None
    assert vote(found(500.0), found(500.0), LEVELS, None) is None  # nothing says the high climbs on


def asked(lows: list[float], three: list[float], fives: list[float], eight: list[float],
          highs: list[float]) -> list[tuple[float, float]]:
    """``_find`` on these series (the minute's, 5 min and highs kept as the check keeps them: the newest 91): the
    newest value and precedent of each series it judged, in order."""
    check = Scripted([])
    check._lows, check._fives, check._highs = (deque(v[-SIZE:], maxlen=SIZE) for v in (lows, fives, highs))
    check._find([three, eight], highs[-1], CAPACITY, MINUTE)
    return check.asked


def test_a_series_is_judged_only_on_a_new_high_of_min_rise_over_its_reference() -> None:
    still = [0.0] * 60
    assert asked(lows=[100.0] * SIZE,  # flat: no new high
                 three=[0.0] * 169 + [15.0] * 30 + [30.0],  # exactly 30 over: min_rise of 1000
                 fives=still + [0.0] * 30 + [40.0],  # over in its newest minute
                 eight=[0.0] * 169 + [15.0] * 30 + [29.99],  # short of it
                 highs=still + [float(v) for v in range(31)] + [100.0]) == \
        [(30.0, -math.inf), (40.0, -math.inf), (100.0, -math.inf)]


def test_the_precedent_is_read_on_the_3_or_8_min_floor_in_the_3_hours_before_the_climb() -> None:
    # 400 minutes; the climb's window the newest 31 (after a reference of 60), the precedent's the 180 before it.
    def floor(*excursions: tuple[int, float]) -> list[float]:
        values = [0.0] * 369 + [100.0 / 31 * (i + 1) for i in range(31)]
        for start, peak in excursions:
            values[start:start + 5] = [peak] * 5
        return values

    # Excursions before the 3 hours (45, 75) and in the climb's window (95, 85) are not the allocator's precedent.
    three = floor((100, 45.0), (200, 50.0), (250, 60.0), (372, 95.0))
    eight = floor((100, 75.0), (210, 70.0), (260, 80.0), (375, 85.0))
    rising = floor()
    assert [precedent for _, precedent in asked(rising, three, rising, eight, rising)] == [50.0, 50.0, 70.0, 70.0, 50.0]
    # A series younger than the 3 hours: they reach back to its first floor (here its lowest: every floor after
    # it one excursion above it that never came back, so no precedent).
    first = [-100.0, *three[-149:]]
    first[20:25], first[40:45] = [50.0] * 5, [60.0] * 5
    assert asked(rising, first, rising, eight, rising)[1][1] == -math.inf


@pytest.mark.parametrize(("minutes", "judged"), [(66, []), (67, [(67, 60, 6)] * 5)])
def test_an_old_series_is_judged_once_it_holds_its_reference_and_the_shortest_climb(
        minutes: int, judged: list[tuple[int, int, int]]) -> None:
    check = Scripted([])
    rising = [float(v) for v in range(minutes)]
    check._lows, check._fives, check._highs = (deque(rising, maxlen=SIZE) for _ in range(3))
    floors = [float(v) for v in range(150)]
    check._find([floors, floors], rising[-1], 100.0, MINUTE)
    assert check.shapes == judged


@pytest.mark.parametrize(("held", "young"), [(119, True), (120, False)])
def test_a_series_is_young_until_its_floor_holds_two_hours(held: int, young: bool) -> None:
    check = Scripted([])
    rising = [float(v) for v in range(SIZE)]
    check._lows, check._fives, check._highs = (deque(rising, maxlen=SIZE) for _ in range(3))
    floors = [float(v) for v in range(held)]
    check._find([floors, floors], rising[-1], 100.0, MINUTE)
    params = FastParams()
    expected = (SIZE, params.least_reference, params.young_shortest) if young else \
        (SIZE, params.reference, params.shortest)
    assert check.shapes == [expected] * 5
