"""Kubernetes node health: node conditions, taints, cordon and remediation behind a cluster-wide limit.

``conditions`` turns tpuwatch's alerts into node conditions (pure), ``slots`` is the Lease-based
blast-radius limit, ``remediation`` the action ladder (pure decisions), ``api`` the few REST calls,
``agent`` the thread that drives them from the daemon's sampling cycles (docs/kubernetes.md).
"""
