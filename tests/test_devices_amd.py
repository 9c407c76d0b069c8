"""AMD backend on amdgpu sysfs trees laid out as the driver lays them out (tests/testdata/amd/, composed):
MI210, MI250X (two dies, two PCI functions), MI300X (a processing accelerator); lost, hung and garbled files."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tpuwatch.alerting.tracker import Track, Tracker
from tpuwatch.config import Config, DevicesConfig, HostConfig, KernelLogConfig, Paths
from tpuwatch.devices import select_backend
from tpuwatch.devices.amd import AmdBackend, parse_hwmon, parse_ras
from tpuwatch.devices.base import reading_samples
from tpuwatch.devices.collector import DeviceCollector
from tpuwatch.devices.expected import expect, missing_problem
from tpuwatch.health import device_problems
from tpuwatch.hw import procfs
from tpuwatch.hw.units import GIB
from tpuwatch.kernel_log.attribution import Attribution, device_lookup
from tpuwatch.kernel_log.records import Record
from tpuwatch.registry import build_collectors
from tpuwatch.sampler import Sampler
from tpuwatch.store import SeriesStore

from conftest import wait_until, waited_seconds

TREES = Path(__file__).parent / "testdata" / "amd"


def host(tmp_path: Path, tree: str) -> Paths:
    """A copy of a fixture tree (tests change it) with /dev/kfd and a render node per GPU."""
    sysfs = tmp_path / "sys"
    shutil.copytree(TREES / tree / "sys", sysfs)
    dev = tmp_path / "dev"
    (dev / "dri").mkdir(parents=True)
    (dev / "kfd").touch()
    for render in sysfs.glob("bus/pci/devices/*/drm/renderD*"):
        (dev / "dri" / render.name).touch()
    return Paths(sysfs=str(sysfs), procfs="/proc", dev=str(dev))


def config(paths: Paths, backend: str = "amd", deadline: float = 1.0) -> Config:
    return Config(paths=paths, devices=DevicesConfig(backend=backend), collector_timeout=deadline)


def gpu_dir(paths: Paths, pci: str) -> Path:
    return Path(paths.sysfs, "bus", "pci", "devices", pci)


# --- parsing ---------------------------------------------------------------------------------------------

def test_ras_counts_are_read_as_the_driver_prints_them() -> None:
    assert parse_ras("ue: 0\nce: 3\n") == {"uncorrected": 0, "corrected": 3}
    assert parse_ras("ue: 1\nce: 0\nde: 2\n") == {"uncorrected": 1, "corrected": 0, "deferred": 2}
    assert parse_ras("Query currently inaccessible\n") is None
    assert parse_ras("ue: 1\nce: lots\n") is None
    assert parse_ras("") is None


def test_hwmon_temperatures_are_taken_by_label_not_by_number() -> None:
    sensors = parse_hwmon({"temp2_label": "junction\n", "temp2_input": "71000\n", "temp3_label": "mem\n",
                           "temp3_input": "62000\n", "power1_input": "731000000\n"})
    assert sensors.temperatures == {"junction": 71.0, "mem": 62.0}
    assert sensors.chip_temperature == ("junction", 71.0)
    assert sensors.power_watts == 731.0
    both = parse_hwmon({"power1_average": "87000000", "power1_input": "90000000", "temp1_label": "edge",
                        "temp1_input": "45000", "temp2_label": "junction", "temp2_input": "52000"})
    assert both.power_watts == 87.0 and both.chip_temperature == ("edge", 45.0)
    assert parse_hwmon({"temp1_label": "edge", "temp1_input": "hot"}) == parse_hwmon({})


# --- one fixture per generation ------------------------------------------------------------------------------

def test_mi210_reads_memory_busy_sensors_and_corrected_errors(tmp_path: Path) -> None:
    paths = host(tmp_path, "mi210")
    (reading,) = AmdBackend(config(paths)).read()
    assert (reading.device, reading.chip, reading.pci, reading.up) == ("0", "MI210", "0000:c1:00.0", True)
    assert reading.memory_total_bytes == 64 * GIB and reading.memory_used_bytes == 2 * GIB
    assert reading.utilization_ratio == 0.37
    assert reading.temperature_celsius == 45.0 and reading.power_watts == 87.0
    assert (reading.ecc_corrected_total, reading.ecc_uncorrected_total) == (3.0, 0.0)
    assert reading.device_files == ("dri/renderD128",)
    root = gpu_dir(paths, "0000:c1:00.0")
    assert reading.sources["temperature_celsius"] == f"hwmon:{root}/hwmon/hwmon2 (edge)"
    assert reading.sources["unique_id"] == f"6b2a1f4c0f2d1a70 (sysfs:{root}/unique_id)"
    assert reading.reset_count is None and reading.pcie_replays_total is None, "not exposed: absent, not 0"


def test_mi250x_dies_are_two_gpus_each_with_its_own_counts_and_render_node(tmp_path: Path) -> None:
    paths = host(tmp_path, "mi250x")
    backend = AmdBackend(config(paths))
    first, second = backend.read()
    assert [(r.device, r.chip, r.pci) for r in (first, second)] == [("0", "MI250X", "0000:c1:00.0"),
                                                                    ("1", "MI250X", "0000:c6:00.0")]
    assert first.memory_total_bytes == second.memory_total_bytes == 64 * GIB
    assert (first.device_files, second.device_files) == (("dri/renderD128",), ("dri/renderD129",))
    assert first.power_watts == 412.0 and second.power_watts is None, "a die without a power file: absent"
    assert (first.ecc_uncorrected_total, second.ecc_uncorrected_total) == (0.0, 1.0)
    ras = [(dict(s.labels), s.value) for s in backend.extra_samples() if s.value]
    assert ras == [({"device": "0", "block": "umc", "kind": "corrected"}, 12.0),
                   ({"device": "1", "block": "umc", "kind": "uncorrected"}, 1.0)]
    kinds = {dict(s.labels)["kind"] for s in backend.extra_samples() if dict(s.labels)["block"] == "umc"}
    assert kinds == {"corrected", "uncorrected", "deferred"}
    assert {dict(s.labels)["kind"] for s in backend.extra_samples() if dict(s.labels)["block"] == "gfx"} == {
        "corrected", "uncorrected"}, "deferred only where the block reports it"


def test_mi300x_is_a_processing_accelerator_without_an_edge_sensor(tmp_path: Path) -> None:
    paths = host(tmp_path, "mi300x")
    backend = AmdBackend(config(paths))
    busy, idle = backend.read()
    assert (busy.chip, busy.pci, idle.pci) == ("MI300X", "0000:05:00.0", "0000:26:00.0")
    assert busy.memory_total_bytes == 192 * GIB and busy.memory_used_bytes == 180 * GIB
    assert busy.temperature_celsius == 71.0
    assert busy.sources["temperature_celsius"].endswith("(junction)")
    assert busy.power_watts == 731.0 and busy.utilization_ratio == 1.0
    assert idle.utilization_ratio == 0.0 and idle.memory_used_bytes == 0.0, "a real 0 stays 0"
    assert busy.ecc_uncorrected_total == 0.0, "deferred errors are not uncorrected ones"
    deferred = [s for s in backend.extra_samples() if dict(s.labels)["kind"] == "deferred" and s.value]
    assert [(dict(s.labels)["device"], dict(s.labels)["block"], s.value) for s in deferred] == [("0", "umc", 2.0)]


def test_radeons_and_other_functions_are_not_picked(tmp_path: Path) -> None:
    paths = host(tmp_path, "mi210")
    radeon = gpu_dir(paths, "0000:0a:00.0")
    radeon.mkdir()
    for name, value in (("vendor", "0x1002"), ("device", "0x744c"), ("class", "0x030000")):
        (radeon / name).write_text(value + "\n")
    assert [r.pci for r in AmdBackend(config(paths)).read()] == ["0000:c1:00.0"]


# --- auto, expected count, alert inputs, kernel attribution ----------------------------------------------------

def test_auto_picks_amd_from_pci_ids_and_says_why(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    paths = host(tmp_path, "mi250x")
    with caplog.at_level(logging.INFO, logger="tpuwatch.devices"):
        backend, why = select_backend(config(paths, backend="auto"))
    assert isinstance(backend, AmdBackend)
    assert why == "auto: 2 amd PCI device(s) at 0000:c1:00.0, 0000:c6:00.0"
    assert f"device backend: {why}" in caplog.messages


def test_the_expected_count_covers_each_die_and_names_a_missing_one(tmp_path: Path) -> None:
    paths = host(tmp_path, "mi250x")
    expectation = expect(config(paths), "amd", {})
    assert expectation is not None and (expectation.count, expectation.source) == (2, "pci")
    assert expectation.pci == ("0000:c1:00.0", "0000:c6:00.0")
    shutil.rmtree(gpu_dir(paths, "0000:c6:00.0") / "ras")
    (gpu_dir(paths, "0000:c6:00.0") / "vendor").unlink()  # gone from the bus as the backend sees it
    readings = AmdBackend(config(paths)).read()
    assert missing_problem(expectation, readings) == (
        "1 of 2 expected accelerator(s) missing (2 accelerator PCI function(s) at start; 1 reported): "
        "pci 0000:c6:00.0 (on the bus, not answering)")


def test_uncorrectable_ras_counts_feed_the_ecc_rule_and_memory_full_its_ratio(tmp_path: Path) -> None:
    paths = host(tmp_path, "mi250x")
    first, second = AmdBackend(config(paths)).read()
    samples = {(s.name, s.labels): s.value for s in reading_samples(second, "amd")}
    assert samples[("tpuwatch_device_ecc_errors_total", (("device", "1"), ("kind", "uncorrected")))] == 1.0
    assert samples[("tpuwatch_device_memory_used_bytes", (("device", "1"),))] == 41 * GIB
    assert samples[("tpuwatch_device_memory_total_bytes", (("device", "1"),))] == 64 * GIB
    assert samples[("tpuwatch_device_temperature_celsius", (("device", "1"),))] == 49.0
    assert ("tpuwatch_device_power_watts", (("device", "1"),)) not in samples


def test_an_amdgpu_kernel_line_is_attributed_to_its_gpu(tmp_path: Path) -> None:
    readings = AmdBackend(config(host(tmp_path, "mi250x"))).read()
    attribution = Attribution(device_lookup(lambda: readings))
    record = Record("amdgpu 0000:c6:00.0: amdgpu: ring gfx_0.0.0 timeout, signaled seq=7292300, emitted seq=7292304")
    pci = attribution.pci_of(record)
    assert (pci, attribution(pci or "")) == ("0000:c6:00.0", "1")


# --- faults ------------------------------------------------------------------------------------------------

def test_a_gpu_whose_files_vanish_between_reads_is_down_and_the_other_keeps_its_number(tmp_path: Path,
                                                                                        caplog: pytest.LogCaptureFixture
                                                                                        ) -> None:
    paths = host(tmp_path, "mi250x")
    collector = DeviceCollector(AmdBackend(config(paths)))
    collector.collect()
    shutil.rmtree(gpu_dir(paths, "0000:c1:00.0"))
    samples = {(s.name, s.labels): s.value for s in collector.collect()}
    assert samples[("tpuwatch_device_up", (("device", "0"),))] == 0
    assert samples[("tpuwatch_device_up", (("device", "1"),))] == 1
    assert ("tpuwatch_device_memory_used_bytes", (("device", "0"),)) not in samples
    assert "device 0 (MI250X, pci 0000:c1:00.0) is down: lost" in caplog.messages


def test_a_gpu_that_vanishes_during_its_read_is_reported_lost(tmp_path: Path) -> None:
    paths = host(tmp_path, "mi210")
    root = gpu_dir(paths, "0000:c1:00.0")
    busy = root / "gpu_busy_percent"
    busy.unlink()
    os.mkfifo(busy)

    def unplug() -> None:
        with open(busy, "w"):  # returns once the backend's read has opened the file
            shutil.rmtree(root)

    unplugging = threading.Thread(target=unplug)
    unplugging.start()
    (reading,) = AmdBackend(config(paths, deadline=10.0)).read()
    unplugging.join()
    assert not reading.up and reading.problem == f"GPU is lost ({root} vanished)"
    assert reading.memory_total_bytes is None and reading.chip == "MI210"


def test_a_hung_read_reports_the_gpu_unresponsive_in_time_and_the_other_die_is_read(tmp_path: Path) -> None:
    paths = host(tmp_path, "mi250x")
    busy = gpu_dir(paths, "0000:c1:00.0") / "gpu_busy_percent"
    busy.unlink()
    os.mkfifo(busy)  # opening it blocks until a writer comes: a sysfs read stuck in the driver
    backend = AmdBackend(config(paths, deadline=0.4))
    try:
        hung, other = backend.read()
        assert not hung.up and hung.problem is not None
        assert 0.1 <= waited_seconds(hung.problem, f"unresponsive: {busy}") <= 0.2
        assert other.up and other.memory_used_bytes == 41 * GIB
        again, _ = backend.read()
        assert again.problem is not None and "an earlier call has not returned" in again.problem
    finally:
        writer = os.open(busy, os.O_WRONLY | os.O_NONBLOCK)
        (busy.parent / "answer").write_text("92\n")
        os.replace(busy.parent / "answer", busy)
        os.close(writer)  # the stuck reader sees end of file; the next read finds the file answering
    back = wait_until(lambda: next((r for r in backend.read()[:1] if r.up), None), what="the lane to come back")
    assert back.utilization_ratio == 0.92


def test_a_counter_that_goes_backwards_is_exported_as_read_and_counted_as_a_reset(tmp_path: Path) -> None:
    paths = host(tmp_path, "mi250x")
    umc = gpu_dir(paths, "0000:c6:00.0") / "ras" / "umc_err_count"
    backend = AmdBackend(config(paths))
    tracker = Tracker()
    tracks = {"tpuwatch_device_ecc_errors_total": Track("external", 3600.0, 3600.0)}
    key = ("tpuwatch_device_ecc_errors_total", (("device", "1"), ("kind", "uncorrected")))
    seen = []
    for now, text in enumerate(("ue: 4\nce: 0\nde: 0\n", "ue: 0\nce: 0\nde: 0\n", "ue: 2\nce: 0\nde: 0\n")):
        umc.write_text(text)
        reading = backend.read()[1]
        seen.append(reading.ecc_uncorrected_total)
        tracker.observe(reading_samples(reading, "amd"), tracks, float(now))
    assert seen == [4.0, 0.0, 2.0]
    assert tracker.increase(key, 3600.0, 2.0) == 2.0, "after the reset, the 2 new errors are the increase"


def test_garbage_and_inaccessible_files_are_absent_and_logged_once(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    paths = host(tmp_path, "mi210")
    root = gpu_dir(paths, "0000:c1:00.0")
    (root / "mem_info_vram_used").write_text("\x00\xff garbage\n")
    backend = AmdBackend(config(paths))
    (root / "ras" / "umc_err_count").write_text("Query currently inaccessible\n")
    with caplog.at_level(logging.WARNING, logger="tpuwatch.devices.amd"):
        first = backend.read()[0]
        second = backend.read()[0]
    for reading in (first, second):
        assert reading.memory_used_bytes is None and reading.memory_total_bytes == 64 * GIB
    warnings = [m for m in caplog.messages if m.startswith("AMD GPU 0000:c1:00.0:")]
    assert len(warnings) == 2, warnings
    assert any("mem_info_vram_used: not a number" in m for m in warnings)
    assert any("ras/umc_err_count: 'Query currently inaccessible'" in m for m in warnings)


def test_unreadable_files_are_counted_per_field_and_named_by_check(tmp_path: Path) -> None:
    paths = host(tmp_path, "mi210")
    root = gpu_dir(paths, "0000:c1:00.0")
    (root / "gpu_busy_percent").unlink()
    (root / "gpu_busy_percent").mkdir()  # open() fails with EISDIR: a read error, not an absent file
    (root / "mem_info_vram_used").write_text("garbage\n")
    collector = DeviceCollector(AmdBackend(config(paths)))
    collector.collect()
    samples = collector.collect()
    reading = collector.last_readings[0]
    assert reading.utilization_ratio is None and reading.memory_used_bytes is None
    assert set(reading.read_errors) == {"gpu_busy_percent", "mem_info_vram_used"}
    counted = {dict(s.labels)["field"]: s.value for s in samples if s.name == "tpuwatch_device_read_errors_total"}
    assert counted == {"gpu_busy_percent": 2, "mem_info_vram_used": 2}
    problems = device_problems(collector.last_readings)
    assert any(p.startswith("device 0 (MI210, pci 0000:c1:00.0): gpu_busy_percent could not be read (")
               and "Is a directory" in p for p in problems), problems


def test_garbage_that_changes_at_every_read_is_remembered_within_a_bound(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    paths = host(tmp_path, "mi210")
    used = gpu_dir(paths, "0000:c1:00.0") / "mem_info_vram_used"
    backend = AmdBackend(config(paths))
    with caplog.at_level(logging.WARNING, logger="tpuwatch.devices.amd"):
        for n in range(backend._logged.limit + 50):
            used.write_text(f"garbage {n}\n")
            assert backend.read()[0].memory_used_bytes is None
    assert len(caplog.messages) == backend._logged.limit  # one line per distinct problem, up to the bound


def test_an_inaccessible_block_counts_what_it_last_said(tmp_path: Path) -> None:
    paths = host(tmp_path, "mi210")
    backend = AmdBackend(config(paths))
    assert backend.read()[0].ecc_corrected_total == 3.0
    (gpu_dir(paths, "0000:c1:00.0") / "ras" / "umc_err_count").write_text("Query currently inaccessible\n")
    assert backend.read()[0].ecc_corrected_total == 3.0, "a gap would read as a reset and re-fire the ECC alert"


# --- processes -------------------------------------------------------------------------------------------

def test_holders_of_a_render_node_are_its_gpus_and_kfd_alone_is_nobodys(tmp_path: Path) -> None:
    paths = host(tmp_path, "mi250x")
    script = "import sys; fs = [open(p) for p in sys.argv[1:]]; sys.stdin.read()"
    compute = subprocess.Popen([sys.executable, "-c", script, f"{paths.dev}/kfd", f"{paths.dev}/dri/renderD129"],
                               stdin=subprocess.PIPE)
    kfd_only = subprocess.Popen([sys.executable, "-c", script, f"{paths.dev}/kfd"], stdin=subprocess.PIPE)
    try:
        wait_until(lambda: _holds(compute.pid, f"{paths.dev}/dri/renderD129") and _holds(
            kfd_only.pid, f"{paths.dev}/kfd"), what="the holders to open their files")
        first, second = AmdBackend(config(paths)).read()
        command = Path(f"/proc/{compute.pid}/comm").read_text().strip()
    finally:
        for process in (compute, kfd_only):
            process.kill()
            process.wait()
    assert first.processes == () and first.owners == ()
    assert [p.pid for p in second.processes or ()] == [compute.pid]
    assert second.owners == (f"{compute.pid} ({command})",)


def test_one_holder_scan_a_cycle_names_a_render_node_s_holder_by_chip_in_the_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The backend, the devices stage and the host collector share the cycle's one scan: the host names the
    # holder of a GPU's render node from the inventory the devices stage published, in the very first cycle.
    paths = host(tmp_path, "mi250x")
    scans: list[tuple[Any, ...]] = []
    scan = procfs.scan_holders

    def counted(*args: Any, **kwargs: Any) -> dict[int, procfs.Holder]:
        scans.append(args)
        return scan(*args, **kwargs)

    monkeypatch.setattr(procfs, "scan_holders", counted)
    script = "import sys; f = open(sys.argv[1]); sys.stdin.read()"
    compute = subprocess.Popen([sys.executable, "-c", script, f"{paths.dev}/dri/renderD129"], stdin=subprocess.PIPE)
    collectors = build_collectors(dataclasses.replace(
        config(paths), state_dir=str(tmp_path / "state"), kernel_log=KernelLogConfig(source="none"),
        host=HostConfig(pod_resources_socket=None)), persist=False)
    try:
        wait_until(lambda: _holds(compute.pid, f"{paths.dev}/dri/renderD129"), what="the holder to open its file")
        sampler = Sampler(collectors.stages(), SeriesStore(10, 10_000), 1.0, collectors.inventory)
        sampler.run_once()
        held = {dict(s.labels)["device"] for s in sampler.store.current()
                if s.name == "tpuwatch_device_holder_info" and dict(s.labels)["pid"] == str(compute.pid)}
        sampler.run_once()
    finally:
        collectors.close()
        compute.kill()
        compute.wait()
    assert held == {"1"}
    assert len(scans) == 1, "one scan of /proc for the backend, the devices stage and the host, within the interval"
    assert [r.owners != () for r in collectors.device_readings()] == [False, True]


def _holds(pid: int, path: str) -> bool:
    return any(str(Path(fd).resolve()) == path for fd in Path(f"/proc/{pid}/fd").iterdir())
