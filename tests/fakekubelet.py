"""The kubelet's PodResources API for tests: a real gRPC server on a unix socket, on the stubs tpuwatch
generates from the kubelet's published proto (kubernetes/kubelet pkg/apis/podresources/v1/api.proto).

It answers ``List`` with the pods it is given, shaped as the kubelet's ``podresources`` server builds them
(one PodResources per pod, one ContainerResources per container, the devices a device plugin assigned as
ContainerDevices{resource_name, device_ids}), or fails as told: ``mode`` "unavailable" aborts with
UNAVAILABLE, "slow" answers only once ``release`` is set.
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from tpuwatch.pods.proto import api_pb2, api_pb2_grpc

# (namespace, pod, container, resource, device ids)
Assignment = tuple[str, str, str, str, list[str]]


class Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    """A PodResourcesLister answering the assignments it holds."""

    def __init__(self, assignments: list[Assignment], mode: str = "ok") -> None:
        self.assignments = assignments
        self.mode = mode
        self.release = threading.Event()
        self.calls: Counter[str] = Counter()

    def List(self, request: Any, context: Any) -> Any:  # noqa: N802 - the gRPC method name
        self.calls["List"] += 1
        if self.mode == "unavailable":
            context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet is restarting")
        if self.mode == "slow":
            self.release.wait(30)
        pods: dict[tuple[str, str], Any] = {}
        for namespace, pod, container, resource, ids in self.assignments:
            entry = pods.setdefault((namespace, pod), api_pb2.PodResources(name=pod, namespace=namespace))
            found = [c for c in entry.containers if c.name == container]
            target = found[0] if found else entry.containers.add(name=container)
            target.devices.add(resource_name=resource, device_ids=ids)
        return api_pb2.ListPodResourcesResponse(pod_resources=list(pods.values()))


def serve(kubelet: Kubelet, socket: Path) -> Any:
    """A started server on ``socket`` (a unix socket path, as the kubelet serves it)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(kubelet, server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    return server
