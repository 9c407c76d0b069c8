"""Which pod and container a process runs in, from the text of its ``/proc/PID/cgroup`` (pure, no I/O).

The kubelet puts every pod in a cgroup named after its UID, below the QoS class's, and the container runtime
puts each container in a cgroup of its own below the pod's (kubelet ``pkg/kubelet/cm``: ``pod`` + UID, the
UID's dashes written as underscores under the systemd cgroup driver, ``escapeSystemdCgroupName``):

- systemd driver: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/
  cri-containerd-<id>.scope`` (containerd; ``crio-<id>.scope`` for CRI-O, ``docker-<id>.scope`` for
  Docker), Guaranteed pods directly under ``kubepods.slice`` as ``kubepods-pod<uid_>.slice``;
- cgroupfs driver: ``/kubepods/burstable/pod<uid>/<id>``, Guaranteed pods as ``/kubepods/pod<uid>/<id>``.

cgroup v1 writes one ``ID:controllers:path`` line per hierarchy, cgroup v2 the single line ``0::path``; the
path is the same in every hierarchy that names the pod.  A static pod's UID is the 32-hex-digit hash of its
manifest rather than a UUID.  CRI-O's ``crio-conmon-<id>.scope`` holds the container's monitor, not the
container.  A process in its own cgroup namespace sees ``0::/`` and names no pod.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_CGROUP_CHARS = 64 * 1024
MAX_LINES = 64

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
_POD_RE = re.compile(rf"(?:^|-)pod({_UID})(?:\.slice)?$")
_CONTAINER_RE = re.compile(r"(?:(?:cri-containerd|crio|docker)-)?([0-9a-f]{64})(?:\.scope)?")


@dataclass(frozen=True)
class CgroupIdentity:
    """The pod UID and container id a process's cgroup names ("" where it names none)."""

    pod_uid: str = ""
    container_id: str = ""


def parse_cgroup(text: str) -> CgroupIdentity:
    """The pod and container of the first hierarchy line (of at most MAX_LINES) that names a pod."""
    for line in text[:MAX_CGROUP_CHARS].splitlines()[:MAX_LINES]:
        _, _, rest = line.partition(":")
        _, _, path = rest.partition(":")
        found = parse_path(path)
        if found.pod_uid:
            return found
    return CgroupIdentity()


def parse_path(path: str) -> CgroupIdentity:
    """The pod UID and the container id below it in one cgroup path."""
    parts = [part for part in path.strip().split("/") if part]
    for i, part in enumerate(parts):
        pod = _POD_RE.search(part)
        if pod is None:
            continue
        container = ""
        if i + 1 < len(parts):
            match = _CONTAINER_RE.fullmatch(parts[i + 1])
            container = match[1] if match else ""
        return CgroupIdentity(pod[1].replace("_", "-"), container)
    return CgroupIdentity()
