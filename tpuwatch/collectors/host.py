"""Host memory and CPU (psutil) and the processes that hold accelerator device files."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import psutil

from tpuwatch.hw.procfs import Holder, read_text, scan_holders
from tpuwatch.samples import Sample, sample

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def parse_statm_rss(text: str, page_size: int = PAGE_SIZE) -> int:
    """Resident bytes from the text of /proc/PID/statm (second field, in pages)."""
    return int(text.split()[1]) * page_size


class HostCollector:
    """Host memory, CPU busy ratio, and resident memory of device-holding processes."""

    name = "host"

    def __init__(self, procfs: str, dev_root: str, device_files: list[str], holder_scan_interval: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._procfs = procfs
        self._dev_root = dev_root
        self._patterns = device_files
        self._scan_interval = holder_scan_interval
        self._clock = clock
        self._next_scan = 0.0
        self._holders: dict[int, Holder] = {}
        self._last_cpu: tuple[float, float] | None = None

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
        now = self._clock()
        if now >= self._next_scan:
            self._holders = scan_holders(self._procfs, self._dev_root, self._patterns)
            self._next_scan = now + self._scan_interval
        out = []
        for pid, holder in list(self._holders.items()):
            statm = read_text(os.path.join(self._procfs, str(pid), "statm"))
            if not statm:
                del self._holders[pid]
                self._next_scan = now  # a holder exited: look again next cycle
                continue
            labels = {"pid": str(pid), "command": holder.command}
            out.append(sample("tpuwatch_holder_process_resident_memory_bytes", parse_statm_rss(statm), **labels))
            out.extend(sample("tpuwatch_device_holder_info", 1, device_file=f, **labels)
                       for f in sorted(holder.device_files))
        return out

