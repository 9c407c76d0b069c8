"""The trend detectors' learned state survives a restart: snapshot, JSON, restore, and the daemon's state file."""

from __future__ import annotations

import json
import logging
import signal
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tpuwatch import statefile
from tpuwatch.analysis.state import FILE_NAME, MAX_BYTES, TrendStateFile
from tpuwatch.analysis.trend import TrendAnalyzer
from tpuwatch.config import TrendConfig
from tpuwatch.samples import Sample, sample

from conftest import SIM_FAST, DaemonProcess, wait_until

GIB = float(1 << 30)
HOUR = 3600.0
STEP = 10.0
START = 1_767_225_600.0


def cycle(t: float, rng: np.random.Generator) -> list[Sample]:
    """One sampling cycle of a 16 GiB chip leaking 1 GiB/h from 3 h on under a 5 min sawtooth, and its canary."""
    used = 4 * GIB + 2 * GIB * ((t % 300) / 300) + max(0.0, t - START - 3 * HOUR) / HOUR * GIB
    return [sample("tpuwatch_device_memory_used_bytes", used + rng.normal(0, 0.01 * GIB), device="0"),
            sample("tpuwatch_device_memory_total_bytes", 16 * GIB, device="0"),
            sample("tpuwatch_canary_duration_seconds", round(0.1 + rng.normal(0, 0.002), 5), device="0")]


def leaking(samples: list[Sample]) -> bool:
    """Whether a memory leak is suspected in what the analyzer exported."""
    return any(s.name == "tpuwatch_memory_leak_suspected" and s.value == 1 for s in samples)


def feed(trend: TrendAnalyzer, times: np.ndarray, seed: int) -> float | None:
    """Observe every cycle; the first time a leak finding is out."""
    rng = np.random.default_rng(seed)
    first = None
    for t in times.tolist():
        if first is None and leaking(trend.observe(cycle(t, rng), t)):
            first = t
    return first


def test_a_restored_analyzer_carries_on_as_if_it_never_stopped() -> None:
    times = np.arange(START, START + 5 * HOUR, STEP)
    restart = int(3.5 * HOUR / STEP)
    whole = TrendAnalyzer(TrendConfig())
    uninterrupted = feed(whole, times, seed=1)

    before = TrendAnalyzer(TrendConfig())
    rng = np.random.default_rng(1)
    for t in times[:restart].tolist():
        before.observe(cycle(t, rng), t)
    after = TrendAnalyzer(TrendConfig())
    assert after.restore(json.loads(json.dumps(before.snapshot(times[restart]))), times[restart] + 30) == 2
    for t in times[restart:].tolist():
        if leaking(after.observe(cycle(t, rng), t)):
            break
    # Found at the same cycle as without the restart, and long before a fresh detector's 2 h of learning.
    assert uninterrupted is not None and t == uninterrupted
    assert t - times[restart] < HOUR
    assert {s.name for s in after.samples()} >= {"tpuwatch_memory_leak_suspected", "tpuwatch_drift_baseline"}


def test_a_snapshot_that_does_not_fit_changes_nothing() -> None:
    saved = TrendAnalyzer(TrendConfig())
    feed(saved, np.arange(START, START + HOUR, STEP), seed=2)
    snapshot = saved.snapshot(START + HOUR)
    trend = TrendAnalyzer(TrendConfig())
    feed(trend, np.arange(START, START + 600, STEP), seed=3)
    before = trend.snapshot(START + HOUR)
    other_version = {**snapshot, "version": 99}
    other_floors = json.loads(json.dumps(snapshot))
    other_floors["leaks"][0]["detector"]["layout"][1] = [60.0]
    truncated = json.loads(json.dumps(snapshot))
    truncated["drifts"][0]["detector"]["sums"] = [0.0]  # the leak series before it would restore fine
    nan_window = json.loads(json.dumps(snapshot))
    nan_window["leaks"][0]["detector"]["lows"][0][0][1][0] = float("nan")  # would break every later update
    untyped_state = json.loads(json.dumps(snapshot))
    untyped_state["leaks"][0]["detector"]["state"] = {"firing": "yes", "slope": 1.0}
    firing_without_slope = json.loads(json.dumps(snapshot))
    firing_without_slope["leaks"][0]["detector"]["state"] = {"firing": True, "slope": None}  # breaks samples()
    wrong_key = json.loads(json.dumps(snapshot))
    wrong_key["drifts"][0]["detector"]["state"] = {"drifting": False, "extra": 1}
    for bad, error in ((other_version, "version 99"), (other_floors, "other floor settings"),
                       (truncated, "not enough values"), (nan_window, "not finite"),
                       (untyped_state, "LeakState.firing: str does not fit"),
                       (firing_without_slope, "firing state without a slope"), (wrong_key, "DriftState.extra")):
        with pytest.raises((ValueError, TypeError), match=error):
            trend.restore(bad, START + HOUR)
        assert trend.snapshot(START + HOUR) == before
    with pytest.raises(ValueError, match="in the future"):
        trend.restore(snapshot, START + HOUR - 600)


def test_series_gone_for_longer_than_forget_after_are_not_restored() -> None:
    saved = TrendAnalyzer(TrendConfig())
    feed(saved, np.arange(START, START + HOUR, STEP), seed=4)
    snapshot = json.loads(json.dumps(saved.snapshot(START + HOUR)))
    assert TrendAnalyzer(TrendConfig()).restore(snapshot, START + HOUR + 0.5 * HOUR) == 2
    assert TrendAnalyzer(TrendConfig()).restore(snapshot, START + HOUR + 2 * HOUR) == 0


def test_the_state_file_restores_and_counts_failed_saves(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    trend = TrendAnalyzer(TrendConfig())
    feed(trend, np.arange(START, START + 600, STEP), seed=3)
    state = TrendStateFile(str(tmp_path / "state"))
    assert state.restore(TrendAnalyzer(TrendConfig()), START) == 0  # nothing saved yet
    state.save(trend, START + 600)
    assert state.restore(TrendAnalyzer(TrendConfig()), START + 660) == 2

    state.path.write_text('{"version": 1, "leaks": [')
    with caplog.at_level(logging.WARNING):
        assert state.restore(TrendAnalyzer(TrendConfig()), START) == 0
    assert "ignoring unusable trend state file" in caplog.text and "not JSON" in caplog.text
    damaged = trend.snapshot(START + 600)
    damaged["leaks"][0]["detector"]["quiet"] = float("inf")  # int(inf) raises OverflowError
    state.path.write_text(json.dumps(damaged))
    with caplog.at_level(logging.WARNING):
        assert state.restore(TrendAnalyzer(TrendConfig()), START + 660) == 0
    assert "OverflowError" in caplog.text and "the detectors learn afresh" in caplog.text
    assert str(state.path) in {path for _, path, _ in statefile.LEDGER.view()[1]}

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    unwritable = TrendStateFile(str(blocked / "state"))  # a state dir under a file: every save fails
    caplog.clear()
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            unwritable.save(trend, START)
        assert unwritable.save_failures == 3
        assert caplog.text.count("not saved (kept in memory") == 1
        unwritable.path = tmp_path / "elsewhere" / FILE_NAME
        unwritable.save(trend, START)
    assert unwritable.path.exists()


def test_the_state_files_bound_holds_as_many_full_leak_detectors_as_the_analyzer_keeps() -> None:
    # A leak series at its longest holds about 47 KiB (43 before the beat test's minutes): a bound of 32 MiB refused the
    # file of an analyzer holding over about 700, so that every detector learned afresh after a restart.
    trend = TrendAnalyzer(TrendConfig())
    feed(trend, np.arange(START, START + 12 * HOUR, STEP), seed=4)  # every history at its longest
    entry = trend.snapshot(START + 12 * HOUR)["leaks"][0]
    assert len(json.dumps(entry)) * trend.max_series < MAX_BYTES


def drifting(trend: TrendAnalyzer, since: float) -> bool:
    """Whether a drift is suspected after ten more minutes of the same readings."""
    rng = np.random.default_rng(9)
    for t in np.arange(since, since + 600, STEP).tolist():
        trend.observe(cycle(t, rng), t)
    return any(s.name == "tpuwatch_drift_suspected" and s.value == 1 for s in trend.samples())


def test_a_damaged_digit_in_the_state_file_is_caught_not_restored_as_a_drift(tmp_path: Path) -> None:
    trained = TrendAnalyzer(TrendConfig())
    feed(trained, np.arange(START, START + 1800, STEP), seed=5)
    state = TrendStateFile(str(tmp_path))
    state.save(trained, START + 1800)
    text = state.path.read_text()
    mean = json.dumps(statefile.unseal(json.loads(text))[0]["drifts"][0]["detector"]["learned"][1])
    at = next(i for i, c in enumerate(mean) if c in "123456789")  # its first significant digit, one byte off
    damaged = text.replace(mean, mean[:at] + str(int(mean[at]) % 9 + 1) + mean[at + 1:], 1)
    assert damaged != text
    unchecked = TrendAnalyzer(TrendConfig())  # what restoring the damaged learned state would do
    assert unchecked.restore(json.loads(damaged)["state"], START + 1830) == 2 and drifting(unchecked, START + 1840)
    state.path.write_text(damaged)
    trend = TrendAnalyzer(TrendConfig())
    assert state.restore(trend, START + 1830) == 0 and not drifting(trend, START + 1840)
    assert "integrity check failed" in statefile.LEDGER.view()[1][-1][2]


def test_a_state_file_from_before_the_digest_is_restored_and_sealed_at_the_next_save(tmp_path: Path) -> None:
    trained = TrendAnalyzer(TrendConfig())
    feed(trained, np.arange(START, START + 1800, STEP), seed=5)
    state = TrendStateFile(str(tmp_path))
    state.path.write_text(json.dumps(trained.snapshot(START + 1800)))
    trend = TrendAnalyzer(TrendConfig())
    assert state.restore(trend, START + 1830) == 2 and not drifting(trend, START + 1840)
    state.save(trend, START + 2440)
    assert statefile.unseal(json.loads(state.path.read_text()))[1]


def test_the_daemon_saves_its_detectors_at_stop_and_reads_them_at_start(
        start_daemon: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    config = {"interval": "200ms", "paths": {"sysfs": str(tmp_path / "empty-sysfs")},
              "state_dir": str(tmp_path / "state")}
    first = start_daemon(config)
    first.wait_ready()
    first.signal(signal.SIGTERM)
    assert first.proc.wait(timeout=10) == 0
    saved = statefile.unseal(json.loads((tmp_path / "state" / FILE_NAME).read_text()))
    assert saved[1] and [["memory", "host"]] in [entry["labels"] for entry in saved[0]["leaks"]]

    second = start_daemon(config)
    second.wait_ready()
    wait_until(lambda: "series carried on from" in second.log(), what="the restore to be logged")
    assert "Traceback" not in second.log()


def test_simulated_chips_neither_read_nor_write_the_state_file(
        start_daemon: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    state = tmp_path / "state" / FILE_NAME
    state.parent.mkdir()
    state.write_text("the real chips' state")
    daemon = start_daemon({**SIM_FAST, "state_dir": str(state.parent)})
    daemon.wait_ready()
    daemon.signal(signal.SIGTERM)
    assert daemon.proc.wait(timeout=10) == 0
    assert state.read_text() == "the real chips' state" and "trend state" not in daemon.log()
