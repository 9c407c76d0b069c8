"""The metric catalogue: every tpuwatch_* family, its type, help and labels.

/metrics emits exactly these families (tests compare the two), so a new metric
is added here first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class MetricSpec:
    """What one metric family is."""

    name: str
    kind: Literal["gauge", "counter"]
    help: str
    labels: tuple[str, ...] = ()
    allow_negative: bool = False


_SPECS = [
    # Devices (one backend at a time).
    MetricSpec("tpuwatch_device_info", "gauge", "Accelerator chip identity; value is always 1.",
               ("device", "chip", "pci", "backend")),
    MetricSpec("tpuwatch_device_up", "gauge", "1 if the chip is present and responding, 0 if it was lost.",
               ("device",)),
    MetricSpec("tpuwatch_device_memory_used_bytes", "gauge", "Device memory (HBM) in use.", ("device",)),
    MetricSpec("tpuwatch_device_memory_total_bytes", "gauge", "Device memory (HBM) capacity.", ("device",)),
    MetricSpec("tpuwatch_device_utilization_ratio", "gauge", "Compute utilization (duty cycle), 0-1.",
               ("device",)),
    MetricSpec("tpuwatch_device_temperature_celsius", "gauge", "Chip temperature.", ("device",),
               allow_negative=True),
    MetricSpec("tpuwatch_device_power_watts", "gauge", "Chip power draw.", ("device",)),
    MetricSpec("tpuwatch_device_ecc_errors_total", "counter",
               "Device memory ECC errors by kind (corrected, uncorrected).", ("device", "kind")),
    # Host.
    MetricSpec("tpuwatch_host_memory_total_bytes", "gauge", "Host physical memory."),
    MetricSpec("tpuwatch_host_memory_available_bytes", "gauge",
               "Host memory available to new allocations without swapping."),
    MetricSpec("tpuwatch_host_cpu_utilization_ratio", "gauge",
               "Host CPU busy fraction since the previous sample, 0-1."),
    MetricSpec("tpuwatch_device_holder_info", "gauge",
               "A process holding an accelerator device file open; value is always 1.",
               ("device_file", "pid", "command")),
    MetricSpec("tpuwatch_holder_process_resident_memory_bytes", "gauge",
               "Resident memory of a process that holds an accelerator device file.", ("pid", "command")),
    # --- device backends (tpu, nvidia) ---
    # --- kernel log ---
    # --- canary ---
    # --- trend analysis ---
    # --- alerting ---
    # tpuwatch itself.
    MetricSpec("tpuwatch_collector_success", "gauge", "1 if the collector's last run succeeded.", ("collector",)),
    MetricSpec("tpuwatch_collector_duration_seconds", "gauge", "Duration of the collector's last run.",
               ("collector",)),
    MetricSpec("tpuwatch_collector_samples", "gauge",
               "Readings the collector's last successful run returned (0 means no data).", ("collector",)),
    MetricSpec("tpuwatch_collector_errors_total", "counter", "Collector runs that failed, by reason.",
               ("collector", "reason")),
    MetricSpec("tpuwatch_readings_dropped_total", "counter",
               "Readings dropped as invalid (nan, inf, negative), by collector and reason.",
               ("collector", "reason")),
    MetricSpec("tpuwatch_scheduler_events_total", "counter",
               "Scheduler job problems: error, missed, max_instances.", ("event",)),
    MetricSpec("tpuwatch_last_sample_timestamp_seconds", "gauge", "Unix time the last sampling cycle ended."),
    MetricSpec("tpuwatch_store_series", "gauge", "Series held in the in-memory store."),
    MetricSpec("tpuwatch_store_evicted_series_total", "counter",
               "Series evicted from the store to stay within store.max_series."),
    MetricSpec("tpuwatch_config_last_reload_successful", "gauge", "1 if the last config (re)load succeeded."),
    MetricSpec("tpuwatch_config_last_reload_success_timestamp_seconds", "gauge",
               "Unix time of the last successful config (re)load."),
    MetricSpec("tpuwatch_build_info", "gauge", "tpuwatch build; value is always 1.", ("version", "python")),
]

CATALOG: dict[str, MetricSpec] = {spec.name: spec for spec in _SPECS}
