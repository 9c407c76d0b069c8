"""Which chips another process holds, found before jax is imported (stdlib only: runs in the worker).

A TPU chip belongs to one process at a time: libtpu takes a lockf lock on
/tmp/libtpu_lockfile for the whole host, and the chip's device file
(/dev/accelN, or /dev/vfio/GROUP for the chip's IOMMU group) is held open by
its owner.  The canary must never open such a chip, so it looks first.  The
PCI and /proc scans are ``tpuwatch.hw``'s, standard library only as well.
It scans /proc itself, right before the run and with no cap on holders,
rather than take the daemon's cycle inventory: that one is up to a holder
scan interval old and stops at ``MAX_HOLDERS``, and a holder it missed is a
chip the canary would open under a running job.
"""

from __future__ import annotations

import fcntl
import os
import re
import struct

from tpuwatch.hw.chips import accelerators
from tpuwatch.hw.pci import iommu_group, scan_pci
from tpuwatch.hw.procfs import scan_holders

# struct flock on 64-bit Linux: l_type, l_whence, l_start, l_len, l_pid (padded to 32 bytes).
_FLOCK = "@hhqqi4x"
_ACCEL_RE = re.compile(r"^accel(\d+)$")
_VFIO_RE = re.compile(r"^vfio/(\d+)$")
_TPU_DEVICE_FILES = ("accel*", "vfio/*")


def accelerator_functions(sysfs: str) -> dict[str, list[str]]:
    """PCI addresses of the accelerators under ``sysfs`` by kind (tpu, nvidia, amd), sorted: index i is chip i."""
    return {kind: [d.address for d in found] for kind, found in accelerators(scan_pci(sysfs)).items()}


def vfio_groups(sysfs: str, tpu_functions: list[str]) -> dict[str, int]:
    """IOMMU group number -> chip index, for chips bound to vfio-pci."""
    groups = {}
    for index, pci in enumerate(tpu_functions):
        group = iommu_group(sysfs, pci)
        if group is not None:
            groups[group] = index
    return groups


def chip_of_device_file(relative: str, groups: dict[str, int]) -> int | None:
    """The chip a device file (relative to /dev) belongs to: ``accel3`` -> 3, ``vfio/GROUP`` via groups."""
    if match := _ACCEL_RE.match(relative):
        return int(match.group(1))
    if match := _VFIO_RE.match(relative):
        return groups.get(match.group(1))
    return None


def lock_holder(path: str) -> int | None:
    """Pid of a process holding a lockf/fcntl lock on ``path``, or None (also when it does not exist)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
    except OSError:
        return None
    finally:
        os.close(fd)
    lock_type, _, _, _, pid = struct.unpack(_FLOCK, answer)
    return pid if lock_type != fcntl.F_UNLCK else None


def device_file_holders(procfs: str, dev: str, groups: dict[str, int]) -> dict[int, int]:
    """Chip index -> pid of another process with that chip's device file open.

    Other users' processes are visible only with privilege; those are missed.
    """
    try:
        found = scan_holders(procfs, dev, _TPU_DEVICE_FILES, limit=None, exclude={os.getpid()})
    except OSError:
        return {}
    holders: dict[int, int] = {}
    for pid, holder in found.items():
        for device_file in holder.device_files:
            chip = chip_of_device_file(device_file, groups)
            if chip is not None:
                holders.setdefault(chip, pid)
    return holders
