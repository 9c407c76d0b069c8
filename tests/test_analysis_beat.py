"""Two allocator sawtooths that beat, told from growth by their minutes' middles and high (tpuwatch.analysis.beat)."""

from __future__ import annotations

import numpy as np
import pytest

from tpuwatch.analysis.beat import Beats

TIMES = np.arange(-10.0, 1.0)  # 11 minutes, newest last (the detector's times are relative to the newest)


def kept(middles: list[float], tops: list[float], minutes: int = 20) -> Beats:
    """Beats holding these minutes' middles and highs."""
    beats = Beats(minutes, middle=0.3, high=0.3)
    for middle, top in zip(middles, tops):
        beats.close(middle, top)
    return beats


def line(slope: float, start: float = 100.0) -> list[float]:
    return [start + slope * t for t in range(11)]


@pytest.mark.parametrize(("middles", "tops", "slope", "beating"), [
    (line(0.0), line(-1.0), 1.0, True),  # the middle holds, the high falls as fast as the floor rises: a beat
    (line(0.29), line(-0.31), 1.0, True),
    (line(0.3), line(-1.0), 1.0, False),  # the middle climbs 0.3 of the floor's slope: growth
    (line(0.0), line(-0.3), 1.0, False),  # the high falls only 0.3 of it: a floor rising under a fixed top
    (line(1.0), line(1.0), 1.0, False),  # a leak: all three climb
    (line(0.5), line(-2.0), 2.0, True),  # the shares are of the slope, whatever its size
    (line(0.0), line(-0.5), 2.0, False),
])
def test_a_beat_holds_its_middle_while_its_high_falls(middles: list[float], tops: list[float], slope: float,
                                                      beating: bool) -> None:
    assert kept(middles, tops).beating(11, TIMES, slope, 45) is beating


def test_it_reads_the_newest_minutes_every_stride_th_one_and_needs_as_many_as_the_scale() -> None:
    # 20 minutes: the older 9 climb steeply (middle and high), the newest 11 are a beat.
    beats = kept([100.0 + 10 * t for t in range(9)] + line(0.0, 200.0), [100.0 + 10 * t for t in range(9)]
                 + line(-1.0, 200.0))
    assert beats.beating(11, TIMES, 1.0, 45)
    assert beats.beating(11, TIMES[::2], 1.0, 6)  # every second minute back from the newest
    assert not beats.beating(21, np.arange(-20.0, 1.0), 1.0, 45)  # more minutes than it holds: not yet


def test_a_snapshot_carries_the_minutes_and_one_that_does_not_fit_is_refused() -> None:
    beats = kept(line(0.0), line(-1.0))
    restored = Beats(20, middle=0.3, high=0.3)
    restored.restore(beats.snapshot())
    assert restored.snapshot() == beats.snapshot() and restored.beating(11, TIMES, 1.0, 45)
    middles, _ = beats.snapshot()
    with pytest.raises(ValueError, match="^the minutes' middles and highs differ in length$"):
        Beats(20, middle=0.3, high=0.3).restore([middles, ""])
