"""The kubelet's PodResources API (gRPC ``v1.PodResourcesLister`` on a unix socket): which container holds
which device.

``List`` answers every pod on the node with, per container, the devices device plugins assigned to it:
``ContainerDevices{resource_name, device_ids}`` (kubernetes/kubelet ``pkg/apis/podresources/v1/api.proto``).
The kubelet serves it at ``/var/lib/kubelet/pod-resources/kubelet.sock`` and rate-limits it, so the answer
is cached by the caller (``tpuwatch.pods.lookup``).  Calls are futures with a deadline: nothing here blocks.
Without grpc (the ``tpu`` extra) ``missing`` says so and no call is made.  The stubs are generated from the
kubelet's proto (``tpuwatch/pods/proto``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_MESSAGE_BYTES = 16 << 20
MAX_ALLOCATIONS = 4096  # (container, resource) pairs kept from one answer
MAX_IDS = 256  # device ids kept per container and resource
MAX_NAME = 253  # a DNS subdomain, the longest name Kubernetes allows

_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.initial_reconnect_backoff_ms", 1000), ("grpc.max_reconnect_backoff_ms", 10000)]


class PodResourcesError(Exception):
    """The kubelet did not answer List usably; ``str()`` is one line."""


@dataclass(frozen=True)
class Allocation:
    """Devices of one resource a device plugin assigned to one container."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


def allocations(response: Any) -> list[Allocation]:
    """The device allocations of a ListPodResourcesResponse, bounded (pure)."""
    out: list[Allocation] = []
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if len(out) >= MAX_ALLOCATIONS:
                    return out
                ids = tuple(str(i)[:MAX_NAME] for i in devices.device_ids[:MAX_IDS])
                if ids:
                    out.append(Allocation(pod.namespace[:MAX_NAME], pod.name[:MAX_NAME], container.name[:MAX_NAME],
                                          devices.resource_name[:MAX_NAME], ids))
    return out


class PodResourcesClient:
    """One kept channel to the kubelet's socket; ``start()`` begins a List call, ``result()`` takes its answer."""

    def __init__(self, socket: str, timeout: float) -> None:
        self.socket = socket
        self.timeout = timeout
        self._channel: Any = None
        self._stub: Any = None
        self._modules: tuple[Any, Any, Any] | None = None
        self._missing: str | None = None

    @property
    def missing(self) -> str | None:
        """Why no call can be made (grpc or protobuf is not installed), or None.

        The first ask imports them: the lookup asks once the kubelet's socket is there, so that a host without
        one does not carry grpc (about 10 MiB of the daemon's memory).
        """
        if self._modules is None and self._missing is None:
            try:
                import grpc

                from tpuwatch.pods.proto import api_pb2, api_pb2_grpc
            except ImportError as exc:
                self._missing = (f"pod names cannot be read from the kubelet: {exc.name} is not installed "
                                 "(pip install 'tpuwatch[tpu]'); pods are named by UID from /proc/PID/cgroup")
            else:
                self._modules = (grpc, api_pb2, api_pb2_grpc)
        return self._missing

    def start(self) -> Any:
        """A future of the List call, answered or failed within ``timeout`` (only once ``missing`` is None)."""
        assert self._modules is not None, "start() before missing said the modules are there"
        grpc, pb2, pb2_grpc = self._modules
        if self._stub is None:
            self._channel = grpc.insecure_channel(f"unix://{self.socket}", options=_CHANNEL_OPTIONS)
            self._stub = pb2_grpc.PodResourcesListerStub(self._channel)
        return self._stub.List.future(pb2.ListPodResourcesRequest(), timeout=self.timeout)

    def result(self, future: Any) -> list[Allocation]:
        """The allocations of a finished call; PodResourcesError naming the status if it failed."""
        assert self._modules is not None
        grpc = self._modules[0]
        try:
            return allocations(future.result(timeout=0))
        except grpc.RpcError as exc:
            raise PodResourcesError(f"{exc.code().name}: {str(exc.details())[:200]}") from None
        except grpc.FutureTimeoutError:
            raise PodResourcesError("the call has not finished") from None

    def close(self) -> None:
        """Close the channel."""
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None
