"""The blast-radius limit: at most N nodes act at once, each holding one of N Leases (coordination.k8s.io/v1).

The API server is the only coordinator.  Slot ``i`` is the Lease ``<prefix>-<i>`` in one namespace; a node
takes a free one by creating it (409 AlreadyExists: someone was faster) or by replacing it with the
``resourceVersion`` it read (409 Conflict: someone was faster), so two nodes can never hold the same slot,
and only slots below the limit are ever taken.  A holder renews its Lease every third of its duration, as
client-go's leader election does; a Lease whose ``renewTime + leaseDurationSeconds`` has passed is free,
unless its holder's Node still carries tpuwatch's taints, cordon or drain request: a node that died
tainted keeps its slot until someone cleans it up, so the limit counts every node tpuwatch has acted on.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime, timezone
from typing import Any

from tpuwatch.kubernetes import node as node_marks
from tpuwatch.kubernetes.client import ApiError, KubeClient
from tpuwatch.kubernetes.conditions import parse_time

log = logging.getLogger(__name__)

SLOT_LABEL = "tpuwatch.io/slot"
SCOPE_CACHE_S = 300.0
RETRY_FULL_S = 30.0  # a node held back asks again this often, so a fleet-wide fault does not flood the server


def slot_limit(spec: str, nodes_in_scope: int) -> int:
    """``"2"`` -> 2; ``"10%"`` of the nodes in scope, rounded down but at least 1 (``"0%"`` and ``"0"``: 0)."""
    if spec.endswith("%"):
        percent = int(spec[:-1])
        return 0 if percent == 0 else max(1, math.floor(nodes_in_scope * percent / 100))
    return int(spec)


def micro_time(timestamp: float) -> str:
    """Unix time as metav1.MicroTime: RFC 3339 in UTC with microseconds."""
    return datetime.fromtimestamp(timestamp, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def holder(lease: dict[str, Any]) -> str:
    """The Lease's holderIdentity, '' if none."""
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def expired(lease: dict[str, Any], now: float) -> bool:
    """True if the holder has not renewed within leaseDurationSeconds (or there is no holder)."""
    spec = lease.get("spec") or {}
    renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
    duration = spec.get("leaseDurationSeconds")
    if not holder(lease) or renewed is None or not isinstance(duration, int):
        return True
    return renewed + duration < now


class SlotLimiter:
    """Takes, renews and gives back this node's slot."""

    def __init__(self, client: KubeClient, namespace: str, prefix: str, identity: str, duration: float,
                 selector: str, limit_spec: str) -> None:
        self.client, self.namespace, self.prefix, self.identity = client, namespace, prefix, identity
        self.duration, self.selector, self.limit_spec = max(1, int(duration)), selector, limit_spec
        self.held: dict[str, Any] | None = None
        self.renewed_at = -math.inf
        self.limit: int | None = None
        self._scope_at = -math.inf
        self._full_until = -math.inf

    @property
    def slot(self) -> str | None:
        """The name of the held Lease, if any."""
        return self.held["metadata"]["name"] if self.held else None

    def _limit(self, now: float) -> int:
        if not self.limit_spec.endswith("%"):
            return int(self.limit_spec)
        if self.limit is None or now - self._scope_at >= SCOPE_CACHE_S:
            self.limit = slot_limit(self.limit_spec, self.client.count_nodes(self.selector))
            self._scope_at = now
        return self.limit

    def acquire(self, now: float) -> bool:
        """Hold a slot (taking one if free); False if the limit is reached.  ApiError if the server fails."""
        if self.held is not None:
            return self.renew(now)
        if now < self._full_until:
            return False
        taken = self._acquire(now)
        self._full_until = -math.inf if taken else now + RETRY_FULL_S
        return taken

    def _acquire(self, now: float) -> bool:
        limit = self._limit(now)
        if not self.limit_spec.endswith("%"):
            self.limit = limit
        leases = {lease["metadata"]["name"]: lease for lease in
                  self.client.list_leases(self.namespace, f"{SLOT_LABEL}={self.prefix}")
                  if isinstance(lease.get("metadata"), dict) and lease["metadata"].get("name")}
        mine = next((lease for lease in leases.values() if holder(lease) == self.identity), None)
        if mine is not None:  # held before a restart: keep it
            self.held = mine
            return self.renew(now)
        occupied = [lease for lease in leases.values() if self._occupied(lease, now)]
        if len(occupied) >= limit:
            return False
        for index in range(limit):
            name = f"{self.prefix}-{index}"
            lease = leases.get(name)
            if lease is not None and lease in occupied:
                continue
            if self._take(name, lease, now):
                log.info("took blast-radius slot %s (%d of %d in use)", name, len(occupied) + 1, limit)
                return True
        return False

    def _occupied(self, lease: dict[str, Any], now: float) -> bool:
        if not holder(lease):
            return False
        if not expired(lease, now):
            return True
        try:
            return node_marks.dirty(self.client.get_node(holder(lease)))
        except ApiError as exc:
            return exc.code != 404  # a deleted node holds nothing; an unknown answer counts as held

    def _body(self, name: str, previous: dict[str, Any] | None, now: float) -> dict[str, Any]:
        spec = (previous or {}).get("spec") or {}
        metadata: dict[str, Any] = {"name": name, "namespace": self.namespace, "labels": {SLOT_LABEL: self.prefix}}
        if previous is not None:
            metadata["resourceVersion"] = previous["metadata"].get("resourceVersion")
        transitions = int(spec.get("leaseTransitions") or 0) + (1 if previous is not None else 0)
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
                "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": self.duration,
                         "acquireTime": micro_time(now), "renewTime": micro_time(now),
                         "leaseTransitions": transitions}}

    def _take(self, name: str, lease: dict[str, Any] | None, now: float) -> bool:
        try:
            if lease is None:
                self.held = self.client.create_lease(self.namespace, self._body(name, None, now))
            else:
                self.held = self.client.replace_lease(self.namespace, self._body(name, lease, now))
        except ApiError as exc:
            if exc.code == 409:  # AlreadyExists or Conflict: another node took it first
                return False
            raise
        self.renewed_at = now
        return True

    def renew(self, now: float) -> bool:
        """Renew the held Lease when a third of its duration has passed; False if it was lost."""
        if self.held is None:
            return False
        if now - self.renewed_at < self.duration / 3:
            return True
        body = dict(self.held)
        body["spec"] = {**(self.held.get("spec") or {}), "renewTime": micro_time(now)}
        try:
            self.held = self.client.replace_lease(self.namespace, body)
        except ApiError as exc:
            if exc.code not in (404, 409):
                raise
            try:  # changed under us: still ours?
                current = self.client.get_lease(self.namespace, body["metadata"]["name"])
            except ApiError as again:
                if again.code != 404:
                    raise
                current = {}
            if holder(current) != self.identity:
                log.warning("lost blast-radius slot %s to %r", body["metadata"]["name"], holder(current) or None)
                self.held = None
                return False
            self.held = current
            return self.renew(now)
        self.renewed_at = now
        return True

    def release(self) -> None:
        """Give the slot back (holderIdentity cleared); ApiError if the server fails (retried later)."""
        if self.held is None:
            return
        body = dict(self.held)
        spec = {k: v for k, v in (self.held.get("spec") or {}).items() if k not in ("holderIdentity", "acquireTime")}
        body["spec"] = spec
        try:
            self.client.replace_lease(self.namespace, body)
        except ApiError as exc:
            if exc.code not in (404, 409):
                raise
        log.info("gave back blast-radius slot %s", body["metadata"]["name"])
        self.held = None
