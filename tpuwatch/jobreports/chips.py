"""Which of this host's chips a report is about: only chips the reporting process holds (or any, for root).

Root is trusted only when its process is visible in the daemon's PID namespace
(a pid of 0 is a process the kernel cannot name to us: another container's,
say, under a DaemonSet without hostPID).

Pure but for ``held_by``: the inventory (the device backend's readings) says
which device files each chip has; a process holds a chip when one of its open
file descriptors points at one of them.  A report names its chips as the job
sees them (protocol.py): by the environment that chose them (``env``), taken
as they are, or by order (``ordinal``), mapped in order onto the chips the
process holds (a container sees its chips renumbered from 0).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from tpuwatch.devices.base import DeviceReading
from tpuwatch.hw.procfs import fd_targets
from tpuwatch.jobreports.message import Refused, Report

MAX_FDS = 65536  # descriptors of one process looked at


def chip_files(readings: Iterable[DeviceReading], dev_root: str) -> dict[str, frozenset[str]]:
    """chip -> the absolute paths of its device files, in the inventory's order."""
    return {r.device: frozenset(os.path.join(dev_root, f) for f in r.device_files) for r in readings}


def held_by(procfs: str, pid: int, files: dict[str, frozenset[str]]) -> list[str]:
    """The chips ``pid`` has a device file of open, in ``files``' order (none for pid 0: not in our namespace)."""
    if pid <= 0:
        return []
    wanted = frozenset().union(*files.values())
    seen: set[str] = set()
    for count, target in enumerate(fd_targets(procfs, pid)):
        if count >= MAX_FDS:
            break
        if target in wanted:
            seen.add(target)
    return [chip for chip, paths in files.items() if paths & seen]


def resolve(report: Report, uid: int, pid: int, held: Sequence[str], known: Iterable[str]) -> dict[str, str]:
    """The report's chip names -> this host's chips; Refused (not_holder, unknown_chip) when it may not say."""
    named = report.devices
    if set(named) <= set(held):
        return {name: name for name in named}
    if report.named_by == "ordinal" and len(named) == len(held):
        return dict(zip(sorted(named, key=int), held))
    if uid == 0 and pid > 0 and not held:
        unknown = sorted(set(named) - set(known), key=int)
        if unknown:
            raise Refused("unknown_chip", f"no chip {', '.join(unknown)} on this host")
        return {name: name for name in named}
    holds = f"holds chip(s) {', '.join(held)}" if held else "holds no chip"
    raise Refused("not_holder", f"pid {pid} {holds}; the report is about chip(s) {', '.join(named)}")
