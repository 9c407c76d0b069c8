"""``devices.backend: nvidia``: NVIDIA GPUs through NVML (PyPI nvidia-ml-py, module ``pynvml``).

NVML calls can block in the kernel for good when a GPU falls off the bus, so
each GPU is read in its own lane off the caller's thread (``tpuwatch.hw.deadline.Lanes``):
a GPU whose call does not return in ``devices.nvidia.call_timeout`` is reported
down as unresponsive, and the other GPUs are read as usual.  A GPU that
answers NVML_ERROR_GPU_IS_LOST is reported down.  Values a GPU does not
support (NVML_ERROR_NOT_SUPPORTED, e.g. ECC on consumer boards) are absent.

Per GPU also: the processes running on it with the device memory each holds (compute and graphics
running processes, v3: a process's memory is absent where NVML answers NVML_VALUE_NOT_AVAILABLE), its
UUID and minor number (the names the device plugin and /dev give it), and its NVLinks: each link's state
and, while it is active, its error counters (replay, recovery, CRC flit, CRC data, ECC data).  Which links
a GPU has is learnt on its first read (links 0 to NVML_NVLINK_MAX_LINKS - 1 that answer); every one is
reported, and the devices collector exports a link once it has been seen active this boot
(``tpuwatch.devices.links``), so unused ports are not reported down.  Also the recovery action the driver
asks for and the fabric registration (``nvidia_health``), and MIG instances with their memory and processes
(``nvidia_mig``).  A read that fails other than NOT_SUPPORTED leaves its value absent and is named in the
reading's ``read_errors`` (``nvidia_calls``).
"""

from __future__ import annotations

import functools
import importlib
import logging
import time
from types import ModuleType
from typing import Any

from tpuwatch.config import Config
from tpuwatch.devices import nvidia_health, nvidia_mig
from tpuwatch.devices.base import DeviceReading, LinkReading
from tpuwatch.devices.nvidia_calls import GpuCalls, GpuLost
from tpuwatch.hw.chips import accelerators
from tpuwatch.hw.deadline import CallTimeout, Lanes
from tpuwatch.hw.pci import scan_pci
from tpuwatch.hw.procfs import read_text
from tpuwatch.logsetup import Once

log = logging.getLogger(__name__)

# nvmlClocksEventReason* bits (older headers: nvmlClocksThrottleReason*); pynvml.py of nvidia-ml-py 13.615
# defines 0x200 and 0x400 only under the deprecated throttle names.
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
    0x200: "board_limit",
    0x400: "reliability",
}
# The current calls first, the deprecated ones for drivers (or nvidia-ml-py releases) without them.
SUPPORTED_REASONS = ("nvmlDeviceGetSupportedClocksEventReasons", "nvmlDeviceGetSupportedClocksThrottleReasons")
CURRENT_REASONS = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
NVML_FEATURE_ENABLED = 1
RESOURCE = "nvidia.com/gpu"  # the NVIDIA device plugin's resource; its device ids are the GPUs' UUIDs (or indices)
# nvmlNvLinkErrorCounter_t (pynvml.py NVML_NVLINK_ERROR_DL_*) -> the ``kind`` label.
NVLINK_ERRORS = {"NVML_NVLINK_ERROR_DL_REPLAY": "replay", "NVML_NVLINK_ERROR_DL_RECOVERY": "recovery",
                 "NVML_NVLINK_ERROR_DL_CRC_FLIT": "crc_flit", "NVML_NVLINK_ERROR_DL_CRC_DATA": "crc_data",
                 "NVML_NVLINK_ERROR_DL_ECC_DATA": "ecc_data"}
MAX_NVLINKS = 64  # bounds the probe should a library report more links than any GPU has


def throttle_reasons(supported: int, active: int) -> dict[str, bool]:
    """Each known reason the GPU supports, True while it is active."""
    return {name: bool(active & bit) for bit, name in THROTTLE_REASONS.items() if supported & bit}


def pci_bus_id(bus_id: str | bytes) -> str:
    """NVML's "00000000:3B:00.0" as sysfs writes it, "0000:3b:00.0"."""
    text = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
    domain, rest = text.strip().lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def build(config: Config) -> NvidiaBackend:
    """The backend ``devices.backend: nvidia`` names."""
    return NvidiaBackend(config)


def chips(sysfs: str) -> list[str]:
    """NVIDIA display-class PCI functions (3D or VGA controllers) under ``sysfs``, one per GPU."""
    return [d.address for d in accelerators(scan_pci(sysfs))["nvidia"]]


class NvidiaBackend:
    """Every GPU NVML sees, each read with a deadline in its own lane."""

    name = "nvidia"

    def __init__(self, config: Config, module: str = "pynvml") -> None:
        self.timeout = config.devices.nvidia.call_timeout
        self.lanes = Lanes()
        self._module = module
        self._nvml: ModuleType | None = None
        self._identity: dict[int, tuple[str, str | None]] = {}  # index -> (name, PCI address) once read
        self._in_call: dict[int, str] = {}  # index -> the NVML function a GPU's lane is in
        self._logged = Once()
        self._procfs = config.paths.procfs
        self._links: dict[int, tuple[int, ...]] = {}  # index -> the links its first read found

    def read(self) -> list[DeviceReading]:
        """One reading per GPU; a GPU that is lost or does not answer in time is reported down."""
        nvml = self._init()
        count = self.lanes.call("nvml", nvml.nvmlDeviceGetCount, self.timeout)
        deadline = time.monotonic() + self.timeout
        started: dict[int, Any] = {}
        readings: dict[int, DeviceReading] = {}
        for index in range(count):
            try:
                started[index] = self.lanes.start(f"gpu{index}", functools.partial(self._read_gpu, nvml, index))
            except CallTimeout as exc:
                readings[index] = self._down(index, f"unresponsive: NVML {self._in_call.get(index)}: {exc}")
        for index, call in started.items():
            try:
                readings[index] = self.lanes.wait(call, deadline)
            except CallTimeout as exc:
                readings[index] = self._down(index, f"unresponsive: NVML {self._in_call.get(index)}: {exc}")
            except GpuLost as exc:
                readings[index] = self._down(index, f"GPU is lost ({exc})")
            except nvml.NVMLError as exc:
                readings[index] = self._down(index, f"NVML {self._in_call.get(index)} failed: {exc}")
        return [readings[i] for i in sorted(readings)]

    def _init(self) -> Any:
        if self._nvml is None:
            try:
                nvml = importlib.import_module(self._module)
            except ImportError:
                raise RuntimeError("NVML cannot be read: nvidia-ml-py is not installed "
                                   "(pip install 'tpuwatch[nvidia]')") from None
            try:
                self.lanes.call("nvml", nvml.nvmlInit, self.timeout)
            except nvml.NVMLError as exc:
                raise RuntimeError(f"nvmlInit failed: {exc}") from None
            self._nvml = nvml
        return self._nvml

    def _down(self, index: int, problem: str) -> DeviceReading:
        name, pci = self._identity.get(index, ("unknown", None))
        return DeviceReading(device=str(index), chip=name, pci=pci, up=False, problem=problem,
                             sources={"presence": "nvml"})

    def _read_gpu(self, nvml: Any, index: int) -> DeviceReading:
        """Everything NVML tells about one GPU (runs in the GPU's lane)."""
        calls = GpuCalls(nvml, index, self._in_call, self._logged)
        handle = calls.call("nvmlDeviceGetHandleByIndex", index)
        name = _text(calls.call("nvmlDeviceGetName", handle))
        pci = pci_bus_id(calls.call("nvmlDeviceGetPciInfo", handle).busId)
        self._identity[index] = (name, pci)
        fields: dict[str, Any] = {}
        memory = calls.optional("nvmlDeviceGetMemoryInfo", handle)
        if memory is not None:
            fields.update(memory_used_bytes=float(memory.used), memory_total_bytes=float(memory.total))
        if hasattr(nvml, "nvmlMemory_v2"):  # used stays v1's: NVML's docs disagree on whether v2's includes reserved
            memory_v2 = calls.first(("nvmlDeviceGetMemoryInfo",), handle, version=nvml.nvmlMemory_v2,
                                    field="nvmlDeviceGetMemoryInfo_v2")
            fields["memory_reserved_bytes"] = float(memory_v2.reserved) if memory_v2 is not None else None
        utilization = calls.optional("nvmlDeviceGetUtilizationRates", handle)
        if utilization is not None:
            fields["utilization_ratio"] = utilization.gpu / 100.0
        fields["temperature_celsius"] = calls.optional("nvmlDeviceGetTemperature", handle, nvml.NVML_TEMPERATURE_GPU)
        power = calls.optional("nvmlDeviceGetPowerUsage", handle)
        fields["power_watts"] = power / 1000.0 if power is not None else None
        for kind, error_type in (("corrected", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                                 ("uncorrected", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
            for suffix, counter in (("", nvml.NVML_VOLATILE_ECC), ("_aggregate", nvml.NVML_AGGREGATE_ECC)):
                fields[f"ecc_{kind}{suffix}_total"] = calls.optional("nvmlDeviceGetTotalEccErrors", handle,
                                                                     error_type, counter)
        causes = (("retired_pages_single_bit", nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
                  ("retired_pages_double_bit", nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR))
        for attribute, cause in causes:
            pages = calls.optional("nvmlDeviceGetRetiredPages", handle, cause)
            fields[attribute] = float(len(pages)) if pages is not None else None
        pages_pending = calls.optional("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        rows = calls.optional("nvmlDeviceGetRemappedRows", handle)
        rows_pending = None
        if rows is not None:
            corrected, uncorrected, rows_pending, failed = rows
            fields.update(remapped_rows_corrected=float(corrected), remapped_rows_uncorrected=float(uncorrected),
                          row_remap_failed=bool(failed))
        pending = [bool(p) for p in (None if pages_pending is None else pages_pending == NVML_FEATURE_ENABLED,
                                     rows_pending) if p is not None]
        fields["memory_repair_pending"] = any(pending) if pending else None
        fields["pcie_replays_total"] = calls.optional("nvmlDeviceGetPcieReplayCounter", handle)
        supported = calls.first(SUPPORTED_REASONS, handle)
        active = calls.first(CURRENT_REASONS, handle)
        if supported is not None and active is not None:
            fields["throttle_reasons"] = throttle_reasons(supported, active)
        fields.update(self._identity_fields(calls, handle))
        action, action_supported = nvidia_health.recovery_action(calls, handle)
        fields["recovery_action"] = action
        fields["fabric"] = nvidia_health.fabric(calls, handle)
        mig = nvidia_mig.instances(calls, handle)
        fields["instances"] = mig[0] if mig is not None else None
        listed = nvidia_mig.processes(calls, handle, mig[1] if mig is not None else [])
        fields["processes"] = None if listed is None else nvidia_mig.uses(listed, self._command)
        fields["links"] = self._read_links(calls, handle)
        self._in_call.pop(index, None)
        sources = {"presence": "nvml"}
        sources.update({key: "nvml" for key, value in fields.items() if value is not None and value != ()})
        if not action_supported:
            sources["recovery_action"] = "not supported by the driver"
        return DeviceReading(device=str(index), chip=name, pci=pci, sources=sources, read_errors=calls.failures,
                             **fields)

    def _identity_fields(self, calls: GpuCalls, handle: Any) -> dict[str, Any]:
        """The GPU's device file (/dev/nvidiaMINOR) and the ids the device plugin names it by."""
        uuid = calls.optional("nvmlDeviceGetUUID", handle)
        minor = calls.optional("nvmlDeviceGetMinorNumber", handle)
        ids = ((RESOURCE, _text(uuid)),) if uuid else ()
        return {"device_files": (f"nvidia{minor}",) if minor is not None else (),
                "plugin_ids": (*ids, (RESOURCE, str(calls.index)))}

    def _command(self, pid: int) -> str:
        return read_text(f"{self._procfs}/{pid}/comm").strip()[:64] or "?"

    def _read_links(self, calls: GpuCalls, handle: Any) -> tuple[LinkReading, ...] | None:
        """State and error counters of every link the GPU has (the collector keeps those seen active)."""
        nvml, index = calls.nvml, calls.index
        if not hasattr(nvml, "nvmlDeviceGetNvLinkState"):
            return None
        if index not in self._links:  # the first read learns which links exist; absent ones answer an error
            count = min(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)), MAX_NVLINKS)
            self._links[index] = tuple(link for link in range(count)
                                       if calls.quiet("nvmlDeviceGetNvLinkState", handle, link) is not None)
        links = []
        for link in self._links[index]:
            up = calls.quiet("nvmlDeviceGetNvLinkState", handle, link) == NVML_FEATURE_ENABLED
            errors = {kind: calls.quiet("nvmlDeviceGetNvLinkErrorCounter", handle, link, getattr(nvml, constant))
                      for constant, kind in NVLINK_ERRORS.items() if up and hasattr(nvml, constant)}
            links.append(LinkReading(link, up, {k: float(v) for k, v in errors.items() if v is not None}))
        return tuple(links) if self._links[index] else None
