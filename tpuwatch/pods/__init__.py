"""Pod attribution: which Kubernetes pod and container a process runs in (cgroup, kubelet PodResources)."""

from tpuwatch.pods.lookup import PodLookup, PodRef

__all__ = ["PodLookup", "PodRef"]
