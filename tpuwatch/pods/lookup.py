"""Which pod and container a process belongs to: the kubelet's PodResources answer where it names the
device the process holds, the process's cgroup otherwise.

``PodLookup.refresh()`` never waits: it takes the answer of a List call that has finished and starts the
next one when the cached answer is ``refresh_every`` old, so sampling never blocks on the kubelet and the
kubelet's rate limit is respected.  ``pod_of(pid, devices)`` then reads ``/proc/PID/cgroup`` (the pod UID
and container id) and, when the process is in a pod and exactly one container was assigned one of
``devices`` (``(resource, device id)`` pairs such as ``("nvidia.com/gpu", "GPU-...")``), takes that
container's namespace, pod and container names.  A device shared by several containers (time-slicing
replicas) names none: only the cgroup's UID and container id are kept.  Nothing is guessed.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tpuwatch.hw.procfs import read_cgroup
from tpuwatch.pods.cgroup import parse_cgroup
from tpuwatch.pods.podresources import Allocation, PodResourcesClient, PodResourcesError

log = logging.getLogger(__name__)

REFRESH_S = 10.0
DEFAULT_TIMEOUT_S = 2.0

Names = tuple[str, str, str]  # namespace, pod, container


@dataclass(frozen=True)
class PodRef:
    """Where a process runs under Kubernetes; every field "" where unknown (not in a pod, no kubelet)."""

    namespace: str = ""
    pod: str = ""
    container: str = ""
    pod_uid: str = ""
    container_id: str = ""

    def labels(self) -> dict[str, str]:
        """The names as metric labels (namespace, pod, container)."""
        return {"namespace": self.namespace, "pod": self.pod, "container": self.container}

    def describe(self) -> str:
        """"pod ns/name container c", "pod UID u", or "" outside a pod."""
        if self.pod:
            return f"pod {self.namespace}/{self.pod}" + (f" container {self.container}" if self.container else "")
        return f"pod UID {self.pod_uid}" if self.pod_uid else ""


def plugin_id(device_id: str) -> str:
    """A device id as the device it names: NVIDIA's time-slicing replicas ``GPU-...::N`` name ``GPU-...``."""
    return device_id.split("::", 1)[0]


def index(found: Iterable[Allocation]) -> dict[tuple[str, str], set[Names]]:
    """(resource, device id) -> the containers assigned it."""
    out: dict[tuple[str, str], set[Names]] = {}
    for a in found:
        for device_id in a.device_ids:
            out.setdefault((a.resource, plugin_id(device_id)), set()).add((a.namespace, a.pod, a.container))
    return out


class PodLookup:
    """Pod attribution of processes, from /proc/PID/cgroup and the kubelet's cached PodResources answer."""

    def __init__(self, procfs: str, socket: str | None, timeout: float = DEFAULT_TIMEOUT_S,
                 refresh_every: float = REFRESH_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.procfs = procfs
        self.socket = socket
        self.refresh_every = refresh_every
        self._client = PodResourcesClient(socket, timeout) if socket else None
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: Any = None
        self._next = 0.0
        self._by_device: dict[tuple[str, str], set[Names]] = {}
        self._problem: str | None = None

    @property
    def degraded(self) -> str | None:
        """Why pods cannot be named though the kubelet's socket is there, or None."""
        if self._client is None or not os.path.exists(self._client.socket):
            return None
        return self._client.missing or self._problem

    def refresh(self) -> None:
        """Take a finished List answer; start the next call when due (never waits)."""
        client = self._client
        if client is None:
            return
        with self._lock:
            if self._pending is not None and self._pending.done():
                future, self._pending = self._pending, None
                self._take(client, future)
            now = self._clock()
            if self._pending is None and now >= self._next:
                self._next = now + self.refresh_every
                if os.path.exists(client.socket):
                    if client.missing is None:
                        self._pending = client.start()
                elif self._by_device:
                    log.info("kubelet PodResources socket %s is gone: pods are named by UID only", client.socket)
                    self._by_device = {}

    def _take(self, client: PodResourcesClient, future: Any) -> None:
        try:
            found = client.result(future)
        except PodResourcesError as exc:
            problem = f"kubelet PodResources at {client.socket}: {exc}"
            if problem != self._problem:
                log.warning("%s (pods are named by UID from /proc/PID/cgroup until it answers)", problem)
            self._problem = problem
            return
        if self._problem is not None:
            log.info("kubelet PodResources at %s answers again", client.socket)
        self._problem = None
        self._by_device = index(found)

    def pod_of(self, pid: int, devices: Iterable[tuple[str, str]] = ()) -> PodRef:
        """Where ``pid`` runs: its cgroup's pod and container, named when one container holds ``devices``."""
        identity = parse_cgroup(read_cgroup(self.procfs, pid))
        if not identity.pod_uid:
            return PodRef()
        with self._lock:
            names = set().union(*(self._by_device.get((resource, plugin_id(d)), set()) for resource, d in devices))
        namespace, pod, container = next(iter(names)) if len(names) == 1 else ("", "", "")
        return PodRef(namespace, pod, container, identity.pod_uid, identity.container_id)

    def close(self) -> None:
        """Close the channel to the kubelet."""
        if self._client is not None:
            self._client.close()
