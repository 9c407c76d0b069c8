"""Processes and their open files under a procfs root: the one scan of ``/proc/*/fd``.

Only paths under the given root are read, so the same code reads /proc and a
tree built by a test.  A process that may not be inspected (another user's,
without privilege) or that exits meanwhile is passed over, never an error.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

MAX_HOLDERS = 256
MAX_CGROUP_BYTES = 64 * 1024  # /proc/PID/cgroup: one short line per hierarchy


def read_boot_id(procfs: str = "/proc") -> str:
    """This boot's id (kmsg sequence numbers and a driver's counters start again at every boot); OSError if it
    cannot be read."""
    with open(os.path.join(procfs, "sys", "kernel", "random", "boot_id"), encoding="ascii") as f:
        return f.read(64).strip()


def pids(procfs: str) -> list[int]:
    """The process ids under ``procfs``, in directory order; OSError if ``procfs`` cannot be listed."""
    return [int(name) for name in os.listdir(procfs) if name.isdigit()]


def fd_targets(procfs: str, pid: int) -> Iterator[str]:
    """Where each open file descriptor of ``pid`` points ("/dev/accel0", "socket:[1234]"), as far as readable."""
    fd_dir = os.path.join(procfs, str(pid), "fd")
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return
    for fd in fds:
        try:
            yield os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue


def read_text(path: str) -> str:
    """The text of a small procfs file (``comm``, ``statm``); "" when it cannot be read (the process exited)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def read_cgroup(procfs: str, pid: int) -> str:
    """The text of /proc/PID/cgroup (at most MAX_CGROUP_BYTES); "" when it cannot be read."""
    try:
        with open(os.path.join(procfs, str(pid), "cgroup"), encoding="utf-8", errors="replace") as handle:
            return handle.read(MAX_CGROUP_BYTES)
    except OSError:
        return ""


def match_device_file(target: str, dev_root: str, patterns: Collection[str]) -> str | None:
    """The device file (relative to ``dev_root``) an fd link points at, if it matches one of the glob patterns."""
    prefix = dev_root.rstrip("/") + "/"
    if not target.startswith(prefix):
        return None
    relative = target[len(prefix):]
    return relative if any(fnmatchcase(relative, p) for p in patterns) else None


@dataclass
class Holder:
    """A process with device files open."""

    pid: int
    command: str
    device_files: set[str] = field(default_factory=set)


def scan_holders(procfs: str, dev_root: str, patterns: Collection[str], limit: int | None = MAX_HOLDERS,
                 exclude: Collection[int] = ()) -> dict[int, Holder]:
    """Processes under ``procfs`` whose open fds point at device files matching ``patterns``, in scan order.

    At most ``limit`` holders (None: all); pids in ``exclude`` (this process, say) are not looked at.
    OSError if ``procfs`` itself cannot be listed.
    """
    holders: dict[int, Holder] = {}
    for pid in pids(procfs):
        if limit is not None and len(holders) >= limit:
            break
        if pid in exclude:
            continue
        for target in fd_targets(procfs, pid):
            device_file = match_device_file(target, dev_root, patterns)
            if device_file is None:
                continue
            if pid not in holders:
                holders[pid] = Holder(pid, read_text(os.path.join(procfs, str(pid), "comm")).strip() or "?")
            holders[pid].device_files.add(device_file)
    return holders
