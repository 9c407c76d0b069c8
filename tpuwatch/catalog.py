"""The metric catalogue: every tpuwatch_* family, its type, help and labels.

/metrics emits exactly these families (tests compare the two), so a new metric
is added here first, or, for a plugin's own metrics, in its declaration
(``tpuwatch.pluginspec``), which this catalogue takes in.  A ``summary`` family is carried as samples named after
the family with a ``quantile`` label, plus ``NAME_count`` and ``NAME_sum``
samples; ``spec_of`` finds the family of any sample name.
"""

from __future__ import annotations

from tpuwatch.metricspec import MetricSpec
from tpuwatch.plugins import PLUGINS

_SPECS = [
    # Devices (one backend at a time).
    MetricSpec("tpuwatch_device_info", "gauge", "Accelerator chip identity; value is always 1.",
               ("device", "chip", "pci", "backend")),
    MetricSpec("tpuwatch_device_up", "gauge", "1 if the chip is present and responding, 0 if it was lost.",
               ("device",)),
    MetricSpec("tpuwatch_device_memory_used_bytes", "gauge",
               "Device memory (HBM) in use; with gpu_instance, that of a MIG GPU instance (NVIDIA).", ("device",),
               optional_labels=("gpu_instance",)),
    MetricSpec("tpuwatch_device_memory_total_bytes", "gauge",
               "Device memory (HBM) capacity; with gpu_instance, that of a MIG GPU instance (NVIDIA).", ("device",),
               optional_labels=("gpu_instance",)),
    MetricSpec("tpuwatch_device_utilization_ratio", "gauge", "Compute utilization (duty cycle), 0-1.",
               ("device",)),
    MetricSpec("tpuwatch_device_temperature_celsius", "gauge", "Chip temperature.", ("device",),
               allow_negative=True),
    MetricSpec("tpuwatch_device_sensor_temperature_celsius", "gauge",
               "Temperature of each sensor of a chip that has several (AMD: edge, junction, mem).",
               ("device", "sensor"), allow_negative=True),
    MetricSpec("tpuwatch_device_temperature_limit_celsius", "gauge",
               "A temperature limit the hardware shows for a sensor: kind crit (throttle) or emergency (shutdown).",
               ("device", "sensor", "kind"), allow_negative=True),
    MetricSpec("tpuwatch_device_temperature_margin_celsius", "gauge",
               "Degrees a sensor is below the limit it is judged against (its crit limit, else a documented "
               "default); negative when over it.", ("device", "sensor"), allow_negative=True),
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
               "A process holding an accelerator device file open, the chip the file is (\"\" if unknown) and "
               "the Kubernetes pod it runs in (\"\" outside one or where unknown); value is always 1.",
               ("device_file", "device", "pid", "command", "namespace", "pod", "container", "pod_uid",
                "container_id")),
    MetricSpec("tpuwatch_holder_process_resident_memory_bytes", "gauge",
               "Resident memory of a process that holds an accelerator device file.",
               ("pid", "command", "namespace", "pod", "container")),
    # --- device backends (tpu, nvidia) ---
    MetricSpec("tpuwatch_device_driver_status", "gauge",
               "TPU v2-v4 accel driver status from sysfs: 1 for the current one (ALIVE, LAMED, DEAD, DRIVER_EXITING).",
               ("device", "status")),
    MetricSpec("tpuwatch_device_resets_total", "counter", "Chip resets since boot (TPU v2-v4 sysfs reset_count).",
               ("device",)),
    MetricSpec("tpuwatch_device_runtime_metrics_available", "gauge",
               "1 if libtpu's runtime metric service answered for the chip, 0 if not (no workload).", ("device",)),
    MetricSpec("tpuwatch_device_memory_bandwidth_utilization_ratio", "gauge",
               "HBM bandwidth utilization, 0-1 (libtpu runtime).", ("device",)),
    MetricSpec("tpuwatch_device_tensorcore_idle_seconds", "gauge",
               "How long the chip's TensorCores have been idle (libtpu runtime).", ("device",)),
    MetricSpec("tpuwatch_device_hlo_queue_size", "gauge", "HLO programs queued for execution (libtpu runtime).",
               ("device",)),
    MetricSpec("tpuwatch_device_queued_programs", "gauge",
               "Programs queued on the chip's cores (libtpu runtime status, GetTpuRuntimeStatus).", ("device",)),
    MetricSpec("tpuwatch_device_runtime_error_info", "gauge",
               "An error message the libtpu runtime status reports for a core of the chip (global core id, "
               "message cut to 300 characters); value is always 1.", ("device", "core", "message")),
    MetricSpec("tpuwatch_device_stalled_seconds", "gauge",
               "How long a held chip has made no progress while work waits for it (0 while it progresses or "
               "idles; absent where no signal judges it; docs/devices.md#hung-cores).", ("device",)),
    MetricSpec("tpuwatch_device_hung", "gauge",
               "1 while the chip's holder has made no progress for devices.hang.after with work queued, else 0; "
               "labelled with the holding process and its pod (absent when the chip is not held or nothing "
               "judges it).", ("device", "pid", "command", "namespace", "pod", "container")),
    MetricSpec("tpuwatch_device_hlo_execution_seconds", "summary",
               "HLO program execution time, quantiles estimated from libtpu's buckets (libtpu runtime).",
               ("device",)),
    MetricSpec("tpuwatch_device_megascale_latency_seconds", "summary",
               "Megascale (multislice DCN) latency by metric and buffer size; device \"\" when the runtime "
               "names no chip (libtpu runtime).", ("device", "metric", "buffer_size")),
    MetricSpec("tpuwatch_device_memory_reserved_bytes", "gauge",
               "Device memory reserved by the driver or firmware (NVML v2 memory info).", ("device",)),
    MetricSpec("tpuwatch_device_ecc_errors_aggregate_total", "counter",
               "Device memory ECC errors over the GPU's lifetime by kind (corrected, uncorrected).",
               ("device", "kind")),
    MetricSpec("tpuwatch_device_retired_pages", "gauge",
               "GPU memory pages retired, by cause (multiple_single_bit_ecc, double_bit_ecc).", ("device", "cause")),
    MetricSpec("tpuwatch_device_remapped_rows", "gauge", "GPU memory rows remapped, by kind (corrected, uncorrected).",
               ("device", "kind")),
    MetricSpec("tpuwatch_device_memory_repair_pending", "gauge",
               "1 if a page retirement or row remap waits for a GPU reset.", ("device",)),
    MetricSpec("tpuwatch_device_row_remap_failed", "gauge", "1 if a GPU row remap failed.", ("device",)),
    MetricSpec("tpuwatch_device_pcie_replays_total", "counter", "PCIe link replays (retransmissions).", ("device",)),
    MetricSpec("tpuwatch_device_throttle_active", "gauge",
               "1 while a clock throttle reason the GPU supports is active.", ("device", "reason")),
    MetricSpec("tpuwatch_device_processes", "gauge",
               "Processes using the chip (NVML's running processes; a TPU's device-file holders).", ("device",)),
    MetricSpec("tpuwatch_process_device_memory_used_bytes", "gauge",
               "Device memory a process uses on the chip, where the hardware reports it per process (NVML; a "
               "TPU process whose runtime answers for the chip); gpu_instance: the MIG instance it runs in.",
               ("device", "pid", "command", "namespace", "pod", "container"), optional_labels=("gpu_instance",)),
    MetricSpec("tpuwatch_devices_expected", "gauge",
               "Accelerator chips this host should have (devices.expected), by where the number comes from "
               "(config, accelerator_type, simulator, pci).", ("source",)),
    MetricSpec("tpuwatch_devices_missing", "gauge",
               "Expected chips the backend does not report: 1 per PCI function on the bus that no chip answers "
               "for, and the count of those known by number only (pci \"\"); 0 when none is missing.", ("pci",)),
    MetricSpec("tpuwatch_device_nvlink_up", "gauge",
               "1 while the NVLink is active, 0 once a link seen active is down.", ("device", "link")),
    MetricSpec("tpuwatch_device_nvlink_errors_total", "counter",
               "NVLink errors since the driver loaded by kind (replay, recovery, crc_flit, crc_data, ecc_data).",
               ("device", "link", "kind")),
    MetricSpec("tpuwatch_device_recovery_action", "gauge",
               "The recovery action the NVIDIA driver asks for the GPU (NVML field 230), its number as value and "
               "in words: none, gpu_reset, node_reboot, drain_p2p, drain_and_reset, recover_imex_domain, "
               "bus_reset, system_reboot (a newer one by its number); absent where the driver does not know it.",
               ("device", "action")),
    MetricSpec("tpuwatch_device_fabric_info", "gauge",
               "A GPU's NVLink fabric registration (NVSwitch systems; absent on PCIe GPUs): state (not_started, "
               "in_progress, completed), status (success or the error), health summary (healthy, unhealthy, "
               "limited_capacity; \"\" where the driver has none), clique and cluster; value is always 1.",
               ("device", "state", "status", "health", "clique_id", "cluster_uuid")),
    MetricSpec("tpuwatch_device_read_errors_total", "counter",
               "Reads of a chip's field that failed other than for want of support (the field stays absent), "
               "by field (for NVIDIA the NVML function), since tpuwatch started.", ("device", "field")),
    MetricSpec("tpuwatch_kernel_recovery_actions_total", "counter",
               "NVIDIA Xid 154 lines by the recovery action they ask of the GPU (kernel log).",
               ("device", "action")),
    MetricSpec("tpuwatch_device_ras_errors_total", "counter",
               "RAS errors the amdgpu driver counts per block (umc, gfx, sdma, ...) by kind (corrected, "
               "uncorrected, deferred where the block reports it).", ("device", "block", "kind")),
    MetricSpec("tpuwatch_dcn_tcp_packets_total", "counter",
               "TCP packets of the TPU runtime's megascale (DCN) transport by kind (sent, retransmitted), summed "
               "over the runtimes answering (libtpu runtime).", ("kind",)),
    MetricSpec("tpuwatch_interconnect_error_detected", "gauge",
               "1 while the TPU runtime reports an interconnect error: source megascale (kind: its error_type, "
               "e.g. HANG_DETECTED) or slice (kind: its type) (libtpu runtime).", ("source", "kind")),
    # --- kernel log ---
    MetricSpec("tpuwatch_kernel_events_total", "counter",
               "Kernel log lines matched by a rule, by rule, severity and device (\"\" when unattributed); "
               "gpu_instance: the MIG instance an Xid line names.", ("rule", "severity", "device"),
               optional_labels=("gpu_instance",)),
    MetricSpec("tpuwatch_kernel_log_records_total", "counter", "Kernel log records read, by source.", ("source",)),
    MetricSpec("tpuwatch_kernel_log_lost_total", "counter",
               "Kernel log records lost before they were read (kmsg ring-buffer overrun), by source.", ("source",)),
    MetricSpec("tpuwatch_kernel_log_skipped_total", "counter",
               "Kernel log records passed over unmatched, by source and reason (not_text, too_long, malformed, "
               "error, backlog: skipped to catch up with a storm).", ("source", "reason")),
    MetricSpec("tpuwatch_kernel_log_events_dropped_total", "counter",
               "Kernel events counted but neither logged nor listed among the recent events: more came between two "
               "sampling cycles than the follower's handoff holds (the oldest went), by source.", ("source",)),
    MetricSpec("tpuwatch_kernel_log_position_save_failures_total", "counter",
               "Failed saves of the kernel log read position (full or read-only disk); retried every cycle.",
               ("source",)),
    MetricSpec("tpuwatch_previous_boot_crash", "gauge",
               "1 when the boot before this one ended in a crash, by kind (panic, oops, mce, hardware_error) and "
               "where it was found (pstore, journal).", ("kind", "source")),
    # --- canary ---
    MetricSpec("tpuwatch_canary_healthy", "gauge",
               "1 if the chip's last canary run (either path) passed, 0 if it computed wrong numbers or errored.",
               ("device",)),
    MetricSpec("tpuwatch_canary_runs_total", "counter",
               "Canary runs by result (pass, fail, suspect: a deviation its re-runs did not confirm, slow, skipped, "
               "error; undetected: a fire drill nothing caught) and path "
               "(scheduled: the daemon's worker on idle chips; job: a probe inside a running job).",
               ("result", "path")),
    MetricSpec("tpuwatch_canary_device_runs_total", "counter",
               "Canary verdicts per chip by result and path; the job path names the reporting process.",
               ("device", "result", "path"), optional_labels=("pid", "command", "namespace", "pod")),
    MetricSpec("tpuwatch_canary_duration_seconds", "gauge", "Device time of one canary inference on the chip.",
               ("device",)),
    MetricSpec("tpuwatch_canary_max_abs_error", "gauge",
               "Largest absolute difference of the chip's canary output from the float64 reference.", ("device",)),
    MetricSpec("tpuwatch_canary_info", "gauge",
               "The chip's last canary output fingerprint, software stack, chip kind and the path that measured it; "
               "value is always 1.", ("device", "fingerprint", "stack", "chip", "path")),
    MetricSpec("tpuwatch_canary_deviating_runs_total", "counter",
               "Runs that found the chip deviating (fail or suspect), kept across restarts: a repeat offender "
               "shows.", ("device",)),
    MetricSpec("tpuwatch_canary_last_success_timestamp_seconds", "gauge",
               "Unix time the chip was last proven right, per path (scheduled, job).", ("device", "path")),
    # --- trend analysis ---
    MetricSpec("tpuwatch_memory_leak_suspected", "gauge",
               "1 if the memory series (hbm per device, host, process per pid, process_hbm per device and pid) "
               "is growing like a leak.",
               ("memory", "device", "pid", "command", "namespace", "pod", "container")),
    MetricSpec("tpuwatch_memory_growth_bytes_per_second", "gauge",
               "Robust growth rate of a series suspected of leaking (absent otherwise).",
               ("memory", "device", "pid", "command", "namespace", "pod", "container")),
    MetricSpec("tpuwatch_memory_exhaustion_eta_seconds", "gauge",
               "Projected time until a leaking series reaches its capacity (absent otherwise).",
               ("memory", "device", "pid", "command", "namespace", "pod", "container")),
    MetricSpec("tpuwatch_drift_suspected", "gauge",
               "1 if the signal (canary_latency, canary_error, temperature per utilization band) shifted.",
               ("series", "device", "band")),
    MetricSpec("tpuwatch_drift_baseline", "gauge", "Baseline mean of a drift signal, in the signal's unit.",
               ("series", "device", "band"), allow_negative=True),
    MetricSpec("tpuwatch_drift_shift", "gauge",
               "Mean shift of a drifting signal from its baseline, in the signal's unit (absent otherwise).",
               ("series", "device", "band"), allow_negative=True),
    # --- alerting ---
    MetricSpec("tpuwatch_alerts", "gauge", "Alerts firing now, by alert name and severity.",
               ("alertname", "severity")),
    MetricSpec("tpuwatch_notifications_total", "counter",
               "Notifications by receiver and result (delivered, failed attempt, rejected, expired, refused).",
               ("receiver", "result")),
    MetricSpec("tpuwatch_notification_queue_length", "gauge", "Notifications waiting in the outbox.",
               ("receiver",)),
    MetricSpec("tpuwatch_notification_queue_oldest_age_seconds", "gauge",
               "Age of the oldest notification waiting in the outbox (0 when empty).", ("receiver",)),
    MetricSpec("tpuwatch_notifier_circuit_open", "gauge",
               "1 while the receiver's circuit breaker is open (deliveries paused), else 0.", ("receiver",)),
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
    MetricSpec("tpuwatch_trend_state_save_failures_total", "counter",
               "Failed saves of the trend detectors' learned state to the state directory."),
    MetricSpec("tpuwatch_state_writable", "gauge",
               "1 while state (alerts, outbox, positions, learned trends) is kept in state_dir; 0 while it is kept "
               "in memory only (state_dir read-only, full or missing)."),
    MetricSpec("tpuwatch_state_files_discarded_total", "counter",
               "State files not used because they were corrupt or of the wrong shape (a database moved aside, "
               "rows deleted, a JSON file ignored), by file relative to state_dir.", ("file",)),
    MetricSpec("tpuwatch_config_last_reload_successful", "gauge", "1 if the last config (re)load succeeded."),
    MetricSpec("tpuwatch_config_last_reload_success_timestamp_seconds", "gauge",
               "Unix time of the last successful config (re)load."),
    MetricSpec("tpuwatch_build_info", "gauge", "tpuwatch build; value is always 1.",
               ("version", "python")),
    MetricSpec("tpuwatch_drill_cannot_run", "gauge",
               "1 while the simulated scenario's fire drill cannot run here: the part it needs (the canary for sdc) "
               "is off or cannot start, for the reason given.", ("scenario", "needs", "reason")),
    # --- HTTP endpoint ---
    MetricSpec("tpuwatch_http_connections_closed_total", "counter",
               "Connections and requests the endpoint refused, evicted, timed out or answered with an error, "
               "by reason.", ("reason",)),
    MetricSpec("tpuwatch_http_requests_total", "counter", "HTTP responses sent, by status code.", ("code",)),
    MetricSpec("tpuwatch_http_connections", "gauge",
               "HTTP connections open, by state (handshake, reading, idle, busy, writing, closing).", ("state",)),
    # --- kubernetes node agent (kubernetes.node_conditions, docs/kubernetes.md) ---
    MetricSpec("tpuwatch_kubernetes_node_condition", "gauge",
               "1 while tpuwatch holds the node condition True (a problem present), 0 while False.", ("condition",)),
    MetricSpec("tpuwatch_kubernetes_api_errors_total", "counter",
               "Failed Kubernetes API calls by operation and reason (metav1.Status reason, Timeout, Unavailable).",
               ("operation", "reason")),
    MetricSpec("tpuwatch_kubernetes_remediation_actions_total", "counter",
               "Remediation actions by trigger, action and result (done, failed, dry_run, held_back, rate_limited, "
               "capped).", ("trigger", "action", "result")),
    MetricSpec("tpuwatch_kubernetes_remediation_held_back", "gauge",
               "1 while this node wants to act but max_unhealthy_nodes other nodes already hold every slot."),
    MetricSpec("tpuwatch_kubernetes_slot_held", "gauge", "1 while this node holds a blast-radius slot (a Lease)."),
    MetricSpec("tpuwatch_kubernetes_last_sync_timestamp_seconds", "gauge",
               "Unix time the node's conditions were last written to the API server."),
    MetricSpec("tpuwatch_kubernetes_handoffs_dropped_total", "counter",
               "Sampling cycles whose alert state was replaced by a newer one before the agent took it."),
    MetricSpec("tpuwatch_kubernetes_state_save_failures_total", "counter",
               "Failed saves of the Kubernetes agent's state (remediation counts, acks) to the state directory."),
]

CATALOG: dict[str, MetricSpec] = {spec.name: spec for spec in [*_SPECS, *(m for p in PLUGINS for m in p.metrics)]}
SUMMARY_SUFFIXES = ("_count", "_sum")


def spec_of(sample_name: str) -> MetricSpec:
    """The family a sample belongs to: its own name, or a summary's for NAME_count and NAME_sum."""
    spec = CATALOG.get(sample_name)
    if spec is None:
        for suffix in SUMMARY_SUFFIXES:
            family = CATALOG.get(sample_name.removesuffix(suffix))
            if sample_name.endswith(suffix) and family is not None and family.kind == "summary":
                return family
        raise KeyError(sample_name)
    return spec
