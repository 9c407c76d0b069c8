"""The device backend interface, what a backend reads from a chip, and the samples of a reading."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from tpuwatch.hw.recovery import action_name
from tpuwatch.samples import Sample, sample

if TYPE_CHECKING:
    from tpuwatch.devices.progress import ChipStatus, HangVerdict


@dataclass(frozen=True)
class Summary:
    """A Prometheus summary in base units: observation count, their sum, and (quantile, value) pairs."""

    count: float
    total: float
    quantiles: tuple[tuple[float, float], ...] = ()


def summary_samples(name: str, summary: Summary, **labels: str) -> list[Sample]:
    """NAME{quantile=...} for each quantile, then NAME_count and NAME_sum."""
    out = [sample(name, value, quantile=f"{q:g}", **labels) for q, value in summary.quantiles]
    return [*out, sample(f"{name}_count", summary.count, **labels), sample(f"{name}_sum", summary.total, **labels)]


@dataclass(frozen=True)
class ProcessUse:
    """A process using a chip, with the device memory it holds where the hardware reports it per process."""

    pid: int
    command: str
    device_memory_bytes: float | None = None
    gpu_instance: int | None = None  # the MIG GPU instance it runs in (NVIDIA)


@dataclass(frozen=True)
class LinkReading:
    """One chip-to-chip link (NVLink): whether it is active, and its error counters by kind."""

    link: int
    up: bool
    errors: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SensorTemperature:
    """One of a chip's temperature sensors (AMD: edge, junction, mem): its reading, the limits the hardware shows
    (kind -> °C, e.g. {"crit": 105.0}), and its margin to the limit it is judged against (negative: over it)."""

    sensor: str
    celsius: float
    margin_celsius: float
    limits: dict[str, float] = field(default_factory=dict)
    limit_source: str = ""  # whence the judged limit: "temp2_crit", "default", ...


@dataclass(frozen=True)
class GpuInstance:
    """One MIG GPU instance (NVIDIA): its id and device memory."""

    gpu_instance: int
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None


@dataclass(frozen=True)
class Fabric:
    """An NVIDIA GPU's fabric registration: state, status (nvmlReturn_t of the registration, "success" or an error's
    words), clique and cluster, and where the driver tells it the health summary and mask."""

    state: str
    status: str
    clique_id: int
    cluster_uuid: str
    health: str | None = None
    health_mask: int | None = None

    @property
    def problem(self) -> str | None:
        """Why the GPU cannot use its fabric (registration pending, failed, unhealthy), or None."""
        if self.state != "completed":
            return f"fabric registration {self.state.replace('_', ' ')} (is the Fabric Manager running?)"
        if self.status != "success":
            return f"fabric registration failed: {self.status}"
        if self.health in ("unhealthy", "limited_capacity"):
            return f"fabric health {self.health.replace('_', ' ')} (health mask 0x{self.health_mask or 0:x})"
        return None


@dataclass(frozen=True)
class DeviceReading:
    """What a backend read from one chip.  None means "not exposed by this hardware"."""

    device: str
    chip: str
    pci: str | None = None
    up: bool = True
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    utilization_ratio: float | None = None
    temperature_celsius: float | None = None
    # Every temperature sensor the chip shows, each judged against its own limit (AMD); None: one sensor only.
    sensors: tuple[SensorTemperature, ...] | None = None
    power_watts: float | None = None
    ecc_corrected_total: float | None = None
    ecc_uncorrected_total: float | None = None
    # Why the chip is down (up False), e.g. "NVML: GPU is lost (NVML_ERROR_GPU_IS_LOST)".
    problem: str | None = None
    # TPU v2-v4 driver status from sysfs (ALIVE, DEAD, LAMED, DRIVER_EXITING) and resets since boot.
    status: str | None = None
    reset_count: float | None = None
    # libtpu runtime metrics: whether the runtime answered for this chip, and what it said.
    runtime_metrics: bool | None = None
    memory_bandwidth_utilization_ratio: float | None = None
    tensorcore_idle_seconds: float | None = None
    hlo_queue_size: float | None = None
    hlo_execution_seconds: Summary | None = None
    # libtpu's runtime status of the chip's cores (GetTpuRuntimeStatus), and the hang detector's verdict on it.
    runtime_status: ChipStatus | None = None
    hang: HangVerdict | None = None
    # Megascale latencies the runtime attributes to this chip: (metric, buffer size, summary).
    megascale: tuple[tuple[str, str, Summary], ...] | None = None
    # NVIDIA: memory the driver or firmware reserves (NVML v2 memory info, drivers that have it).
    memory_reserved_bytes: float | None = None
    # NVIDIA: lifetime ECC counts (the two fields above are since the driver loaded).
    ecc_corrected_aggregate_total: float | None = None
    ecc_uncorrected_aggregate_total: float | None = None
    retired_pages_single_bit: float | None = None
    retired_pages_double_bit: float | None = None
    remapped_rows_corrected: float | None = None
    remapped_rows_uncorrected: float | None = None
    memory_repair_pending: bool | None = None
    row_remap_failed: bool | None = None
    pcie_replays_total: float | None = None
    # Clock throttle reasons the chip supports, each True while active.
    throttle_reasons: dict[str, bool] | None = None
    # Processes holding the chip's device files, as "PID (command)"; None when not looked at.
    owners: tuple[str, ...] | None = None
    # The chip's device files (relative to paths.dev; the simulator's are absolute) and the (resource, device id)
    # pairs a Kubernetes device plugin names it by, for pod attribution.
    device_files: tuple[str, ...] = ()
    plugin_ids: tuple[tuple[str, str], ...] = ()
    # Processes using the chip (NVML's running processes, the TPU's device-file holders); None: not looked at.
    processes: tuple[ProcessUse, ...] | None = None
    # NVLinks that are active or were seen active since tpuwatch started; None: the chip has none it reports.
    links: tuple[LinkReading, ...] | None = None
    # NVIDIA: the recovery action the driver asks for (tpuwatch.hw.recovery), None where not supported.
    recovery_action: int | None = None
    # NVIDIA: the GPU's fabric registration (NVSwitch systems), None on GPUs without one.
    fabric: Fabric | None = None
    # NVIDIA: MIG GPU instances while MIG is enabled (at most 7 per GPU), None otherwise.
    instances: tuple[GpuInstance, ...] | None = None
    # Fields whose read failed this time (not for want of support): field -> error, counted by the devices
    # collector (tpuwatch_device_read_errors_total) and reported by check.
    read_errors: dict[str, str] = field(default_factory=dict)
    # What was read from where, e.g. {"memory": "libtpu:localhost:8431", "status": "sysfs:/sys/..."}.
    sources: dict[str, str] = field(default_factory=dict)


def slug(text: str) -> str:
    """Words as a label value: "Insufficient Resources" -> "insufficient_resources"."""
    return "_".join(text.lower().split())


def sources_line(sources: dict[str, str]) -> str:
    """What was read from where, one source at a time: "nvml: memory_used_bytes, power_watts; sysfs:...: presence"."""
    by_source: dict[str, list[str]] = {}
    for what, source in sources.items():
        by_source.setdefault(source, []).append(what)
    return "; ".join(f"{source}: {', '.join(what)}" for source, what in by_source.items())


class DeviceBackend(Protocol):
    """One kind of accelerator.  ``read()`` returns a reading per chip it can see.

    A backend may also have ``extra_samples()``: samples of its last read that
    belong to no chip (e.g. megascale latencies the runtime gives per host),
    and ``missing``: a sentence naming what to install to read everything it
    could (the ``tpu`` extra's gRPC client), None when nothing is missing.
    One that names the processes holding its chips has ``holders``: the
    cycle's one holder scan (``tpuwatch.devices.inventory.holder_scan``),
    asked for its chips' device files in ``read()``; the devices stage
    publishes the same holders in the cycle's inventory.
    """

    name: str

    def read(self) -> list[DeviceReading]: ...


_MEMORY_GAUGES = (  # also what a MIG instance reports
    ("memory_used_bytes", "tpuwatch_device_memory_used_bytes"),
    ("memory_total_bytes", "tpuwatch_device_memory_total_bytes"),
)
_GAUGES = (
    *_MEMORY_GAUGES,
    ("utilization_ratio", "tpuwatch_device_utilization_ratio"),
    ("temperature_celsius", "tpuwatch_device_temperature_celsius"),
    ("power_watts", "tpuwatch_device_power_watts"),
    ("reset_count", "tpuwatch_device_resets_total"),
    ("runtime_metrics", "tpuwatch_device_runtime_metrics_available"),
    ("memory_bandwidth_utilization_ratio", "tpuwatch_device_memory_bandwidth_utilization_ratio"),
    ("tensorcore_idle_seconds", "tpuwatch_device_tensorcore_idle_seconds"),
    ("hlo_queue_size", "tpuwatch_device_hlo_queue_size"),
    ("memory_reserved_bytes", "tpuwatch_device_memory_reserved_bytes"),
    ("memory_repair_pending", "tpuwatch_device_memory_repair_pending"),
    ("row_remap_failed", "tpuwatch_device_row_remap_failed"),
    ("pcie_replays_total", "tpuwatch_device_pcie_replays_total"),
)

# (attribute, metric, label name, label value): one series per label value.
_LABELLED = (
    ("ecc_corrected_total", "tpuwatch_device_ecc_errors_total", "kind", "corrected"),
    ("ecc_uncorrected_total", "tpuwatch_device_ecc_errors_total", "kind", "uncorrected"),
    ("ecc_corrected_aggregate_total", "tpuwatch_device_ecc_errors_aggregate_total", "kind", "corrected"),
    ("ecc_uncorrected_aggregate_total", "tpuwatch_device_ecc_errors_aggregate_total", "kind", "uncorrected"),
    ("retired_pages_single_bit", "tpuwatch_device_retired_pages", "cause", "multiple_single_bit_ecc"),
    ("retired_pages_double_bit", "tpuwatch_device_retired_pages", "cause", "double_bit_ecc"),
    ("remapped_rows_corrected", "tpuwatch_device_remapped_rows", "kind", "corrected"),
    ("remapped_rows_uncorrected", "tpuwatch_device_remapped_rows", "kind", "uncorrected"),
)

SENSOR_TEMPERATURE = "tpuwatch_device_sensor_temperature_celsius"
SENSOR_LIMIT = "tpuwatch_device_temperature_limit_celsius"
SENSOR_MARGIN = "tpuwatch_device_temperature_margin_celsius"
DRIVER_STATUSES = ("ALIVE", "LAMED", "DEAD", "DRIVER_EXITING")
HLO_EXECUTION = "tpuwatch_device_hlo_execution_seconds"
QUEUED_PROGRAMS = "tpuwatch_device_queued_programs"
RUNTIME_ERROR = "tpuwatch_device_runtime_error_info"
STALLED = "tpuwatch_device_stalled_seconds"
MEGASCALE = "tpuwatch_device_megascale_latency_seconds"

# The fields the simulator fills; families of every other field only real backends emit, so checks that
# every catalogue family appears on a simulated host exempt HARDWARE_ONLY_FAMILIES.
_SIMULATED = {"memory_used_bytes", "memory_total_bytes", "utilization_ratio", "temperature_celsius", "power_watts",
              "ecc_corrected_total", "ecc_uncorrected_total"}
HARDWARE_ONLY_FAMILIES = frozenset(
    {metric for attribute, metric in _GAUGES if attribute not in _SIMULATED}
    | {metric for attribute, metric, _, _ in _LABELLED if attribute not in _SIMULATED}
    | {"tpuwatch_device_driver_status", "tpuwatch_device_throttle_active", HLO_EXECUTION, MEGASCALE,
       QUEUED_PROGRAMS, RUNTIME_ERROR, STALLED,
       "tpuwatch_device_nvlink_up", "tpuwatch_device_nvlink_errors_total", "tpuwatch_device_recovery_action",
       "tpuwatch_device_fabric_info", SENSOR_TEMPERATURE, SENSOR_LIMIT, SENSOR_MARGIN}
)


def reading_samples(reading: DeviceReading, backend: str) -> list[Sample]:
    """The samples of one chip's reading; fields the hardware does not expose are absent."""
    device = reading.device
    out = [
        sample("tpuwatch_device_info", 1, device=device, chip=reading.chip, pci=reading.pci or "",
               backend=backend),
        sample("tpuwatch_device_up", 1 if reading.up else 0, device=device),
    ]
    for attribute, metric in _GAUGES:
        value = getattr(reading, attribute)
        if value is not None:
            out.append(sample(metric, value, device=device))
    for attribute, metric, label, label_value in _LABELLED:
        value = getattr(reading, attribute)
        if value is not None:
            out.append(sample(metric, value, device=device, **{label: label_value}))
    for sensor in reading.sensors or ():
        out.append(sample(SENSOR_TEMPERATURE, sensor.celsius, device=device, sensor=sensor.sensor))
        out += [sample(SENSOR_LIMIT, value, device=device, sensor=sensor.sensor, kind=kind)
                for kind, value in sorted(sensor.limits.items())]
        out.append(sample(SENSOR_MARGIN, sensor.margin_celsius, device=device, sensor=sensor.sensor))
    if reading.status is not None:
        statuses = DRIVER_STATUSES if reading.status in DRIVER_STATUSES else (*DRIVER_STATUSES, reading.status)
        out += [sample("tpuwatch_device_driver_status", 1 if s == reading.status else 0, device=device, status=s)
                for s in statuses]
    for reason, active in (reading.throttle_reasons or {}).items():
        out.append(sample("tpuwatch_device_throttle_active", 1 if active else 0, device=device, reason=reason))
    if reading.hlo_execution_seconds is not None:
        out += summary_samples(HLO_EXECUTION, reading.hlo_execution_seconds, device=device)
    if reading.runtime_status is not None:
        out.append(sample(QUEUED_PROGRAMS, reading.runtime_status.queued, device=device))
        out += [sample(RUNTIME_ERROR, 1, device=device, core=str(core), message=message)
                for core, message in reading.runtime_status.errors]
    if reading.hang is not None:
        out.append(sample(STALLED, reading.hang.stalled_seconds, device=device))
    for metric, buffer_size, latency in reading.megascale or ():
        out += summary_samples(MEGASCALE, latency, device=device, metric=metric, buffer_size=buffer_size)
    if reading.recovery_action is not None:
        out.append(sample("tpuwatch_device_recovery_action", reading.recovery_action, device=device,
                          action=action_name(reading.recovery_action)))
    if reading.fabric is not None:
        f = reading.fabric
        out.append(sample("tpuwatch_device_fabric_info", 1, device=device, state=f.state, status=slug(f.status),
                          health=f.health or "", clique_id=str(f.clique_id), cluster_uuid=f.cluster_uuid))
    for instance in reading.instances or ():
        for attribute, metric in _MEMORY_GAUGES:
            value = getattr(instance, attribute)
            if value is not None:
                out.append(sample(metric, value, device=device, gpu_instance=str(instance.gpu_instance)))
    for link in reading.links or ():
        out.append(sample("tpuwatch_device_nvlink_up", 1 if link.up else 0, device=device, link=str(link.link)))
        out += [sample("tpuwatch_device_nvlink_errors_total", count, device=device, link=str(link.link), kind=kind)
                for kind, count in sorted(link.errors.items())]
    return out
