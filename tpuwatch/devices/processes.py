"""The processes using each chip, as samples: bounded per chip, named by pod where the lookup can.

Per chip: ``tpuwatch_device_processes{device}`` (how many, uncapped) and, for at most
``host.max_processes_per_device`` of them (those holding the most device memory first, then by pid),
``tpuwatch_process_device_memory_used_bytes{device,pid,command,namespace,pod,container}`` where the
hardware reports memory per process (with ``gpu_instance``: the MIG instance it runs in).  A process that
ends leaves no series behind: each cycle exports what it read.
"""

from __future__ import annotations

from tpuwatch.devices.base import DeviceReading, ProcessUse
from tpuwatch.pods import PodLookup, PodRef
from tpuwatch.samples import Sample, sample

DEFAULT_CAP = 16


def kept(processes: tuple[ProcessUse, ...], cap: int) -> list[ProcessUse]:
    """The ``cap`` processes exported: most device memory first (unknown last), then lowest pid."""
    return sorted(processes, key=lambda p: (p.device_memory_bytes is None, -(p.device_memory_bytes or 0), p.pid))[:cap]


def process_samples(reading: DeviceReading, pods: PodLookup | None, cap: int = DEFAULT_CAP) -> list[Sample]:
    """The process samples of one chip's reading (none when its processes were not looked at)."""
    if reading.processes is None:
        return []
    out = [sample("tpuwatch_device_processes", len(reading.processes), device=reading.device)]
    for process in kept(reading.processes, cap):
        if process.device_memory_bytes is None:
            continue
        where = pods.pod_of(process.pid, reading.plugin_ids) if pods is not None else PodRef()
        instance = {} if process.gpu_instance is None else {"gpu_instance": str(process.gpu_instance)}
        out.append(sample("tpuwatch_process_device_memory_used_bytes", process.device_memory_bytes,
                          device=reading.device, pid=str(process.pid), command=process.command, **where.labels(),
                          **instance))
    return out


def hang_samples(reading: DeviceReading, pods: PodLookup | None) -> list[Sample]:
    """``tpuwatch_device_hung`` of one chip's reading, labelled with its holder (none when not judged)."""
    verdict = reading.hang
    if verdict is None:
        return []
    where = pods.pod_of(verdict.pid, reading.plugin_ids) if pods is not None else PodRef()
    return [sample("tpuwatch_device_hung", 1 if verdict.hung else 0, device=reading.device, pid=str(verdict.pid),
                   command=verdict.command, **where.labels())]
