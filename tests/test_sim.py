"""Simulated chips: plausible readings, determinism, and each scenario's fault on its chip."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from tpuwatch.analysis.trend import TrendAnalyzer
from tpuwatch.config import SimChip, SimConfig, TrendConfig
from tpuwatch.devices.base import reading_samples
from tpuwatch.devices.collector import DeviceCollector
from tpuwatch.devices.sim import SimBackend, history
from tpuwatch.health import device_problems
from tpuwatch.hw.chips import CHIPS, SIMULATED
from tpuwatch.samples import Sample


class Clock:
    """A settable clock for the simulator's elapsed time."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def run(scenario: str, seconds: float, step: float = 10.0, **overrides: object) -> tuple[SimBackend, list]:
    clock = Clock()
    backend = SimBackend(SimConfig(scenario=scenario, fault_after=60.0, **overrides), clock=clock)
    history = []
    while clock.now - 1000.0 <= seconds:
        history.append(backend.read())
        clock.now += step
    return backend, history


def test_healthy_chips_are_plausible() -> None:
    _, history = run("healthy", 3600, chip="v5p", count=8)
    for readings in history:
        assert [r.device for r in readings] == [str(i) for i in range(8)]
        for r in readings:
            assert 0 < r.memory_used_bytes <= r.memory_total_bytes == CHIPS["v5p"].hbm_bytes
            assert 0 <= r.utilization_ratio <= 1
            assert 30 < r.temperature_celsius < 80
            assert CHIPS["v5p"].idle_watts * 0.8 < r.power_watts <= CHIPS["v5p"].max_watts * 1.05
            assert r.ecc_corrected_total == 0 and r.ecc_uncorrected_total == 0
    assert not any(device_problems(readings) for readings in history)


def test_the_chips_the_config_accepts_are_those_the_chip_table_can_simulate() -> None:
    assert typing.get_args(SimChip) == SIMULATED


def test_same_seed_same_readings_other_seed_other_readings() -> None:
    assert run("ecc-errors", 600)[1] == run("ecc-errors", 600)[1]
    assert run("healthy", 600)[1] != run("healthy", 600, seed=1)[1]


def series(history: list, device: int, field: str) -> list[float]:
    return [getattr(readings[device], field) for readings in history]


def test_hbm_leak_grows_only_on_the_fault_device() -> None:
    _, history = run("hbm-leak", 1200, fault_device=2)
    leaking = series(history, 2, "memory_used_bytes")
    healthy = series(history, 1, "memory_used_bytes")
    # 15 % of capacity per hour: 5 % over these 20 minutes.
    assert max(leaking[-12:]) > max(leaking[:6]) + 0.04 * CHIPS["v5e"].hbm_bytes
    assert max(healthy[-12:]) < max(healthy[:12]) + 0.02 * CHIPS["v5e"].hbm_bytes
    assert max(leaking) <= CHIPS["v5e"].hbm_bytes


def test_history_is_the_past_with_an_hour_of_leak_before_fault_after() -> None:
    config = SimConfig(scenario="hbm-leak", fault_device=1, fault_after=0.0)
    past = list(history(config, 3 * 3600, 10))
    assert [offset for offset, _ in past] == [-10.0 * k for k in range(1080, 0, -1)]
    capacity = CHIPS["v5e"].hbm_bytes

    def floor(device: int, start: float, end: float) -> float:
        return min(r[device].memory_used_bytes for offset, r in past if start <= offset < end)

    assert abs(floor(1, -7200, -3600) - floor(1, -10800, -7200)) < 0.02 * capacity
    assert 0.12 * capacity < floor(1, -600, 0) - floor(1, -4200, -3600) < 0.18 * capacity
    assert abs(floor(0, -600, 0) - floor(0, -4200, -3600)) < 0.02 * capacity


def test_history_lets_the_leak_detector_judge_the_drill_from_the_start() -> None:
    trend = TrendAnalyzer(TrendConfig())
    for offset, readings in history(SimConfig(scenario="hbm-leak", fault_device=3), 3 * 3600, 10):
        trend.observe([s for r in readings for s in reading_samples(r, "sim")], 1e9 + offset)
    found = trend.samples()
    assert _leaking(found) == [{"device": "3", "memory": "hbm"}]
    [eta] = [s.value for s in found if s.name == "tpuwatch_memory_exhaustion_eta_seconds"]
    assert eta < TrendConfig().critical_eta  # AcceleratorMemoryExhaustionSoon's threshold: it pages
    healthy = TrendAnalyzer(TrendConfig())
    for offset, readings in history(SimConfig(scenario="healthy"), 3 * 3600, 10):
        healthy.observe([s for r in readings for s in reading_samples(r, "sim")], 1e9 + offset)
    assert _leaking(healthy.samples()) == []


def _leaking(samples: list[Sample]) -> list[dict[str, str]]:
    return [dict(s.labels) for s in samples if s.name == "tpuwatch_memory_leak_suspected" and s.value == 1]


def test_ecc_errors_count_up_on_the_fault_device() -> None:
    _, history = run("ecc-errors", 600, fault_device=1)
    corrected = series(history, 1, "ecc_corrected_total")
    assert corrected == sorted(corrected) and corrected[-1] > 10
    assert series(history, 1, "ecc_uncorrected_total")[-1] == 2
    assert series(history, 0, "ecc_corrected_total")[-1] == 0
    assert device_problems(history[-1]) == [
        "device 1 (v5e, pci 0000:11:00.0): 2 uncorrectable ECC error(s) since the driver loaded"]


def test_overheat_passes_the_limit() -> None:
    _, history = run("overheat", 600, fault_device=3)
    assert series(history, 3, "temperature_celsius")[-1] > 85
    assert max(series(history, 0, "temperature_celsius")) < 80
    assert "device 3" in device_problems(history[-1])[0] and "temperature" in device_problems(history[-1])[0]


def test_device_lost_is_reported_down_by_the_device_collector() -> None:
    clock = Clock()
    collector = DeviceCollector(SimBackend(SimConfig(scenario="device-lost", fault_after=30.0), clock=clock))
    before = {s.labels: s.value for s in collector.collect() if s.name == "tpuwatch_device_up"}
    clock.now += 60
    samples = collector.collect()
    after = {s.labels: s.value for s in samples if s.name == "tpuwatch_device_up"}
    assert before == {(("device", str(i)),): 1.0 for i in range(4)}
    assert after[(("device", "0"),)] == 0.0
    assert not [s for s in samples if s.name == "tpuwatch_device_memory_used_bytes" and s.labels[0][1] == "0"]
    assert device_problems(collector.last_readings) == ["device 0 (v5e, pci 0000:10:00.0) is down or lost"]


@pytest.mark.parametrize("scenario", ["healthy", "sdc", "maintenance"])
def test_scenarios_without_metric_faults_stay_quiet(scenario: str) -> None:
    _, history = run(scenario, 900)
    assert not any(device_problems(readings) for readings in history)


def test_readings_leave_unexposed_fields_absent() -> None:
    reading = SimBackend(SimConfig()).read()[0]
    partial = dataclasses.replace(reading, temperature_celsius=None, power_watts=None)
    names = {s.name for s in reading_samples(partial, "sim")}
    assert "tpuwatch_device_temperature_celsius" not in names and "tpuwatch_device_power_watts" not in names
    assert "tpuwatch_device_memory_used_bytes" in names
