"""The stand-in libnvidia-ml.so.1 (tests/nvml/) at its C boundary, through the real nvidia-ml-py.

What the NVIDIA backend's tests rely on: the struct versions nvidia-ml-py passes, the INSUFFICIENT_SIZE
protocol of the list calls, the NVMLError subclass nvidia-ml-py raises for each return code, a hung call
that returns once released, a slow one, MIG and fabric calls, a driver lacking newer symbols, and state
files that are garbage (an answer of NVML_ERROR_UNKNOWN, never a crash); once under AddressSanitizer.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest

import statefuzz
from conftest import wait_until
from fakenvml import SONAME, FakeNvml, build, environment

MIG_NVSWITCH = Path(__file__).parent / "testdata" / "devices" / "nvml" / "mig_nvswitch.json"
NOT_MIG = 0xFFFFFFFF


@pytest.fixture
def gpus(nvml: FakeNvml) -> FakeNvml:
    """h100x4.json with nvmlInit called (nvidia-ml-py counts references; the library too)."""
    pynvml.nvmlInit()
    return nvml


@pytest.fixture
def composed(gpus: FakeNvml) -> FakeNvml:
    """An A100 in MIG mode and an H100 on an NVSwitch board (mig_nvswitch.json)."""
    gpus.write(json.loads(MIG_NVSWITCH.read_text()))
    return gpus


def handle(index: int) -> Any:
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def test_system_calls_answer_from_the_state_file(gpus: FakeNvml) -> None:
    assert pynvml.nvmlDeviceGetCount() == 4
    assert pynvml.nvmlSystemGetDriverVersion() == "580.95.05", "a default when the file does not say"
    gpus.update(driver_version="535.104.05", nvml_version="12.535.104.05")
    assert (pynvml.nvmlSystemGetDriverVersion(), pynvml.nvmlSystemGetNVMLVersion()) == ("535.104.05",
                                                                                       "12.535.104.05")
    assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_GPU_IS_LOST) == "GPU is lost"
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        handle(4)
    name = ctypes.create_string_buffer(8)  # too small for "NVIDIA H100 80GB HBM3"
    ret = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetName")(handle(0), name, ctypes.c_uint(8))
    assert ret == pynvml.NVML_ERROR_INSUFFICIENT_SIZE


def test_every_reading_of_a_gpu_reaches_nvidia_ml_py(gpus: FakeNvml) -> None:
    h = handle(0)
    assert pynvml.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3"
    pci = pynvml.nvmlDeviceGetPciInfo(h)
    assert (pci.busId, pci.busIdLegacy, pci.domain, pci.bus, pci.device) == ("00000000:18:00.0", "0000:18:00.0",
                                                                          0, 0x18, 0)
    memory = pynvml.nvmlDeviceGetMemoryInfo(h)
    assert (memory.total, memory.used, memory.free) == (85520809984, 42949672960, 85520809984 - 42949672960)
    assert pynvml.nvmlDeviceGetUtilizationRates(h).gpu == 97
    assert pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 61
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 512345
    assert [pynvml.nvmlDeviceGetTotalEccErrors(h, kind, counter) for kind in (0, 1) for counter in (0, 1)] == [
        3, 17, 0, 0]
    assert pynvml.nvmlDeviceGetRemappedRows(handle(1)) == (0, 1, 1, 0)
    assert pynvml.nvmlDeviceGetPcieReplayCounter(h) == 5
    assert (pynvml.nvmlDeviceGetSupportedClocksEventReasons(h), pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
            pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)) == (2047, 516, 516)
    assert (pynvml.nvmlDeviceGetUUID(h), pynvml.nvmlDeviceGetMinorNumber(h)) == (
        "GPU-0b1c7f3e-5a2d-4e6f-9b0c-1d2e3f4a5b6c", 0)
    assert (pynvml.nvmlDeviceGetNvLinkState(h, 3), pynvml.nvmlDeviceGetNvLinkState(handle(1), 1)) == (1, 0)
    assert pynvml.nvmlDeviceGetNvLinkErrorCounter(h, 3, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT) == 12
    assert pynvml.nvmlDeviceGetNvLinkErrorCounter(h, 4, pynvml.NVML_NVLINK_ERROR_DL_REPLAY) == 0
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetNvLinkState(h, 18)  # an H100 has links 0-17
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkState(handle(3), 0)  # no NVLink at all
    gpus.change(0, retired_pages={"single_bit": 3, "double_bit": 0}, unsupported=[])
    assert pynvml.nvmlDeviceGetRetiredPages(h, 0) == [0x1000, 0x2000, 0x3000]
    assert [p["address"] for p in pynvml.nvmlDeviceGetRetiredPages_v2(h, 0)] == [0x1000, 0x2000, 0x3000]
    assert pynvml.nvmlDeviceGetRetiredPages(h, 1) == []


@pytest.mark.parametrize("change,call,error", [
    ({"lost": True}, "nvmlDeviceGetPowerUsage", "NVMLError_GpuIsLost"),
    ({"unsupported": ["nvmlDeviceGetPowerUsage"]}, "nvmlDeviceGetPowerUsage", "NVMLError_NotSupported"),
    ({"errors": {"nvmlDeviceGetPowerUsage": "NO_PERMISSION"}}, "nvmlDeviceGetPowerUsage", "NVMLError_NoPermission"),
    ({"errors": {"nvmlDeviceGetPowerUsage": "NVML_ERROR_TIMEOUT"}}, "nvmlDeviceGetPowerUsage", "NVMLError_Timeout"),
    ({"errors": {"nvmlDeviceGetPowerUsage": 999}}, "nvmlDeviceGetPowerUsage", "NVMLError_Unknown"),
    ({"errors": {"nvmlDeviceGetPowerUsage": "RESET_REQUIRED"}}, "nvmlDeviceGetPowerUsage",
     "NVMLError_ResetRequired"),
    # A name without its version suffix covers the versioned entry points nvidia-ml-py calls.
    ({"errors": {"nvmlDeviceGetComputeRunningProcesses": "GPU_IS_LOST"}}, "nvmlDeviceGetComputeRunningProcesses",
     "NVMLError_GpuIsLost"),
    ({"power_mw": "lots"}, "nvmlDeviceGetPowerUsage", "NVMLError_Unknown"),
    ({"power_mw": -5}, "nvmlDeviceGetPowerUsage", "NVMLError_Unknown"),
    ({"power_mw": None}, "nvmlDeviceGetPowerUsage", "NVMLError_NotSupported"),
])
def test_each_return_code_is_raised_as_its_nvmlerror_subclass(gpus: FakeNvml, change: dict[str, Any], call: str,
                                                              error: str) -> None:
    h = handle(0)
    gpus.change(0, **change)
    with pytest.raises(pynvml.NVMLError) as raised:
        getattr(pynvml, call)(h)
    assert type(raised.value).__name__ == error


def test_struct_versions_are_checked(composed: FakeNvml) -> None:
    a100, h100 = handle(0), handle(1)
    memory = pynvml.nvmlDeviceGetMemoryInfo(h100, version=pynvml.nvmlMemory_v2)
    assert (memory.version, memory.total, memory.reserved, memory.used) == (pynvml.nvmlMemory_v2, 85520809984,
                                                                            566231040, 1048576)
    assert memory.free == 85520809984 - 566231040 - 1048576
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetMemoryInfo(h100, version=0x01000028)
    v3 = pynvml.c_nvmlGpuFabricInfo_v3_t()
    pynvml.nvmlDeviceGetGpuFabricInfoV(h100, ctypes.byref(v3))
    assert (v3.version, v3.status, v3.cliqueId, v3.state, v3.healthMask, v3.healthSummary) == (
        0x03000028, 0, 32766, pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, 0x51AA,
        pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY)
    v2 = pynvml.c_nvmlGpuFabricInfo_v2_t()  # nvidia-ml-py's c_nvmlGpuFabricInfoV_t: no health summary
    pynvml.nvmlDeviceGetGpuFabricInfoV(h100, ctypes.byref(v2))
    assert (v2.version, v2.cliqueId, v2.state, v2.healthMask) == (0x02000024, 32766, 3, 0x51AA)
    v1 = pynvml.c_nvmlGpuFabricInfo_t()
    pynvml.nvmlDeviceGetGpuFabricInfo(h100, ctypes.byref(v1))
    assert (v1.cliqueId, v1.state, bytes(v1.clusterUuid)) == (32766, 3, bytes(16))
    v4 = pynvml.c_nvmlGpuFabricInfo_v4_t()
    pynvml.nvmlDeviceGetGpuFabricInfo_v4(h100, ctypes.byref(v4))
    assert (v4.numCliques, v4.cliques[0].id, v4.healthSummary) == (1, 32766, 1)
    wrong = pynvml.c_nvmlGpuFabricInfo_v3_t()
    wrong.version = 0x04000028
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetGpuFabricInfoV(h100, ctypes.byref(wrong))
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuFabricInfoV(a100, ctypes.byref(pynvml.c_nvmlGpuFabricInfo_v3_t()))
    composed.change(1, fabric={**composed.read()["gpus"][1]["fabric"], "max_version": 2})  # a driver before v3
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetGpuFabricInfoV(h100, ctypes.byref(v3))
    pynvml.nvmlDeviceGetGpuFabricInfoV(h100, ctypes.byref(v2))
    composed.change(1, fabric={"cluster_uuid": "0123456789abcdef0123456789ABCDEF", "status": "NOT_READY",
                               "state": 2, "health_summary": 2})
    pynvml.nvmlDeviceGetGpuFabricInfoV(h100, ctypes.byref(v3))
    assert (bytes(v3.clusterUuid).hex(), v3.status, v3.state, v3.healthSummary) == (
        "0123456789abcdef0123456789abcdef", pynvml.NVML_ERROR_NOT_READY, 2, 2)


def test_running_processes_follow_the_insufficient_size_protocol(gpus: FakeNvml) -> None:
    h = handle(0)
    v3 = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
    count = ctypes.c_uint(0)
    assert v3(h, ctypes.byref(count), None) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE and count.value == 2
    count = ctypes.c_uint(1)
    room = (pynvml.c_nvmlProcessInfo_v3_t * 1)()
    assert v3(h, ctypes.byref(count), room) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE and count.value == 2
    count = ctypes.c_uint(5)
    room = (pynvml.c_nvmlProcessInfo_v3_t * 5)()
    assert v3(h, ctypes.byref(count), room) == pynvml.NVML_SUCCESS and count.value == 2
    assert [(p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId) for p in room[:2]] == [
        (4101, 40802189312, NOT_MIG, NOT_MIG), (4102, 2147483648, NOT_MIG, NOT_MIG)]
    none = ctypes.c_uint(0)
    assert v3(handle(1), ctypes.byref(none), None) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE  # 4201, memory N/A
    assert v3(handle(3), ctypes.byref(none), None) == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert v3(None, ctypes.byref(none), None) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert v3(h, None, None) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    # The unversioned symbol takes the v1 struct: pid and memory, 16 bytes an entry.
    v1 = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses")

    class V1(ctypes.Structure):
        _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]

    count = ctypes.c_uint(2)
    room1 = (V1 * 2)()
    assert v1(h, ctypes.byref(count), room1) == pynvml.NVML_SUCCESS
    assert [(p.pid, p.usedGpuMemory) for p in room1] == [(4101, 40802189312), (4102, 2147483648)]
    # nvidia-ml-py asks for the count, allocates count * 2 + 5 and asks again: hundreds come back whole.
    gpus.change(2, lost=False, processes={"compute": [[10000 + i, i * 4096] for i in range(700)],
                                          "graphics": []})
    listed = pynvml.nvmlDeviceGetComputeRunningProcesses(handle(2))
    assert [p.pid for p in listed] == [10000 + i for i in range(700)]
    assert [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses_v2(handle(1))] == [
        (4201, None)], "NVML_VALUE_NOT_AVAILABLE becomes None in nvidia-ml-py"
    assert [p.pid for p in pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle(1))] == [4201]
    assert pynvml.nvmlDeviceGetGraphicsRunningProcesses(h) == []


def test_a_hung_call_blocks_until_released_and_a_slow_one_takes_its_time(gpus: FakeNvml) -> None:
    h = handle(3)
    gpus.change(3, hang="nvmlDeviceGetPowerUsage", slow={"nvmlDeviceGetTemperature": 300})
    answers: list[Any] = []
    thread = threading.Thread(target=lambda: answers.append(pynvml.nvmlDeviceGetPowerUsage(h)), daemon=True)
    thread.start()
    thread.join(0.5)
    assert thread.is_alive() and answers == [], "hung while the file says so"
    assert pynvml.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3", "other calls answer meanwhile"
    started = time.monotonic()
    assert pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 31
    assert time.monotonic() - started >= 0.3
    gpus.change(3, hang=None)
    thread.join(10)
    assert answers == [68000]
    gpus.update(hang="nvmlDeviceGetCount_v2")  # a system call too
    counted: list[int] = []
    thread = threading.Thread(target=lambda: counted.append(pynvml.nvmlDeviceGetCount()), daemon=True)
    thread.start()
    thread.join(0.3)
    assert thread.is_alive()
    gpus.release()
    wait_until(lambda: counted == [4], what="the count once released")


def test_field_values_answer_per_field(composed: FakeNvml) -> None:
    h = handle(1)
    recovery, absent = pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, 9999])
    assert (recovery.fieldId, recovery.nvmlReturn, recovery.valueType, recovery.value.uiVal) == (
        230, pynvml.NVML_SUCCESS, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, 0)
    assert recovery.timestamp > 0
    assert absent.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    composed.change(1, fields={"230": pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT})
    assert pynvml.nvmlDeviceGetFieldValues(h, [230])[0].value.uiVal == 2
    composed.change(1, fields={"230": "NOT_SUPPORTED"})  # a driver that does not know the field
    assert pynvml.nvmlDeviceGetFieldValues(h, [230])[0].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_mig_devices_answer_for_their_instance(composed: FakeNvml) -> None:
    a100, h100 = handle(0), handle(1)
    assert pynvml.nvmlDeviceGetMigMode(a100) == [1, 1]
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(a100) == 7
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(a100, 1)
    assert pynvml.nvmlDeviceIsMigDeviceHandle(mig).value == 1 and pynvml.nvmlDeviceIsMigDeviceHandle(a100).value == 0
    assert (pynvml.nvmlDeviceGetGpuInstanceId(mig), pynvml.nvmlDeviceGetComputeInstanceId(mig)) == (2, 0)
    assert pynvml.nvmlDeviceGetUUID(mig) == "MIG-9d3f5e7a-2b4c-6d8e-0f1a-3b5c7d9e1f2a"
    memory = pynvml.nvmlDeviceGetMemoryInfo(mig)
    assert (memory.total, memory.used) == (20937965568, 11274289152)
    assert [(p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(mig)] == [(5201, 8589934592, 2, 0),
                                                                           (5202, None, 2, 0)]
    assert [(p.pid, p.gpuInstanceId) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(a100)] == [
        (5101, 1), (5201, 2), (5202, 2)], "the parent lists every instance's processes with its ids"
    parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
    assert pynvml.nvmlDeviceGetPciInfo(parent).busId == "00000000:07:00.0"
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(a100, 2)  # an empty slot
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(a100, 7)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceId(a100)  # not a MIG device handle
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetTemperature(mig, pynvml.NVML_TEMPERATURE_GPU)  # the parent's, not the instance's
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetUtilizationRates(a100)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMigMode(h100)
    composed.change(0, lost=True)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetMemoryInfo(mig)
    composed.change(0, lost=False, mig={"current": 0, "pending": 0, "instances": []})
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetMemoryInfo(mig)  # the instance was destroyed
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(a100) == 0


GARBAGE = [
    b"", b"not json", b"{", b'{"gpus": 5}', b"[]", b'{"gpus": [1, 2]}', b"[" * 100_000, b"{\"gpus\": []}" + b"x",
    b'{"gpus": [], "hang": ["nvmlDeviceGetCount_v2"' + b", []" * 10 + b"]", b'{"gpus": [{}' + b", {}" * 64 + b"]}",
    b'{"gpus": ["\\ud800\\u0000"]}', b'{"gpus": [], "k": "\x01"}', b'{"gpus": [], "k": 01}',
    b"{\"gpus\": []" + b" " * (5 << 20) + b"}",
]


@pytest.mark.parametrize("data", GARBAGE, ids=range(len(GARBAGE)))
def test_a_garbage_state_file_answers_unknown(gpus: FakeNvml, data: bytes) -> None:
    h = handle(0)
    gpus.state.write_bytes(data)
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetPowerUsage(h)


def test_mutated_state_files_never_crash_the_library(gpus: FakeNvml) -> None:
    good = json.loads(MIG_NVSWITCH.read_text())
    calls = [("nvmlDeviceGetCount",), ("nvmlDeviceGetName", 0), ("nvmlDeviceGetMemoryInfo", 0),
             ("nvmlDeviceGetComputeRunningProcesses", 0), ("nvmlDeviceGetTotalEccErrors", 0, 0, 1),
             ("nvmlDeviceGetNvLinkErrorCounter", 1, 0, 0), ("nvmlDeviceGetMigMode", 0),
             ("nvmlDeviceGetMigDeviceHandleByIndex", 0, 1), ("nvmlDeviceGetFieldValues", 1, [230]),
             ("nvmlDeviceGetGpuFabricInfoV", 1, None), ("nvmlDeviceGetPciInfo", 1)]
    handles = [handle(0), handle(1)]
    answered = 0
    for _, data in statefuzz.json_cases(good, random.Random(statefuzz.SEED), min(statefuzz.CASES, 400)):
        gpus.state.write_bytes(data)
        for name, *args in calls:
            if args:
                args[0] = handles[args[0]]
            if name == "nvmlDeviceGetGpuFabricInfoV":
                args[1] = ctypes.byref(pynvml.c_nvmlGpuFabricInfo_v3_t())
            try:
                getattr(pynvml, name)(*args)
                answered += 1
            except pynvml.NVMLError:
                pass
    assert answered > 0, "some mutations leave calls answerable"


# Calls whose answer differs when a driver lacks the newer symbols; what nvidia-ml-py does is printed.
PROBE = """
import json, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
seen = {}
for name, args in [("nvmlDeviceGetComputeRunningProcesses", (h,)),
                   ("nvmlDeviceGetComputeRunningProcesses_v3", (h,)),
                   ("nvmlDeviceGetComputeRunningProcesses_v2", (h,)),
                   ("nvmlDeviceGetGraphicsRunningProcesses", (h,)),
                   ("nvmlDeviceGetMemoryInfo", (h, pynvml.nvmlMemory_v2)), ("nvmlDeviceGetMemoryInfo", (h,)),
                   ("nvmlDeviceGetCurrentClocksEventReasons", (h,)),
                   ("nvmlDeviceGetCurrentClocksThrottleReasons", (h,))]:
    try:
        answer = getattr(pynvml, name)(*args)
        seen[name + str(len(args))] = [p.pid for p in answer] if isinstance(answer, list) else str(answer)
    except Exception as exc:
        seen[name + str(len(args))] = type(exc).__name__
print(json.dumps(seen, sort_keys=True))
"""
OLD = ["nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetMemoryInfo_v2",
       "nvmlDeviceGetCurrentClocksEventReasons"]


def probe(library: Path, state: Path) -> dict[str, Any]:
    env = {**os.environ, **environment(library, state)}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_missing_symbols_look_to_nvidia_ml_py_as_a_library_without_them(nvml: FakeNvml, tmp_path: Path) -> None:
    hidden = build(tmp_path, missing=OLD)
    variant = ctypes.CDLL(str(hidden / SONAME))  # loaded by path beside the other: a copy of its own
    assert [hasattr(variant, name) for name in OLD] == [False] * len(OLD)
    assert hasattr(variant, "nvmlDeviceGetComputeRunningProcesses_v2")
    real_old_driver = probe(hidden, nvml.state)
    nvml.update(missing_symbols=OLD)
    answered = probe(nvml.library, nvml.state)
    assert answered == real_old_driver
    assert answered["nvmlDeviceGetComputeRunningProcesses_v31"] == "NVMLError_FunctionNotFound"
    assert answered["nvmlDeviceGetComputeRunningProcesses1"] == "NVMLLibraryMismatchError", \
        "nvidia-ml-py's unversioned wrapper raises an exception that is not an NVMLError"
    assert answered["nvmlDeviceGetComputeRunningProcesses_v21"] == [4101, 4102]
    assert answered["nvmlDeviceGetMemoryInfo2"] == "NVMLError_FunctionNotFound"
    assert answered["nvmlDeviceGetCurrentClocksThrottleReasons1"] == "516"
    nvml.update(missing_symbols=[])
    assert probe(nvml.library, nvml.state)["nvmlDeviceGetComputeRunningProcesses1"] == [4101, 4102]


UNINITIALISED = """
import pynvml
pynvml._LoadNvmlLibrary()
count = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetCount_v2")
import ctypes
n = ctypes.c_uint(0)
before = count(ctypes.byref(n))
pynvml.nvmlInit()
during = count(ctypes.byref(n)), n.value
pynvml.nvmlShutdown()
try:
    pynvml.nvmlDeviceGetCount()
except pynvml.NVMLError_Uninitialized:
    print(before, during, "uninitialized after shutdown")
"""


def test_calls_before_nvmlinit_or_after_shutdown_answer_uninitialized(nvml: FakeNvml) -> None:
    env = {**os.environ, **environment(nvml.library, nvml.state)}
    done = subprocess.run([sys.executable, "-c", UNINITIALISED], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.stdout.strip() == "1 (0, 4) uninitialized after shutdown", done.stderr


def asan_runtime() -> str | None:
    """gcc's libasan.so, to preload into an uninstrumented python; None where gcc has none."""
    done = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True, check=False)
    path = done.stdout.strip()
    return path if done.returncode == 0 and os.path.isabs(path) and os.path.exists(path) else None


def test_the_library_is_clean_under_addresssanitizer(nvml_library: Path, tmp_path: Path) -> None:
    if os.environ.get("TPUWATCH_NVML_SANITIZE") == "1":
        pytest.skip("this is the AddressSanitizer run itself")
    runtime = asan_runtime()
    if runtime is None:
        pytest.skip("gcc has no AddressSanitizer runtime (libasan.so) here")
    try:
        build(tmp_path / "lib", sanitize=True)
    except RuntimeError as exc:
        pytest.skip(f"gcc cannot build with -fsanitize=address,undefined here: {exc}")
    env = {**os.environ, "TPUWATCH_NVML_SANITIZE": "1", "LD_PRELOAD": runtime, "PYTHONMALLOC": "malloc",
           "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1:abort_on_error=0:exitcode=86",
           "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1:exitcode=87"}
    env.pop("FAKE_NVML_STATE", None)  # the run sets its own
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={tmp_path}/run",
                           __file__, "-k", "not addresssanitizer"], env=env, capture_output=True, text=True,
                          timeout=600, check=False, cwd=Path(__file__).parent.parent)
    output = done.stdout + done.stderr
    assert "ERROR: AddressSanitizer" not in output and "runtime error:" not in output, output[-6000:]
    assert done.returncode == 0, output[-6000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout.splitlines()[-1], done.stdout[-2000:]
