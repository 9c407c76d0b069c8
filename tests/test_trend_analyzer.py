"""Drift detection (CUSUM) and the daemon's TrendAnalyzer hook."""

from __future__ import annotations

import random

import pytest

from tpuwatch.alerting.rules import CompiledRule, default_rules_text, parse_rules
from tpuwatch.alerting.tracker import Tracker
from tpuwatch.analysis.drift import DriftDetector
from tpuwatch.analysis.trend import TrendAnalyzer, drift_series, memory_series
from tpuwatch.catalog import CATALOG
from tpuwatch.config import TrendConfig
from tpuwatch.samples import Sample, sample

GIB = float(1 << 30)


def test_drift_reports_baseline_and_shift_and_clears_when_back() -> None:
    rng = random.Random(1)
    detector = DriftDetector()
    for _ in range(500):
        assert not detector.update(0.100 + rng.gauss(0, 0.002)).drifting
    assert detector.state.baseline == pytest.approx(0.100, abs=0.002)
    for i in range(200):
        state = detector.update(0.110 + rng.gauss(0, 0.002))
        if state.drifting:
            break
    assert state.drifting and state.direction == "up" and i < 10
    assert state.shift == pytest.approx(0.010, abs=0.003)
    for _ in range(200):
        detector.update(0.100 + rng.gauss(0, 0.002))
    assert not detector.state.drifting


def test_drift_downwards_and_constant_signals() -> None:
    detector = DriftDetector(warmup=5)
    for _ in range(5):
        detector.update(40.0)
    states = [detector.update(39.0) for _ in range(50)]
    assert states[-1].drifting and states[-1].direction == "down" and states[-1].shift == pytest.approx(-1.0)
    assert DriftDetector().update(1.0).baseline is None  # still learning


def _cycle(used: float, device: str = "0") -> list[Sample]:
    return [
        sample("tpuwatch_device_memory_used_bytes", used, device=device),
        sample("tpuwatch_device_memory_total_bytes", 16 * GIB, device=device),
        sample("tpuwatch_host_memory_total_bytes", 64 * GIB),
        sample("tpuwatch_host_memory_available_bytes", 40 * GIB),
        sample("tpuwatch_holder_process_resident_memory_bytes", 3 * GIB, pid="42", command="python3"),
        sample("tpuwatch_device_temperature_celsius", 60.0, device=device),
        sample("tpuwatch_device_utilization_ratio", 0.85, device=device),
        sample("tpuwatch_canary_duration_seconds", 0.004, device=device),
        sample("tpuwatch_device_up", 1, device=device),
    ]


def test_series_extracted_from_a_cycle() -> None:
    memory = memory_series(_cycle(5 * GIB))
    assert memory == {
        (("device", "0"), ("memory", "hbm")): (5 * GIB, 16 * GIB),
        (("memory", "host"),): (24 * GIB, 64 * GIB),
        (("command", "python3"), ("memory", "process"), ("pid", "42")): (3 * GIB, 64 * GIB),
    }
    mig = [sample("tpuwatch_device_memory_used_bytes", 1 * GIB, device="0", gpu_instance="3"),
           sample("tpuwatch_device_memory_total_bytes", 2 * GIB, device="0", gpu_instance="3")]
    assert memory_series(_cycle(5 * GIB) + mig) == memory, "a MIG instance's memory is not the chip's"
    drift = drift_series(_cycle(5 * GIB))
    assert drift == {(("device", "0"), ("series", "canary_latency")): 0.004,
                     (("band", "0.8-1.0"), ("device", "0"), ("series", "temperature")): 60.0}


def test_analyzer_flags_a_leaking_chip_only() -> None:
    analyzer = TrendAnalyzer(TrendConfig())
    rng = random.Random(2)
    out: list[Sample] = []
    for k in range(6 * 360):  # 6 h at 10 s; chip 1 leaks 1 GiB/h from 3 h on
        t = 1_767_225_600.0 + 10.0 * k
        leak = max(0.0, t - 1_767_225_600.0 - 3 * 3600) * GIB / 3600
        cycle = _cycle(5 * GIB + rng.gauss(0, 0.01 * GIB)) + _cycle(5 * GIB + leak + rng.gauss(0, 0.01 * GIB), "1")
        out = analyzer.observe(cycle, t)
    suspected = {dict(s.labels).get("device"): s.value for s in out
                 if s.name == "tpuwatch_memory_leak_suspected" and dict(s.labels)["memory"] == "hbm"}
    assert suspected == {"0": 0, "1": 1}
    eta = [s for s in out if s.name == "tpuwatch_memory_exhaustion_eta_seconds"]
    assert [dict(s.labels)["device"] for s in eta] == ["1"]
    assert 4 * 3600 < eta[0].value < 10 * 3600
    assert all(s.name in CATALOG and set(dict(s.labels)) <= set(CATALOG[s.name].labels) for s in out)
    [growth] = [s for s in out if s.name == "tpuwatch_memory_growth_bytes_per_second"]
    assert dict(growth.labels) == {"device": "1", "memory": "hbm"}
    assert growth.value == pytest.approx(GIB / 3600, rel=0.2)


def test_analyzer_reports_drift_and_forgets_vanished_series() -> None:
    analyzer = TrendAnalyzer(TrendConfig(), forget_after=60.0)
    for k in range(100):
        latency = 0.004 + 0.0001 * (k % 3) + (0.002 if k >= 60 else 0.0)
        cycle = [sample("tpuwatch_canary_duration_seconds", latency, device="0")]
        out = analyzer.observe(cycle, 10.0 * k)
    drifting = [s for s in out if s.name == "tpuwatch_drift_suspected" and s.value == 1]
    assert [dict(s.labels) for s in drifting] == [{"device": "0", "series": "canary_latency"}]
    [shift] = [s.value for s in out if s.name == "tpuwatch_drift_shift"]
    assert shift == pytest.approx(0.002, rel=0.2)
    assert analyzer.observe([], 10.0 * 100 + 61) == []


def test_a_leaking_process_is_named_by_command_and_pod_in_the_series_and_the_alert() -> None:
    analyzer = TrendAnalyzer(TrendConfig())
    rng = random.Random(3)
    who = {"pid": "4101", "command": "python3", "namespace": "ml", "pod": "trainer-0", "container": "jax"}
    out: list[Sample] = []
    for k in range(6 * 360):  # the process's device memory grows 1 GiB/h from 3 h on; the chip's stays put
        t = 1_767_225_600.0 + 10.0 * k
        leak = max(0.0, t - 1_767_225_600.0 - 3 * 3600) * GIB / 3600
        cycle = [sample("tpuwatch_device_memory_total_bytes", 80 * GIB, device="0"),
                 sample("tpuwatch_process_device_memory_used_bytes", 20 * GIB + leak + rng.gauss(0, 0.01 * GIB),
                        device="0", **who),
                 sample("tpuwatch_process_device_memory_used_bytes", 10 * GIB + rng.gauss(0, 0.01 * GIB),
                        device="0", pid="4102", command="python3", namespace="", pod="", container="")]
        out = analyzer.observe(cycle, t)
    suspected = {dict(s.labels)["pid"]: (dict(s.labels), s.value) for s in out
                 if s.name == "tpuwatch_memory_leak_suspected"}
    assert suspected["4101"] == ({"memory": "process_hbm", "device": "0", **who}, 1)
    assert suspected["4102"] == ({"memory": "process_hbm", "device": "0", "pid": "4102", "command": "python3"}, 0)
    rules = [CompiledRule(r) for r in parse_rules(default_rules_text(), "built-in")
             if r.alert == "AcceleratorMemoryLeak"]
    fired = [c for r in rules for c in r.evaluate(out, Tracker(), 1e9, {"host": "h"})]
    assert [c.annotations["summary"] for c in fired] == [
        "Memory leak suspected in process 4101 (python3) in pod ml/trainer-0 on chip 0: HBM keeps growing"]


def _temperature_drifts(trend: TrendAnalyzer) -> set[str]:
    return {dict(s.labels)["device"] for s in trend.samples()
            if s.name == "tpuwatch_drift_suspected" and dict(s.labels)["series"] == "temperature" and s.value}


def test_healthy_chips_sampled_every_second_show_no_temperature_drift_and_a_hotter_chip_does() -> None:
    # Simulated chips whose load cycles every 137 s, read every second for two hours: temperature moves
    # with the load inside each utilization band, and that is no drift.  Then chip 3 runs 6 C hotter at the
    # same load (a failing fan): that is.
    from tpuwatch.config import SimConfig
    from tpuwatch.devices.base import reading_samples
    from tpuwatch.devices.sim import SimBackend

    clock = [0.0]
    backend = SimBackend(SimConfig(count=4, fault_after=10 ** 9), clock=lambda: clock[0])
    trend = TrendAnalyzer(TrendConfig())

    def run(seconds: int, hotter: float = 0.0) -> None:
        for _ in range(seconds):
            clock[0] += 1.0
            samples = [s._replace(value=s.value + hotter) if hotter and s.name == "tpuwatch_device_temperature_celsius"
                       and dict(s.labels)["device"] == "3" else s
                       for r in backend.read() for s in reading_samples(r, "sim")]
            trend.observe(samples, 1_767_225_600 + clock[0])

    run(2 * 3600)
    assert _temperature_drifts(trend) == set()
    run(3600, hotter=6.0)
    assert _temperature_drifts(trend) == {"3"}


@pytest.mark.parametrize("second", range(0, 60, 10))
def test_the_drills_chips_show_no_temperature_drift_from_their_past_into_a_daemon_started_at_any_second(
        second: int) -> None:
    # What a --simulate daemon does: its detectors learn the simulated chips' past (the status page's history),
    # then read the chips every 200 ms.  Whatever second of the minute it starts at, no healthy chip drifts.
    from tpuwatch.config import SimConfig
    from tpuwatch.devices import sim
    from tpuwatch.devices.base import reading_samples
    from tpuwatch.drills.history import SIM_HISTORY_S, SIM_HISTORY_STEP_S

    config, start, clock = SimConfig(count=8, fault_after=10 ** 9), 1_767_225_600 + second + 0.37, [0.0]
    trend = TrendAnalyzer(TrendConfig())
    for offset, readings in sim.history(config, SIM_HISTORY_S, SIM_HISTORY_STEP_S):
        trend.observe([s for r in readings for s in reading_samples(r, "sim")], start + offset)
    backend = sim.SimBackend(config, clock=lambda: clock[0])
    drifted: set[str] = set()
    while clock[0] < 180:
        clock[0] += 0.2
        trend.observe([s for r in backend.read() for s in reading_samples(r, "sim")], start + clock[0])
        drifted |= _temperature_drifts(trend)
    assert drifted == set()


def test_the_part_of_a_minute_a_restarted_daemon_begins_in_is_not_judged() -> None:
    # A load in step with the clock: every whole minute averages 60.0 C (30 s at 58, 30 s at 62), so the learned
    # spread is tiny.  A daemon restarted at :30 reads only the hot half of its first minute: 62 C, which is no
    # drift; the whole minutes after it are judged as before, and a chip really 3 C hotter still is one.
    def cycle(second: float, hotter: float = 0.0) -> list[Sample]:
        celsius = (58.0 if second % 60 < 30 else 62.0) + hotter
        return [sample("tpuwatch_device_utilization_ratio", 0.9, device="0"),
                sample("tpuwatch_device_temperature_celsius", celsius, device="0")]

    start = 1_767_225_600.0
    before = TrendAnalyzer(TrendConfig())
    for second in range(0, 45 * 60, 5):
        before.observe(cycle(second), start + second)
    restarted = TrendAnalyzer(TrendConfig())
    restarted.restore(before.snapshot(start + 45 * 60), start + 45 * 60)
    for second in range(45 * 60 + 30, 60 * 60, 5):
        restarted.observe(cycle(second), start + second)
    assert _temperature_drifts(restarted) == set()
    for second in range(60 * 60, 70 * 60, 5):
        restarted.observe(cycle(second, hotter=3.0), start + second)
    assert _temperature_drifts(restarted) == {"0"}
