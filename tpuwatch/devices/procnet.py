"""Which process listens on a TCP port: procfs net/tcp{,6} and the socket links in /proc/PID/fd.

A libtpu runtime serves its metrics from inside the workload process, so the
process that listens on a metrics port is the one whose chips that port
describes.  Parsing is pure (``listening_inodes``); only the candidate
processes' fds are read, never every process's.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from tpuwatch.hw.procfs import fd_targets

TCP_LISTEN = "0A"
MAX_NET_BYTES = 4 << 20  # /proc/net/tcp of a busy host stays far below this; read no more


def listening_inodes(table: str, ports: set[int]) -> dict[str, int]:
    """Socket inode -> port for LISTEN sockets on ``ports`` in the text of /proc/net/tcp or tcp6."""
    found: dict[str, int] = {}
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != TCP_LISTEN or ":" not in fields[1]:
            continue
        try:
            port = int(fields[1].rsplit(":", 1)[1], 16)
        except ValueError:
            continue
        if port in ports and fields[9] != "0":
            found[fields[9]] = port
    return found


def port_owners(procfs: str, ports: set[int], candidates: Iterable[int]) -> dict[int, int]:
    """Port -> PID among ``candidates`` that holds the listening socket (ports not found are absent)."""
    inodes: dict[str, int] = {}
    for name in ("tcp", "tcp6"):
        try:
            with open(os.path.join(procfs, "net", name), encoding="ascii", errors="replace") as handle:
                inodes.update(listening_inodes(handle.read(MAX_NET_BYTES), ports))
        except OSError:
            continue
    owners: dict[int, int] = {}
    for pid in sorted(candidates):
        for target in fd_targets(procfs, pid):
            if target.startswith("socket:[") and target[8:-1] in inodes:
                owners.setdefault(inodes[target[8:-1]], pid)
    return owners
