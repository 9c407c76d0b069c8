"""A series that starts with its job (a TPU chip reads nothing while idle; the detector forgets a series unseen for
an hour): the fast check judges it on what it has.  Before, it waited for 91 minutes of history, so a leak that
filled the chip within 90 minutes of the job's start was never paged.  Composed series: 30 % of a 16 GiB chip
from the first reading, a wobble of 0.1 %."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from tpuwatch.analysis import analyze
from tpuwatch.analysis.fast import FastParams
from tpuwatch.analysis.leak import LeakDetector, LeakParams
from tpuwatch.config import Config

GIB = 1024.0**3
CAPACITY = 16 * GIB
START = 1_700_000_000.0
STEP = 10.0
MINUTE = 60.0


def job(extra: Callable[[float], float], minutes: float) -> list[tuple[float, float]]:
    """``minutes`` of readings from the job's start: 30 % plus ``extra(seconds since start)``, capped at full."""
    return [(START + i * STEP, min(CAPACITY, 0.3 * CAPACITY + extra(i * STEP)
                                   + 0.001 * CAPACITY * math.sin(i * 1.7) * math.cos(i * 0.31)))
            for i in range(int(minutes * MINUTE / STEP))]


def first_page(points: list[tuple[float, float]], **fast: float) -> float | None:
    detector = LeakDetector(LeakParams(fast=dataclasses.replace(FastParams(), **fast)))
    for t, v in points:
        detector.update(t, v, CAPACITY)
    return detector.first_alert_at


def leak(minutes_to_full: float, every: float = 0.0) -> Callable[[float], float]:
    """From the first reading, 70 % of the chip in ``minutes_to_full`` (in steps every ``every`` s if given)."""
    def extra(t: float) -> float:
        stepped = math.floor(t / every) * every if every else t
        return 0.7 * CAPACITY * stepped / (minutes_to_full * MINUTE)
    return extra


def lead(points: list[tuple[float, float]], page: float | None) -> float:
    """Minutes from the page to the first reading at capacity (-inf: never paged)."""
    full = next(t for t, v in points if v >= CAPACITY)
    return -math.inf if page is None else (full - page) / MINUTE


@pytest.mark.parametrize(("minutes", "every"), [(35, 0.0), (45, 0.0), (60, 0.0), (45, 120.0)])
def test_a_leak_from_the_jobs_start_is_paged_10_minutes_before_full(minutes: float, every: float) -> None:
    points = job(leak(minutes, every), minutes + 5)
    assert lead(points, first_page(points)) >= 10.0
    # Asked for a climb of an hour and a half in a young series, as good as the old wait: never in time.
    assert lead(points, first_page(points, young_shortest=90)) < 10.0


def test_a_leak_of_110_minutes_from_the_jobs_start_is_paged_while_the_slow_scales_still_learn() -> None:
    # Due a page by its 100th minute: the series holds more than the check's 91 minutes by then, but the slow
    # scales judge nothing before 2 h, so it is young until then (the first minutes it holds are its reference).
    points = job(leak(110), 115)
    assert lead(points, first_page(points)) >= 10.0
    assert lead(points, first_page(points, young_until=91)) < 10.0  # young only while under 91 minutes: missed


def test_a_leak_under_a_sawtooth_from_the_jobs_start_is_paged_10_minutes_before_full() -> None:
    def extra(t: float) -> float:
        return leak(45)(t) * (1 - 0.08 / 0.7) + 0.08 * CAPACITY * ((t % 150.0) / 150.0)
    points = job(extra, 50)
    assert lead(points, first_page(points)) >= 10.0


def test_a_straight_ramp_at_the_jobs_start_that_stops_below_full_is_its_start_up_not_a_leak() -> None:
    # 3.5 % of the chip a minute for 11 min, to 68 %: at its rate it would fill the chip 9 min later.  A young
    # series' climb counts once it has lasted young_shortest (15 min); at the old series' 6 min it is paged.
    def extra(t: float) -> float:
        return 0.035 * CAPACITY * min(t, 11 * MINUTE) / MINUTE
    points = job(extra, 60)
    assert first_page(points) is None
    assert first_page(points, young_shortest=6) is not None


@pytest.mark.parametrize("shape", ["quadratic", "exponential"])
def test_a_cache_warming_up_from_the_jobs_start_does_not_page(shape: str) -> None:
    def extra(t: float) -> float:
        x = min(t / (20 * MINUTE), 1.0)
        eased = 1 - (1 - x) ** 2 if shape == "quadratic" else (1 - math.exp(-4 * x)) / (1 - math.exp(-4))
        return 0.5 * CAPACITY * eased
    assert first_page(job(extra, 120)) is None


def test_a_model_loaded_at_the_jobs_start_does_not_page() -> None:
    assert first_page(job(lambda t: 0.5 * CAPACITY if t >= 30 else 0.0, 120)) is None


def test_analyze_pages_a_leak_in_a_csv_of_the_jobs_first_40_minutes(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    points = job(leak(35), 40)
    path = tmp_path / "job.csv"
    path.write_text("timestamp,value,capacity\n" + "".join(f"{t:.0f},{v:.0f},{CAPACITY:.0f}\n" for t, v in points))
    parser = argparse.ArgumentParser()
    analyze.add_arguments(parser)
    assert analyze.run(parser.parse_args([str(path), "--json"]), Config()) == 1
    (series,) = json.loads(capsys.readouterr().out)["series"]
    assert series["verdict"] == "leak"
    assert lead(points, series["first_alert_at"]) >= 10.0
