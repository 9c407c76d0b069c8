"""The pipeline's order within one cycle, and a collector's bad output failing that collector alone (the inventory
the devices stage hands every later part: tests/test_inventory.py)."""

from __future__ import annotations

import time
from pathlib import Path

from tpuwatch import config as config_module
from tpuwatch.assembly import assemble
from tpuwatch.sampler import Sampler
from tpuwatch.samples import Sample, sample
from tpuwatch.store import SeriesStore


class Fixed:
    def __init__(self, name: str, readings: list[Sample]) -> None:
        self.name, self.readings = name, readings

    def collect(self) -> list[Sample]:
        return list(self.readings)


def test_a_leak_verdict_and_its_alert_come_in_the_same_cycle(tmp_path: Path) -> None:
    # Simulated chips come with three hours of past, the last hour of it leaking on chip 2: the first cycle's
    # trend stage finds the leak, and the alerting stage after it sees that finding in the same cycle.
    config = config_module.parse(f"""
state_dir: {tmp_path}
interval: 1s
kernel_log: {{source: none}}
canary: {{enabled: false}}
devices: {{backend: sim, sim: {{count: 4, scenario: hbm-leak, fault_device: 2, fault_after: 0s}}}}
""")
    parts = assemble(config, None, lambda: [])
    parts.sampler.run_once()
    current = {(s.name, s.labels): s.value for s in parts.store.current()}
    assert current[("tpuwatch_memory_leak_suspected", (("device", "2"), ("memory", "hbm")))] == 1.0
    leaks = [a for a in parts.alerting.active_alerts() if a["labels"]["alertname"] == "AcceleratorMemoryLeak"]
    assert [a["labels"]["device"] for a in leaks] == ["2"]
    assert [s.name for s in parts.store.current() if s.name == "tpuwatch_build_info"]  # self-metrics are stored


def test_output_outside_the_catalogue_fails_its_collector_alone() -> None:
    store = SeriesStore(10, 100)
    good = Fixed("good", [sample("tpuwatch_host_memory_total_bytes", 42)])
    stray = Fixed("stray", [sample("tpuwatch_host_memory_total_bytes", 1), Sample("tpuwatch_made_up", (), 1.0)])
    odd = Fixed("odd", ["not a sample"])  # type: ignore[list-item]
    later = Fixed("later", [sample("tpuwatch_host_memory_available_bytes", 7)])
    sampler = Sampler([[stray, good, odd], [later]], store, timeout=1.0)
    sampler.run_once()
    assert sorted(store.current()) == [sample("tpuwatch_host_memory_available_bytes", 7),
                                       sample("tpuwatch_host_memory_total_bytes", 42)]
    statuses = {g.name: g.status for g in sampler.guards}
    assert statuses["good"].success and statuses["later"].success
    stray_error, odd_error = statuses["stray"].last_error or "", statuses["odd"].last_error or ""
    assert not statuses["stray"].success and "'tpuwatch_made_up' is not in the catalogue" in stray_error
    assert not statuses["odd"].success and "returned str, not a Sample" in odd_error
    assert sampler.last_cycle_end is not None and sampler.last_cycle_end <= time.time()
