"""Running processes and MIG instances of an NVIDIA GPU.

Process lists: nvidia-ml-py's ``nvmlDeviceGet{Compute,Graphics}RunningProcesses`` call the driver's ``_v3``
symbols; drivers 535.43 to 535.104 changed, removed and restored ``_v3`` (nvitop issues #79, #89 and #94), and
older drivers have only ``_v2`` or the unversioned symbol.  So, as nvitop does: ``_v3`` (nvidia-ml-py raises
NVMLLibraryMismatchError when the symbol is missing), then ``_v2``, then the unversioned symbol with its
``nvmlProcessInfo_v1_t`` (pid, usedGpuMemory; no instance ids), each with NVML's size protocol (count 0
first; NVML_ERROR_INSUFFICIENT_SIZE tells the count; SUCCESS means none).

MIG (nvml.h; pynvml.py of nvidia-ml-py 13.615.71): ``nvmlDeviceGetMigMode`` answers (current, pending); with
current 1, MIG device handles 0 to ``nvmlDeviceGetMaxMigDeviceCount`` - 1 (NOT_FOUND: an empty slot) each
name their GPU instance (``nvmlDeviceGetGpuInstanceId``) and answer memory per GPU instance
(``nvmlDeviceGetMemoryInfo``; compute instances of one GPU instance share its memory).  Processes carry
``gpuInstanceId`` (0xFFFFFFFF without MIG).  A GPU has at most 7 GPU instances (A100, H100, B200: seven
memory slices), so at most ``MAX_INSTANCES`` instances are exported per GPU.
"""

from __future__ import annotations

import ctypes
from typing import Any

from tpuwatch.devices.base import GpuInstance, ProcessUse
from tpuwatch.devices.nvidia_calls import GpuCalls, GpuLost, error_text

MAX_INSTANCES = 7
NO_INSTANCE = 0xFFFFFFFF
NVML_VALUE_NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF
MAX_PROCESSES = 4096  # bounds the buffer should a driver answer an absurd count
KINDS = ("Compute", "Graphics")


class ProcessInfoV1(ctypes.Structure):
    """nvmlProcessInfo_v1_t: what the unversioned process-list symbols fill (nvml.h)."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


def running(calls: GpuCalls, handle: Any, kind: str) -> list[tuple[int, float | None, int | None]] | None:
    """(pid, device memory or None, GPU instance or None) of ``kind`` ("Compute", "Graphics") processes;
    None when no symbol answers."""
    function = f"nvmlDeviceGet{kind}RunningProcesses"
    listed = calls.first((function, f"{function}_v2"), handle, field=function)
    if listed is None and function not in calls.failures:
        listed = _unversioned(calls, handle, function)
    if listed is None:
        return None
    out = []
    for process in listed:
        used = getattr(process, "usedGpuMemory", None)
        instance = getattr(process, "gpuInstanceId", NO_INSTANCE)
        out.append((int(process.pid), None if used is None or used == NVML_VALUE_NOT_AVAILABLE else float(used),
                    None if instance in (None, NO_INSTANCE) else int(instance)))
    return out


def _unversioned(calls: GpuCalls, handle: Any, function: str) -> list[ProcessInfoV1] | None:
    """The unversioned symbol, called as nvitop does (nvidia-ml-py has no wrapper for it)."""
    nvml = calls.nvml
    pointer = getattr(nvml, "_nvmlGetFunctionPointer", None)
    if pointer is None:
        return None
    calls.in_call[calls.index] = function
    try:
        fn = pointer(function)
    except nvml.NVMLError:
        return None
    count = ctypes.c_uint(0)
    code = fn(handle, ctypes.byref(count), None)
    if code == nvml.NVML_ERROR_INSUFFICIENT_SIZE:
        count.value = min(count.value * 2 + 5, MAX_PROCESSES)
        buffer = (ProcessInfoV1 * count.value)()
        code = fn(handle, ctypes.byref(count), buffer)
        if code == nvml.NVML_SUCCESS:
            return [buffer[i] for i in range(min(count.value, len(buffer)))]
    if code == nvml.NVML_SUCCESS:
        return []
    if code == nvml.NVML_ERROR_GPU_IS_LOST:
        raise GpuLost(f"{function}: {error_text(nvml, code)}")
    if code != calls.not_supported:
        calls.failed(function, function, error_text(nvml, code))
    return None


def processes(calls: GpuCalls, handle: Any, mig: list[Any]) -> tuple[tuple[int, float | None, int | None], ...] | None:
    """Compute and graphics processes on the GPU and on its MIG devices ``mig`` ((GPU instance, handle)),
    a pid once: its largest memory figure, and its instance where any list names one."""
    found: dict[int, tuple[float | None, int | None]] = {}
    answered = False
    lists = [(None, handle), *mig]
    for instance, where in lists:
        for kind in KINDS:
            listed = running(calls, where, kind)
            answered = answered or listed is not None
            for pid, used, named in listed or ():
                previous_used, previous_instance = found.get(pid, (None, None))
                best = used if previous_used is None else max(previous_used, used or 0.0)
                found[pid] = (best, next((i for i in (previous_instance, named, instance) if i is not None), None))
    if not answered:
        return None
    return tuple((pid, used, instance) for pid, (used, instance) in sorted(found.items()))


def uses(listed: tuple[tuple[int, float | None, int | None], ...], command: Any) -> tuple[ProcessUse, ...]:
    """The processes as ProcessUse, each named by ``command(pid)``."""
    return tuple(ProcessUse(pid, command(pid), used, instance) for pid, used, instance in listed)


def instances(calls: GpuCalls, handle: Any) -> tuple[tuple[GpuInstance, ...], list[Any]] | None:
    """The GPU's MIG instances (at most MAX_INSTANCES, by id) and its MIG device handles as (GPU instance,
    handle); None when MIG is not enabled or not supported."""
    mode = calls.optional("nvmlDeviceGetMigMode", handle)
    if mode is None or int(mode[0]) != 1:
        return None
    count = calls.optional("nvmlDeviceGetMaxMigDeviceCount", handle) or 0
    found: dict[int, GpuInstance] = {}
    handles = []
    for slot in range(int(count)):
        mig, code = calls.attempt("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
        if mig is None:
            if code not in (calls.nvml.NVML_ERROR_NOT_FOUND, calls.not_supported, *calls.not_found):
                calls.failed("nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetMigDeviceHandleByIndex",
                             error_text(calls.nvml, code or -1))
            continue
        instance = calls.optional("nvmlDeviceGetGpuInstanceId", mig)
        if instance is None or (int(instance) not in found and len(found) >= MAX_INSTANCES):
            continue
        handles.append((int(instance), mig))
        if int(instance) in found:  # another compute instance of the same GPU instance: the same memory
            continue
        memory = calls.optional("nvmlDeviceGetMemoryInfo", mig)
        found[int(instance)] = GpuInstance(int(instance), None if memory is None else float(memory.used),
                                           None if memory is None else float(memory.total))
    return tuple(found[i] for i in sorted(found)), handles
