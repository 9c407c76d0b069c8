"""How the fast check combines its five series' verdicts (``FastCheck._find``): the minute's floor, the 3 min
floor, the 5 min floor, the 8 min floor and the high, each judged by ``_climb``, here scripted, so that each rule
of the vote in ``fast.py``'s docstring is tested on its own: the first finding is reported with the latest time
to full any series found; the high levelling off or turning vetoes alone; a floor that turned or bends is a vote
against, outnumbered by more findings; a bend with no climb on the high vetoes; a high due a page overrules the
floors' bends; a floor that held still before it bends vetoes alone."""

from __future__ import annotations

from collections import deque

import pytest

from tpuwatch.analysis.fast import LEVELS, STEADY, TURNED, FastCheck, FastFinding

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

    def _climb(self, values: list[float], ref: int, shortest: int, precedent: float, high: float, capacity: float,
               bucket: float) -> FastFinding | None:
        return self.verdicts.pop(0)


def vote(lows: Verdict, three: Verdict, fives: Verdict, eight: Verdict, high: Verdict | str = "absent",
         still: bool = False) -> FastFinding | None:
    """``_find`` with each series rising 1 a minute for 150 minutes (an old series: its 91 newest are judged), a
    new high on each; ``still``: the 3 min floor held still before its climb; ``high`` "absent": no highs kept
    (a snapshot from before they were)."""
    verdicts = [lows, three, fives, eight] + ([] if high == "absent" else [high])
    check = Scripted(verdicts)  # type: ignore[arg-type]
    rising = [float(v) for v in range(150)]
    check._lows = deque(rising[-SIZE:], maxlen=SIZE)
    check._fives = deque(rising[-SIZE:], maxlen=SIZE)
    check._highs = deque([] if high == "absent" else rising[-SIZE:], maxlen=SIZE)
    three_floor = [0.0] * 119 + [30.0 + v for v in range(31)] if still else rising
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


def test_with_no_highs_kept_the_floors_are_judged_alone() -> None:
    assert vote(found(500.0), found(500.0), None, None) == FastFinding(1.0, 500.0, 500.0, 500.0)
    assert vote(found(500.0), TURNED, None, None) is None
    assert vote(found(500.0), found(500.0), LEVELS, None) is None  # nothing says the high climbs on
