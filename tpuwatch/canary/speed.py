"""When a chip is slow: its device time against its peers' (pure; the worker and the judge both ask).

A chip is slow when its device time for the suite's timed check is over
SLOW_FACTOR times the median of the host's other chips (three chips or more),
and over it by SLOW_MIN_S: a timer's jitter on a run of a millisecond or two is
not a slow chip.  When a chip looks slow the worker times every chip up to
SPEED_ROUNDS times more, in a rotated order, and compares each chip's fastest
time so far after each round, stopping once no chip looks slow: a busy host
slows some timings (by a scheduler's time slice, a few ms), not every timing of
one chip.  The judge calls the chip slow when every round says so.
"""

from __future__ import annotations

SLOW_FACTOR = 2.0
SLOW_MIN_S = 0.0005
SPEED_ROUNDS = 8  # at most; a clean chip needs one unhurried timing to clear, a slow chip has none


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
