"""Device readings as samples: the families real backends add, and where each reading came from."""

from __future__ import annotations

from tpuwatch.catalog import CATALOG
from tpuwatch.devices.base import HARDWARE_ONLY_FAMILIES, DeviceReading, reading_samples, sources_line


def test_hardware_only_families_are_catalogued_device_families() -> None:
    assert HARDWARE_ONLY_FAMILIES <= set(CATALOG)
    assert all(CATALOG[name].labels[0] == "device" for name in HARDWARE_ONLY_FAMILIES)
    assert "tpuwatch_device_memory_used_bytes" not in HARDWARE_ONLY_FAMILIES


def test_every_sample_of_a_full_reading_is_catalogued_with_its_labels() -> None:
    reading = DeviceReading(
        device="0", chip="v4", status="LAMED", reset_count=2, runtime_metrics=True,
        memory_bandwidth_utilization_ratio=0.3, tensorcore_idle_seconds=1.0, hlo_queue_size=3,
        hlo_execution_mean_seconds=0.002, ecc_corrected_aggregate_total=1, ecc_uncorrected_aggregate_total=0,
        retired_pages_single_bit=0, retired_pages_double_bit=1, remapped_rows_corrected=0, remapped_rows_uncorrected=1,
        memory_repair_pending=True, row_remap_failed=False, pcie_replays_total=7,
        throttle_reasons={"gpu_idle": True, "hw_slowdown": False},
    )
    samples = reading_samples(reading, "tpu")
    assert {s.name for s in samples} >= HARDWARE_ONLY_FAMILIES
    for s in samples:
        assert tuple(sorted(CATALOG[s.name].labels)) == tuple(name for name, _ in s.labels), s.name
    status = {dict(s.labels)["status"]: s.value for s in samples if s.name == "tpuwatch_device_driver_status"}
    assert status == {"ALIVE": 0, "LAMED": 1, "DEAD": 0, "DRIVER_EXITING": 0}


def test_an_unknown_driver_status_is_exported_beside_the_known_ones() -> None:
    samples = reading_samples(DeviceReading(device="1", chip="v4", status="RESETTING"), "tpu")
    status = {dict(s.labels)["status"]: s.value for s in samples if s.name == "tpuwatch_device_driver_status"}
    assert status == {"ALIVE": 0, "LAMED": 0, "DEAD": 0, "DRIVER_EXITING": 0, "RESETTING": 1}


def test_a_reading_without_hardware_values_has_only_identity_and_up() -> None:
    names = [s.name for s in reading_samples(DeviceReading(device="0", chip="v5e"), "tpu")]
    assert names == ["tpuwatch_device_info", "tpuwatch_device_up"]


def test_sources_line_groups_what_was_read_by_where() -> None:
    assert sources_line({"presence": "sysfs:/sys/bus/pci/devices/0000:00:04.0", "memory_used_bytes": "libtpu:x:1",
                         "utilization_ratio": "libtpu:x:1"}) == (
        "sysfs:/sys/bus/pci/devices/0000:00:04.0: presence; libtpu:x:1: memory_used_bytes, utilization_ratio")
