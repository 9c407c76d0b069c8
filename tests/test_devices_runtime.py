"""libtpu runtime answers: parsing and folding on literal messages, the client against real servers,
and several addresses (in this process, and in workload processes holding their chips)."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakelibtpu import Runtime, serving
from google.protobuf import text_format
from test_devices_tpu import make_config, make_host
from tpu_info.proto import tpu_metric_service_pb2 as pb2

from tpuwatch.devices.collector import DeviceCollector
from tpuwatch.devices.procnet import listening_inodes
from tpuwatch.devices.runtime import Distribution, MalformedMetric, fold, merge, parse_response, quantile, summary
from tpuwatch.devices.tpu import TpuBackend

GIB = 1 << 30
USAGE, DUTY = "tpu.runtime.hbm.memory.usage.bytes", "tpu.runtime.tensorcore.dutycycle.percent"
QUEUE, TIMING = "hlo.queue.size.gauge", "hlo.execution.timing.distribution.microseconds"


def response(name: str, *metrics: str) -> Any:
    text = f'metric {{ name: "{name}" ' + " ".join(f"metrics {{ {m} }}" for m in metrics) + " }"
    return text_format.Parse(text, pb2.MetricResponse())


def gauges(name: str, values: list[float], first_id: int = 0) -> Any:
    return response(name, *(f'attribute {{ key: "device-id" value {{ int_attr: {first_id + i} }} }} '
                            f'gauge {{ as_double: {v} }}' for i, v in enumerate(values)))


@pytest.fixture
def serve() -> Iterator[Any]:
    """Start RuntimeMetricService servers in this process; stopped after the test."""
    yield from serving()


# --- parsing ---------------------------------------------------------------------------------------

def test_entries_carry_int_device_ids_and_device_ordinals_of_either_kind() -> None:
    usage = parse_response(response(USAGE,
                                    'attribute { key: "device-id" value { int_attr: 1 } } gauge { as_int: 2048 }',
                                    'attribute { key: "device-id" value { int_attr: 0 } } gauge { as_int: 1024 }'),
                           USAGE)
    assert [(e.ordinal, e.value) for e in usage] == [(1, 2048.0), (0, 1024.0)]
    queue = parse_response(response(QUEUE, 'attribute { value { kvlist_attr { attributes { key: "core_type" value '
                                    '{ string_attr: "tc" } } attributes { key: "device_ordinal" value { string_attr: '
                                    '"3" } } } } } gauge { as_int: 5 }',
                                    'attribute { value { kvlist_attr { attributes { key: "device_ordinal" value '
                                    '{ int_attr: 4 } } } } } gauge { as_int: 6 }'), QUEUE)
    assert [(e.ordinal, e.value) for e in queue] == [(3, 5.0), (4, 6.0)]


@pytest.mark.parametrize("metric,reason", [
    ('attribute { key: "device-id" value { int_attr: 0 } } gauge { as_string: "lots" }', "gauge holds as_string"),
    ('attribute { key: "device-id" value { string_attr: "zero" } } gauge { as_int: 1 }', "device attribute is"),
    ('gauge { as_int: 1 }', "device attribute is missing"),
    (('attribute { value { kvlist_attr { attributes { key: "device_ordinal" value { string_attr: "tc0" } } } } }'
      ' gauge { as_int: 1 }'), "device_ordinal is string_attr 'tc0'"),
    ('attribute { key: "device-id" value { int_attr: 0 } }', "measure is missing"),
    ('attribute { key: "device-id" value { int_attr: 0 } } distribution { count: 2 bucket_counts: [1, 1] }',
     "bucket counts without bucket options"),
    ('attribute { key: "device-id" value { int_attr: 0 } } distribution { count: 2 bucket_options { '
     'explicit_buckets { bounds: [1.0] } } bucket_counts: [1, 0, 1] }', "3 bucket counts for 2 buckets"),
])
def test_malformed_answers_are_refused_with_a_reason(metric: str, reason: str) -> None:
    with pytest.raises(MalformedMetric, match=reason):
        parse_response(response(QUEUE, metric), QUEUE)


def test_duplicates_and_answers_for_another_metric_are_refused() -> None:
    entry = 'attribute { key: "device-id" value { int_attr: 0 } } gauge { as_int: 1 }'
    with pytest.raises(MalformedMetric, match="appears twice"):
        parse_response(response(QUEUE, entry, entry), QUEUE)
    with pytest.raises(MalformedMetric, match="answer is for 'other'"):
        parse_response(response("other", entry), QUEUE)


def test_an_empty_distribution_is_an_answer_with_no_samples() -> None:
    (entry,) = parse_response(response(TIMING, 'attribute { value { kvlist_attr { attributes { key: "device_ordinal" '
                                       'value { string_attr: "0" } } } } } distribution { count: 0 mean: 0 '
                                       'bucket_options { exponential_buckets { num_finite_buckets: 3 growth_factor: 2 '
                                       'scale: 1000 } } }'), TIMING)
    assert entry.distribution is not None
    assert summary(entry.distribution, 1e-6) == summary(entry.distribution, 1.0) and \
        summary(entry.distribution, 1e-6).count == 0 and summary(entry.distribution, 1e-6).quantiles == ()


# --- quantiles ------------------------------------------------------------------------------------

def test_quantiles_interpolate_within_the_bucket_that_holds_them() -> None:
    # Buckets: (-inf, 10], (10, 20], (20, 40], (40, +inf); 10 observations, min 5, max 50.
    dist = Distribution(10, 19.0, (10.0, 20.0, 40.0), (2, 6, 1, 1), minimum=5.0, maximum=50.0)
    assert quantile(dist, 0.5) == pytest.approx(10 + 10 * 3 / 6)
    assert quantile(dist, 0.9) == pytest.approx(40.0)
    assert quantile(dist, 0.1) == pytest.approx(5 + 5 * 1 / 2), "the first bucket starts at the observed minimum"
    assert quantile(dist, 0.999) == pytest.approx(40 + 10 * 0.99), "the overflow bucket ends at the maximum"
    timing = summary(dist, 1e-6)
    assert (timing.count, timing.total) == (10, pytest.approx(190e-6))
    assert dict(timing.quantiles)[0.5] == pytest.approx(15e-6)


def test_merging_sums_buckets_and_refuses_different_ones() -> None:
    one = Distribution(2, 10.0, (10.0, 20.0), (1, 1), 5.0, 15.0)
    two = Distribution(4, 25.0, (10.0, 20.0), (0, 1, 3), 12.0, 30.0)
    merged = merge([one, two])
    assert (merged.count, merged.mean, merged.counts, merged.minimum, merged.maximum) == (
        6, pytest.approx(20.0), (1, 2, 3), 5.0, 30.0)
    assert merge([one, Distribution(0, 0.0, (10.0, 20.0), ())]).counts == (1, 1)
    with pytest.raises(MalformedMetric, match="different buckets"):
        merge([one, Distribution(1, 1.0, (1.0,), (1,))])


# --- folding per chip -----------------------------------------------------------------------------

def entries(*answers: tuple[str, Any]) -> dict[str, Any]:
    return {name: parse_response(message, name) for name, message in answers}


def test_v3_8_answers_memory_per_core_and_duty_cycle_per_chip() -> None:
    # tpu-info's metrics_test.py (commit abf9f4b), case v3_8: 8 memory entries, 4 duty-cycle entries.
    found = entries((USAGE, gauges(USAGE, list(range(8)))), (DUTY, gauges(DUTY, [100.0 / (i + 1) for i in range(4)])))
    folded = fold(found, cores_per_chip=2, duty_cycle_per_chip=True)
    assert folded.served == 4
    assert [folded.fields[c]["memory_used_bytes"] for c in range(4)] == [1.0, 5.0, 9.0, 13.0]
    assert [folded.fields[c]["utilization_ratio"] for c in range(4)] == pytest.approx([1.0, 0.5, 1 / 3, 0.25])


def test_7x_answers_duty_cycle_per_core_so_each_chip_gets_its_own_two() -> None:
    found = entries((USAGE, gauges(USAGE, [1.0] * 4)), (DUTY, gauges(DUTY, [80.0, 60.0, 40.0, 20.0])))
    folded = fold(found, cores_per_chip=2, duty_cycle_per_chip=False)
    assert folded.served == 2, "four cores are two chips, not four"
    assert [folded.fields[c]["utilization_ratio"] for c in range(2)] == pytest.approx([0.7, 0.3])


def test_device_ids_are_ranked_not_taken_as_chip_numbers() -> None:
    folded = fold(entries((USAGE, gauges(USAGE, [1.0, 2.0], first_id=8))), 1, False)
    assert folded.fields == {0: {"memory_used_bytes": 1.0}, 1: {"memory_used_bytes": 2.0}}


# --- the client -----------------------------------------------------------------------------------

def test_supported_metrics_are_listed_once_and_again_after_the_runtime_comes_back(tmp_path: Path,
                                                                                  serve: Any) -> None:
    runtime = Runtime("v5e", "busy")
    address = serve(runtime)
    backend = TpuBackend(make_config(make_host(tmp_path, "v5e", 4), [address]))
    assert all(r.runtime_metrics for r in backend.read() + backend.read())
    assert runtime.calls["ListSupportedMetrics"] == 1 and runtime.calls[USAGE] == 2
    runtime.mode = "unavailable"  # the workload ended
    assert not any(r.runtime_metrics for r in backend.read())
    runtime.mode = "ok"  # a new one started, maybe with another libtpu
    assert all(r.runtime_metrics for r in backend.read())
    assert runtime.calls["ListSupportedMetrics"] == 2


def test_a_runtime_that_cannot_list_its_metrics_is_asked_for_all(tmp_path: Path, serve: Any) -> None:
    runtime = Runtime("v5e", "busy")
    runtime.listing = {"error": "UNIMPLEMENTED"}
    address = serve(runtime)
    (first, *_) = TpuBackend(make_config(make_host(tmp_path, "v5e", 4), [address])).read()
    assert first.hlo_queue_size == 2 and first.memory_used_bytes == 6871947674
    assert runtime.calls["megascale.dcn_transfer_latencies.microsecond.cumulative.distribution"] == 1
    assert first.sources["memory_used_bytes"] == f"libtpu:{address}"


def test_malformed_answers_are_skipped_and_logged_once(tmp_path: Path, serve: Any,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    runtime = Runtime("v5e", "busy")
    runtime.answers[USAGE]["metric"]["metrics"][0]["gauge"] = {"asString": "full"}
    address = serve(runtime)
    backend = TpuBackend(make_config(make_host(tmp_path, "v5e", chips=4), [address]))
    with caplog.at_level(logging.WARNING):
        first, second = backend.read(), backend.read()
    assert first == second
    assert all(r.memory_used_bytes is None for r in first), "a malformed metric is dropped whole"
    assert first[0].utilization_ratio == pytest.approx(0.9), "the other metrics are kept"
    warnings = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    assert warnings == [f"libtpu runtime at {address}: {USAGE}: malformed answer: gauge holds as_string (logged once)"]


def test_bytes_that_are_not_protobuf_are_no_data(tmp_path: Path, serve: Any) -> None:
    address = serve(Runtime(), raw=b"\xff\xff\xff\xff")
    (reading,) = TpuBackend(make_config(make_host(tmp_path, "v5e", chips=1), [address])).read()
    assert reading.runtime_metrics is False
    assert reading.sources["runtime"] == f"libtpu:{address}: no usable answer (INTERNAL)"


def test_megascale_latencies_become_summaries_in_seconds(tmp_path: Path, serve: Any) -> None:
    busy, idle = serve(Runtime("v5p", "busy")), serve(Runtime("v5p", "idle"))
    samples = DeviceCollector(TpuBackend(make_config(make_host(tmp_path, "v5p", 4), [busy]))).collect()
    megascale = {(s.name, dict(s.labels).get("metric"), dict(s.labels).get("buffer_size"),
                  dict(s.labels).get("quantile")): s for s in samples if "megascale" in s.name}
    count = megascale[("tpuwatch_device_megascale_latency_seconds_count", "buffer_transfer_latency", "8MB+", None)]
    assert count.value == 100 and dict(count.labels)["device"] == "", "the runtime names no chip: a host series"
    p50 = megascale[("tpuwatch_device_megascale_latency_seconds", "buffer_transfer_latency", "8MB+", "0.5")].value
    assert 2 ** 14 * 1e-6 < p50 < 2 ** 16 * 1e-6
    assert {key[1:3] for key in megascale} == {("buffer_transfer_latency", "8MB+"), ("buffer_transfer_latency", "4MB+"),
                                               ("collective_e2e_latency", "8MB+"), ("grpc_tcp_min_rtt", "")}
    quiet = DeviceCollector(TpuBackend(make_config(make_host(tmp_path / "idle", "v5p", 4), [idle]))).collect()
    names = {(s.name, s.value) for s in quiet if "megascale" in s.name}
    assert names == {("tpuwatch_device_megascale_latency_seconds_count", 0.0),
                     ("tpuwatch_device_megascale_latency_seconds_sum", 0.0)}, "idle: no samples, no quantiles"


# --- several addresses ----------------------------------------------------------------------------

def test_addresses_serving_different_chip_counts_are_numbered_in_order(tmp_path: Path, serve: Any) -> None:
    one = Runtime("v5e", "busy", ids={0})
    three = serve(Runtime("v5e", "busy", ids={0, 1, 2}))
    first = serve(one)
    backend = TpuBackend(make_config(make_host(tmp_path, "v5e", 4), [first, three]))
    readings = backend.read()
    assert [r.sources["memory_used_bytes"] for r in readings] == [f"libtpu:{first}"] + [f"libtpu:{three}"] * 3
    assert [r.memory_used_bytes for r in readings] == [6871947674, 6871947674, 8589934592, 10307921510]
    assert readings[2].sources["runtime_chip"] == (
        f"chip 1 of libtpu:{three}, numbered after those of the addresses configured before it (the process "
        "listening on it was not found)")
    one.mode = "unavailable"  # the first process goes idle: the others keep their chips
    again = backend.read()
    assert [r.runtime_metrics for r in again] == [False, True, True, True]
    assert again[1].memory_used_bytes == 6871947674


@pytest.fixture
def workloads() -> Iterator[Any]:
    """Workload processes, each serving the runtime for the chips it holds open."""
    started: list[subprocess.Popen[str]] = []

    def launch(generation: str, ids: str, *device_files: str) -> str:
        process = subprocess.Popen([sys.executable, str(Path(__file__).parent / "fakelibtpu.py"), generation,
                                    "busy", ids, *device_files], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True)
        started.append(process)
        assert process.stdout is not None
        return f"localhost:{process.stdout.readline().strip()}"

    yield launch
    for process in started:
        process.kill()
        process.wait()


def test_each_address_describes_the_chips_its_process_holds(tmp_path: Path, workloads: Any) -> None:
    paths = make_host(tmp_path, "v6e", 4)
    # The process on the first configured port holds chips 2 and 3 (vfio/12, /13) and names them 12, 13.
    late = workloads("v6e", "12,13", f"{paths.dev}/vfio/12", f"{paths.dev}/vfio/13")
    early = workloads("v6e", "8,9", f"{paths.dev}/vfio/10", f"{paths.dev}/vfio/11")
    readings = TpuBackend(make_config(paths, [late, early])).read()
    assert [r.sources["memory_used_bytes"] for r in readings] == [f"libtpu:{early}"] * 2 + [f"libtpu:{late}"] * 2
    assert [round(r.memory_used_bytes / GIB, 2) for r in readings] == [17.26, 9.26, 9.26, 9.26]
    assert readings[3].sources["runtime_chip"].startswith("process ")
    assert readings[3].sources["runtime_chip"].endswith(f" listens on libtpu:{late} and holds this chip")


def test_listening_sockets_are_read_from_proc_net_tcp() -> None:
    table = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
             "   0: 0100007F:20EF 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 31337 1 "
             "0000000000000000 100 0 0 10 0\n"
             "   1: 0100007F:20F0 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 31338 1 "
             "0000000000000000 20 4 30 10 -1\n"
             "   2: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1000 1 "
             "0000000000000000 100 0 0 10 0\n")
    assert listening_inodes(table, {8431, 8432}) == {"31337": 8431}, "8432 is a connection, not a listener"


def test_addresses_without_a_known_process_share_the_chips_the_others_do_not_hold(tmp_path: Path, serve: Any,
                                                                                   workloads: Any) -> None:
    paths = make_host(tmp_path, "v6e", 4)
    unknown = serve(Runtime("v6e", "busy", ids={12, 13}))  # served from this process, which holds no chip
    known = workloads("v6e", "8,9", f"{paths.dev}/vfio/10", f"{paths.dev}/vfio/11")
    readings = TpuBackend(make_config(paths, [unknown, known])).read()
    assert [r.sources["memory_used_bytes"] for r in readings] == [f"libtpu:{known}"] * 2 + [f"libtpu:{unknown}"] * 2
    assert readings[2].sources["runtime_chip"].startswith(f"chip 0 of libtpu:{unknown}, numbered after")


# --- who holds a chip, and the interconnect ---------------------------------------------------------

def test_the_process_whose_runtime_answers_uses_its_chips_hbm(tmp_path: Path, workloads: Any) -> None:
    paths = make_host(tmp_path, "v6e", 4)
    late = workloads("v6e", "12,13", f"{paths.dev}/vfio/12", f"{paths.dev}/vfio/13")
    readings = TpuBackend(make_config(paths, [late])).read()
    holder = readings[2].processes
    assert holder is not None and len(holder) == 1
    assert holder[0].device_memory_bytes == readings[2].memory_used_bytes is not None
    assert readings[0].processes == (), "nobody holds chip 0"
    assert (readings[2].device_files, readings[2].plugin_ids) == (("vfio/12",), (("google.com/tpu", "12"),)), \
        "the TPU device plugin's id of a vfio chip is its IOMMU group"
    samples = DeviceCollector(TpuBackend(make_config(paths, [late]))).collect()
    used = [dict(s.labels) for s in samples if s.name == "tpuwatch_process_device_memory_used_bytes"]
    assert [u["device"] for u in used] == ["2", "3"] and {u["pid"] for u in used} == {str(holder[0].pid)}
    assert used[0]["namespace"] == used[0]["pod"] == "", "not in a pod"


def test_dcn_packet_counters_and_a_megascale_hang_are_host_series(tmp_path: Path, serve: Any) -> None:
    runtime = Runtime("v5p-dcn", "busy")
    backend = TpuBackend(make_config(make_host(tmp_path, "v5p", 4), [serve(runtime)]))
    collector = DeviceCollector(backend)

    def interconnect() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {(s.name, s.labels): s.value for s in collector.collect()
                if s.name in ("tpuwatch_dcn_tcp_packets_total", "tpuwatch_interconnect_error_detected")}

    assert interconnect() == {
        ("tpuwatch_dcn_tcp_packets_total", (("kind", "retransmitted"),)): 30,
        ("tpuwatch_dcn_tcp_packets_total", (("kind", "sent"),)): 3_000_000,
        ("tpuwatch_interconnect_error_detected", (("kind", "HANG_DETECTED"), ("source", "megascale"))): 0,
        ("tpuwatch_interconnect_error_detected", (("kind", "SLICE_FAILURE"), ("source", "slice"))): 0,
    }
    runtime.answers = Runtime("v5p-dcn", "stuck").answers
    stuck = interconnect()
    assert stuck[("tpuwatch_interconnect_error_detected", (("kind", "HANG_DETECTED"), ("source", "megascale")))] == 1
    assert stuck[("tpuwatch_dcn_tcp_packets_total", (("kind", "retransmitted"),))] == 14_030
    assert all(r.runtime_metrics for r in backend.read()), "the chips' own metrics are read as before"


def test_host_counters_and_error_gauges_parse_counter_and_gauge_measures() -> None:
    counters = response("megascale.grpc_tcp_packets_sent.cumulative.count",
                        'attribute { value { int_attr: 0 } } counter { as_int: 7 }',
                        'attribute { value { int_attr: 1 } } gauge { as_double: 2.5 }')
    assert [e.value for e in parse_response(counters, "megascale.grpc_tcp_packets_sent.cumulative.count")] == [7, 2.5]
    with pytest.raises(MalformedMetric, match="measure is distribution"):
        parse_response(response("slice.error.detected.gauge", "distribution { count: 1 }"),
                       "slice.error.detected.gauge")
