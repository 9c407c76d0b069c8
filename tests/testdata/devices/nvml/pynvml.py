"""A stand-in for nvidia-ml-py's ``pynvml`` at the NVML boundary, for tests on hosts without a GPU.

Shaped after pynvml.py of nvidia-ml-py 13.615.71: the clocks "event reason"
calls beside the deprecated "throttle reason" ones, nvmlDeviceGetMemoryInfo
with ``version=nvmlMemory_v2`` calling nvmlDeviceGetMemoryInfo_v2 and
answering (version, total, reserved, free, used), and NVML_ERROR_FUNCTION_NOT_FOUND
when the loaded driver library lacks a C function (``_nvmlGetFunctionPointer``).  The
running-process calls answer what nvmlDeviceGet{Compute,Graphics}RunningProcesses_v3 do:
objects with pid, usedGpuMemory (None where NVML answered NVML_VALUE_NOT_AVAILABLE, as
pynvml converts it), gpuInstanceId and computeInstanceId.  The NVLink calls take a link
index below NVML_NVLINK_MAX_LINKS (36 in 13.615.71): nvmlDeviceGetNvLinkState answers
NVML_FEATURE_ENABLED or DISABLED, a link the GPU lacks NVML_ERROR_INVALID_ARGUMENT, a GPU
without NVLink NVML_ERROR_NOT_SUPPORTED; nvmlDeviceGetNvLinkErrorCounter takes an
NVML_NVLINK_ERROR_DL_* counter.

The GPUs are described by the JSON file named in $FAKE_NVML_STATE, read again
on every call so a test can change a GPU while the backend runs.  Per GPU:
name, bus_id, memory_used, memory_total, utilization_gpu, temperature,
power_mw, ecc {"corrected"|"uncorrected": [volatile, aggregate]}, retired_pages
{"single_bit"|"double_bit": N}, retired_pending, remapped_rows [corr, unc,
pending, failed], pcie_replays, throttle [supported, active], memory_reserved;
"unsupported": [function names] answer NVML_ERROR_NOT_SUPPORTED; "driver_lacks":
[NVML C function names] answer NVML_ERROR_FUNCTION_NOT_FOUND, like an older
driver; uuid, minor; "processes": {"compute"|"graphics": [[pid, bytes or null]]};
"nvlinks": [state per link], "nvlink_errors": {"LINK": {"replay"|"recovery"|"crc_flit"|
"crc_data"|"ecc_data": N}}; "lost": true makes every call
answer NVML_ERROR_GPU_IS_LOST; "hang": a function name that never returns
(until RELEASE is set), like NVML on a GPU that fell off the bus.
"""

from __future__ import annotations

import json
import os
import threading
from collections import namedtuple
from types import SimpleNamespace
from typing import Any

NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
nvmlMemory_v2 = 0x02000028
NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_NVLINK_ERROR_DL_CRC_DATA = 3
NVML_NVLINK_ERROR_DL_ECC_DATA = 4
_NVLINK_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data", "ecc_data")
_MESSAGES = {NVML_ERROR_NOT_SUPPORTED: "Not Supported", NVML_ERROR_GPU_IS_LOST: "GPU is lost",
             NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found", NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument"}

RELEASE = threading.Event()
Memory = namedtuple("Memory", "total free used")
MemoryV2 = namedtuple("MemoryV2", "version total reserved free used")
Utilization = namedtuple("Utilization", "gpu memory")
PciInfo = namedtuple("PciInfo", "busId")


class NVMLError(Exception):
    """pynvml's error: ``value`` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML error {self.value}")


def _gpus() -> list[dict[str, Any]]:
    with open(os.environ["FAKE_NVML_STATE"], encoding="utf-8") as handle:
        return json.load(handle)["gpus"]


def _gpu(handle: int, function: str) -> dict[str, Any]:
    gpu = _gpus()[handle]
    if function in gpu.get("driver_lacks", []):
        raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
    if gpu.get("lost"):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    if gpu.get("hang") == function:
        RELEASE.wait()
    if function in gpu.get("unsupported", []):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return gpu


def nvmlInit() -> None:
    _gpus()


def nvmlDeviceGetCount() -> int:
    return len(_gpus())


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    _gpu(index, "nvmlDeviceGetHandleByIndex")
    return index


def nvmlDeviceGetName(handle: int) -> str:
    return _gpu(handle, "nvmlDeviceGetName")["name"]


def nvmlDeviceGetPciInfo(handle: int) -> PciInfo:
    return PciInfo(_gpu(handle, "nvmlDeviceGetPciInfo")["bus_id"])


def nvmlDeviceGetMemoryInfo(handle: int, version: int | None = None) -> Memory | MemoryV2:
    if not version:
        gpu = _gpu(handle, "nvmlDeviceGetMemoryInfo")
        return Memory(gpu["memory_total"], gpu["memory_total"] - gpu["memory_used"], gpu["memory_used"])
    gpu = _gpu(handle, "nvmlDeviceGetMemoryInfo_v2")
    reserved = gpu.get("memory_reserved", 0)
    return MemoryV2(version, gpu["memory_total"], reserved, gpu["memory_total"] - gpu["memory_used"],
                    gpu["memory_used"])


def nvmlDeviceGetUtilizationRates(handle: int) -> Utilization:
    return Utilization(_gpu(handle, "nvmlDeviceGetUtilizationRates")["utilization_gpu"], 0)


def nvmlDeviceGetTemperature(handle: int, sensor: int) -> int:
    assert sensor == NVML_TEMPERATURE_GPU
    return _gpu(handle, "nvmlDeviceGetTemperature")["temperature"]


def nvmlDeviceGetPowerUsage(handle: int) -> int:
    return _gpu(handle, "nvmlDeviceGetPowerUsage")["power_mw"]


def nvmlDeviceGetTotalEccErrors(handle: int, error_type: int, counter_type: int) -> int:
    kind = "corrected" if error_type == NVML_MEMORY_ERROR_TYPE_CORRECTED else "uncorrected"
    return _gpu(handle, "nvmlDeviceGetTotalEccErrors")["ecc"][kind][counter_type]


def nvmlDeviceGetRetiredPages(handle: int, cause: int) -> list[int]:
    kind = "single_bit" if cause == NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS else "double_bit"
    return [0x1000 * (i + 1) for i in range(_gpu(handle, "nvmlDeviceGetRetiredPages")["retired_pages"][kind])]


def nvmlDeviceGetRetiredPagesPendingStatus(handle: int) -> int:
    return int(_gpu(handle, "nvmlDeviceGetRetiredPagesPendingStatus")["retired_pending"])


def nvmlDeviceGetRemappedRows(handle: int) -> tuple[int, int, int, int]:
    return tuple(_gpu(handle, "nvmlDeviceGetRemappedRows")["remapped_rows"])


def nvmlDeviceGetPcieReplayCounter(handle: int) -> int:
    return _gpu(handle, "nvmlDeviceGetPcieReplayCounter")["pcie_replays"]


def nvmlDeviceGetSupportedClocksThrottleReasons(handle: int) -> int:
    return _gpu(handle, "nvmlDeviceGetSupportedClocksThrottleReasons")["throttle"][0]


def nvmlDeviceGetCurrentClocksThrottleReasons(handle: int) -> int:
    return _gpu(handle, "nvmlDeviceGetCurrentClocksThrottleReasons")["throttle"][1]


def nvmlDeviceGetSupportedClocksEventReasons(handle: int) -> int:
    return _gpu(handle, "nvmlDeviceGetSupportedClocksEventReasons")["throttle"][0]


def nvmlDeviceGetCurrentClocksEventReasons(handle: int) -> int:
    return _gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons")["throttle"][1]


def nvmlDeviceGetUUID(handle: int) -> str:
    return _gpu(handle, "nvmlDeviceGetUUID")["uuid"]


def nvmlDeviceGetMinorNumber(handle: int) -> int:
    return _gpu(handle, "nvmlDeviceGetMinorNumber")["minor"]


def _processes(handle: int, function: str, kind: str) -> list[SimpleNamespace]:
    listed = _gpu(handle, function).get("processes", {}).get(kind, [])
    return [SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
            for pid, used in listed]


def nvmlDeviceGetComputeRunningProcesses(handle: int) -> list[SimpleNamespace]:
    return _processes(handle, "nvmlDeviceGetComputeRunningProcesses", "compute")


def nvmlDeviceGetGraphicsRunningProcesses(handle: int) -> list[SimpleNamespace]:
    return _processes(handle, "nvmlDeviceGetGraphicsRunningProcesses", "graphics")


def _link(handle: int, function: str, link: int) -> dict[str, Any]:
    gpu = _gpu(handle, function)
    if "nvlinks" not in gpu:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if not 0 <= link < min(len(gpu["nvlinks"]), NVML_NVLINK_MAX_LINKS):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return gpu


def nvmlDeviceGetNvLinkState(handle: int, link: int) -> int:
    return int(_link(handle, "nvmlDeviceGetNvLinkState", link)["nvlinks"][link])


def nvmlDeviceGetNvLinkErrorCounter(handle: int, link: int, counter: int) -> int:
    gpu = _link(handle, "nvmlDeviceGetNvLinkErrorCounter", link)
    return int(gpu.get("nvlink_errors", {}).get(str(link), {}).get(_NVLINK_COUNTERS[counter], 0))
