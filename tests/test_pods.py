"""Pod attribution at the protocol boundary: /proc/PID/cgroup in cgroup v1 and v2 layouts, and a real gRPC
PodResources server on a unix socket built from the kubelet's proto."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakekubelet import Kubelet, serve

from tpuwatch.devices.base import DeviceReading
from tpuwatch.devices.inventory import Inventory
from tpuwatch.host.collector import HostCollector
from tpuwatch.hw.procfs import HolderScan
from tpuwatch.pods import PodLookup, PodRef
from tpuwatch.pods.cgroup import CgroupIdentity, parse_cgroup
from tpuwatch.pods.podresources import MAX_IDS, allocations
from tpuwatch.pods.proto import api_pb2

from conftest import wait_until

CGROUPS = Path(__file__).parent / "testdata" / "pods"
V2_UID = "9f1b6a3e-4c2d-4f6e-8a1b-2c3d4e5f6a7b"
V2_CID = "3c6f0e3b0f2a6d7c8e9f0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d"
V1_UID = "5b0d3c1e-2f4a-4b6c-9d8e-7f6a5b4c3d2e"
V1_CID = "8e2f1d0c9b8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e"
GPU = ("nvidia.com/gpu", "GPU-8b1c7f3e-5a2d-4e6f-9b0c-1d2e3f4a5b6c")
TPU = ("google.com/tpu", "accel0")


@pytest.mark.parametrize("name,expected", [
    ("v2-systemd-containerd", CgroupIdentity(V2_UID, V2_CID)),
    ("v1-cgroupfs-docker", CgroupIdentity(V1_UID, V1_CID)),
    ("v1-systemd-crio-guaranteed", CgroupIdentity("0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f",
                                                  "1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b")),
])
def test_the_pod_uid_and_container_id_come_from_each_layout(name: str, expected: CgroupIdentity) -> None:
    assert parse_cgroup((CGROUPS / name).read_text()) == expected


@pytest.mark.parametrize("text,expected", [
    # Docker under the systemd driver, a BestEffort pod.
    (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{V2_UID.replace('-', '_')}.slice/"
     f"docker-{V2_CID}.scope\n", CgroupIdentity(V2_UID, V2_CID)),
    # A static pod: its UID is the hash of its manifest.
    (f"0::/kubepods/burstable/pod6f1e0b7c2d9a4e38b5c1d0e9f8a7b6c5/{V1_CID}\n",
     CgroupIdentity("6f1e0b7c2d9a4e38b5c1d0e9f8a7b6c5", V1_CID)),
    # Seen from another cgroup namespace the path is relative, the pod still named.
    (f"0::/../../kubepods-burstable-pod{V2_UID.replace('-', '_')}.slice/cri-containerd-{V2_CID}.scope\n",
     CgroupIdentity(V2_UID, V2_CID)),
    # CRI-O's monitor lives beside the container: the pod, not a container.
    (f"0::/kubepods.slice/kubepods-pod{V2_UID.replace('-', '_')}.slice/crio-conmon-{V2_CID}.scope\n",
     CgroupIdentity(V2_UID, "")),
    # The pod's own cgroup (a process in the pod sandbox).
    (f"0::/kubepods/burstable/pod{V1_UID}\n", CgroupIdentity(V1_UID, "")),
    ("0::/system.slice/tpuwatch.service\n", CgroupIdentity()),
    ("0::/\n", CgroupIdentity()),
    ("", CgroupIdentity()),
    ("not a cgroup file\x00\xff" * 10000, CgroupIdentity()),
    ("0::/kubepods/burstable/podnot-a-uid/abc\n", CgroupIdentity()),
])
def test_cgroup_paths_read_as_literal_strings(text: str, expected: CgroupIdentity) -> None:
    assert parse_cgroup(text) == expected


def test_allocations_are_bounded_and_skip_containers_without_devices() -> None:
    response = api_pb2.ListPodResourcesResponse()
    pod = response.pod_resources.add(name="trainer-0", namespace="ml")
    pod.containers.add(name="sidecar")
    main = pod.containers.add(name="jax")
    main.devices.add(resource_name="google.com/tpu", device_ids=[str(i) for i in range(MAX_IDS + 10)])
    (found,) = allocations(response)
    assert (found.namespace, found.pod, found.container, found.resource) == ("ml", "trainer-0", "jax", "google.com/tpu")
    assert len(found.device_ids) == MAX_IDS


def _procfs(root: Path, cgroups: dict[int, str]) -> str:
    for pid, text in cgroups.items():
        (root / "proc" / str(pid)).mkdir(parents=True)
        (root / "proc" / str(pid) / "cgroup").write_text(text)
    return str(root / "proc")


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[tuple[Kubelet, Path]]:
    socket = tmp_path / "pod-resources" / "kubelet.sock"
    socket.parent.mkdir()
    fake = Kubelet([("ml", "trainer-0", "jax", GPU[0], [GPU[1]]),
                    ("ml", "trainer-1", "jax", TPU[0], ["accel1", "accel2"]),
                    ("batch", "a", "main", GPU[0], ["GPU-shared::0"]),
                    ("batch", "b", "main", GPU[0], ["GPU-shared::1"])])
    server = serve(fake, socket)
    yield fake, socket
    fake.release.set()
    server.stop(grace=None)


def _answered(lookup: PodLookup, pid: int, devices: list[tuple[str, str]]) -> PodRef:
    def named() -> PodRef | None:
        lookup.refresh()
        found = lookup.pod_of(pid, devices)
        return found if found.pod else None
    return wait_until(named, timeout=10, what="the kubelet's answer")


def test_a_holder_is_named_by_the_container_its_device_was_assigned_to(
        tmp_path: Path, kubelet: tuple[Kubelet, Path]) -> None:
    procfs = _procfs(tmp_path, {41: (CGROUPS / "v2-systemd-containerd").read_text(),
                                42: (CGROUPS / "v1-cgroupfs-docker").read_text(),
                                43: "0::/system.slice/nvidia-persistenced.service\n"})
    lookup = PodLookup(procfs, str(kubelet[1]), refresh_every=0.0)
    assert _answered(lookup, 41, [GPU]) == PodRef("ml", "trainer-0", "jax", V2_UID, V2_CID)
    # Time-slicing replicas of one GPU name it in several containers: only the cgroup's identity is kept.
    assert lookup.pod_of(42, [("nvidia.com/gpu", "GPU-shared")]) == PodRef(pod_uid=V1_UID, container_id=V1_CID)
    # A host process holding a chip assigned to a pod is not that pod's.
    assert lookup.pod_of(43, [GPU]) == PodRef()
    # A process that exited (no cgroup file) is in no pod.
    assert lookup.pod_of(99, [GPU]) == PodRef()
    assert lookup.degraded is None
    lookup.close()


def test_without_the_socket_pods_are_named_by_uid_from_the_cgroup(tmp_path: Path) -> None:
    procfs = _procfs(tmp_path, {41: (CGROUPS / "v2-systemd-containerd").read_text()})
    lookup = PodLookup(procfs, str(tmp_path / "no-kubelet.sock"), refresh_every=0.0)
    lookup.refresh()
    assert lookup.pod_of(41, [GPU]) == PodRef(pod_uid=V2_UID, container_id=V2_CID)
    assert lookup.degraded is None, "a host without Kubernetes is not degraded"
    assert PodRef(pod_uid=V2_UID).describe() == f"pod UID {V2_UID}"


def test_a_kubelet_that_fails_or_hangs_never_blocks_and_is_reported(tmp_path: Path,
                                                                    kubelet: tuple[Kubelet, Path]) -> None:
    fake, socket = kubelet
    procfs = _procfs(tmp_path, {41: (CGROUPS / "v2-systemd-containerd").read_text()})
    fake.mode = "unavailable"
    lookup = PodLookup(procfs, str(socket), timeout=0.5, refresh_every=0.0)
    wait_until(lambda: (lookup.refresh(), lookup.degraded)[1], timeout=10, what="the failure to be seen")
    assert lookup.degraded == f"kubelet PodResources at {socket}: UNAVAILABLE: kubelet is restarting"
    assert lookup.pod_of(41, [GPU]) == PodRef(pod_uid=V2_UID, container_id=V2_CID)
    # A kubelet that does not answer: refresh() returns while the call is still held by the server.
    fake.mode = "slow"
    calls = fake.calls["List"]
    wait_until(lambda: (lookup.refresh(), fake.calls["List"] > calls)[1], timeout=10, what="the next call")
    assert not fake.release.is_set()
    lookup.refresh()
    wait_until(lambda: (lookup.refresh(), "DEADLINE_EXCEEDED" in (lookup.degraded or ""))[1], timeout=10,
               what="the deadline to pass")
    fake.mode = "ok"
    fake.release.set()
    assert _answered(lookup, 41, [GPU]).pod == "trainer-0"
    assert lookup.degraded is None
    lookup.close()


def test_without_grpc_the_cgroup_fallback_still_names_the_pod_uid(tmp_path: Path, kubelet: tuple[Kubelet, Path],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    procfs = _procfs(tmp_path, {41: (CGROUPS / "v2-systemd-containerd").read_text()})
    monkeypatch.setitem(sys.modules, "grpc", None)  # import grpc raises ImportError, as without the tpu extra
    lookup = PodLookup(procfs, str(kubelet[1]), refresh_every=0.0)
    lookup.refresh()
    assert lookup.pod_of(41, [GPU]) == PodRef(pod_uid=V2_UID, container_id=V2_CID)
    assert lookup.degraded is not None and "grpc is not installed" in lookup.degraded
    assert kubelet[0].calls["List"] == 0


def _holder(procfs: Path, dev: Path, pid: int, cgroup: str, device_file: str) -> None:
    directory = procfs / str(pid)
    (directory / "fd").mkdir(parents=True)
    (directory / "comm").write_text("python3\n")
    (directory / "statm").write_text("1000 256 10 1 0 100 0\n")
    (directory / "cgroup").write_text(cgroup)
    os.symlink(dev / device_file, directory / "fd" / "5")


def test_the_host_collector_names_each_holder_by_chip_and_pod(tmp_path: Path, kubelet: tuple[Kubelet, Path]) -> None:
    procfs, dev = tmp_path / "proc", tmp_path / "dev"
    dev.mkdir()
    (dev / "accel1").write_text("")
    _holder(procfs, dev, 41, (CGROUPS / "v1-systemd-crio-guaranteed").read_text(), "accel1")
    chip = DeviceReading(device="1", chip="v5e", device_files=("accel1",), plugin_ids=(("google.com/tpu", "accel1"),))
    inventory = Inventory(1, (chip,), HolderScan(str(procfs), str(dev), ["accel[0-9]*"], 60.0).scan())
    lookup = PodLookup(str(procfs), str(kubelet[1]), refresh_every=0.0)
    collector = HostCollector(str(procfs), lambda: inventory, pods=lookup)

    def holder_info() -> dict[str, Any] | None:
        found = [dict(s.labels) for s in collector.collect() if s.name == "tpuwatch_device_holder_info"]
        return found[0] if found and found[0]["pod"] else None

    info = wait_until(holder_info, timeout=10, what="the holder named by pod")
    assert info == {"device_file": "accel1", "device": "1", "pid": "41", "command": "python3", "namespace": "ml",
                    "pod": "trainer-1", "container": "jax", "pod_uid": "0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f",
                    "container_id": "1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b"}
    (rss,) = [s for s in collector.collect() if s.name == "tpuwatch_holder_process_resident_memory_bytes"]
    assert dict(rss.labels) == {"pid": "41", "command": "python3", "namespace": "ml", "pod": "trainer-1",
                                "container": "jax"}
    collector.close()


def test_without_the_kubelets_socket_grpc_is_never_imported(tmp_path: Path) -> None:
    # grpc costs the daemon about 10 MiB: a host without a kubelet must not carry it.
    code = ("import sys\nfrom tpuwatch.pods import PodLookup\n"
            f"lookup = PodLookup('/proc', {str(tmp_path / 'kubelet.sock')!r})\n"
            "lookup.refresh(); lookup.pod_of(1); assert lookup.degraded is None; lookup.close()\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'google')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout == "[]\n", out.stderr
