"""The leak detector's fast-exhaustion check: a steady climb that fills the chip within 20 minutes.

Run once a minute (when the detector closes a one-minute bucket), per series
with a known capacity, in bounded memory, on four floors, each the
second-lowest reading of its window (the minute's own, the detector's 3 min
floor, a 5 min floor of its own, the detector's 8 min floor: a sawtooth of up
to 8 min seen through at the price of that much lag), and on the detector's
high (the second-highest reading of 15 min: the ceiling, which follows a climb
without lag and whose teeth's tops fill the chip).  On each, in order:

1. a new high above the ``reference`` hour before the last ``longest``
   minutes by ``new_high`` times its range, at least ``min_rise`` of the
   capacity, its top raised to the allocator's precedent (``_precedent``);
   most minutes end here, on a look where the reference peaked a minute ago;
2. a climb from its onset of at least ``shortest`` minutes, rising in each
   third (the slowest at least ``min_ratio`` as steep as the steepest), with
   no one-minute jump over ``max_jump`` of it; one whose thirds rose ever
   slower and fell back in the newest has levelled off;
3. its shape: a quadratic's slope and bend (``decelerating`` standard errors,
   widened by the residuals' AR(1) factor up to ``max_lag``); a bend that
   levels off below capacity is a warm-up and vetoes; a climb too rough for a
   bend to show (``bend``) waits; a climb of ``2 x newest`` minutes or more
   whose newest half alone bends by ``newest_bar`` times that bar and levels
   off is a warm-up too (an S: it sped up, then slowed down);
4. a projection from the high, plus a staircase's largest step (at most half
   the room), within ``horizon``, and within ``near`` even at the faster end
   of the slope's ``confidence`` interval.

The floors and the high vote: the high bending or falling back, or a floor
that held still before the climb bending, ends the minute; another floor that
falls back or bends votes against those that see the climb go on, and a bend
ends it where the high shows no straight climb.  A young series (under
``young_until`` minutes: a job's chip) takes its first ``least_reference``
minutes as the reference and waits ``young_shortest`` minutes of climb.  A
finding is dropped while the raw readings, their sawtooth or steps set aside,
show the climb levelling off below capacity (``teeth.py``); one found
``persistence`` minutes in a row whose time to full closes in by ``closing``
of the time passed (over up to ``streak`` minutes) is reported, or after
``urgent`` when waiting would leave under ``lead`` before full and the raw
readings show the climb straight at ``urgent_bar`` of their significance.
docs/trend.md ("The fast-exhaustion check") gives each rule's reason and what
it was measured to cost.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from itertools import islice, pairwise
from typing import Any

from tpuwatch.analysis.quadratic import fits, quadratic
from tpuwatch.analysis.teeth import Teeth, TeethParams


@dataclass(frozen=True)
class FastParams:
    """Tuning of the fast check (minutes are one-minute buckets)."""

    shortest: int = 6
    longest: int = 30
    reference: int = 60
    memory: int = 180
    min_rise: float = 0.03
    min_ratio: float = 0.2
    max_jump: float = 0.5
    new_high: float = 1.0
    decelerating: float = 3.0
    horizon: float = 1200.0
    near: float = 960.0
    confidence: float = 3.0
    bend: float = 1.5
    max_lag: float = 0.8
    newest: int = 4
    newest_bar: float = 2.0
    onset: float = 0.33
    least_reference: int = 3
    young_shortest: int = 15
    young_until: int = 120
    closing: float = 0.5
    persistence: int = 4
    streak: int = 10
    urgent: int = 3
    lead: float = 600.0
    urgent_bar: float = 0.5
    teeth: TeethParams = TeethParams()


@dataclass(frozen=True)
class FastFinding:
    """A climb that would fill the chip: its slope (bytes/s), the time until it does (s), for the persistence
    test the straight projection's time until it does (s; a staircase's next step set aside) and, for the urgency
    test, the latest time until it does that any floor or the high found (s; None: ``eta``)."""

    slope: float
    eta: float
    track: float
    latest: float | None = None


FIVE = 5  # buckets of the floor between the 3 and 8 min ones (a sawtooth of a 4-5 min period)
VETO = 0.0  # rising, then falling in the newest third: it has levelled off
LEVELS = FastFinding(0.0, math.inf, math.inf)  # a climb that bends and levels off below capacity
TURNED = FastFinding(0.0, -math.inf, -math.inf)  # a climb whose thirds rose ever slower and fell in the newest
STEADY = FastFinding(0.0, math.nan, math.nan)  # a straight climb, not yet due a page


class FastCheck:
    """Feed ``close(lows, floors, high, capacity, bucket)`` once per one-minute bucket; it returns a finding or None."""

    __slots__ = ("params", "_window", "_lows", "_fives", "_highs", "_etas", "_teeth", "_peaks")

    def __init__(self, params: FastParams | None = None) -> None:
        self.params = params or FastParams()
        keep = self.params.reference + self.params.longest + 1
        self._window: deque[tuple[float, ...]] = deque(maxlen=FIVE)  # the last buckets' lows
        self._lows: deque[float] = deque(maxlen=keep)  # per bucket, its second-lowest reading
        self._fives: deque[float] = deque(maxlen=keep)  # and the second-lowest of the last five buckets'
        self._highs: deque[float] = deque(maxlen=keep)  # and the detector's high (a ceiling that does not lag a climb)
        self._etas: deque[float] = deque(maxlen=max(self.params.persistence, self.params.streak))
        self._teeth = Teeth(self.params.teeth)
        # Per series judged, how many minutes before its newest value its reference's highest one stood at the last
        # minute: where the first test looks first (a hint only, checked against the reference's bounds).
        self._peaks = [-1] * 5

    def sample(self, timestamp: float, value: float) -> None:
        """One raw reading (for the sawtooth-aware fit, ``teeth.py``); O(1)."""
        self._teeth.add(timestamp, value)

    def close(self, lows: tuple[float, ...], floors: list[Any], high: float, capacity: float | None,
              bucket: float) -> FastFinding | None:
        """One bucket closed with ``lows`` (its lowest and second-lowest readings); ``floors`` are the values of the
        detector's 3 and 8 min floor histories (oldest first, as ``History.values()`` gives them), ``high`` its
        high."""
        self._window.append(lows)
        self._lows.append(lows[-1])
        self._fives.append(sorted(v for low in self._window for v in low)[1] if len(self._window) > 1 else lows[-1])
        self._highs.append(high)
        finding = None
        if capacity is not None and capacity > 0:
            finding = self._find(floors, high, capacity, bucket)
            if finding is not None and self._teeth.levels_off(high, capacity):
                finding = None  # on the raw readings, its sawtooth set aside, the climb tops out below capacity
        if finding is None or capacity is None:  # (no capacity, no finding)
            self._etas.clear()
            return None
        self._etas.append(finding.track)
        # A leak's projected full time stays put while it is watched (its ETA falls a minute a minute); a climb
        # that levels off pushes it away.  Judged over the whole streak (up to ``streak`` minutes), not only
        # the last ``persistence``: a warm-up whose ETA hovers for minutes has not closed in.
        p = self.params
        if len(self._etas) < p.persistence and not self._urgent(finding, high, capacity, bucket):
            return None
        if self._etas[-1] > self._etas[0] - p.closing * (len(self._etas) - 1) * bucket:
            return None
        return finding

    def _urgent(self, finding: FastFinding, high: float, capacity: float, bucket: float) -> bool:
        """A streak of ``urgent`` findings or more, short of ``persistence``, is paged now when waiting out the
        rest would leave under ``lead`` before full (by the latest projection of any floor or the high), if every
        finding's time to full came at least ``closing`` of a minute nearer than the one before and the raw
        readings show the climb straight, even at ``urgent_bar`` of their significance (a warm-up in steps levels
        off there first)."""
        p = self.params
        etas = self._etas
        latest = finding.eta if finding.latest is None else finding.latest
        if len(etas) < p.urgent or latest - (p.persistence - len(etas)) * bucket >= p.lead:
            return False
        if any(later > earlier - p.closing * bucket for earlier, later in pairwise(etas)):
            return False
        return not self._teeth.levels_off(high, capacity, p.urgent_bar)

    def snapshot(self) -> dict[str, Any]:
        """The bounded state, as JSON data."""
        return {"window": [list(lows) for lows in self._window], "lows": list(self._lows),
                "fives": list(self._fives), "highs": list(self._highs), "etas": list(self._etas),
                "teeth": self._teeth.snapshot()}

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Carry on from ``snapshot()`` (into a fresh check); ValueError for a value that is not finite."""
        window = [tuple(float(v) for v in lows) for lows in snapshot["window"]]
        lows, fives, etas = ([float(v) for v in snapshot[key]] for key in ("lows", "fives", "etas"))
        highs = [float(v) for v in snapshot.get("highs", ())]  # a snapshot from before the highs were kept has none
        if not all(math.isfinite(v) for v in (*lows, *fives, *highs, *(v for low in window for v in low))):
            raise ValueError("the fast check holds a value that is not finite")
        if len(lows) != len(fives) or len(highs) > len(lows):
            raise ValueError("the fast check's floors differ in length")
        self._window.extend(window)
        self._lows.extend(lows)
        self._fives.extend(fives)
        self._highs.extend(highs)
        self._etas.extend(etas)
        if snapshot.get("teeth") is not None:  # a snapshot from before the raw readings were kept has none
            self._teeth.restore(snapshot["teeth"])

    def _find(self, floors: list[Any], high: float, capacity: float, bucket: float) -> FastFinding | None:
        p = self.params
        need = p.reference + p.longest + 1
        size = min(need, len(self._lows))
        # A young series (a job's chip, whose readings start with the job): the first minutes it holds are the
        # reference, and a climb counts once it has lasted ``young_shortest`` (a job's start-up is no leak).
        young = len(floors[0]) < p.young_until
        ref, shortest = (p.least_reference, p.young_shortest) if young else (p.reference, p.shortest)
        if size < ref + shortest + 1:
            return None
        least = p.min_rise * capacity
        finding = None
        findings = vetoes = bent = 0
        latest = 0.0
        steady = False
        precedents: dict[int, float] = {}
        peaks = self._peaks
        for index, (series, held) in enumerate(((self._lows, 0), (floors[0], 0), (self._fives, 1), (floors[1], 1),
                                                (self._highs, 0))):
            start = len(series) - size
            if start < 0:
                if series is self._highs:
                    continue  # restored from a snapshot that kept no highs: not yet
                return None
            # The cheap test first: no new high on this floor, nothing to judge.  One value of the reference that
            # stands too high is enough: where its highest stood a minute ago (it most often still stands there).
            hint = len(series) - 2 - peaks[index]
            if start <= hint < start + ref and series[-1] - series[hint] < least:
                peaks[index] += 1
                continue
            reference = list(islice(series, start, start + ref) if isinstance(series, deque)
                             else series[start:start + ref])
            top = max(reference)
            peaks[index] = len(series) - 1 - start - reference.index(top)
            if series[-1] - top < least:
                continue
            if held not in precedents:  # read on the detector's 3 or 8 min floor (it holds them for hours)
                history = floors[held]
                end = len(history) - (size - ref)
                precedents[held] = _precedent(history[max(0, end - p.memory):end], least)
            precedent = precedents[held]
            values = list(series)[start:] if isinstance(series, deque) else list(series[start:])
            found = self._climb(values, ref, shortest, precedent, high, capacity, bucket)
            if series is self._highs:
                if found is LEVELS or found is TURNED:
                    return None  # the ceiling bends to below capacity, or falls back: a warm-up
                steady = found is not None
                if found is not None and found is not STEADY:
                    bent = 0  # the ceiling is due a page: the swinging floors' bends are troughs held
            if found is LEVELS and max(values[:ref]) - min(values[:ref]) < least:
                return None  # a floor that held still before the climb bends to below capacity: a warm-up
            if found is LEVELS:
                bent += 1
            elif found is TURNED:
                vetoes += 1
            elif found is not None and found is not STEADY:
                findings += 1
                finding = finding or found
                latest = max(latest, found.eta)
        if bent and not steady:
            return None  # a floor bends to below capacity and the ceiling does not climb on: a warm-up
        # A floor whose newest third fell back, or that bends while the ceiling climbs on straight (a floor holds
        # a sawtooth's trough or a step for up to its window: flat for minutes, a bend to the quadratic), vetoes
        # unless more floors see the climb go on.
        if finding is None or vetoes + bent >= findings:
            return None
        return FastFinding(finding.slope, finding.eta, finding.track, latest)

    def _climb(self, values: list[float], ref: int, shortest: int, precedent: float, high: float, capacity: float,
               bucket: float) -> FastFinding | None:
        """The climb of one floor since it left the range of its reference, judged; ``values`` hold the reference
        (``ref`` floors) then the newest; a climb shorter than ``shortest`` minutes is none yet; ``precedent`` is the
        height the allocator has climbed to and released from before (``_precedent``)."""
        p = self.params
        now = values[-1]
        reference = values[:ref]
        top, bottom = max(max(reference), precedent), min(reference)
        margin = max(p.new_high * (top - bottom), p.min_rise * capacity)
        if now - top < margin:
            return None
        recent = values[ref:]
        onset = len(recent) - 1
        while onset > 0 and recent[onset - 1] > top + p.onset * margin:
            onset -= 1
        climb = recent[onset:]
        span = len(climb) - 1
        if span < shortest:
            return None
        rise = now - climb[0]
        cuts = (0, round(span / 3.0), round(2.0 * span / 3.0), span)
        rates = [(climb[b] - climb[a]) / (b - a) for a, b in zip(cuts, cuts[1:])]  # per bucket, each third
        if min(rates) <= 0 or min(rates) < p.min_ratio * max(rates):
            # Rising ever slower, the newest third far slower than the first: it levels off.
            return TURNED if rates[0] >= rates[1] >= rates[2] and rates[2] < VETO * rates[0] else None
        if max(b - a for a, b in zip(climb, climb[1:])) > p.max_jump * rise:
            return None
        diffs = sorted(b - a for a, b in zip(reference, reference[1:]))
        center = diffs[len(diffs) // 2]
        spread = sorted(abs(d - center) for d in diffs)[len(diffs) // 2]
        floor_noise = max(1.4826 * spread / math.sqrt(2.0), 1e-4 * capacity)  # of one floor value
        fit_m, _, fit_b, _, norm_c = fits(span)
        slope = sum(w * y for w, y in zip(fit_m, climb)) / bucket  # the straight line's, per second
        current, curvature, noise, inflation = quadratic(climb, floor_noise, p.max_lag)
        resolution = p.decelerating * noise * norm_c  # the least curvature told from noise
        if resolution > p.bend * slope * bucket / span:
            return None  # too rough yet to see the climb bend, if it does: wait for a longer one
        if span >= 2 * p.newest and _levels_now(climb[-(span // 2) - 1:], floor_noise, p, capacity - high):
            return LEVELS  # its newest half slows down and levels off (an S-shaped warm-up past its steepest)
        if -resolution * inflation <= curvature < -resolution:
            return None  # a bend only if the minutes were independent: neither a warm-up's nor a steady climb
        if curvature < -resolution:
            # Slowing down: where does it level off?  Slope falling linearly (s^2 / 2a), or the segment rises
            # shrinking geometrically (r q / (1 - q)); the nearer of the two.
            linear = current * current / (4.0 * -curvature) if current > 0 else 0.0
            q = rates[2] / rates[1]
            geometric = rates[2] * span / 3.0 * q / (1.0 - q) if q < 1.0 else math.inf
            if high + min(linear, geometric) < capacity:
                return LEVELS
            slope, weights = current / bucket, fit_b
        else:
            weights = fit_m
        if slope <= 0:
            return None
        # A staircase is full at the step that crosses capacity: project from the high plus its largest step (at
        # most half the room: a model load within the climb is no step to come).
        highs = islice(self._highs, max(0, len(self._highs) - span - 1), None)
        step = max(0.0, max((b - a for a, b in pairwise(highs)), default=0.0) - slope * bucket)
        room = max(0.0, capacity - high - min(step, 0.5 * (capacity - high)))
        eta = room / slope
        if eta > p.horizon or not math.isfinite(eta):
            return STEADY
        # Only once even the faster end of the slope's confidence interval fills the chip within ``near``: a
        # steady climb is paged as late as its 10 min of lead allow, so that a ramp that stops is seen to stop.
        error = p.confidence * noise * math.sqrt(sum(w * w for w in weights)) / bucket
        if room / (slope + error) > p.near:
            return STEADY
        return FastFinding(slope, eta, max(0.0, capacity - high) / slope)


def _precedent(values: list[float], tolerance: float) -> float:
    """The height this floor climbed to and fell back from before: of its excursions above its lowest value
    (plus ``tolerance``) that ended back there, the second-highest peak (an allocator's sawtooth repeats; one
    excursion that ended, a job that ran higher and was replaced, is no precedent); -inf with fewer than two."""
    if not values:
        return -math.inf
    base = min(values) + tolerance
    peaks = [-math.inf, -math.inf]
    peak = -math.inf
    for v in values:
        if v > base:
            peak = max(peak, v)
        elif peak > -math.inf:
            if peak > peaks[0]:
                peaks = sorted((peak, peaks[1]))
            peak = -math.inf
    return peaks[0]


def _levels_now(newest: list[float], noise: float, p: FastParams, room: float) -> bool:
    """Whether ``newest`` (the newest half of a climb) slows down by over ``newest_bar`` times ``decelerating``
    standard errors (widened by its AR(1) factor: few minutes, a high bar) while still rising, and tops out
    (b^2 / 4|c| above the high) within ``room``.  A climb that sped up, then slows down (an S-shaped warm-up) fits
    no bend over its whole length."""
    current, curvature, noise, inflation = quadratic(newest, noise, p.max_lag)
    if current <= 0 or curvature >= -p.newest_bar * p.decelerating * noise * fits(len(newest) - 1)[4] * inflation:
        return False
    return current * current / (4.0 * -curvature) < room
