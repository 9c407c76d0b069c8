"""What an NVIDIA driver says a GPU needs: its recovery action (NVML field 230) and its fabric registration.

Sources: nvml.h of nvidia-nvml-dev 13.5.37 and pynvml.py of nvidia-ml-py 13.615.71.  The recovery action is
``nvmlDeviceGetFieldValues(h, [NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])``: each entry carries its own
``nvmlReturn`` and the action in ``value.uiVal``; a driver older than the field (before 565) answers
NOT_SUPPORTED for it, which is "not supported", never "none".  Fabric info (NVSwitch and multi-node NVLink
systems: HGX, GB200 NVL) is ``nvmlDeviceGetGpuFabricInfoV`` with the newest struct the driver takes: v3
(version 0x03000028, adds ``healthSummary``), else v2 (0x02000024, adds ``healthMask``; a driver that does
not know v3 answers NVML_ERROR_ARGUMENT_VERSION_MISMATCH), else the deprecated ``nvmlDeviceGetGpuFabricInfo``
(no health).  PCIe GPUs answer NOT_SUPPORTED, or state NOT_SUPPORTED: no fabric, no metric.
"""

from __future__ import annotations

import ctypes
from typing import Any

from tpuwatch.devices.base import Fabric
from tpuwatch.devices.nvidia_calls import GpuCalls, GpuLost, error_text
from tpuwatch.hw.recovery import RECOVERY_ACTION_FIELD

FIELD_NAME = "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
HEALTH_SUMMARIES = {0: "not_supported", 1: "healthy", 2: "unhealthy", 3: "limited_capacity"}
FABRIC_V3 = 0x03000028
FABRIC_V2 = 0x02000024
UUID_LEN = 16  # NVML_GPU_FABRIC_UUID_LEN


class FabricInfoV3(ctypes.Structure):
    """nvmlGpuFabricInfo_v3_t (nvml.h), defined here for nvidia-ml-py releases whose struct is v2."""

    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_uint8 * UUID_LEN), ("status", ctypes.c_uint),
                ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint), ("healthMask", ctypes.c_uint32),
                ("healthSummary", ctypes.c_uint8)]


class FabricInfoV2(ctypes.Structure):
    """nvmlGpuFabricInfo_v2_t (nvml.h)."""

    _fields_ = FabricInfoV3._fields_[:-1]


class FabricInfoV1(ctypes.Structure):
    """nvmlGpuFabricInfo_t, the deprecated call's struct (no version, no health)."""

    _fields_ = FabricInfoV3._fields_[1:5]


def recovery_action(calls: GpuCalls, handle: Any) -> tuple[int | None, bool]:
    """(the action, supported): the action code when the driver answers field 230, (None, False) when it does
    not know the field; a failed read is (None, True) and recorded."""
    nvml = calls.nvml
    values = calls.first(("nvmlDeviceGetFieldValues",), handle, [RECOVERY_ACTION_FIELD], field=FIELD_NAME)
    if values is None:
        return None, FIELD_NAME in calls.failures
    entry = values[0]
    code = int(entry.nvmlReturn)
    if code == nvml.NVML_SUCCESS:
        return int(entry.value.uiVal), True
    if code == nvml.NVML_ERROR_GPU_IS_LOST:
        raise GpuLost(f"nvmlDeviceGetFieldValues({FIELD_NAME}): {error_text(nvml, code)}")
    if code == calls.not_supported:
        return None, False
    calls.failed(FIELD_NAME, "nvmlDeviceGetFieldValues", error_text(nvml, code))
    return None, True


def fabric(calls: GpuCalls, handle: Any) -> Fabric | None:
    """The GPU's fabric registration, None where it has none (PCIe GPUs) or it could not be read."""
    mismatch = getattr(calls.nvml, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", None)
    attempts: tuple[tuple[str, type[ctypes.Structure], int | None], ...] = (
        ("nvmlDeviceGetGpuFabricInfoV", FabricInfoV3, FABRIC_V3),
        ("nvmlDeviceGetGpuFabricInfoV", FabricInfoV2, FABRIC_V2),
        ("nvmlDeviceGetGpuFabricInfo", FabricInfoV1, None))
    for function, struct, version in attempts:
        info = struct(version=version) if version is not None else struct()
        _, code = calls.attempt(function, handle, ctypes.byref(info))
        if code is None:
            return _fabric(calls.nvml, info)
        if code == mismatch or code in calls.not_found:
            continue
        if code != calls.not_supported:
            calls.failed("fabric", function, error_text(calls.nvml, code))
        return None
    return None


def _fabric(nvml: Any, info: ctypes.Structure) -> Fabric | None:
    state = int(info.state)  # type: ignore[attr-defined]
    if state == 0:
        return None
    status = int(info.status)  # type: ignore[attr-defined]
    health = getattr(info, "healthSummary", None)
    return Fabric(state=FABRIC_STATES.get(state, str(state)),
                  status="success" if status == 0 else error_text(nvml, status),
                  clique_id=int(info.cliqueId),  # type: ignore[attr-defined]
                  cluster_uuid=bytes(info.clusterUuid).hex(),  # type: ignore[attr-defined]
                  health=None if health is None else HEALTH_SUMMARIES.get(int(health), str(int(health))),
                  health_mask=getattr(info, "healthMask", None))
