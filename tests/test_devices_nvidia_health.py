"""What the NVIDIA driver says a GPU needs, through the real nvidia-ml-py and the stand-in libnvidia-ml.so.1
(tests/nvml/): the recovery action (field 230), fabric registration, MIG instances, process lists on drivers whose
versioned symbols differ, and reads that fail other than NOT_SUPPORTED - with lost, hung and slow GPUs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tpuwatch.config import Config, DevicesConfig, NvidiaConfig, Paths
from tpuwatch.devices.base import Fabric, GpuInstance, ProcessUse
from tpuwatch.devices.collector import DeviceCollector
from tpuwatch.devices.nvidia import NvidiaBackend
from tpuwatch.health import device_problems
from tpuwatch.samples import Sample

from conftest import run_cli, wait_until, waited_seconds
from fakenvml import FakeNvml

HEALTHY_FABRIC = {"cluster_uuid": "0123456789abcdef0123456789abcdef", "status": 0, "clique_id": 7, "state": 3,
                  "health_mask": 0, "health_summary": 1}


def config(timeout: float = 1.0, procfs: str = "/proc") -> Config:
    return Config(paths=Paths(procfs=procfs),
                  devices=DevicesConfig(backend="nvidia", nvidia=NvidiaConfig(call_timeout=timeout)))


def _values(samples: list[Sample], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {s.labels: s.value for s in samples if s.name == name}


def _firing(make_alerting: Any, samples: list[Sample]) -> list[dict[str, Any]]:
    """The alerts the built-in rules raise on the first evaluation of ``samples``."""
    alerting = make_alerting([])
    alerting.evaluate(samples, time.time())
    return [a for a in alerting.active_alerts() if a["state"] == "firing"]


# --- recovery action -----------------------------------------------------------------------------------------


def test_a_gpu_that_needs_a_reboot_at_start_is_reported_on_the_first_cycle(nvml: FakeNvml,
                                                                           make_alerting: Any) -> None:
    nvml.change(0, fields={"230": 2})
    nvml.change(1, fields={"230": 0})
    nvml.change(3, fields={"230": 3})
    collector = DeviceCollector(NvidiaBackend(config()))
    samples = collector.collect()
    first, second, _, fourth = collector.last_readings
    assert (first.recovery_action, second.recovery_action, fourth.recovery_action) == (2, 0, 3)
    assert _values(samples, "tpuwatch_device_recovery_action") == {
        (("action", "node_reboot"), ("device", "0")): 2, (("action", "none"), ("device", "1")): 0,
        (("action", "drain_p2p"), ("device", "3")): 3}
    assert ("device 0 (NVIDIA H100 80GB HBM3, pci 0000:18:00.0): the driver asks for a recovery action: node reboot"
            in device_problems(collector.last_readings))
    alerts = {(a["labels"]["alertname"], a["labels"]["severity"], a["labels"].get("device")): a
              for a in _firing(make_alerting, samples)}
    reboot = alerts[("AcceleratorRecoveryActionRequired", "critical", "0")]
    assert reboot["labels"]["pci"] == "0000:18:00.0" and reboot["labels"]["action"] == "node_reboot"
    assert reboot["annotations"]["summary"] == "GPU recovery action node_reboot on chip 0 (0000:18:00.0)"
    assert ("AcceleratorRecoveryActionRequired", "warning", "3") in alerts
    assert not any(key[2] == "1" for key in alerts if key[0] == "AcceleratorRecoveryActionRequired")


def test_a_driver_without_the_field_is_not_supported_never_none(nvml: FakeNvml) -> None:
    nvml.change(0, fields={"230": "NOT_SUPPORTED"})  # GPU 1 has no "fields" at all: the entry says NOT_SUPPORTED
    nvml.change(3, fields={"230": 9})  # an action newer than tpuwatch
    collector = DeviceCollector(NvidiaBackend(config()))
    samples = collector.collect()
    first, second, _, fourth = collector.last_readings
    assert first.recovery_action is None and second.recovery_action is None
    assert first.sources["recovery_action"] == "not supported by the driver"
    assert first.read_errors == {}, "not supported is not a failure"
    assert _values(samples, "tpuwatch_device_recovery_action") == {(("action", "9"), ("device", "3")): 9}
    nvml.update(missing_symbols=["nvmlDeviceGetFieldValues"])  # a driver older than field values altogether
    old = NvidiaBackend(config()).read()[3]
    assert old.recovery_action is None and old.sources["recovery_action"] == "not supported by the driver"
    assert old.read_errors == {}


def test_check_shows_the_action_and_not_supported(nvml: FakeNvml, tmp_path: Path) -> None:
    nvml.change(0, fields={"230": 1})
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({"devices": {"backend": "nvidia"}, "kernel_log": {"source": "none"}}))
    json_report = json.loads(run_cli("check", "--json", "--config", str(path)).stdout)
    assert json_report["devices"][0]["recovery_action"] == 1
    assert json_report["devices"][1]["sources"]["recovery_action"] == "not supported by the driver"
    assert ("device 0 (NVIDIA H100 80GB HBM3, pci 0000:18:00.0): the driver asks for a recovery action: GPU reset"
            in json_report["problems"])
    text = run_cli("check", "--config", str(path)).stdout
    assert "device 1 read from nvml: " in text and "; not supported by the driver: recovery_action" in text


def test_a_failed_field_read_is_counted_shown_and_the_gpu_lost_in_its_entry_is_down(nvml: FakeNvml) -> None:
    nvml.change(0, fields={"230": "UNKNOWN"})
    nvml.change(1, fields={"230": "GPU_IS_LOST"})
    collector = DeviceCollector(NvidiaBackend(config()))
    collector.collect()
    samples = collector.collect()
    first, second = collector.last_readings[:2]
    assert first.recovery_action is None and "recovery_action" not in first.sources
    assert first.read_errors == {"NVML_FI_DEV_GET_GPU_RECOVERY_ACTION": "NVML nvmlDeviceGetFieldValues: Unknown Error"}
    assert _values(samples, "tpuwatch_device_read_errors_total") == {
        (("device", "0"), ("field", "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION")): 2}
    assert ("device 0 (NVIDIA H100 80GB HBM3, pci 0000:18:00.0): NVML_FI_DEV_GET_GPU_RECOVERY_ACTION could not be "
            "read (NVML nvmlDeviceGetFieldValues: Unknown Error)") in device_problems(collector.last_readings)
    assert not second.up and second.problem is not None and "GPU_IS_LOST" not in second.problem
    assert second.problem.startswith("GPU is lost (nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)")


# --- reads that fail other than NOT_SUPPORTED ----------------------------------------------------------------


def test_a_field_failing_other_than_not_supported_is_counted_per_field(nvml: FakeNvml, make_alerting: Any) -> None:
    nvml.change(0, errors={"nvmlDeviceGetPowerUsage": "NO_PERMISSION", "nvmlDeviceGetTemperature": "TIMEOUT"},
                unsupported=["nvmlDeviceGetPcieReplayCounter"])
    collector = DeviceCollector(NvidiaBackend(config()))
    for _ in range(3):
        samples = collector.collect()
    first = collector.last_readings[0]
    assert first.power_watts is None and first.temperature_celsius is None and first.pcie_replays_total is None
    assert set(first.read_errors) == {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature"}
    assert _values(samples, "tpuwatch_device_read_errors_total") == {
        (("device", "0"), ("field", "nvmlDeviceGetPowerUsage")): 3,
        (("device", "0"), ("field", "nvmlDeviceGetTemperature")): 3}
    problems = device_problems(collector.last_readings)
    assert ("device 0 (NVIDIA H100 80GB HBM3, pci 0000:18:00.0): nvmlDeviceGetPowerUsage could not be read "
            "(NVML nvmlDeviceGetPowerUsage: Insufficient Permissions)") in problems
    assert not any("PcieReplay" in p for p in problems), "NOT_SUPPORTED stays quietly absent"
    firing = {(a["labels"]["alertname"], a["labels"].get("field")) for a in _firing(make_alerting, samples)}
    assert ("AcceleratorReadFailing", "nvmlDeviceGetPowerUsage") in firing
    nvml.change(0, errors={})
    collector.collect()
    assert collector.last_readings[0].read_errors == {} and collector.last_readings[0].power_watts == 512.345


# --- fabric --------------------------------------------------------------------------------------------------


def test_fabric_state_status_and_health_are_read_from_the_v3_struct(nvml: FakeNvml, make_alerting: Any) -> None:
    nvml.change(0, fabric=HEALTHY_FABRIC)
    nvml.change(1, fabric={**HEALTHY_FABRIC, "state": 1})  # the Fabric Manager is down: registration not started
    nvml.change(3, fabric={**HEALTHY_FABRIC, "health_summary": 3, "health_mask": 0x10})
    collector = DeviceCollector(NvidiaBackend(config()))
    samples = collector.collect()
    first, second, _, fourth = collector.last_readings
    assert first.fabric == Fabric("completed", "success", 7, HEALTHY_FABRIC["cluster_uuid"], "healthy", 0)
    assert second.fabric is not None and second.fabric.state == "not_started"
    assert fourth.fabric is not None and fourth.fabric.health == "limited_capacity"
    info = {dict(labels)["device"]: dict(labels) for labels in _values(samples, "tpuwatch_device_fabric_info")}
    assert sorted(info) == ["0", "1", "3"]
    assert info["0"] == {"device": "0", "state": "completed", "status": "success", "health": "healthy",
                         "clique_id": "7", "cluster_uuid": HEALTHY_FABRIC["cluster_uuid"]}
    problems = device_problems(collector.last_readings)
    assert ("device 1 (NVIDIA H100 80GB HBM3, pci 0000:2a:00.0): fabric registration not started (is the Fabric "
            "Manager running?)") in problems
    assert any("device 3" in p and "fabric health limited capacity (health mask 0x10)" in p for p in problems)
    firing = {(a["labels"]["alertname"], a["labels"]["severity"], a["labels"]["device"])
              for a in _firing(make_alerting, samples) if a["labels"]["alertname"] == "AcceleratorFabricUnhealthy"}
    assert firing == {("AcceleratorFabricUnhealthy", "warning", "3")}, "not started waits out its grace (for: 5m)"


def test_a_failed_registration_and_unhealthy_fabric(nvml: FakeNvml) -> None:
    nvml.change(0, fabric={**HEALTHY_FABRIC, "status": "NVML_ERROR_TIMEOUT"})
    nvml.change(1, fabric={**HEALTHY_FABRIC, "health_summary": 2, "health_mask": 0x2})
    first, second = NvidiaBackend(config()).read()[:2]
    assert first.fabric is not None and first.fabric.problem == "fabric registration failed: Timeout"
    assert second.fabric is not None and second.fabric.problem == "fabric health unhealthy (health mask 0x2)"


def test_pcie_gpus_have_no_fabric_metric_and_no_alert(nvml: FakeNvml) -> None:
    samples = DeviceCollector(NvidiaBackend(config())).collect()  # no "fabric": NOT_SUPPORTED
    assert _values(samples, "tpuwatch_device_fabric_info") == {}
    nvml.change(0, fabric={**HEALTHY_FABRIC, "state": 0})  # state NOT_SUPPORTED
    reading = NvidiaBackend(config()).read()[0]
    assert reading.fabric is None and reading.read_errors == {}


def test_older_drivers_answer_the_v2_struct_or_the_deprecated_call(nvml: FakeNvml) -> None:
    nvml.change(0, fabric={**HEALTHY_FABRIC, "max_version": 2, "health_mask": 0x5})
    v2 = NvidiaBackend(config()).read()[0]
    assert v2.fabric == Fabric("completed", "success", 7, HEALTHY_FABRIC["cluster_uuid"], None, 0x5)
    nvml.change(0, fabric=HEALTHY_FABRIC)
    nvml.update(missing_symbols=["nvmlDeviceGetGpuFabricInfoV"])
    v1 = NvidiaBackend(config()).read()[0]
    assert v1.fabric == Fabric("completed", "success", 7, HEALTHY_FABRIC["cluster_uuid"], None, None)
    assert v1.read_errors == {}


# --- process lists and MIG -----------------------------------------------------------------------------------


@pytest.mark.parametrize("missing", [[], ["nvmlDeviceGetComputeRunningProcesses_v3"],
                                     ["nvmlDeviceGetComputeRunningProcesses_v3",
                                      "nvmlDeviceGetComputeRunningProcesses_v2"]],
                         ids=["v3", "v2 (535.43-535.104 without _v3)", "unversioned"])
def test_process_lists_fall_back_through_the_versioned_symbols(nvml: FakeNvml, tmp_path: Path,
                                                               missing: list[str]) -> None:
    (tmp_path / "4101").mkdir()
    (tmp_path / "4101" / "comm").write_text("python3\n")
    nvml.update(missing_symbols=missing)
    first = NvidiaBackend(config(procfs=str(tmp_path))).read()[0]
    assert first.processes == (ProcessUse(4101, "python3", 40802189312.0), ProcessUse(4102, "?", 2147483648.0))
    assert first.read_errors == {}


def test_a_gpu_lost_on_the_oldest_process_list_is_reported_lost(nvml: FakeNvml) -> None:
    nvml.update(missing_symbols=["nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"])
    nvml.change(0, errors={"nvmlDeviceGetComputeRunningProcesses": "GPU_IS_LOST"})
    first, second, *_ = NvidiaBackend(config()).read()
    assert (first.up, first.problem) == (False, "GPU is lost (nvmlDeviceGetComputeRunningProcesses: GPU is lost)")
    assert second.up


def test_mig_instances_carry_their_memory_and_processes(nvml: FakeNvml, tmp_path: Path) -> None:
    instances: list[dict[str, Any] | None] = [
        {"gpu_instance_id": 3, "compute_instance_id": 0, "uuid": "MIG-a", "memory_used": 1 << 30,
         "memory_total": 10 << 30, "processes": {"compute": [[5001, 1 << 29]]}},
        None,
        {"gpu_instance_id": 3, "compute_instance_id": 1, "uuid": "MIG-b", "memory_used": 1 << 30,
         "memory_total": 10 << 30, "processes": {"compute": [[5002, 1 << 28]]}},
        {"gpu_instance_id": 5, "compute_instance_id": 0, "uuid": "MIG-c", "memory_used": 2 << 30,
         "memory_total": 20 << 30, "processes": {"compute": []}},
    ]
    nvml.change(0, mig={"current": 1, "pending": 1, "instances": instances}, processes={"compute": []})
    collector = DeviceCollector(NvidiaBackend(config(procfs=str(tmp_path))))  # no such pids: no command
    samples = collector.collect()
    first = collector.last_readings[0]
    assert first.instances == (GpuInstance(3, 1 << 30, 10 << 30), GpuInstance(5, 2 << 30, 20 << 30))
    assert first.processes == (ProcessUse(5001, "?", float(1 << 29), 3), ProcessUse(5002, "?", float(1 << 28), 3))
    assert _values(samples, "tpuwatch_device_memory_used_bytes")[(("device", "0"), ("gpu_instance", "5"))] == 2 << 30
    assert _values(samples, "tpuwatch_device_memory_total_bytes")[(("device", "0"), ("gpu_instance", "3"))] == 10 << 30
    processes = _values(samples, "tpuwatch_process_device_memory_used_bytes")
    assert {dict(labels)["pid"]: dict(labels).get("gpu_instance") for labels in processes} == {
        "5001": "3", "5002": "3", "4201": None}
    assert collector.last_readings[1].instances is None, "MIG not supported: no instances"
    nvml.change(0, mig={"current": 0, "pending": 0, "instances": instances})
    assert NvidiaBackend(config()).read()[0].instances is None


def test_mig_instances_are_capped_at_seven_per_gpu(nvml: FakeNvml) -> None:
    instances = [{"gpu_instance_id": i, "compute_instance_id": 0, "uuid": f"MIG-{i}", "memory_used": i,
                  "memory_total": 100} for i in range(8)]
    nvml.change(0, mig={"current": 1, "pending": 1, "instances": instances})
    first = NvidiaBackend(config()).read()[0]
    assert first.instances is not None and [i.gpu_instance for i in first.instances] == list(range(7))


# --- lost, hung and slow GPUs while the new reads run -----------------------------------------------------------


@pytest.mark.parametrize("function", ["nvmlDeviceGetFieldValues", "nvmlDeviceGetGpuFabricInfoV",
                                      "nvmlDeviceGetMigMode"])
def test_a_hung_new_read_stalls_only_its_gpu(nvml: FakeNvml, function: str) -> None:
    nvml.change(0, fabric=HEALTHY_FABRIC, fields={"230": 0})
    nvml.change(3, hang=function, fabric=HEALTHY_FABRIC, fields={"230": 0})
    backend = NvidiaBackend(config(timeout=1.0))
    started = time.monotonic()
    readings = backend.read()
    assert time.monotonic() - started < 3.0, "one shared deadline, not one per GPU or call"
    assert [r.up for r in readings] == [True, True, False, False]
    assert 0.5 <= waited_seconds(readings[3].problem, f"unresponsive: NVML {function}") <= 1.0
    assert readings[0].recovery_action == 0 and readings[0].fabric is not None
    nvml.release()
    assert wait_until(lambda: backend.read()[3].up or None, timeout=10, what="GPU 3 to answer again")


def test_slow_new_reads_within_the_deadline_are_read(nvml: FakeNvml) -> None:
    nvml.change(0, fabric=HEALTHY_FABRIC, fields={"230": 1},
                slow={"nvmlDeviceGetFieldValues": 100, "nvmlDeviceGetGpuFabricInfoV": 100})
    first = NvidiaBackend(config(timeout=5.0)).read()[0]
    assert first.up and first.recovery_action == 1 and first.fabric is not None and first.fabric.health == "healthy"


def test_a_gpu_lost_in_a_new_read_is_down(nvml: FakeNvml) -> None:
    nvml.change(0, errors={"nvmlDeviceGetGpuFabricInfoV": "GPU_IS_LOST"}, fabric=HEALTHY_FABRIC)
    nvml.change(1, errors={"nvmlDeviceGetMigMode": "GPU_IS_LOST"})
    first, second = NvidiaBackend(config()).read()[:2]
    assert (first.up, first.problem) == (False, "GPU is lost (nvmlDeviceGetGpuFabricInfoV: GPU is lost)")
    assert (second.up, second.problem) == (False, "GPU is lost (nvmlDeviceGetMigMode: GPU is lost)")
