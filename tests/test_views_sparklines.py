"""`tpuwatch top`'s sparklines: each from its own series' lowest to its highest point over the window shown.

On a scale from 0 to the capacity, an allocator's sawtooth on a full chip was a row of identical blocks; on its
own, a small change on a large value shows, and a series that does not move is a flat low line.
"""

from __future__ import annotations

from tpuwatch.views.lines import sparkline

GIB, MIB = float(1 << 30), float(1 << 20)
NAN = float("nan")


def sawtooth(low: float, rise: float, period: float, end: float, step: float = 5.0) -> list[list[float]]:
    """A value climbing from ``low`` by ``rise`` over each ``period`` seconds, then dropping back, from 0 to
    ``end``."""
    return [[t, low + rise * (t % period) / period] for t in (k * step for k in range(int(end / step)))]


def test_a_sawtooth_draws_its_teeth() -> None:
    # Four characters (50 s each) per 200 s tooth: each climbs from the lowest block to the highest.
    line = sparkline(sawtooth(10.0, 2.0, 200.0, 800.0), 0.0, 800.0, True, width=16)
    assert line == "▁▃▆█" * 4, line


def test_a_small_change_on_a_large_value_shows() -> None:
    # 16 GiB +- 1 MiB: on a scale from 0 (or to the capacity) every character would be the same block.
    line = sparkline(sawtooth(16 * GIB - MIB, 2 * MIB, 200.0, 800.0), 0.0, 800.0, True, width=16)
    assert line == "▁▃▆█" * 4, line
    assert sparkline(sawtooth(16 * GIB - MIB, 2 * MIB, 200.0, 800.0), 0.0, 800.0, False, width=16) == "_-*@" * 4


def test_a_series_that_does_not_move_is_a_flat_low_line() -> None:
    flat = [[float(t), 0.97] for t in range(0, 800, 5)]
    assert sparkline(flat, 0.0, 800.0, True, width=16) == "▁" * 16
    assert sparkline(flat, 0.0, 800.0, False, width=16) == "_" * 16
    assert sparkline([[float(t), 16 * GIB] for t in range(0, 800, 5)], 0.0, 800.0, True, width=16) == "▁" * 16


def test_what_was_not_read_is_a_gap() -> None:
    points = sawtooth(10.0, 2.0, 200.0, 800.0)
    absent = [p for p in points if not 200 <= p[0] < 400]  # characters 4 to 7: nothing read
    unread = [[t, None if 200 <= t < 400 else v] for t, v in points]  # the JSON's null
    broken = [[t, NAN if 200 <= t < 400 else v] for t, v in points]  # a driver's NaN
    for series in (absent, unread, broken):
        assert sparkline(series, 0.0, 800.0, True, width=16) == "▁▃▆█" + " " * 4 + "▁▃▆█" * 2
    assert sparkline([], 0.0, 800.0, True, width=4) == "    "
    assert sparkline([[1.0, None], [2.0, NAN]], 0.0, 4.0, True, width=4) == "    "


def test_only_the_shown_window_sets_the_scale() -> None:
    # A spike before the window (or after it) is not shown, and does not squash what is.
    points = [[-100.0, 1e12], *sawtooth(10.0, 2.0, 200.0, 800.0), [900.0, -1e12]]
    assert sparkline(points, 0.0, 800.0, True, width=16) == "▁▃▆█" * 4
