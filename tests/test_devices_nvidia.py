"""NVIDIA backend through the real nvidia-ml-py and the stand-in libnvidia-ml.so.1 (tests/nvml/): lost and hung GPUs."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
import pytest
import requests
from fakekubelet import Kubelet, serve

from tpuwatch.collectors import GuardedCollector
from tpuwatch.config import Config, DevicesConfig, NvidiaConfig, Paths
from tpuwatch.devices import select_backend
from tpuwatch.devices.base import DeviceReading, ProcessUse
from tpuwatch.devices.collector import DeviceCollector
from tpuwatch.devices.nvidia import NvidiaBackend, pci_bus_id, throttle_reasons
from tpuwatch.devices.seen import SeenThisBoot
from tpuwatch.health import collector_problems, device_problems
from tpuwatch.pods import PodLookup

from conftest import DaemonProcess, run_cli, wait_until, waited_seconds
from fakenvml import FakeNvml

# Entry points an older driver's library lacks (the clocks "event reason" calls, nvmlDeviceGetMemoryInfo_v2): the
# stand-in answers NVML_ERROR_FUNCTION_NOT_FOUND, as nvidia-ml-py reports a symbol it cannot find.
OLD_DRIVER = ["nvmlDeviceGetSupportedClocksEventReasons", "nvmlDeviceGetCurrentClocksEventReasons",
              "nvmlDeviceGetMemoryInfo_v2"]


def config(timeout: float = 0.5, backend: str = "nvidia", sysfs: str = "/sys") -> Config:
    return Config(paths=Paths(sysfs=sysfs), devices=DevicesConfig(backend=backend,
                                                                  nvidia=NvidiaConfig(call_timeout=timeout)))


def test_pci_bus_id_is_written_as_sysfs_writes_it() -> None:
    assert pci_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert pci_bus_id(b"00000001:AF:00.1") == "0001:af:00.1"


def test_throttle_reasons_lists_only_supported_ones() -> None:
    assert throttle_reasons(supported=0x1 | 0x4 | 0x40, active=0x4 | 0x8) == {
        "gpu_idle": False, "sw_power_cap": True, "hw_thermal_slowdown": False}
    assert throttle_reasons(supported=0x600, active=0x400) == {"board_limit": False, "reliability": True}


def test_clock_event_reasons_and_reserved_memory_come_from_the_current_calls(nvml: FakeNvml,
                                                                              caplog: pytest.LogCaptureFixture) -> None:
    nvml.change(0, unsupported=["nvmlDeviceGetSupportedClocksThrottleReasons",
                                "nvmlDeviceGetCurrentClocksThrottleReasons"])
    with caplog.at_level(logging.WARNING):
        first, second, _, fourth = NvidiaBackend(config()).read()
    assert first.throttle_reasons is not None, "read through the current calls, not the deprecated ones"
    assert [name for name, active in first.throttle_reasons.items() if active] == ["sw_power_cap", "board_limit"]
    assert first.throttle_reasons["reliability"] is False
    assert (first.memory_reserved_bytes, first.sources["memory_reserved_bytes"]) == (566231040, "nvml")
    assert first.memory_used_bytes == 42949672960, "used stays what nvmlDeviceGetMemoryInfo (v1) says"
    assert fourth.throttle_reasons is not None and "board_limit" not in fourth.throttle_reasons
    # An older driver lacks the event-reason and v2 functions: the deprecated calls answer, reserved is absent.
    nvml.change(0, unsupported=[])
    nvml.update(missing_symbols=OLD_DRIVER)
    with caplog.at_level(logging.WARNING):
        old_driver = NvidiaBackend(config()).read()[0]
    assert old_driver.throttle_reasons == first.throttle_reasons
    assert old_driver.memory_reserved_bytes is None and "memory_reserved_bytes" not in old_driver.sources
    assert old_driver.memory_used_bytes == 42949672960
    assert caplog.records == [], "a function the driver lacks is not a failure"


def test_an_older_nvidia_ml_py_without_the_new_calls_falls_back(nvml: FakeNvml,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    nvml.change(0, unsupported=["nvmlDeviceGetSupportedClocksEventReasons", "nvmlDeviceGetCurrentClocksEventReasons",
                                "nvmlDeviceGetMemoryInfo_v2"])  # proof that the module's functions are not called
    for name in ("nvmlDeviceGetSupportedClocksEventReasons", "nvmlDeviceGetCurrentClocksEventReasons",
                 "nvmlMemory_v2"):
        monkeypatch.delattr(pynvml, name)
    first = NvidiaBackend(config()).read()[0]
    assert first.throttle_reasons is not None and first.throttle_reasons["board_limit"] is True
    assert first.memory_reserved_bytes is None


def test_every_reading_comes_from_nvml(nvml: FakeNvml) -> None:
    first, second, lost, fourth = NvidiaBackend(config()).read()
    assert (first.device, first.chip, first.pci, first.up) == ("0", "NVIDIA H100 80GB HBM3", "0000:18:00.0", True)
    assert (first.memory_used_bytes, first.memory_total_bytes) == (42949672960, 85520809984)
    assert (first.utilization_ratio, first.temperature_celsius, first.power_watts) == (0.97, 61, 512.345)
    assert (first.ecc_corrected_total, first.ecc_corrected_aggregate_total) == (3, 17)
    assert (first.ecc_uncorrected_total, first.ecc_uncorrected_aggregate_total) == (0, 0)
    assert (first.remapped_rows_corrected, first.remapped_rows_uncorrected, first.row_remap_failed) == (2, 0, False)
    assert first.retired_pages_single_bit is None, "Ampere and later answer NOT_SUPPORTED: absent, not 0"
    assert first.memory_repair_pending is False
    assert first.pcie_replays_total == 5
    assert first.throttle_reasons is not None and first.throttle_reasons["sw_power_cap"] is True
    assert [name for name, active in first.throttle_reasons.items() if active] == ["sw_power_cap", "board_limit"]
    assert first.sources["memory_used_bytes"] == "nvml" and "retired_pages_single_bit" not in first.sources
    assert (second.ecc_uncorrected_total, second.memory_repair_pending) == (1, True)
    assert (lost.up, lost.problem) == (False, "GPU is lost (nvmlDeviceGetHandleByIndex: GPU is lost)")
    assert fourth.up and fourth.temperature_celsius == 31


def test_health_names_the_lost_gpu_the_uncorrectable_error_and_the_pending_repair(nvml: FakeNvml) -> None:
    collector = DeviceCollector(NvidiaBackend(config()))
    collector.collect()
    assert device_problems(collector.last_readings) == [
        ("device 1 (NVIDIA H100 80GB HBM3, pci 0000:2a:00.0): memory repair pending (page retirement or row remap "
         "needs a GPU reset)"),
        "device 1 (NVIDIA H100 80GB HBM3, pci 0000:2a:00.0): 1 uncorrectable ECC error(s) since the driver loaded",
        "device 2 (unknown) is down: GPU is lost (nvmlDeviceGetHandleByIndex: GPU is lost)",
    ]


def test_a_gpu_lost_after_being_seen_keeps_its_identity(nvml: FakeNvml) -> None:
    backend = NvidiaBackend(config())
    backend.read()
    nvml.change(0, lost=True)
    reading = backend.read()[0]
    assert (reading.chip, reading.pci, reading.up) == ("NVIDIA H100 80GB HBM3", "0000:18:00.0", False)
    assert reading.memory_used_bytes is None


def test_samples_carry_the_nvidia_families(nvml: FakeNvml) -> None:
    samples = DeviceCollector(NvidiaBackend(config())).collect()
    values = {(s.name, tuple(sorted(dict(s.labels).items()))): s.value for s in samples}
    assert values[("tpuwatch_device_ecc_errors_aggregate_total", (("device", "0"), ("kind", "corrected")))] == 17
    assert values[("tpuwatch_device_remapped_rows", (("device", "1"), ("kind", "uncorrected")))] == 1
    assert values[("tpuwatch_device_memory_repair_pending", (("device", "1"),))] == 1
    assert values[("tpuwatch_device_pcie_replays_total", (("device", "0"),))] == 5
    assert values[("tpuwatch_device_memory_reserved_bytes", (("device", "1"),))] == 566231040
    assert values[("tpuwatch_device_throttle_active", (("device", "0"), ("reason", "sw_power_cap")))] == 1
    assert values[("tpuwatch_device_throttle_active", (("device", "0"), ("reason", "gpu_idle")))] == 0
    assert values[("tpuwatch_device_up", (("device", "2"),))] == 0
    retired = sorted(labels for name, labels in values if name == "tpuwatch_device_retired_pages")
    assert retired == [(("cause", "double_bit_ecc"), ("device", "3")), (("cause", "multiple_single_bit_ecc"),
                                                                         ("device", "3"))], "absent where unsupported"
    assert not any(labels == (("device", "2"),) for name, labels in values if name != "tpuwatch_device_up")


def test_a_call_that_never_returns_marks_only_that_gpu_unresponsive(nvml: FakeNvml) -> None:
    nvml.change(3, hang="nvmlDeviceGetPowerUsage")
    backend = NvidiaBackend(config(timeout=1.0))  # generous: the healthy GPUs must answer even on a busy CI host
    started = time.monotonic()
    readings = backend.read()
    assert time.monotonic() - started < 2.0
    assert [r.up for r in readings] == [True, True, False, False]
    assert 0.5 <= waited_seconds(readings[3].problem, "unresponsive: NVML nvmlDeviceGetPowerUsage") <= 1.0
    assert readings[3].pci == "0000:5d:00.0", "what was read before the hang names the GPU"
    threads = threading.active_count()
    again = backend.read()
    assert again[3].problem.startswith("unresponsive: NVML nvmlDeviceGetPowerUsage: an earlier call has not "
                                       "returned for ")
    assert again[0].up and again[0].memory_used_bytes == 42949672960
    assert threading.active_count() <= threads + 1, "a stuck GPU holds one thread, not one more per read"
    nvml.change(3, hang=None)
    # The released call finishes in its own thread; until it has, the lane is still busy.
    def answering() -> DeviceReading | None:
        reading = backend.read()[3]
        return reading if reading.up else None

    assert wait_until(answering, timeout=5, what="GPU 3 to answer again").power_watts == 68.0


def test_a_slow_gpu_is_read_within_the_deadline_and_reported_unresponsive_past_it(nvml: FakeNvml) -> None:
    nvml.change(1, slow={"nvmlDeviceGetTemperature": 300})
    readings = NvidiaBackend(config(timeout=3.0)).read()
    assert readings[1].up and readings[1].temperature_celsius == 33
    nvml.change(1, slow={"nvmlDeviceGetTemperature": 4000})
    started = time.monotonic()
    readings = NvidiaBackend(config(timeout=1.0)).read()
    assert time.monotonic() - started < 3.0
    assert 0.5 <= waited_seconds(readings[1].problem, "unresponsive: NVML nvmlDeviceGetTemperature") <= 1.0
    assert [r.up for r in readings] == [True, False, False, True]


def test_the_daemon_follows_a_gpu_that_is_lost_hangs_and_comes_back(nvml: FakeNvml, tmp_path: Path,
                                                                    start_daemon: Callable[..., DaemonProcess]) -> None:
    # The daemon is another process: nvidia-ml-py there finds the stand-in through LD_LIBRARY_PATH, and the
    # state file is rewritten under it.
    daemon = start_daemon({"interval": "2s", "collector_timeout": "2s", "canary": {"enabled": False},
                           "kernel_log": {"source": "none"}, "paths": {"sysfs": gpu_sysfs(tmp_path)},
                           "devices": {"backend": "nvidia", "nvidia": {"call_timeout": "1s"}}})
    daemon.wait_ready()

    def up() -> dict[str, float]:
        text = requests.get(f"{daemon.url}/metrics", timeout=5).text
        return {line.split('"')[1]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith("tpuwatch_device_up{")}

    wait_until(lambda: up() == {"0": 1, "1": 1, "2": 0, "3": 1}, timeout=30, what="the fixture's GPUs")
    nvml.change(0, lost=True)
    nvml.change(3, hang="nvmlDeviceGetPowerUsage")
    wait_until(lambda: up() == {"0": 0, "1": 1, "2": 0, "3": 0}, timeout=30, what="GPU 0 lost and GPU 3 hung")
    nvml.change(0, lost=False)
    nvml.release()
    wait_until(lambda: up() == {"0": 1, "1": 1, "2": 0, "3": 1}, timeout=30, what="both back")


def test_without_nvidia_ml_py_the_collector_fails_naming_the_extra() -> None:
    backend = NvidiaBackend(config(), module="tpuwatch_no_such_pynvml")
    guard = GuardedCollector(DeviceCollector(backend))
    guard.start()
    assert guard.finish(time.monotonic() + 5) is None
    assert guard.status.last_error == ("RuntimeError: NVML cannot be read: nvidia-ml-py is not installed "
                                       "(pip install 'tpuwatch[nvidia]')")
    assert collector_problems([guard]) == [f"collector devices failed: {guard.status.last_error}"]


def gpu_sysfs(root: Path) -> str:
    """A sysfs tree as on a Google Cloud A3 VM: one NVIDIA 3D controller, an NVSwitch bridge, and Google's gVNIC
    network card (vendor 0x1ae0, Google's like a TPU's, device 0x0042: the kernel's gve driver)."""
    for address, vendor, device, pci_class in (("0000:18:00.0", "0x10de", "0x2330", "0x030200"),
                                               ("0000:07:00.0", "0x10de", "0x22a3", "0x068000"),
                                               ("0000:00:04.0", "0x1ae0", "0x0042", "0x020000")):
        entry = root / "sys" / "bus" / "pci" / "devices" / address
        entry.mkdir(parents=True)
        for name, value in (("vendor", vendor), ("device", device), ("class", pci_class)):
            (entry / name).write_text(value + "\n")
    return str(root / "sys")


def test_auto_picks_nvidia_from_pci(tmp_path: Path) -> None:
    backend, why = select_backend(config(backend="auto", sysfs=gpu_sysfs(tmp_path)))
    assert isinstance(backend, NvidiaBackend)
    assert why == "auto: 1 nvidia PCI device(s) at 0000:18:00.0"


def test_check_reports_each_gpu_and_exits_unhealthy(nvml: FakeNvml, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({"paths": {"sysfs": gpu_sysfs(tmp_path)}, "devices": {"backend": "auto"}}))
    result = run_cli("check", "--json", "--config", str(path))
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["backend"] == "nvidia"
    assert [d["up"] for d in report["devices"]] == [True, True, False, True]
    assert report["devices"][0]["power_watts"] == 512.345
    assert report["devices"][0]["sources"]["power_watts"] == "nvml"
    assert report["devices"][2]["problem"] == "GPU is lost (nvmlDeviceGetHandleByIndex: GPU is lost)"



FAKE_SMI = """#!{python}
import json, os, sys
gpus = json.load(open(os.environ["FAKE_NVML_STATE"]))["gpus"]
if sys.argv[1:3] == ["-q", "-d"]:
    print("".join(f"GPU {{g['bus_id']}}\\n    Replays Since Reset : {{g['pcie_replays']}}\\n" for g in gpus))
    sys.exit(0)
query = sys.argv[1].split("=", 1)[1]
fields = {{"pci.bus_id": lambda g: g["bus_id"], "name": lambda g: g["name"],
          "memory.total": lambda g: g["memory_total"] >> 20, "memory.used": lambda g: g["memory_used"] >> 20,
          "ecc.errors.uncorrected.volatile.total": lambda g: g["ecc"]["uncorrected"][0] + {skew}}}
if query not in fields:
    print(f"Field \\"{{query}}\\" is not a valid field to query.")
    sys.exit(2)
for g in gpus:
    print(fields[query](g))
"""


@pytest.mark.parametrize("skew,exit_code", [(0, 0), (1, 1)])
def test_the_hardware_check_prints_both_sides_and_flags_a_mismatch(nvml: FakeNvml, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch, skew: int,
                                                                   exit_code: int) -> None:
    nvml.change(2, lost=False)
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(FAKE_SMI.format(python=sys.executable, skew=skew))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    script = Path(__file__).parent / "hardware" / "nvidia_check.py"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == exit_code, done.stdout + done.stderr
    total = [line.split() for line in done.stdout.splitlines() if line.startswith("  memory_total_bytes ")]
    assert total == [["memory_total_bytes", "81559", "81559", "81559"]] * 4, "backend, check --json, nvidia-smi"
    assert ("  MISMATCH" in done.stdout) == bool(skew)
    assert done.stdout.rstrip().endswith(f"4 GPU(s), {4 * skew} mismatch(es) in values that should agree exactly")


def test_running_processes_device_files_and_plugin_ids_come_from_nvml(nvml: FakeNvml, tmp_path: Path) -> None:
    procfs = tmp_path / "proc"
    (procfs / "4101").mkdir(parents=True)
    (procfs / "4101" / "comm").write_text("python3\n")
    backend = NvidiaBackend(Config(paths=Paths(procfs=str(procfs)), devices=DevicesConfig(backend="nvidia")))
    first, second, lost, fourth = backend.read()
    assert first.processes == (ProcessUse(4101, "python3", 40802189312.0), ProcessUse(4102, "?", 2147483648.0))
    assert second.processes == (ProcessUse(4201, "?", 1048576.0),), "in both lists once; NOT_AVAILABLE is absent"
    assert fourth.processes is None, "not supported: not looked at, not 'no processes'"
    assert (first.device_files, first.plugin_ids) == (
        ("nvidia0",), (("nvidia.com/gpu", "GPU-0b1c7f3e-5a2d-4e6f-9b0c-1d2e3f4a5b6c"), ("nvidia.com/gpu", "0")))
    assert lost.processes is None and lost.links is None


def _links_down(samples: list[Any]) -> list[dict[str, str]]:
    return [dict(s.labels) for s in samples if s.name == "tpuwatch_device_nvlink_up" and s.value == 0]


def test_nvlinks_report_state_and_counters_and_only_links_seen_active(nvml: FakeNvml) -> None:
    backend = NvidiaBackend(config())
    first, second, _, fourth = backend.read()
    assert first.links is not None and [link.link for link in first.links] == list(range(18))
    assert first.links[3].errors == {"replay": 4.0, "recovery": 1.0, "crc_flit": 12.0, "crc_data": 0.0,
                                     "ecc_data": 0.0}
    assert second.links is not None and (second.links[1].link, second.links[1].up) == (1, False)
    assert fourth.links is None, "no NVLink at all"
    collector = DeviceCollector(backend)
    exported = {(dict(s.labels)["device"], dict(s.labels)["link"]) for s in collector.collect()
                if s.name == "tpuwatch_device_nvlink_up"}
    assert ("1", "0") in exported and ("1", "1") not in exported, \
        "link 1 was never active: an unused port, not a link down"
    nvml.change(1, nvlinks=[0, 0] + [1] * 16)
    samples = collector.collect()
    assert _links_down(samples) == [{"device": "1", "link": "0"}]
    errors = {(dict(s.labels)["link"], dict(s.labels)["kind"]): s.value for s in samples
              if s.name == "tpuwatch_device_nvlink_errors_total" and dict(s.labels)["device"] == "0"}
    assert errors[("3", "crc_flit")] == 12


def test_a_link_down_stays_down_when_tpuwatch_restarts_in_the_same_boot(nvml: FakeNvml, tmp_path: Path) -> None:
    # Before, the links seen active lived in memory only: a restart (an upgrade) made a down link an unused
    # port again, its series vanished and AcceleratorLinkDown resolved while the link was still down.
    state = tmp_path / "devices" / "seen.json"
    DeviceCollector(NvidiaBackend(config()), seen=SeenThisBoot("nvidia", state, "boot-1")).collect()
    nvml.change(1, nvlinks=[0, 0] + [1] * 16)
    restarted = DeviceCollector(NvidiaBackend(config()), seen=SeenThisBoot("nvidia", state, "boot-1"))
    assert _links_down(restarted.collect()) == [{"device": "1", "link": "0"}]
    rebooted = DeviceCollector(NvidiaBackend(config()), seen=SeenThisBoot("nvidia", state, "boot-2"))
    assert _links_down(rebooted.collect()) == [], "after a reboot the links train afresh"
    state.write_text('{"boot_id": "boot-2", "backend": "nvidia", "links": {"0000:2a:00.0": [0, 1]}}')  # bad shape
    unfit = DeviceCollector(NvidiaBackend(config()), seen=SeenThisBoot("nvidia", state, "boot-2"))
    assert _links_down(unfit.collect()) == []


def test_a_gpu_gone_from_the_bus_stays_down_when_tpuwatch_restarts_in_the_same_boot(nvml: FakeNvml,
                                                                                       tmp_path: Path) -> None:
    state = tmp_path / "devices" / "seen.json"
    nvml.change(2, lost=False)
    DeviceCollector(NvidiaBackend(config()), seen=SeenThisBoot("nvidia", state, "boot-1")).collect()
    data = nvml.read()
    data["gpus"].pop()  # the last GPU is no longer enumerated (removed after it fell off the bus)
    nvml.write(data)
    gone = str(len(data["gpus"]))

    saved = state.read_bytes()

    def up(backend: str, boot: str) -> dict[str, float]:
        state.write_bytes(saved)
        collector = DeviceCollector(NvidiaBackend(config()), seen=SeenThisBoot(backend, state, boot))
        return {dict(s.labels)["device"]: s.value for s in collector.collect() if s.name == "tpuwatch_device_up"}

    assert up("nvidia", "boot-1")[gone] == 0
    data["gpus"].pop(0)  # and the first one: NVML numbers the rest from 0 again
    nvml.write(data)
    assert up("nvidia", "boot-1") == {"0": 1, "1": 1, gone: 0}, \
        "a chip whose number another has now is forgotten, never reported down under another's number"
    assert gone not in up("nvidia", "boot-2"), "after a reboot only what is there counts"
    assert gone not in up("sim", "boot-1"), "another backend's chips are not these"

def test_gpu_processes_are_named_by_pod_and_capped(nvml: FakeNvml, tmp_path: Path) -> None:
    uuid = "GPU-0b1c7f3e-5a2d-4e6f-9b0c-1d2e3f4a5b6c"
    socket = tmp_path / "kubelet.sock"
    kubelet = Kubelet([("ml", "trainer-0", "jax", "nvidia.com/gpu", [uuid])])
    server = serve(kubelet, socket)
    procfs = tmp_path / "proc"
    for pid in (4101, 4102):
        (procfs / str(pid)).mkdir(parents=True)
        (procfs / str(pid) / "comm").write_text("python3\n")
    (procfs / "4101" / "cgroup").write_text(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod9f1b6a3e_4c2d_4f6e_8a1b_2c3d4e5f6a7b.slice/"
        "cri-containerd-3c6f0e3b0f2a6d7c8e9f0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d.scope\n")
    lookup = PodLookup(str(procfs), str(socket), refresh_every=0.0)
    collector = DeviceCollector(NvidiaBackend(Config(paths=Paths(procfs=str(procfs)),
                                                     devices=DevicesConfig(backend="nvidia"))),
                                pods=lookup, max_processes=1)

    def memory() -> list[dict[str, str]] | None:
        found = [{**dict(s.labels), "value": s.value} for s in collector.collect()
                 if s.name == "tpuwatch_process_device_memory_used_bytes" and dict(s.labels)["device"] == "0"]
        return found if found and found[0]["pod"] else None

    try:
        assert wait_until(memory, timeout=10, what="GPU 0's process named by pod") == [
            {"device": "0", "pid": "4101", "command": "python3", "namespace": "ml", "pod": "trainer-0",
             "container": "jax", "value": 40802189312.0}], "capped at one: the one holding the most memory"
        counts = {dict(s.labels)["device"]: s.value for s in collector.collect()
                  if s.name == "tpuwatch_device_processes"}
        assert counts == {"0": 2, "1": 1}, "the count is not capped; GPU 3 does not say; lost GPU 2 neither"
    finally:
        lookup.close()
        server.stop(grace=None)


def test_a_hostile_seen_file_is_read_for_what_fits_and_never_crashes(nvml: FakeNvml, tmp_path: Path) -> None:
    state = tmp_path / "seen.json"
    state.write_text(json.dumps({"boot_id": "b", "backend": "nvidia",
                                 "chips": {"\u00b2": {"chip": "x", "pci": ""}, "9": {"chip": "gone", "pci": ""}},
                                 "links": {"0000:2a:00.0": "\u00b2,1,99999,-3,0"}}))
    samples = DeviceCollector(NvidiaBackend(config()), seen=SeenThisBoot("nvidia", state, "b")).collect()
    up = {dict(s.labels)["device"]: s.value for s in samples if s.name == "tpuwatch_device_up"}
    assert up["9"] == 0 and "\u00b2" not in up
