"""devices.expected: how many chips a host should have, and naming those it does not report."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from tpuwatch.alerting.rules import CompiledRule, default_rules_text, parse_rules
from tpuwatch.alerting.tracker import Tracker
from tpuwatch.config import Config, DevicesConfig, NvidiaConfig, Paths, SimConfig
from tpuwatch.devices import DeviceReading
from tpuwatch.devices.collector import DeviceCollector
from tpuwatch.devices.expected import Expectation, chips_from_environment, expect, missing, missing_samples
from tpuwatch.devices.nvidia import NvidiaBackend
from tpuwatch.devices.sim import SimBackend
from tpuwatch.samples import sample

from conftest import SIM_FAST, DaemonProcess, run_cli, wait_until
from fakenvml import FakeNvml


@pytest.mark.parametrize("environ,expected", [
    ({"TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1"}, (4, "TPU_CHIPS_PER_HOST_BOUNDS=2,2,1")),
    ({"CHIPS_PER_HOST_BOUNDS": "'2,4,1'"}, (8, "CHIPS_PER_HOST_BOUNDS=2,4,1")),  # tpu-env writes values quoted
    # The device plugin's per-host bounds win over a slice name that could be two 4-chip hosts.
    ({"TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1", "TPU_ACCELERATOR_TYPE": "v5litepod-8"},
     (4, "TPU_CHIPS_PER_HOST_BOUNDS=2,2,1")),
    ({"TPU_ACCELERATOR_TYPE": "v4-8"}, (4, "TPU_ACCELERATOR_TYPE=v4-8")),  # TensorCores: 2 per chip
    ({"TPU_ACCELERATOR_TYPE": "v3-32"}, (4, "TPU_ACCELERATOR_TYPE=v3-32")),  # 16 chips: 4 per host
    ({"TPU_ACCELERATOR_TYPE": "v5p-8"}, (4, "TPU_ACCELERATOR_TYPE=v5p-8")),
    ({"ACCELERATOR_TYPE": "v5litepod-8"}, (8, "ACCELERATOR_TYPE=v5litepod-8")),  # chips
    ({"TPU_ACCELERATOR_TYPE": "v5litepod-1"}, (1, "TPU_ACCELERATOR_TYPE=v5litepod-1")),
    ({"TPU_ACCELERATOR_TYPE": "v6e-16"}, (4, "TPU_ACCELERATOR_TYPE=v6e-16")),
    ({"TPU_ACCELERATOR_TYPE": "tpu7x-8"}, None),  # not a naming tpuwatch knows: left to the PCI count
    ({"TPU_ACCELERATOR_TYPE": "v4-1"}, None),
    ({"TPU_CHIPS_PER_HOST_BOUNDS": "0,2,1"}, None),
    ({"TPU_ACCELERATOR_TYPE": "v4-8; rm -rf /"}, None),
    ({}, None),
])
def test_the_chips_of_one_host_from_the_environment(environ: dict[str, str],
                                                    expected: tuple[int, str] | None) -> None:
    assert chips_from_environment(environ) == expected


def test_config_sim_and_off_choose_the_expectation() -> None:
    assert expect(Config(devices=DevicesConfig(expected="8")), "tpu") == Expectation(8, "config",
                                                                                     "devices.expected is 8")
    assert expect(Config(devices=DevicesConfig(expected="off")), "nvidia") is None
    sim = Config(devices=DevicesConfig(backend="sim", sim=SimConfig(count=3)))
    assert expect(sim, "sim") == Expectation(3, "simulator", "devices.sim.count is 3")
    assert expect(Config(), "tpu", {"TPU_ACCELERATOR_TYPE": "v4-8"}) == Expectation(
        4, "accelerator_type", "TPU_ACCELERATOR_TYPE=v4-8: 4 chip(s) on this host")
    assert expect(Config(paths=Paths(sysfs="/nonexistent")), "tpu", {}) is None, "nothing on the bus: no count"


def test_a_chip_still_reported_down_is_not_missing() -> None:
    expected = Expectation(4, "pci", "4 at start", ("0000:00:04.0", "0000:00:05.0", "0000:00:06.0", "0000:00:07.0"))
    readings = [DeviceReading("0", "v5e", "0000:00:04.0"), DeviceReading("1", "v5e", "0000:00:05.0", up=False)]
    assert missing(expected, readings) == (["0000:00:06.0", "0000:00:07.0"], 0)
    # A chip lost before its address was read: which of the two unclaimed functions is missing is unknown.
    lost = [*readings, DeviceReading("2", "unknown", None, up=False)]
    assert missing(expected, lost) == ([], 1)
    by_count = Expectation(8, "accelerator_type", "8 chips")
    assert missing(by_count, readings) == ([], 6)
    assert {(s.name, s.labels, s.value) for s in missing_samples(by_count, readings * 4)} == {
        ("tpuwatch_devices_expected", (("source", "accelerator_type"),), 8),
        ("tpuwatch_devices_missing", (("pci", ""),), 0)}, "nothing missing: the series says 0"


BUS = ("0000:18:00.0", "0000:2a:00.0", "0000:3b:00.0", "0000:5d:00.0", "0000:6c:00.0")


def gpu_sysfs(root: Path, count: int) -> str:
    """NVIDIA 3D controllers on the bus (H100 SXM, device 0x2330): h100x4.json's four and a fifth."""
    for address in BUS[:count]:
        entry = root / "sys" / "bus" / "pci" / "devices" / address
        entry.mkdir(parents=True)
        for name, value in (("vendor", "0x10de"), ("device", "0x2330"), ("class", "0x030200")):
            (entry / name).write_text(value + "\n")
    return str(root / "sys")


@pytest.fixture
def answering(nvml: FakeNvml) -> FakeNvml:
    """The four GPUs of h100x4.json, every one answering: the fifth on the bus is the one missing."""
    nvml.change(2, lost=False)
    return nvml


def test_a_gpu_on_the_bus_that_nvml_does_not_see_is_named_missing(answering: FakeNvml, tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    # Five GPUs on the bus; NVML answers for the four of h100x4.json (18, 2a, 3b, 5d): 6c failed to initialise.
    config = Config(paths=Paths(sysfs=gpu_sysfs(tmp_path, 5)),
                    devices=DevicesConfig(backend="nvidia", nvidia=NvidiaConfig(call_timeout=1.0)))
    expected = expect(config, "nvidia")
    assert expected is not None and (expected.count, expected.source) == (5, "pci")
    collector = DeviceCollector(NvidiaBackend(config), expected)
    with caplog.at_level(logging.ERROR):
        samples = collector.collect()
    found = {(s.name, s.labels): s.value for s in samples if s.name.startswith("tpuwatch_devices_")}
    assert found == {("tpuwatch_devices_expected", (("source", "pci"),)): 5,
                     ("tpuwatch_devices_missing", (("pci", "0000:6c:00.0"),)): 1}
    assert collector.missing_problem == (
        "1 of 5 expected accelerator(s) missing (5 accelerator PCI function(s) at start; 4 reported): "
        "pci 0000:6c:00.0 (on the bus, not answering)")
    assert collector.missing_problem in [r.getMessage() for r in caplog.records], "logged when it appears"
    caplog.clear()
    collector.collect()
    assert caplog.records == [], "and only then"
    rules = [CompiledRule(r) for r in parse_rules(default_rules_text(), "built-in")
             if r.alert == "AcceleratorsMissing"]
    fired = [c for r in rules for c in r.evaluate(samples, Tracker(), 1e9, {"host": "h"})]
    assert [(c.labels["pci"], c.annotations["summary"]) for c in fired] == [
        ("0000:6c:00.0", "1 expected accelerator(s) missing: PCI 0000:6c:00.0 does not answer")]


def test_check_names_the_missing_chips(answering: FakeNvml, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({"paths": {"sysfs": gpu_sysfs(tmp_path, 5)}, "devices": {"backend": "auto"},
                                "kernel_log": {"source": "none", "previous_boot": False}}))
    result = run_cli("check", "--json", "--config", str(path))
    report = json.loads(result.stdout)
    assert result.returncode == 1
    assert [p for p in report["problems"] if "expected accelerator" in p] == [
        "1 of 5 expected accelerator(s) missing (5 accelerator PCI function(s) at start; 4 reported): "
        "pci 0000:6c:00.0 (on the bus, not answering)"]


def test_a_simulated_host_short_of_its_configured_count_is_a_health_problem() -> None:
    config = Config(devices=DevicesConfig(backend="sim", expected="6", sim=SimConfig(count=4)))
    expected = expect(config, "sim")
    assert expected is not None
    collector = DeviceCollector(SimBackend(config.devices.sim), expected)
    samples = collector.collect()
    assert sample("tpuwatch_devices_missing", 2, pci="") in samples
    assert collector.missing_problem == ("2 of 6 expected accelerator(s) missing (devices.expected is 6; "
                                         "4 reported): 2 not on the PCI bus or not enumerated")


def test_the_daemon_shows_missing_chips_and_the_previous_boots_crash(
        start_daemon: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    pstore = tmp_path / "sys" / "fs" / "pstore"
    pstore.mkdir(parents=True)
    shutil.copyfile(Path(__file__).parent / "testdata" / "kernel_log" / "pstore" / "mce" /
                    "dmesg-erst-7212345678901234567", pstore / "dmesg-erst-7212345678901234567")
    config = {**SIM_FAST, "paths": {"sysfs": str(tmp_path / "sys")},
              "kernel_log": {"source": "none", "pstore_archive": None},
              "devices": {"backend": "sim", "expected": 6, "sim": {"count": 4}}}
    daemon = start_daemon(config)
    daemon.wait_ready()

    def health() -> dict[str, Any] | None:
        report = requests.get(f"{daemon.url}/healthz", timeout=5).json()
        checks = report["checks"]
        return report if checks["devices"]["problems"] and checks["previous_boot"]["status"] == "crashed" else None

    report = wait_until(health, timeout=30, what="/healthz to show both")
    assert report["checks"]["devices"]["problems"] == [
        "2 of 6 expected accelerator(s) missing (devices.expected is 6; 4 reported): 2 not on the PCI bus or not "
        "enumerated"]
    (event,) = report["checks"]["previous_boot"]["events"]
    assert (event["rule"], event["severity"], event["fields"]["kind"]) == ("previous_boot_panic", "critical", "mce")
    # /healthz reads the collectors as they are; /metrics is rendered at the end of the cycle that read them.
    wanted = ('tpuwatch_devices_missing{pci=""} 2.0', 'tpuwatch_devices_expected{source="config"} 6.0',
              'tpuwatch_previous_boot_crash{kind="mce",source="pstore"} 1.0',
              'tpuwatch_kernel_events_total{device="",rule="previous_boot_panic",severity="critical"} 1.0')
    wait_until(lambda: all(w in requests.get(f"{daemon.url}/metrics", timeout=5).text for w in wanted),
               what="both in /metrics")
