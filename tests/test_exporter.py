"""Exposition: families from samples, the catalogue against real /metrics, promtool."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import requests
from prometheus_client.parser import text_string_to_metric_families

from tpuwatch.catalog import CATALOG
from tpuwatch.exporter import families
from tpuwatch.samples import sample

from conftest import SIM_FAST, DaemonProcess, require_tool, wait_until

FORBIDDEN_LABELS = {"type", "instance", "job"}


def test_families_follow_the_catalogue() -> None:
    out = families([sample("tpuwatch_device_ecc_errors_total", 3, device="0", kind="corrected"),
                    sample("tpuwatch_device_up", 1, device="0")])
    by_name = {f.name: f for f in out}
    assert by_name["tpuwatch_device_ecc_errors"].type == "counter"
    assert by_name["tpuwatch_device_ecc_errors"].samples[0].name == "tpuwatch_device_ecc_errors_total"
    assert by_name["tpuwatch_device_up"].type == "gauge"


def test_catalogue_follows_prometheus_naming() -> None:
    for name, spec in CATALOG.items():
        assert name.startswith("tpuwatch_")
        assert (spec.kind == "counter") == name.endswith("_total"), name
        assert not FORBIDDEN_LABELS & set(spec.labels), name
        assert spec.help.endswith("."), name


def scrape(daemon: DaemonProcess) -> str:
    return requests.get(f"{daemon.url}/metrics", timeout=5).text


def test_metrics_endpoint_matches_the_catalogue_and_passes_promtool(
        start_daemon: Callable[..., DaemonProcess]) -> None:
    promtool = require_tool("promtool")
    config = {**SIM_FAST, "devices": {"backend": "sim", "sim": {"count": 4, "scenario": "device-lost",
                                                                "fault_after": "600ms"}}}
    daemon = start_daemon(config)
    daemon.wait_ready()
    # Under load a 150 ms collector deadline misses cycles: the loss shows within seconds, not the first ones.
    wait_until(lambda: 'tpuwatch_device_up{device="0"} 0.0' in scrape(daemon), timeout=30,
               what="device 0 to be lost")
    text = scrape(daemon)
    emitted = {s.name for f in text_string_to_metric_families(text) for s in f.samples
               if s.name.startswith("tpuwatch_")}
    # Every emitted family is catalogued; the families a simulated host always has are all there.
    assert emitted <= set(CATALOG), emitted - set(CATALOG)
    always = {name for name in CATALOG if name.startswith(("tpuwatch_host_", "tpuwatch_store_", "tpuwatch_config_"))}
    always |= {"tpuwatch_device_info", "tpuwatch_device_up", "tpuwatch_device_memory_used_bytes",
               "tpuwatch_device_memory_total_bytes", "tpuwatch_device_utilization_ratio",
               "tpuwatch_device_temperature_celsius", "tpuwatch_device_power_watts",
               "tpuwatch_device_ecc_errors_total", "tpuwatch_collector_success", "tpuwatch_collector_duration_seconds",
               "tpuwatch_collector_samples", "tpuwatch_scheduler_events_total",
               "tpuwatch_last_sample_timestamp_seconds",
               "tpuwatch_build_info"}
    assert always <= emitted, always - emitted
    # A lost chip is down and its readings are absent, not zero or stale.
    assert 'tpuwatch_device_memory_used_bytes{device="0"}' not in text
    assert 'tpuwatch_device_memory_used_bytes{device="1"}' in text
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.strip() == "" and checked.stderr.strip() == "", checked.stdout + checked.stderr


def test_openmetrics_and_gzip_are_negotiated(start_daemon: Callable[..., DaemonProcess]) -> None:
    daemon = start_daemon(SIM_FAST)
    daemon.wait_ready()
    response = requests.get(f"{daemon.url}/metrics", timeout=5, headers={
        "Accept": "application/openmetrics-text; version=1.0.0", "Accept-Encoding": "gzip"})
    assert response.headers["Content-Type"].startswith("application/openmetrics-text")
    assert response.headers["Content-Encoding"] == "gzip"
    assert response.text.rstrip().endswith("# EOF")
