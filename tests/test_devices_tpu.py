"""TPU backend: sysfs/procfs/dev trees in temp dirs laid out as real VMs have them, a real runtime on localhost."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakelibtpu import Runtime, fixture, serving

from tpuwatch.config import Config, DevicesConfig, HostConfig, Paths, TpuConfig
from tpuwatch.devices import select_backend
from tpuwatch.devices.collector import DeviceCollector
from tpuwatch.devices.tpu import TpuBackend
from tpuwatch.devices.tpu_sysfs import discover_tpus, read_hwmon
from tpuwatch.health import device_problems

from conftest import free_port, run_cli, wait_until

GIB = 1 << 30

# PCI device id, subsystem device id, and whether the chip is reached through vfio (else /dev/accelN).
# Ids: tpu-info's device.py (TpuChip.from_pci_device_id) and jax's hardware_utils.py (0x0056, "plc").
GENERATIONS = {
    "v2": ("0x0027", "0x004e", False), "v3": ("0x0027", "0x004f", False), "plc": ("0x0056", "0x0000", False),
    "v4": ("0x005e", "0x0000", False), "v5e": ("0x0063", "0x0000", True), "v5p": ("0x0062", "0x0000", True),
    "v6e": ("0x006f", "0x0000", True), "7x": ("0x0076", "0x0000", True),
}


# --- a host tree: sysfs, procfs, dev ---------------------------------------------------------------

def make_host(root: Path, generation: str, chips: int, first_group: int = 10, functions: int = 1) -> Paths:
    """A sysfs/dev tree of ``chips`` TPU chips (plus an unrelated NIC), as the kernel lays it out.

    One PCI function per chip (a v3-8 VM shows accel0-3 on four functions); ``functions`` > 1 gives
    each chip that many functions with a vfio group each, the layout tpu-info's ``get_chips`` groups
    by domain:bus:device (unverified on hardware).
    """
    device_id, subsystem, vfio = GENERATIONS[generation]
    sysfs, dev = root / "sys", root / "dev"
    (dev / "vfio").mkdir(parents=True)
    add_pci(sysfs, "0000:00:03.0", "0x1af4", "0x1000", "0x020000")  # virtio-net: not a TPU
    for i in range(chips):
        for function in range(functions):
            number = i * functions + function
            entry = add_pci(sysfs, f"0000:00:{i + 4:02x}.{function}", "0x1ae0", device_id, "0x120000", subsystem)
            if vfio:
                group = sysfs / "kernel" / "iommu_groups" / str(first_group + number)
                group.mkdir(parents=True)
                (entry / "iommu_group").symlink_to(group)
                (dev / "vfio" / str(first_group + number)).write_text("")
            else:
                accel = entry / "accel" / f"accel{number}"
                accel.mkdir(parents=True)
                (accel / "status").write_text("ALIVE\n")
                (accel / "reset_count").write_text(f"{number}\n")
                (dev / f"accel{number}").write_text("")
    return Paths(sysfs=str(sysfs), procfs="/proc", dev=str(dev))


def add_pci(sysfs: Path, address: str, vendor: str, device: str, pci_class: str, subsystem: str = "0x0000") -> Path:
    entry = sysfs / "bus" / "pci" / "devices" / address
    entry.mkdir(parents=True)
    for name, value in (("vendor", vendor), ("device", device), ("class", pci_class),
                        ("subsystem_device", subsystem)):
        (entry / name).write_text(value + "\n")
    return entry


def make_config(paths: Paths, addresses: list[str], timeout: float = 1.0, backend: str = "tpu") -> Config:
    return Config(paths=paths, host=HostConfig(holder_scan_interval=1.0),
                  devices=DevicesConfig(backend=backend, tpu=TpuConfig(metrics_addr=addresses, call_timeout=timeout)))


@pytest.fixture
def serve() -> Iterator[Any]:
    """Start RuntimeMetricService servers in this process; stopped after the test."""
    yield from serving()


# --- discovery ------------------------------------------------------------------------------------

@pytest.mark.parametrize("generation", ["v4", "v5e", "v5p", "v6e", "7x"])
def test_discovery_finds_each_generation_and_its_device_files(tmp_path: Path, generation: str) -> None:
    paths = make_host(tmp_path, generation, chips=4)
    chips = discover_tpus(paths.sysfs)
    assert [c.generation.name for c in chips] == [generation] * 4
    assert [c.pci for c in chips] == ["0000:00:04.0", "0000:00:05.0", "0000:00:06.0", "0000:00:07.0"]
    expected = [f"vfio/{10 + i}" for i in range(4)] if GENERATIONS[generation][2] else [f"accel{i}" for i in range(4)]
    assert [c.device_files for c in chips] == [(f,) for f in expected]


def test_a_v3_8_vm_has_four_chips_on_four_functions_accel0_to_3(tmp_path: Path) -> None:
    paths = make_host(tmp_path, "v3", chips=4)
    chips = discover_tpus(paths.sysfs)
    assert [(c.generation.name, c.functions, c.device_files) for c in chips] == [
        ("v3", (f"0000:00:0{4 + i}.0",), (f"accel{i}",)) for i in range(4)]
    assert chips[0].hbm_bytes == 16 * GIB and chips[0].generation.devices_per_chip == 2
    v2 = discover_tpus(make_host(tmp_path / "v2", "v2", chips=1).sysfs)
    assert v2[0].generation.name == "v2", "v2 and v3 share 0x0027; the subsystem id tells them apart"


def test_functions_of_one_chip_are_one_chip(tmp_path: Path) -> None:
    paths = make_host(tmp_path, "7x", chips=2, functions=2)
    chips = discover_tpus(paths.sysfs)
    assert [(c.functions, c.device_files) for c in chips] == [
        (("0000:00:04.0", "0000:00:04.1"), ("vfio/10", "vfio/11")),
        (("0000:00:05.0", "0000:00:05.1"), ("vfio/12", "vfio/13"))]


def test_0x0056_has_no_public_name_and_no_published_capacity(tmp_path: Path) -> None:
    (chip,) = discover_tpus(make_host(tmp_path, "plc", chips=1).sysfs)
    assert (chip.generation.name, chip.hbm_bytes, chip.device_files) == ("plc", None, ("accel0",))
    (reading,) = TpuBackend(make_config(make_host(tmp_path / "b", "plc", chips=1),
                                        [f"localhost:{free_port()}"])).read()
    assert reading.chip == "plc" and reading.memory_total_bytes is None


def test_vfio_chips_are_ordered_by_group_number_not_text(tmp_path: Path) -> None:
    paths = make_host(tmp_path, "v5e", chips=2, first_group=9)  # groups 9 and 10: "10" < "9" as text
    assert [c.device_files for c in discover_tpus(paths.sysfs)] == [("vfio/9",), ("vfio/10",)]


def test_hwmon_bound_to_the_chip_is_a_real_sensor(tmp_path: Path) -> None:
    paths = make_host(tmp_path, "v5e", chips=1)
    hwmon = Path(paths.sysfs, "bus/pci/devices/0000:00:04.0/hwmon/hwmon3")
    hwmon.mkdir(parents=True)
    (hwmon / "temp1_input").write_text("47250\n")
    (hwmon / "power1_average").write_text("91500000\n")
    found = read_hwmon(paths.sysfs, "0000:00:04.0")
    assert found is not None and (found.temperature_celsius, found.power_watts) == (47.25, 91.5)
    assert read_hwmon(paths.sysfs, "0000:00:03.0") is None


# --- the backend against a real runtime, per generation --------------------------------------------

def _per_core(recorded: dict[str, Any], name: str, key: str) -> list[float]:
    return [float(m["gauge"][key]) for m in recorded["busy"][name]["metric"]["metrics"]]


@pytest.mark.parametrize("generation", ["v4", "v5e", "v5p", "v6e", "7x"])
def test_busy_runtime_values_land_on_their_chips(tmp_path: Path, serve: Any, generation: str) -> None:
    recorded = fixture(generation)
    chips, cores = recorded["chips"], recorded["devices_per_chip"]
    address = serve(Runtime(generation, "busy"))
    readings = TpuBackend(make_config(make_host(tmp_path, generation, chips), [address])).read()
    used = _per_core(recorded, "tpu.runtime.hbm.memory.usage.bytes", "asInt")
    total = _per_core(recorded, "tpu.runtime.hbm.memory.total.bytes", "asInt")
    duty = _per_core(recorded, "tpu.runtime.tensorcore.dutycycle.percent", "asDouble")
    assert [r.device for r in readings] == [str(i) for i in range(chips)], "no values for chips that do not exist"
    for i, r in enumerate(readings):
        mine = slice(i * cores, (i + 1) * cores)
        assert r.chip == generation and r.up and r.runtime_metrics is True
        assert r.memory_used_bytes == sum(used[mine]) and r.memory_total_bytes == sum(total[mine])
        assert r.utilization_ratio == pytest.approx(sum(duty[mine]) / cores / 100)
        assert r.sources["memory_used_bytes"] == f"libtpu:{address}" and "runtime_chip" not in r.sources
        assert r.temperature_celsius is None and r.power_watts is None and r.ecc_uncorrected_total is None
    if generation == "v4":  # libtpu 0.0.16: no HLO metrics offered, and none asked
        assert readings[0].hlo_queue_size is None and readings[0].hlo_execution_seconds is None
        assert [r.status for r in readings] == ["ALIVE"] * 4
    else:
        assert (readings[0].hlo_queue_size, readings[-1].hlo_queue_size) == (2 * cores, cores if cores > 1 else 0)
        timing = readings[0].hlo_execution_seconds
        entries = recorded["busy"]["hlo.execution.timing.distribution.microseconds"]["metric"]["metrics"]
        assert timing is not None and timing.count == sum(int(m["distribution"]["count"]) for m in entries[:cores])
        assert [q for q, _ in timing.quantiles] == [0.5, 0.9, 0.95, 0.999]
        assert all(0.0001 < v < 0.0204 for _, v in timing.quantiles), "microseconds become seconds"
    assert readings[-1].tensorcore_idle_seconds == 0.0 if cores > 1 else 42.5


def test_tpu7x_duty_cycle_is_per_core_and_chip_1_gets_its_own_cores(tmp_path: Path, serve: Any) -> None:
    address = serve(Runtime("7x", "busy"))
    readings = TpuBackend(make_config(make_host(tmp_path, "7x", 4), [address])).read()
    assert [r.utilization_ratio for r in readings] == pytest.approx([0.7, 0.3, 0.0, 1.0])
    assert [r.memory_used_bytes for r in readings] == [42 * GIB, 22 * GIB, 0, 181 * GIB]
    assert [r.memory_total_bytes for r in readings] == [192 * GIB] * 4


def test_device_ids_that_do_not_start_at_0_are_placed_by_rank(tmp_path: Path, serve: Any) -> None:
    address = serve(Runtime("v6e", "busy"))  # device ids 8, 9, 12, 13, as in tpu-info's README
    readings = TpuBackend(make_config(make_host(tmp_path, "v6e", 4), [address])).read()
    assert [round(r.memory_used_bytes / GIB, 2) for r in readings] == [17.26, 9.26, 9.26, 9.26]
    assert [r.memory_total_bytes for r in readings] == [31.25 * GIB] * 4


@pytest.mark.parametrize("generation", ["v4", "v5e", "v5p", "v6e", "7x"])
def test_an_idle_runtime_is_data_not_an_error(tmp_path: Path, serve: Any, generation: str,
                                              caplog: pytest.LogCaptureFixture) -> None:
    recorded = fixture(generation)
    runtime = Runtime(generation, "idle")
    address = serve(runtime)
    backend = TpuBackend(make_config(make_host(tmp_path, generation, recorded["chips"]), [address]))
    with caplog.at_level(logging.WARNING):
        first, second = backend.read(), backend.read()
    assert first == second
    assert [r.utilization_ratio for r in first] == [0.0] * recorded["chips"]
    assert all(r.runtime_metrics for r in first)
    timing = first[0].hlo_execution_seconds
    if generation == "v4":
        assert timing is None
        assert not any(name.startswith("hlo.") for name in runtime.calls), "not offered, so not asked"
    else:
        assert timing is not None and (timing.count, timing.total, timing.quantiles) == (0, 0.0, ())
    assert runtime.calls["ListSupportedMetrics"] == 1, "asked once, not every read"
    assert [r.getMessage() for r in caplog.records] == []


def test_no_workload_still_exports_presence_owners_and_published_capacity(tmp_path: Path, serve: Any) -> None:
    paths = make_host(tmp_path, "v5e", chips=2)
    address = serve(Runtime(mode="unavailable"))
    holder = subprocess.Popen([sys.executable, "-c", "import sys; f = open(sys.argv[1]); sys.stdin.read()",
                               f"{paths.dev}/vfio/11"], stdin=subprocess.PIPE)
    try:
        backend = TpuBackend(make_config(paths, [address]))
        wait_until(lambda: _holds(holder.pid, f"{paths.dev}/vfio/11"), what="the holder to open its chip")
        readings = backend.read()
        command = Path(f"/proc/{holder.pid}/comm").read_text().strip()
    finally:
        holder.kill()
        holder.wait()
    assert [r.up for r in readings] == [True, True]
    assert [r.owners for r in readings] == [(), (f"{holder.pid} ({command})",)]
    for r in readings:
        assert r.runtime_metrics is False
        assert r.memory_used_bytes is None and r.utilization_ratio is None
        assert r.memory_total_bytes == 16 * GIB
        assert r.sources["memory_total_bytes"] == "published capacity of v5e"
        assert r.sources["runtime"] == (f"libtpu:{address}: no runtime answering "
                                        "(UNAVAILABLE: no workload running libtpu)")
    assert device_problems(readings) == []


def _holds(pid: int, path: str) -> bool:
    fds = Path(f"/proc/{pid}/fd")
    return any(str(Path(fd).resolve()) == path for fd in fds.iterdir())


def test_absent_runtime_means_no_data_not_an_error(tmp_path: Path) -> None:
    backend = TpuBackend(make_config(make_host(tmp_path, "v6e", chips=1), [f"localhost:{free_port()}"]))
    (reading,) = backend.read()
    assert reading.up and reading.runtime_metrics is False
    assert "UNAVAILABLE" in reading.sources["runtime"]


def test_a_runtime_slower_than_the_deadline_is_abandoned_in_time(tmp_path: Path, serve: Any) -> None:
    address = serve(Runtime("v5e", mode="slow"))
    backend = TpuBackend(make_config(make_host(tmp_path, "v5e", chips=4), [address], timeout=0.3))
    started = time.monotonic()
    readings = backend.read()
    assert time.monotonic() - started < 1.5, "the listing and the metric calls share one deadline"
    assert all(r.runtime_metrics is False for r in readings)
    assert readings[0].sources["runtime"] == f"libtpu:{address}: no answer within 0.3s (DEADLINE_EXCEEDED)"


# --- lost and dead chips --------------------------------------------------------------------------

def test_a_vanished_chip_is_down_and_the_others_keep_their_numbers(tmp_path: Path) -> None:
    paths = make_host(tmp_path, "v6e", chips=4)
    collector = DeviceCollector(TpuBackend(make_config(paths, [f"localhost:{free_port()}"])))
    collector.collect()
    shutil.rmtree(Path(paths.sysfs, "bus/pci/devices/0000:00:05.0"))
    samples = collector.collect()
    up = {dict(s.labels)["device"]: s.value for s in samples if s.name == "tpuwatch_device_up"}
    assert up == {"0": 1.0, "1": 0.0, "2": 1.0, "3": 1.0}
    assert [r.pci for r in collector.last_readings] == ["0000:00:04.0", "0000:00:05.0", "0000:00:06.0",
                                                        "0000:00:07.0"]
    assert not any(s.name == "tpuwatch_device_memory_total_bytes" and dict(s.labels)["device"] == "1"
                   for s in samples)


def test_a_dead_v4_chip_is_down_with_its_status_and_raises_an_event(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    paths = make_host(tmp_path, "v4", chips=2)
    collector = DeviceCollector(TpuBackend(make_config(paths, [f"localhost:{free_port()}"])))
    collector.collect()
    status = Path(paths.sysfs, "bus/pci/devices/0000:00:05.0/accel/accel1/status")
    status.write_text("DEAD\n")
    with caplog.at_level(logging.ERROR):
        samples = collector.collect()
    values = {(s.name, tuple(sorted(dict(s.labels).items()))): s.value for s in samples}
    assert values[("tpuwatch_device_up", (("device", "1"),))] == 0
    assert values[("tpuwatch_device_driver_status", (("device", "1"), ("status", "DEAD")))] == 1
    assert values[("tpuwatch_device_driver_status", (("device", "1"), ("status", "ALIVE")))] == 0
    assert values[("tpuwatch_device_resets_total", (("device", "1"),))] == 1
    assert device_problems(collector.last_readings) == [
        f"device 1 (v4, pci 0000:00:05.0) is down: driver reports the chip DEAD (sysfs:{status.parent})"]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [
        f"device 1 (v4, pci 0000:00:05.0) is down: driver reports the chip DEAD (sysfs:{status.parent})"]
    status.write_text("LAMED\n")
    collector.collect()
    assert device_problems([r for r in collector.last_readings if r.device == "1"]) == [
        "device 1 (v4, pci 0000:00:05.0): driver status LAMED"]


# --- auto-detection and the command line ----------------------------------------------------------

def test_auto_picks_tpu_from_pci_and_logs_why(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    paths = make_host(tmp_path, "v5p", chips=2)
    with caplog.at_level(logging.INFO, logger="tpuwatch.devices"):
        backend, why = select_backend(make_config(paths, ["localhost:8431"], backend="auto"))
    assert isinstance(backend, TpuBackend)
    assert why == "auto: 2 tpu PCI device(s) at 0000:00:04.0, 0000:00:05.0"
    assert f"device backend: {why}" in caplog.messages


def test_check_shows_each_chip_and_where_its_readings_came_from(tmp_path: Path, serve: Any) -> None:
    paths = make_host(tmp_path, "7x", chips=4)
    address = serve(Runtime("7x", "busy"))
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"paths": dataclasses.asdict(paths),
                                  "devices": {"backend": "auto", "tpu": {"metrics_addr": [address]}}}))
    result = run_cli("check", "--json", "--config", str(config))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["backend"] == "tpu"
    assert report["notes"][1].startswith("device backend: auto: 4 tpu PCI device(s) at 0000:00:04.0, ")
    device = report["devices"][3]
    assert (device["device"], device["chip"], device["pci"], device["up"]) == ("3", "7x", "0000:00:07.0", True)
    assert device["memory_total_bytes"] == 192 * GIB and device["runtime_metrics"] is True
    assert device["utilization_ratio"] == 1.0
    assert device["hlo_execution_seconds"]["count"] == 132 + 133  # cores 6 and 7
    assert device["sources"]["memory_used_bytes"] == f"libtpu:{address}"
    assert device["sources"]["device_file"] == f"{paths.dev}/vfio/13"
    assert device["temperature_celsius"] is None
    assert report["problems"] == []


def test_a_tpu_host_without_the_tpu_extra_says_which_extra_to_install(tmp_path: Path, start_daemon: Any) -> None:
    # The tpu extra's gRPC client made unimportable, as on a host where only `pip install tpuwatch` ran.
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "grpc.py").write_text("raise ImportError('no grpc here', name='grpc')\n")
    paths = make_host(tmp_path, "v5e", chips=2)
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"devices": {"backend": "tpu"}, "kernel_log": {"source": "none"},
                                  "canary": {"enabled": False}, "state_dir": str(tmp_path / "state"),
                                  "paths": {"sysfs": paths.sysfs, "dev": paths.dev}}))
    env = {"PYTHONPATH": f"{blocker}:{Path(__file__).resolve().parent.parent}"}
    result = subprocess.run([sys.executable, "-m", "tpuwatch", "check", "--config", str(config), "--json"],
                            capture_output=True, text=True, timeout=120, env={**os.environ, **env})
    report = json.loads(result.stdout)
    wanted = ("device backend tpu: libtpu's runtime metrics cannot be read: grpc is not installed "
              "(pip install 'tpuwatch[tpu]')")
    assert result.returncode == 1 and wanted in report["problems"], result.stdout + result.stderr
    assert [d["up"] for d in report["devices"]] == [True, True]
    daemon = start_daemon(json.loads(config.read_text()), env=env)
    daemon.wait_ready()
    assert "WARNING tpuwatch.devices.tpu: libtpu's runtime metrics cannot be read: grpc is not installed " \
           "(pip install 'tpuwatch[tpu]')" in daemon.log()
