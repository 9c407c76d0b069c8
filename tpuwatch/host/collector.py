"""Host memory and CPU (psutil) and the processes that hold accelerator device files.

The holders come from the cycle's inventory (``inventory``: the devices stage's one holder scan, or the
registry's own scan where no devices stage runs).  Each is named by chip where the inventory says which chip a
device file is (``chip_files``: device file -> (chip, device-plugin ids)) and by Kubernetes pod through
``pods`` (its cgroup; the kubelet's PodResources answer for the chips it holds).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Protocol

import psutil

from tpuwatch.hw.procfs import Holder, read_text
from tpuwatch.pods import PodLookup, PodRef
from tpuwatch.samples import Sample, sample

# device file -> (chip, the (resource, id) pairs a device plugin names the chip by)
ChipFiles = Mapping[str, tuple[str, tuple[tuple[str, str], ...]]]

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


class Chips(Protocol):
    """What the host collector reads of a cycle's inventory (tpuwatch.devices.inventory.Inventory)."""

    @property
    def holders(self) -> Mapping[int, Holder]:
        """pid -> the process and the device files it holds."""

    @property
    def chip_files(self) -> ChipFiles:
        """device file -> (chip, device-plugin ids)."""


def parse_statm_rss(text: str, page_size: int = PAGE_SIZE) -> int:
    """Resident bytes from the text of /proc/PID/statm (second field, in pages)."""
    return int(text.split()[1]) * page_size


class HostCollector:
    """Host memory, CPU busy ratio, and resident memory of device-holding processes."""

    name = "host"

    def __init__(self, procfs: str, inventory: Callable[[], Chips], pods: PodLookup | None = None) -> None:
        self._procfs = procfs
        self._inventory = inventory
        self._last_cpu: tuple[float, float] | None = None
        self.pods = pods

    @property
    def degraded(self) -> str | None:
        """Why holders cannot be named by pod though the kubelet's socket is there, or None."""
        return self.pods.degraded if self.pods is not None else None

    def close(self) -> None:
        """Close the channel to the kubelet, if one is open."""
        if self.pods is not None:
            self.pods.close()

    def collect(self) -> list[Sample]:
        """One reading of host memory, CPU and holders."""
        memory = psutil.virtual_memory()
        out = [
            sample("tpuwatch_host_memory_total_bytes", memory.total),
            sample("tpuwatch_host_memory_available_bytes", memory.available),
        ]
        busy = self._cpu_busy_ratio()
        if busy is not None:
            out.append(sample("tpuwatch_host_cpu_utilization_ratio", busy))
        out.extend(self._holder_samples())
        return out

    def _cpu_busy_ratio(self) -> float | None:
        times = psutil.cpu_times()
        total = sum(times)
        idle = times.idle + getattr(times, "iowait", 0.0)
        previous, self._last_cpu = self._last_cpu, (total, idle)
        if previous is None or total <= previous[0]:
            return None
        return max(0.0, min(1.0, 1.0 - (idle - previous[1]) / (total - previous[0])))

    def _holder_samples(self) -> list[Sample]:
        inventory = self._inventory()
        chips = inventory.chip_files
        if self.pods is not None:
            self.pods.refresh()
        out = []
        for pid, holder in inventory.holders.items():
            statm = read_text(os.path.join(self._procfs, str(pid), "statm"))
            if not statm:  # it exited since the scan, which looks again next cycle
                continue
            files = sorted(holder.device_files)
            ids = [i for f in files for i in chips.get(f, ("", ()))[1]]
            where = self.pods.pod_of(pid, ids) if self.pods is not None else PodRef()
            labels = {"pid": str(pid), "command": holder.command, **where.labels()}
            out.append(sample("tpuwatch_holder_process_resident_memory_bytes", parse_statm_rss(statm), **labels))
            out.extend(sample("tpuwatch_device_holder_info", 1, device_file=f, device=chips.get(f, ("", ()))[0],
                              pod_uid=where.pod_uid, container_id=where.container_id, **labels) for f in files)
        return out
