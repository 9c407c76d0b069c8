"""Device readings as samples: the families real backends add, and where each reading came from."""

from __future__ import annotations

import subprocess

from prometheus_client import CollectorRegistry, generate_latest

from tpuwatch.catalog import CATALOG, spec_of
from tpuwatch.devices.base import (
    HARDWARE_ONLY_FAMILIES,
    DeviceReading,
    Fabric,
    GpuInstance,
    LinkReading,
    SensorTemperature,
    Summary,
    reading_samples,
    sources_line,
    summary_samples,
)
from tpuwatch.devices.progress import ChipStatus, HangVerdict
from tpuwatch.exporter import SampleCollector

from conftest import require_tool

FULL = DeviceReading(
    device="0", chip="v4", status="LAMED", reset_count=2, runtime_metrics=True,
    memory_bandwidth_utilization_ratio=0.3, tensorcore_idle_seconds=1.0, hlo_queue_size=3,
    hlo_execution_seconds=Summary(120, 0.18, ((0.5, 0.0014), (0.999, 0.0039))),
    megascale=(("buffer_transfer_latency", "8MB+", Summary(5, 0.5, ((0.5, 0.1),))),
               ("grpc_tcp_min_rtt", "", Summary(0, 0.0))),
    ecc_corrected_aggregate_total=1, ecc_uncorrected_aggregate_total=0, memory_reserved_bytes=512 << 20,
    retired_pages_single_bit=0, retired_pages_double_bit=1, remapped_rows_corrected=0, remapped_rows_uncorrected=1,
    memory_repair_pending=True, row_remap_failed=False, pcie_replays_total=7,
    throttle_reasons={"gpu_idle": True, "hw_slowdown": False, "board_limit": False},
    links=(LinkReading(0, True, {"crc_flit": 3, "replay": 0}), LinkReading(1, False, {})),
    recovery_action=2, fabric=Fabric("completed", "success", 7, "ab" * 16, "limited_capacity", 0x4),
    instances=(GpuInstance(3, 1 << 30, 10 << 30), GpuInstance(5, None, None)),
    runtime_status=ChipStatus(positions=((0, 1, 0, 0x517, 7, 3),), queued=2, errors=((0, "halted"),)),
    hang=HangVerdict(hung=True, stalled_seconds=700.0, pid=4101, command="python3"),
    sensors=(SensorTemperature("edge", 60.0, 40.0, {"crit": 100.0, "emergency": 105.0}, "temp1_crit"),
             SensorTemperature("junction", 101.5, -2.5, {}, "default")),
)


def test_hardware_only_families_are_catalogued_device_families() -> None:
    assert HARDWARE_ONLY_FAMILIES <= set(CATALOG)
    assert all(CATALOG[name].labels[0] == "device" for name in HARDWARE_ONLY_FAMILIES)
    assert "tpuwatch_device_memory_used_bytes" not in HARDWARE_ONLY_FAMILIES


def test_every_sample_of_a_full_reading_is_catalogued_with_its_labels() -> None:
    samples = reading_samples(FULL, "tpu")
    assert {spec_of(s.name).name for s in samples} >= HARDWARE_ONLY_FAMILIES
    for s in samples:
        spec = spec_of(s.name)
        quantile = ("quantile",) if spec.kind == "summary" and s.name == spec.name else ()
        optional = tuple(name for name in spec.optional_labels if name in dict(s.labels))
        assert tuple(sorted(spec.labels + quantile + optional)) == tuple(name for name, _ in s.labels), s.name
    nvidia = {(s.name, s.labels): s.value for s in samples if "recovery" in s.name or "fabric" in s.name
              or "gpu_instance" in dict(s.labels)}
    assert nvidia == {
        ("tpuwatch_device_recovery_action", (("action", "node_reboot"), ("device", "0"))): 2,
        ("tpuwatch_device_fabric_info", (("clique_id", "7"), ("cluster_uuid", "ab" * 16), ("device", "0"),
                                         ("health", "limited_capacity"), ("state", "completed"),
                                         ("status", "success"))): 1,
        ("tpuwatch_device_memory_used_bytes", (("device", "0"), ("gpu_instance", "3"))): 1 << 30,
        ("tpuwatch_device_memory_total_bytes", (("device", "0"), ("gpu_instance", "3"))): 10 << 30}
    status = {dict(s.labels)["status"]: s.value for s in samples if s.name == "tpuwatch_device_driver_status"}
    assert status == {"ALIVE": 0, "LAMED": 1, "DEAD": 0, "DRIVER_EXITING": 0}
    timing = {(s.name, dict(s.labels).get("quantile")): s.value for s in samples if "hlo_execution" in s.name}
    assert timing == {("tpuwatch_device_hlo_execution_seconds", "0.5"): 0.0014,
                      ("tpuwatch_device_hlo_execution_seconds", "0.999"): 0.0039,
                      ("tpuwatch_device_hlo_execution_seconds_count", None): 120,
                      ("tpuwatch_device_hlo_execution_seconds_sum", None): 0.18}


def test_the_exposition_of_every_device_family_passes_promtool() -> None:
    promtool = require_tool("promtool")
    host = Summary(3, 0.3, ((0.5, 0.1), (0.9, 0.2)))
    extra = summary_samples("tpuwatch_device_megascale_latency_seconds", host, device="",
                            metric="collective_e2e_latency", buffer_size="8MB+")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SampleCollector(lambda: reading_samples(FULL, "tpu") + extra))
    text = generate_latest(registry).decode()
    assert "# TYPE tpuwatch_device_hlo_execution_seconds summary" in text
    assert 'tpuwatch_device_hlo_execution_seconds{device="0",quantile="0.999"} 0.0039' in text
    assert 'tpuwatch_device_megascale_latency_seconds_count{buffer_size="",device="0",metric="grpc_tcp_min_rtt"} 0' \
        in text.replace(".0\n", "\n")
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0 and checked.stdout + checked.stderr == "", checked.stdout + checked.stderr


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
