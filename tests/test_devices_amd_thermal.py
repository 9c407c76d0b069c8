"""AMD temperatures: every sensor amdgpu shows (edge, junction, mem) judged against its own limit
(``tempN_crit``, else ``tempN_emergency`` less the CTF offset, else the driver's default), exported per sensor,
and the built-in AcceleratorTemperatureHigh naming the hot one.  Trees: tests/testdata/amd/ (composed, laid out
as amdgpu_pm.c lays out its hwmon files), changed per test."""

from __future__ import annotations

from pathlib import Path

from test_alerting_rules import HOST, T0
from test_devices_amd import config, gpu_dir, host

from tpuwatch.alerting.rules import CompiledRule, default_rules_text, parse_rules, tracks
from tpuwatch.alerting.state import AlertBook
from tpuwatch.alerting.tracker import Tracker
from tpuwatch.config import Paths
from tpuwatch.devices.amd import AmdBackend
from tpuwatch.devices.amd_thermal import DEFAULT_LIMIT_C, hottest, parse_temperatures
from tpuwatch.devices.base import DeviceReading, reading_samples
from tpuwatch.health import device_problems
from tpuwatch.samples import Sample

SENSOR = "tpuwatch_device_sensor_temperature_celsius"
LIMIT = "tpuwatch_device_temperature_limit_celsius"
MARGIN = "tpuwatch_device_temperature_margin_celsius"


def hwmon(paths: Paths, **files: float | None) -> Path:
    """The MI210's hwmon directory with ``files`` set (millidegrees from °C) or removed (None)."""
    directory = gpu_dir(paths, "0000:c1:00.0") / "hwmon" / "hwmon2"
    for name, celsius in files.items():
        if celsius is None:
            (directory / name).unlink(missing_ok=True)
        else:
            (directory / name).write_text(f"{round(celsius * 1000)}\n")
    return directory


def mi210(tmp_path: Path, **files: float | None) -> Paths:
    """An MI210 (edge, junction, mem, each with temp*_crit) with its hwmon files changed as ``files`` says."""
    paths = host(tmp_path, "mi210")
    hwmon(paths, **files)
    return paths


def samples_of(paths: Paths) -> tuple[DeviceReading, list[Sample]]:
    (reading,) = AmdBackend(config(paths)).read()
    return reading, reading_samples(reading, "amd")


def series(samples: list[Sample], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {s.labels: s.value for s in samples if s.name == name}


def temperature_alerts(samples: list[Sample]) -> list[tuple[str, dict[str, str], dict[str, str]]]:
    """(severity, labels, annotations) of the AcceleratorTemperatureHigh alerts the built-in rules fire when the
    samples stay as they are for 10 minutes."""
    rules = [CompiledRule(r) for r in parse_rules(default_rules_text(), "built-in")]
    tracker, book = Tracker(), AlertBook()
    windows = tracks(r.rule for r in rules)
    for t in (0, 10, 400, 600):
        tracker.observe(samples, windows, T0 + t)
        book.apply([c for r in rules for c in r.evaluate(samples, tracker, T0 + t, HOST)], set(), T0 + t)
    return [(a.labels["severity"], a.labels, a.annotations) for a in book.alerts.values()
            if a.state == "firing" and a.labels["alertname"] == "AcceleratorTemperatureHigh"]


# --- parsing ---------------------------------------------------------------------------------------------

def test_each_sensor_takes_its_limit_from_crit_else_emergency_else_the_default() -> None:
    sensors = parse_temperatures({
        "temp1_label": "edge\n", "temp1_input": "60000\n", "temp1_crit": "100000\n", "temp1_emergency": "105000\n",
        "temp2_label": "junction\n", "temp2_input": "100000\n", "temp2_emergency": "110000\n",
        "temp3_label": "mem\n", "temp3_input": "80000\n", "temp3_crit": "n/a\n"})
    assert list(sensors) == ["edge", "junction", "mem"]
    assert sensors["edge"].limit == (100.0, "temp1_crit") and sensors["edge"].margin == 40.0
    assert sensors["edge"].limits == {"crit": 100.0, "emergency": 105.0}
    assert sensors["junction"].limit == (105.0, "temp2_emergency - 5") and sensors["junction"].margin == 5.0
    assert sensors["mem"].limit == (DEFAULT_LIMIT_C, "default") and sensors["mem"].limits == {}
    assert hottest(sensors) is sensors["junction"]
    assert parse_temperatures({"temp1_label": "edge", "temp1_input": "hot", "temp1_crit": "100000"}) == {}


# --- MI210: junction hot under a cool edge ------------------------------------------------------------------

def test_a_junction_near_its_own_crit_warns_under_a_cool_edge_and_every_sensor_is_exported(tmp_path: Path) -> None:
    paths = mi210(tmp_path, temp1_input=60, temp1_crit=100, temp2_input=100, temp2_crit=105, temp2_emergency=110,
                  temp3_input=80, temp3_crit=95)
    reading, samples = samples_of(paths)
    assert reading.temperature_celsius == 60.0, "the chip's temperature stays the edge sensor, as before"
    assert series(samples, SENSOR) == {(("device", "0"), ("sensor", "edge")): 60.0,
                                       (("device", "0"), ("sensor", "junction")): 100.0,
                                       (("device", "0"), ("sensor", "mem")): 80.0}
    assert series(samples, LIMIT) == {(("device", "0"), ("kind", "crit"), ("sensor", "edge")): 100.0,
                                      (("device", "0"), ("kind", "crit"), ("sensor", "junction")): 105.0,
                                      (("device", "0"), ("kind", "emergency"), ("sensor", "junction")): 110.0,
                                      (("device", "0"), ("kind", "crit"), ("sensor", "mem")): 95.0}
    assert series(samples, MARGIN)[(("device", "0"), ("sensor", "junction"))] == 5.0
    ((severity, labels, annotations),) = temperature_alerts(samples)  # the case: 100 °C under a 60 °C edge
    assert (severity, labels["sensor"]) == ("warning", "junction") and "within 5 °C" in annotations["summary"]
    assert not [p for p in device_problems([reading]) if "temperature" in p]
    hwmon(paths, temp2_input=99)
    assert temperature_alerts(samples_of(paths)[1]) == []  # 6 °C under its limit: quiet


def test_a_junction_over_its_crit_fires_naming_the_junction_under_a_cool_edge(tmp_path: Path) -> None:
    paths = mi210(tmp_path, temp1_input=60, temp1_crit=100, temp2_input=107, temp2_crit=105, temp3_input=80)
    reading, samples = samples_of(paths)
    assert reading.temperature_celsius == 60.0
    alerts = temperature_alerts(samples)
    assert sorted((a[0], a[1]["sensor"]) for a in alerts) == [("critical", "junction"), ("warning", "junction")]
    ((severity, labels, annotations),) = [a for a in alerts if a[0] == "critical"]
    assert labels["device"] == "0"
    assert "junction" in annotations["summary"] and "junction" in annotations["description"]
    assert "margin -2 °C" in annotations["description"]
    assert [p for p in device_problems([reading]) if "temperature" in p] == [
        "device 0 (MI210, pci 0000:c1:00.0): junction temperature 107 °C at or over its limit 105 °C (temp2_crit)"]


def test_memory_over_its_crit_fires_naming_mem(tmp_path: Path) -> None:
    paths = mi210(tmp_path, temp1_input=55, temp2_input=90, temp3_input=96, temp3_crit=95)
    assert sorted((a[0], a[1]["sensor"]) for a in temperature_alerts(samples_of(paths)[1])) == [
        ("critical", "mem"), ("warning", "mem")]  # junction, 9 °C under its limit, stays quiet


# --- cards without limits, or with edge alone ---------------------------------------------------------------

def test_a_card_without_crit_files_is_judged_against_the_default_and_exports_no_limit(tmp_path: Path) -> None:
    no_limits = {f"temp{n}_{kind}": None for n in (1, 2, 3) for kind in ("crit", "emergency")}
    paths = mi210(tmp_path, temp1_input=60, temp2_input=93, temp3_input=80, **no_limits)
    reading, samples = samples_of(paths)
    assert series(samples, LIMIT) == {}, "a limit the hardware does not show is not exported"
    assert series(samples, MARGIN)[(("device", "0"), ("sensor", "junction"))] == DEFAULT_LIMIT_C - 93
    assert temperature_alerts(samples) == []
    hwmon(paths, temp2_input=DEFAULT_LIMIT_C + 1)
    reading, samples = samples_of(paths)
    assert sorted((severity, labels["sensor"]) for severity, labels, _ in temperature_alerts(samples)) == [
        ("critical", "junction"), ("warning", "junction")]
    assert any("limit 99 °C (default)" in p for p in device_problems([reading]))


def test_a_card_with_edge_alone_works_as_before(tmp_path: Path) -> None:
    paths = mi210(tmp_path, temp1_input=88, temp2_input=None, temp2_label=None, temp2_crit=None,
                  temp3_input=None, temp3_label=None, temp3_crit=None)
    reading, samples = samples_of(paths)
    assert reading.temperature_celsius == 88.0
    assert series(samples, "tpuwatch_device_temperature_celsius") == {(("device", "0"),): 88.0}
    assert series(samples, SENSOR) == {(("device", "0"), ("sensor", "edge")): 88.0}, "absent sensors are absent"
    alerts = temperature_alerts(samples)
    assert [(severity, "sensor" in labels) for severity, labels, _ in alerts] == [("warning", False)], \
        "the chip rule fires over 85 °C as before; the edge is 12 °C under its crit"


def test_one_sensor_chips_export_no_per_sensor_series() -> None:
    """NVIDIA and TPU readings carry one temperature and no sensors: their series are as before."""
    names = {s.name for s in reading_samples(DeviceReading(device="0", chip="h100", temperature_celsius=70), "nvidia")}
    assert names == {"tpuwatch_device_info", "tpuwatch_device_up", "tpuwatch_device_temperature_celsius"}
