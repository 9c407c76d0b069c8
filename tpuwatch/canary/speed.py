"""When a chip is slow: its device time against its peers', beside the host's own pace (pure; the worker and
the judge both ask).

A chip is slow when its device time for the suite's timed check is over
SLOW_FACTOR times the median of the host's other chips (three chips or more),
and over it by SLOW_MIN_S: a timer's jitter on a run of a millisecond or two is
not a slow chip.  When a chip looks slow the worker times every chip up to
SPEED_ROUNDS times more, in a rotated order, and compares each chip's fastest
time so far after each round, stopping once no chip looks slow: a busy host
slows some timings (by a scheduler's time slice, a few ms), not every timing of
one chip.

Beside every timing the worker also times a host reference: a small fixed
program on the host's own CPU backend, before each run of the chip's program
and after the last (``host_seconds``, beside ``runs_seconds``).  The reference
is the host's pace, not a chip's: a busy host slows it, a slow TPU or GPU does
not.  A timing (the chip's fastest run) is divided by the host's slowdown
beside that run: the slower of the references just before and after it, over
the reference's fastest so far in the speed check, never below 1.  A round
that says slow is conclusive when the chip is still slow after that, and
inconclusive when the host's slowdown explains it: it neither confirms nor
clears.  A round that says not slow always clears (a busy host only ever slows
a chip down).  While a chip is slow in every round with fewer than
MIN_CONCLUSIVE conclusive ones, the worker times up to BUSY_ROUNDS rounds
more.  The judge calls a chip slow when no round cleared it and at least
MIN_CONCLUSIVE of its timings (the first included) were conclusively slow;
with fewer, its speed is inconclusive: recorded in the run, never paged.  On a
calm host the references stay near their fastest and every round counts as
before.
"""

from __future__ import annotations

from collections.abc import Sequence

SLOW_FACTOR = 2.0
SLOW_MIN_S = 0.0005
SPEED_ROUNDS = 8  # at most; a clean chip needs one unhurried timing to clear, a slow chip has none
BUSY_ROUNDS = 4  # more at most, while a chip slow in every round has too few conclusive ones (a busy host)
MIN_CONCLUSIVE = 3  # timings (the first included) that must be slow beyond the host's own slowdown
SLOW, CLEAR, INCONCLUSIVE = "slow", "clear", "inconclusive"


def is_slow(took: float, median: float) -> bool:
    """A device time over SLOW_FACTOR x its peers' median, and over it by SLOW_MIN_S."""
    return median > 0 and took > SLOW_FACTOR * median and took - median > SLOW_MIN_S


def slow_against_peers(took: dict[str, float]) -> dict[str, float]:
    """device -> its peers' median device time, for each device slow against it (three chips or more)."""
    if len(took) < 3:
        return {}
    out = {}
    for device, mine in took.items():
        peers = sorted(t for d, t in took.items() if d != device)
        median = (peers[(len(peers) - 1) // 2] + peers[len(peers) // 2]) / 2
        if is_slow(mine, median):
            out[device] = median
    return out


def beyond_host(runs: Sequence[float], host: Sequence[float] | None, usual: float) -> float:
    """A chip's timing with the host's slowdown beside it divided out: its fastest run (the one that is its
    timing) over the slower of the host references just before and after that run, relative to ``usual``,
    the reference's median so far (never below 1).  Without references (or a mismatch): the fastest run."""
    quickest = min(range(len(runs)), key=lambda i: runs[i])
    if not host or len(host) != len(runs) + 1 or usual <= 0:
        return runs[quickest]
    return runs[quickest] / max(1.0, max(host[quickest], host[quickest + 1]) / usual)


def speed_verdict(deviations: Sequence[bool], conclusive: Sequence[bool] | None) -> str:
    """SLOW, CLEAR or INCONCLUSIVE for a chip's speed rounds (``deviations``: slow in each; ``conclusive``: in
    each, slow beyond the host's own slowdown, or not slow at all; None from a worker that timed no host
    reference: every round counts, as before)."""
    if not all(deviations):
        return CLEAR
    if conclusive is None:
        return SLOW
    return SLOW if sum(bool(c) for c in conclusive) >= min(MIN_CONCLUSIVE, len(deviations)) else INCONCLUSIVE
