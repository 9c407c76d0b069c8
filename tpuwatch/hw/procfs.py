"""Processes and their open files under a procfs root: the one scan of ``/proc/*/fd``.

Only paths under the given root are read, so the same code reads /proc and a
tree built by a test.  A process that may not be inspected (another user's,
without privilege) or that exits meanwhile is passed over, never an error.
``HolderScan`` is the daemon's one scan of device-file holders per cycle: the
device backend, the devices stage and, through the cycle's inventory, the host
collector read the same holders.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Holder:
    """A process with device files open."""

    pid: int
    command: str
    device_files: frozenset[str] = frozenset()


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
        files = {f for f in (match_device_file(t, dev_root, patterns) for t in fd_targets(procfs, pid)) if f}
        if files:
            command = read_text(os.path.join(procfs, str(pid), "comm")).strip() or "?"
            holders[pid] = Holder(pid, command, frozenset(files))
    return holders


class HolderScan:
    """The holders of the device files matching ``patterns`` (``host.device_files``) and the chips' own files,
    scanned at most every ``interval`` seconds of ``clock`` and kept in between.

    It scans again before then when a chip's file not yet looked for is asked for, when a holder it found has
    exited (its /proc entry is gone), or when the holders are older than the ``max_age`` a caller asks for.
    One caller at a time (the devices stage's thread, or the host collector's where no devices stage runs).
    """

    def __init__(self, procfs: str, dev_root: str, patterns: Collection[str], interval: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.procfs = procfs
        self.dev_root = dev_root
        self.patterns = tuple(patterns)
        self.interval = interval
        self._clock = clock
        self._files: frozenset[str] = frozenset()  # the chips' files the last scan looked for
        self._at: float | None = None
        self.holders: Mapping[int, Holder] = {}
        """The last scan's holders (the same object until the next scan)."""

    def scan(self, files: Collection[str] = (), max_age: float | None = None) -> Mapping[int, Holder]:
        """The holders of ``files`` and of the patterns, as last scanned, or scanned now when due.

        OSError when procfs cannot be listed (the holders kept stay as they were)."""
        now = self._clock()
        age = None if self._at is None else now - self._at
        due = (age is None or age >= (self.interval if max_age is None else min(self.interval, max_age))
               or not self._files.issuperset(files)
               or any(not os.path.exists(os.path.join(self.procfs, str(pid))) for pid in self.holders))
        if due:
            wanted = frozenset(files)
            self.holders = scan_holders(self.procfs, self.dev_root, [*self.patterns, *sorted(wanted)])
            self._files, self._at = wanted, now
        return self.holders
