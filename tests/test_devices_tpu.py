"""TPU backend: sysfs/procfs/dev trees in temp dirs and a real RuntimeMetricService on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format, text_format
from tpu_info.proto import tpu_metric_service_pb2 as pb2
from tpu_info.proto import tpu_metric_service_pb2_grpc as pb2_grpc

from tpuwatch.config import Config, DevicesConfig, HostConfig, Paths, TpuConfig
from tpuwatch.devices import DeviceCollector, select_backend
from tpuwatch.devices.libtpu import RUNTIME_METRICS, MalformedMetric, parse_metric, values_by_chip
from tpuwatch.devices.pci import discover_tpus, read_hwmon
from tpuwatch.devices.tpu import TpuBackend
from tpuwatch.health import device_problems

from conftest import free_port, run_cli, wait_until

RUNTIME = Path(__file__).parent / "testdata" / "devices" / "runtime"
GIB = 1 << 30
SPECS = {spec.name: spec for spec in RUNTIME_METRICS}

# PCI device id and whether the chip is reached through vfio (else /dev/accelN).
GENERATIONS = {"v4": ("0x005e", False), "v5e": ("0x0063", True), "v5p": ("0x0062", True), "v6e": ("0x006f", True)}


# --- a host tree: sysfs, procfs, dev ---------------------------------------------------------------

def make_host(root: Path, generation: str, chips: int, first_group: int = 10) -> Paths:
    """A sysfs/dev tree of ``chips`` TPU chips (plus an unrelated NIC), as the kernel lays it out."""
    device_id, vfio = GENERATIONS[generation]
    sysfs, dev = root / "sys", root / "dev"
    (dev / "vfio").mkdir(parents=True)
    add_pci(sysfs, "0000:00:03.0", "0x1af4", "0x1000", "0x020000")  # virtio-net: not a TPU
    for i in range(chips):
        entry = add_pci(sysfs, f"0000:00:{i + 4:02x}.0", "0x1ae0", device_id, "0x120000")
        if vfio:
            group = sysfs / "kernel" / "iommu_groups" / str(first_group + i)
            group.mkdir(parents=True)
            (entry / "iommu_group").symlink_to(group)
            (dev / "vfio" / str(first_group + i)).write_text("")
        else:
            accel = entry / "accel" / f"accel{i}"
            accel.mkdir(parents=True)
            (accel / "status").write_text("ALIVE\n")
            (accel / "reset_count").write_text(f"{i}\n")
            (dev / f"accel{i}").write_text("")
    return Paths(sysfs=str(sysfs), procfs="/proc", dev=str(dev))


def add_pci(sysfs: Path, address: str, vendor: str, device: str, pci_class: str) -> Path:
    entry = sysfs / "bus" / "pci" / "devices" / address
    entry.mkdir(parents=True)
    for name, value in (("vendor", vendor), ("device", device), ("class", pci_class),
                        ("subsystem_device", "0x0000")):
        (entry / name).write_text(value + "\n")
    return entry


def make_config(paths: Paths, addresses: list[str], timeout: float = 1.0, backend: str = "tpu") -> Config:
    return Config(paths=paths, host=HostConfig(holder_scan_interval=1.0),
                  devices=DevicesConfig(backend=backend, tpu=TpuConfig(metrics_addr=addresses, call_timeout=timeout)))


# --- a real RuntimeMetricService ------------------------------------------------------------------

class Runtime(pb2_grpc.RuntimeMetricServiceServicer):
    """libtpu's metric service as tests need it: answers from a host file, or a chosen failure."""

    def __init__(self, host: str | None = None, mode: str = "ok") -> None:
        self.mode = mode
        self.release = threading.Event()
        self.answers = json.loads((RUNTIME / f"{host}.json").read_text()) if host else {}

    def GetRuntimeMetric(self, request: Any, context: Any) -> Any:
        if self.mode == "unavailable":
            context.abort(grpc.StatusCode.UNAVAILABLE, "TPU runtime is not initialized")
        if self.mode == "slow":
            self.release.wait(30)
        if request.metric_name not in self.answers:
            context.abort(grpc.StatusCode.NOT_FOUND, f"metric {request.metric_name} not supported")
        return json_format.ParseDict(self.answers[request.metric_name], pb2.MetricResponse())


@pytest.fixture
def serve() -> Iterator[Any]:
    """Start RuntimeMetricService servers on localhost with local credentials, like libtpu's."""
    servers: list[tuple[Any, Runtime]] = []

    def start(runtime: Runtime, raw: bytes | None = None) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        if raw is None:
            pb2_grpc.add_RuntimeMetricServiceServicer_to_server(runtime, server)
        else:  # answers bytes that are not a MetricResponse at all
            handler = grpc.unary_unary_rpc_method_handler(lambda request, context: raw,
                                                          request_deserializer=None, response_serializer=None)
            server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
                "tpu.monitoring.runtime.RuntimeMetricService", {"GetRuntimeMetric": handler}),))
        port = free_port()
        server.add_secure_port(f"localhost:{port}", grpc.local_server_credentials())
        server.start()
        servers.append((server, runtime))
        return f"localhost:{port}"

    yield start
    for server, runtime in servers:
        runtime.release.set()
        server.stop(grace=None)


# --- pure parts -----------------------------------------------------------------------------------

def response(name: str, *metrics: str) -> Any:
    text = f'metric {{ name: "{name}" ' + " ".join(f"metrics {{ {m} }}" for m in metrics) + " }"
    return text_format.Parse(text, pb2.MetricResponse())


def test_parse_metric_reads_int_attributes_and_device_ordinals() -> None:
    usage = response("tpu.runtime.hbm.memory.usage.bytes",
                     'attribute { key: "device-id" value { int_attr: 1 } } gauge { as_int: 2048 }',
                     'attribute { key: "device-id" value { int_attr: 0 } } gauge { as_int: 1024 }')
    assert parse_metric(usage, SPECS["tpu.runtime.hbm.memory.usage.bytes"]) == {0: 1024.0, 1: 2048.0}
    queue = response("hlo.queue.size.gauge",
                     'attribute { value { kvlist_attr { attributes { key: "core_type" value { string_attr: "tc" } }'
                     ' attributes { key: "device_ordinal" value { string_attr: "3" } } } } } gauge { as_int: 5 }')
    assert parse_metric(queue, SPECS["hlo.queue.size.gauge"]) == {3: 5.0}
    duty = response("tpu.runtime.tensorcore.dutycycle.percent",
                    'attribute { key: "device-id" value { int_attr: 0 } } gauge { as_double: 87.5 }')
    assert parse_metric(duty, SPECS["tpu.runtime.tensorcore.dutycycle.percent"]) == {0: 0.875}


@pytest.mark.parametrize("metric,reason", [
    ('attribute { key: "device-id" value { int_attr: 0 } } gauge { as_string: "lots" }', "gauge holds as_string"),
    ('attribute { key: "device-id" value { string_attr: "zero" } } gauge { as_int: 1 }', "device attribute is"),
    ('gauge { as_int: 1 }', "device attribute is missing"),
    (('attribute { value { kvlist_attr { attributes { key: "device_ordinal" value { string_attr: "tc0" } } } } }'
      ' gauge { as_int: 1 }'), "device_ordinal is string_attr 'tc0'"),
    ('attribute { key: "device-id" value { int_attr: 0 } }', "measure is missing"),
])
def test_parse_metric_refuses_malformed_answers(metric: str, reason: str) -> None:
    with pytest.raises(MalformedMetric, match=reason):
        parse_metric(response("hlo.queue.size.gauge", metric), SPECS["hlo.queue.size.gauge"])


def test_parse_metric_refuses_duplicates_and_answers_for_another_metric() -> None:
    entry = 'attribute { key: "device-id" value { int_attr: 0 } } gauge { as_int: 1 }'
    with pytest.raises(MalformedMetric, match="appears twice"):
        parse_metric(response("hlo.queue.size.gauge", entry, entry), SPECS["hlo.queue.size.gauge"])
    with pytest.raises(MalformedMetric, match="answer is for 'other'"):
        parse_metric(response("other", entry), SPECS["hlo.queue.size.gauge"])


def test_two_core_chips_fold_memory_per_chip_but_not_duty_cycle() -> None:
    memory, duty = SPECS["tpu.runtime.hbm.memory.usage.bytes"], SPECS["tpu.runtime.tensorcore.dutycycle.percent"]
    assert values_by_chip({0: 1.0, 1: 2.0, 2: 4.0, 3: 8.0}, memory, cores_per_chip=2) == {0: 3.0, 1: 12.0}
    assert values_by_chip({0: 0.5, 1: 0.25}, duty, cores_per_chip=2) == {0: 0.5, 1: 0.25}
    bandwidth = SPECS["tpu.runtime.hbm.utilization.percent"]
    idle = SPECS["tpu.runtime.tensorcore.idle_duration.seconds"]
    assert values_by_chip({0: 0.5, 1: 0.25}, bandwidth, cores_per_chip=2) == {0: 0.375}
    assert values_by_chip({0: 3.0, 1: 0.0}, idle, cores_per_chip=2) == {0: 0.0}, "a chip is idle while all cores are"


# --- discovery ------------------------------------------------------------------------------------

@pytest.mark.parametrize("generation", ["v4", "v5e", "v5p", "v6e"])
def test_discovery_finds_each_generation_and_its_device_files(tmp_path: Path, generation: str) -> None:
    paths = make_host(tmp_path, generation, chips=4)
    chips = discover_tpus(paths.sysfs)
    assert [c.generation.name for c in chips] == [generation] * 4
    assert [c.pci for c in chips] == ["0000:00:04.0", "0000:00:05.0", "0000:00:06.0", "0000:00:07.0"]
    expected = [f"vfio/{10 + i}" for i in range(4)] if GENERATIONS[generation][1] else [f"accel{i}" for i in range(4)]
    assert [c.device_files for c in chips] == [(f,) for f in expected]


def test_vfio_chips_are_ordered_by_group_number_not_text(tmp_path: Path) -> None:
    paths = make_host(tmp_path, "v5e", chips=2, first_group=9)  # groups 9 and 10: "10" < "9" as text
    assert [c.device_files for c in discover_tpus(paths.sysfs)] == [("vfio/9",), ("vfio/10",)]


def test_v3_is_told_from_v2_by_subsystem_and_has_two_functions_per_chip(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    for function in (0, 1):
        entry = add_pci(sysfs, f"0000:00:04.{function}", "0x1ae0", "0x0027", "0x120000")
        (entry / "subsystem_device").write_text("0x004f\n")
        (entry / "accel" / f"accel{function}").mkdir(parents=True)
    (chip,) = discover_tpus(str(sysfs))
    assert (chip.generation.name, chip.functions, chip.device_files) == (
        "v3", ("0000:00:04.0", "0000:00:04.1"), ("accel0", "accel1"))
    assert chip.hbm_bytes == 16 * GIB


def test_hwmon_bound_to_the_chip_is_a_real_sensor(tmp_path: Path) -> None:
    paths = make_host(tmp_path, "v5e", chips=1)
    hwmon = Path(paths.sysfs, "bus/pci/devices/0000:00:04.0/hwmon/hwmon3")
    hwmon.mkdir(parents=True)
    (hwmon / "temp1_input").write_text("47250\n")
    (hwmon / "power1_average").write_text("91500000\n")
    found = read_hwmon(paths.sysfs, "0000:00:04.0")
    assert found is not None and (found.temperature_celsius, found.power_watts) == (47.25, 91.5)
    assert read_hwmon(paths.sysfs, "0000:00:03.0") is None


# --- the backend against a real runtime -----------------------------------------------------------

@pytest.mark.parametrize("generation,chips", [("v4", 4), ("v5e", 4), ("v5p", 4), ("v6e", 8)])
def test_backend_reads_each_generation_from_sysfs_and_the_runtime(tmp_path: Path, serve: Any, generation: str,
                                                                  chips: int) -> None:
    address = serve(Runtime(generation))
    backend = TpuBackend(make_config(make_host(tmp_path, generation, chips), [address]))
    readings = backend.read()
    answers = json.loads((RUNTIME / f"{generation}.json").read_text())
    assert [r.device for r in readings] == [str(i) for i in range(chips)]
    for i, r in enumerate(readings):
        used = answers["tpu.runtime.hbm.memory.usage.bytes"]["metric"]["metrics"][i]["gauge"]["asInt"]
        duty = answers["tpu.runtime.tensorcore.dutycycle.percent"]["metric"]["metrics"][i]["gauge"]["asDouble"]
        assert r.chip == generation and r.up and r.runtime_metrics is True
        assert r.memory_used_bytes == int(used)
        assert r.utilization_ratio == pytest.approx(duty / 100)
        assert r.sources["memory_used_bytes"] == f"libtpu:{address}"
        assert r.temperature_celsius is None and r.power_watts is None and r.ecc_uncorrected_total is None
    first, last = readings[0], readings[-1]
    assert first.memory_total_bytes == {"v4": 32, "v5e": 16, "v5p": 95, "v6e": 32}[generation] * GIB
    assert first.memory_bandwidth_utilization_ratio == pytest.approx(0.305)
    assert (first.hlo_queue_size, last.hlo_queue_size) == (2, 0)
    assert (first.tensorcore_idle_seconds, last.tensorcore_idle_seconds) == (0.0, 42.5)
    assert first.hlo_execution_mean_seconds == pytest.approx(0.0015)
    if generation == "v4":
        assert [(r.status, r.reset_count) for r in readings] == [("ALIVE", i) for i in range(4)]
    else:
        assert first.status is None and first.reset_count is None


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
    assert time.monotonic() - started < 1.5, "the seven metric calls must share one deadline, not add up"
    assert all(r.runtime_metrics is False for r in readings)
    assert readings[0].sources["runtime"] == f"libtpu:{address}: no answer within 0.3s (DEADLINE_EXCEEDED)"


def test_malformed_answers_are_skipped_and_logged_once(tmp_path: Path, serve: Any,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    runtime = Runtime("v5e")
    runtime.answers["tpu.runtime.hbm.memory.usage.bytes"]["metric"]["metrics"][0]["gauge"] = {"asString": "full"}
    address = serve(runtime)
    backend = TpuBackend(make_config(make_host(tmp_path, "v5e", chips=4), [address]))
    with caplog.at_level(logging.WARNING):
        first, second = backend.read(), backend.read()
    assert first == second
    assert all(r.memory_used_bytes is None for r in first), "a malformed metric is dropped whole"
    assert first[0].utilization_ratio == pytest.approx(0.9), "the other metrics are kept"
    warnings = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    assert warnings == [(f"libtpu runtime at {address}: tpu.runtime.hbm.memory.usage.bytes: malformed answer: "
                         "gauge holds as_string (logged once)")]


def test_bytes_that_are_not_protobuf_are_no_data(tmp_path: Path, serve: Any) -> None:
    address = serve(Runtime(), raw=b"\xff\xff\xff\xff")
    (reading,) = TpuBackend(make_config(make_host(tmp_path, "v5e", chips=1), [address])).read()
    assert reading.runtime_metrics is False
    assert reading.sources["runtime"] == f"libtpu:{address}: no usable answer (INTERNAL)"


def test_several_runtime_ports_serve_consecutive_chips(tmp_path: Path, serve: Any) -> None:
    first, second = serve(Runtime("v5e")), serve(Runtime("v5e"))
    readings = TpuBackend(make_config(make_host(tmp_path, "v5e", chips=8), [first, second])).read()
    assert [r.sources["memory_used_bytes"] for r in readings] == [f"libtpu:{first}"] * 4 + [f"libtpu:{second}"] * 4
    assert readings[4].utilization_ratio == readings[0].utilization_ratio == pytest.approx(0.9)


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
    assert device_problems([r for r in _readings(collector) if r.device == "1"]) == [
        "device 1 (v4, pci 0000:00:05.0): driver status LAMED"]


def _readings(collector: DeviceCollector) -> list[Any]:
    collector.collect()
    return collector.last_readings


# --- auto-detection and the command line ----------------------------------------------------------

def test_auto_picks_tpu_from_pci_and_logs_why(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    paths = make_host(tmp_path, "v5p", chips=2)
    with caplog.at_level(logging.INFO, logger="tpuwatch.devices"):
        backend, why = select_backend(make_config(paths, ["localhost:8431"], backend="auto"))
    assert isinstance(backend, TpuBackend)
    assert why == "auto: 2 tpu PCI device(s) at 0000:00:04.0, 0000:00:05.0"
    assert f"device backend: {why}" in caplog.messages


def test_check_shows_each_chip_and_where_its_readings_came_from(tmp_path: Path, serve: Any) -> None:
    paths = make_host(tmp_path, "v6e", chips=8)
    address = serve(Runtime("v6e"))
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"paths": dataclasses.asdict(paths),
                                  "devices": {"backend": "auto", "tpu": {"metrics_addr": [address]}}}))
    result = run_cli("check", "--json", "--config", str(config))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["backend"] == "tpu"
    assert report["notes"][1].startswith("device backend: auto: 8 tpu PCI device(s) at 0000:00:04.0, ")
    device = report["devices"][7]
    assert (device["device"], device["chip"], device["pci"], device["up"]) == ("7", "v6e", "0000:00:0b.0", True)
    assert device["memory_total_bytes"] == 32 * GIB and device["runtime_metrics"] is True
    assert device["sources"]["memory_used_bytes"] == f"libtpu:{address}"
    assert device["sources"]["device_file"] == f"{paths.dev}/vfio/17"
    assert device["temperature_celsius"] is None
