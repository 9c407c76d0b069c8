"""Two allocator sawtooths that beat, told from growth by their minute means and high (tpuwatch.analysis.beat)."""

from __future__ import annotations

import numpy as np
import pytest

from tpuwatch.analysis.beat import Beats

TIMES = np.arange(-10.0, 1.0)  # 11 minutes, newest last (the detector's times are relative to the newest)


def kept(means: list[float], tops: list[float], minutes: int = 20) -> Beats:
    """Beats holding these minute means and highs, one reading per minute each."""
    beats = Beats(minutes, mean=0.3, high=0.3)
    for mean, top in zip(means, tops):
        beats.add(mean)
        beats.close(top)
    return beats


def line(slope: float, start: float = 100.0) -> list[float]:
    return [start + slope * t for t in range(11)]


@pytest.mark.parametrize(("means", "tops", "beating"), [
    (line(0.0), line(-1.0), True),  # the mean holds, the high falls as fast as the floor rises: a beat
    (line(0.29), line(-0.31), True),
    (line(0.3), line(-1.0), False),  # the mean climbs 0.3 of the floor's slope: growth
    (line(0.0), line(-0.3), False),  # the high falls only 0.3 of it: a floor rising under a fixed top
    (line(1.0), line(1.0), False),  # a leak: all three climb
])
def test_a_beat_holds_its_mean_while_its_high_falls(means: list[float], tops: list[float], beating: bool) -> None:
    assert kept(means, tops).beating(11, TIMES, 1.0, 45) is beating


def test_it_reads_the_newest_minutes_every_stride_th_one_and_needs_as_many_as_the_scale() -> None:
    # 20 minutes: the older 9 climb steeply (mean and high), the newest 11 are a beat.
    beats = kept([100.0 + 10 * t for t in range(9)] + line(0.0, 200.0), [100.0 + 10 * t for t in range(9)]
                 + line(-1.0, 200.0))
    assert beats.beating(11, TIMES, 1.0, 45)
    assert beats.beating(11, TIMES[::2], 1.0, 6)  # every second minute back from the newest
    assert not beats.beating(21, np.arange(-20.0, 1.0), 1.0, 45)  # more minutes than it holds: not yet


def test_a_minute_without_readings_is_left_out_and_the_open_one_is_averaged() -> None:
    beats = Beats(5, mean=0.3, high=0.3)
    beats.close(7.0)  # nothing read: as after a restart from a snapshot that kept no sums
    for value in (1.0, 2.0, 6.0):
        beats.add(value)
    assert beats.snapshot()[:2] == [9.0, 3]
    beats.close(8.0)
    restored = Beats(5, mean=0.3, high=0.3)
    restored.restore(beats.snapshot())
    assert list(restored._means) == [3.0] and list(restored._tops) == [8.0]
    assert restored.snapshot() == beats.snapshot() and beats.snapshot()[:2] == [0.0, 0]


@pytest.mark.parametrize(("change", "message"), [
    (lambda s: s.__setitem__(0, float("nan")), "the open bucket's sum is not a sum"),
    (lambda s: s.__setitem__(1, -1), "the open bucket's sum is not a sum"),
    (lambda s: s.__setitem__(3, ""), "the minute means and highs differ in length"),
])
def test_a_snapshot_that_does_not_fit_is_refused(change: object, message: str) -> None:
    snapshot = kept(line(0.0), line(-1.0)).snapshot()
    change(snapshot)  # type: ignore[operator]
    with pytest.raises(ValueError, match=f"^{message}$"):
        Beats(20, mean=0.3, high=0.3).restore(snapshot)
