"""When a chip is slow: its device time against its peers', the fastest and at the same moment (pure; the worker
and the judge both ask).

A chip is slow when its device time for the suite's timed check is over
SLOW_FACTOR times the median of the host's other chips (three chips or more),
and over it by SLOW_MIN_S: a timer's jitter on a run of a millisecond or two is
not a slow chip.  When a chip looks slow (over SLOW_FACTOR times its peers'
median, or times its fastest peer: a busy moment that slowed two peers' first
timings hides a slow chip from the median) the worker times every chip up to
SPEED_ROUNDS times more, in a rotated order, and compares each chip's fastest
time so far with its peers' fastest so far after each round, stopping once no
chip looks slow: a clean chip clears with one unhurried timing.  A chip slow at
first only against its fastest peer has its rounds from its second timing on.

A busy host (a CPU shared with other work) slows random timings, by a
scheduler's time slice or many; a slow chip is slow in every timing.  On a host
that busy a clean chip can draw a slow timing in every round and keep its
fastest over SLOW_FACTOR times its peers' fastest through all of them.  So a
round that says slow is conclusive only when the chip's timing in it is also
slow against its peers' timings in that same round (their median, the host's
pace at that moment: the host slows them too), and a chip is slow only when it
is so in CONSISTENT (3 in 4) of its timings, MIN_CONCLUSIVE at least.  A round
that says not slow always clears (a busy host only ever slows a chip down).
While a chip is slow in every round with too few conclusive ones, the worker
times up to BUSY_ROUNDS rounds more.  With too few at the end its speed is
inconclusive: recorded in the run, never paged.  On a calm host every round is
conclusive for a slow chip and the verdict is as before.

The worker also times a host reference beside every run of the timed check (a
small fixed program on the host's own CPU backend: ``host_seconds`` beside
``runs_seconds``) and keeps it with each round (``rounds`` in the speed
line), for the record: it is not part of the verdict.  Divided out of a
chip's timing it called clean chips slow on a busy host (the reference, about
0.5 ms, misses the time slices taken from a run of several), and excused slow
chips on a quiet one (its own jitter).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

SLOW_FACTOR = 2.0
SLOW_MIN_S = 0.0005
SPEED_ROUNDS = 8  # at most; a clean chip needs one unhurried timing to clear, a slow chip has none
BUSY_ROUNDS = 4  # more at most, while a chip slow in every round has too few conclusive ones (a busy host)
MIN_CONCLUSIVE = 3  # timings that must be slow against the peers timed beside them, at least
CONSISTENT = 0.75  # the share of a chip's timings that must be: a slow chip is slow in every one, a busy host not
SLOW, CLEAR, INCONCLUSIVE = "slow", "clear", "inconclusive"


def is_slow(took: float, median: float) -> bool:
    """A device time over SLOW_FACTOR x its peers' median, and over it by SLOW_MIN_S."""
    return median > 0 and took > SLOW_FACTOR * median and took - median > SLOW_MIN_S


def median(times: Sequence[float]) -> float:
    """The median of ``times`` (one or more)."""
    ordered = sorted(times)
    return (ordered[(len(ordered) - 1) // 2] + ordered[len(ordered) // 2]) / 2


def slow_against_peers(took: dict[str, float]) -> dict[str, float]:
    """device -> its peers' median device time, for each device slow against it (three chips or more)."""
    if len(took) < 3:
        return {}
    peers = {device: median([t for d, t in took.items() if d != device]) for device in took}
    return {device: peers[device] for device, mine in took.items() if is_slow(mine, peers[device])}


def looks_slow(took: dict[str, float]) -> list[str]:
    """The devices worth timing again: slow against their peers' median, or against their fastest peer (three
    chips or more).  A busy moment that slowed two peers' first timings hides a slow chip from the median."""
    if len(took) < 3:
        return []
    return [device for device, mine in took.items() if is_slow(mine, min(t for d, t in took.items() if d != device))]


def slow_beside(mine: float, beside: Sequence[float]) -> bool:
    """Whether a chip's timing in a round is slow against its peers' timings in the same round (the host's pace
    at that moment: a busy host slows them too): over SLOW_FACTOR x their median, and over it by SLOW_MIN_S."""
    return len(beside) >= 2 and is_slow(mine, median(beside))


def needed(timings: int) -> int:
    """Conclusive timings a chip slow in all ``timings`` needs to be called slow: CONSISTENT of them (rounded
    up), MIN_CONCLUSIVE at least (fewer timings than that: all of them)."""
    return min(timings, max(MIN_CONCLUSIVE, math.ceil(CONSISTENT * timings - 1e-9)))


def speed_verdict(deviations: Sequence[bool], conclusive: Sequence[bool] | None) -> str:
    """SLOW, CLEAR or INCONCLUSIVE for a chip's speed rounds (``deviations``: slow in each; ``conclusive``: in
    each, slow against its peers timed in the same round, or not slow at all; None from a worker that recorded
    no such flag: every round counts, as before)."""
    if not deviations or not all(deviations):
        return CLEAR
    if conclusive is None:
        return SLOW
    return SLOW if sum(bool(c) for c in conclusive) >= needed(len(deviations)) else INCONCLUSIVE
