"""A stand-in for kube-apiserver on 127.0.0.1: Nodes, Node status and Leases, as the real API answers them.

No kube-apiserver can be installed here, so tpuwatch's client (and kubectl, as a second real client) talk
to this HTTP(S) server, shaped after the upstream behaviour:

- Paths and verbs of core/v1 Nodes (``/api/v1/nodes[/NAME[/status]]``) and coordination.k8s.io/v1 Leases
  (``/apis/coordination.k8s.io/v1/namespaces/NS/leases[/NAME]``), with the discovery documents kubectl
  reads first (``/api``, ``/apis``, ``/api/v1``, ``/apis/coordination.k8s.io/v1``, ``/version``).
- Strategic merge patch (``application/strategic-merge-patch+json``): maps merge, ``null`` deletes, lists
  are replaced, except ``status.conditions`` which merges by ``type`` (k8s.io/api core/v1 types.go:
  ``Conditions []NodeCondition `patchStrategy:"merge" patchMergeKey:"type"```; ``NodeSpec.Taints`` has no
  patch strategy, so a taints patch replaces the list).  JSON merge patch (RFC 7386) too.
- A ``metadata.resourceVersion`` in a patch or a PUT is a precondition: a stale one is answered 409 with
  reason Conflict; a POST of an existing name 409 AlreadyExists (apimachinery's metav1.Status bodies:
  kind Status, status Failure, reason, code, message, details).  Every write bumps one cluster-wide
  resourceVersion, as etcd's revision does.
- The status subresource takes only ``status`` from a patch; the main resource ignores ``status``.
- Bearer-token authentication (401 Unauthorized), and a set of (verb, resource) pairs answered 403
  Forbidden with the RBAC message, to test missing permissions.
- Knobs: ``delay`` (seconds before each answer), ``down`` (connections dropped unanswered), ``conflicts``
  (the next N writes that carry a resourceVersion answered 409, as if another client had written first;
  a write without one is never a conflict, as the API server retries those itself).
- ``list`` with ``labelSelector`` (equality terms), ``limit`` and ``continue`` with ``remainingItemCount``.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from certs import TlsFiles

NODE_PATH = re.compile(r"^/api/v1/nodes(?:/(?P<name>[^/]+)(?P<status>/status)?)?$")
LEASE_PATH = re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/leases(?:/(?P<name>[^/]+))?$")
DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
MERGE_KEYS = {("status", "conditions"): "type", ("status", "addresses"): "type"}
VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
CONDITION_STATUSES = {"True", "False", "Unknown"}
TAINT_EFFECTS = {"NoSchedule", "PreferNoSchedule", "NoExecute"}
USER = "system:serviceaccount:monitoring:tpuwatch"


def status_body(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    """A metav1.Status failure, as the API server writes it."""
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}
    if details:
        body["details"] = details
    return body


def strategic_merge(target: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    """Apply a strategic merge patch (the subset Nodes use): maps merge, null deletes, lists replace or merge by key."""
    if not isinstance(patch, dict) or not isinstance(target, dict):
        return copy.deepcopy(patch)
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
            continue
        merge_key = MERGE_KEYS.get((*path, key))
        if merge_key and isinstance(value, list) and isinstance(out.get(key), list):
            merged = {item.get(merge_key): item for item in out[key]}
            for item in value:
                current = merged.get(item.get(merge_key))
                merged[item.get(merge_key)] = strategic_merge(current, item, (*path, key)) if current else item
            out[key] = list(merged.values())
        else:
            out[key] = strategic_merge(out.get(key), value, (*path, key))
    return out


def json_merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = json_merge(out.get(key), value)
    return out


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """Equality-based label selector (``a=b,c!=d,e``)."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term not in labels:
            return False
    return True


class ApiServer:
    """The stand-in; ``url`` once started.  Use as a context manager or call ``close()``."""

    def __init__(self, token: str = "test-token", tls: TlsFiles | None = None) -> None:
        self.token = token
        self.nodes: dict[str, dict[str, Any]] = {}
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.forbidden: set[tuple[str, str]] = set()
        self.delay = 0.0
        self.down = False
        self.conflicts = 0
        self.requests: list[tuple[str, str, str]] = []
        self._revision = itertools.count(1000)
        self.lock = threading.RLock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.scheme = "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(tls.server_cert, tls.server_key)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            self.scheme = "https"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> ApiServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def write_kubeconfig(self, path: Path, ca: Path | None = None) -> Path:
        """A kubeconfig whose current context is this server with its token (and ``ca`` for TLS)."""
        cluster: dict[str, Any] = {"server": self.url, **({"certificate-authority": str(ca)} if ca else {})}
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": cluster}],
            "users": [{"name": "tpuwatch", "user": {"token": self.token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "tpuwatch"}}]}))
        return path

    @contextmanager
    def outage(self) -> Iterator[None]:
        """Every connection dropped while inside."""
        self.down = True
        try:
            yield
        finally:
            self.down = False

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj["metadata"]["resourceVersion"] = str(next(self._revision))
        return obj

    def add_node(self, name: str, labels: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
        """A Node as the kubelet registers it, with a Ready condition."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "uid": str(uuid.uuid4()), "creationTimestamp": now,
                             "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
                "spec": {"podCIDR": "10.244.0.0/24", **extra},
                "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                           "message": "kubelet is posting ready status",
                                           "lastHeartbeatTime": now, "lastTransitionTime": now}],
                           "nodeInfo": {"kubeletVersion": "v1.30.0"}}}
        with self.lock:
            self.nodes[name] = self._stamp(node)
        return node

    def node(self, name: str) -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy(self.nodes[name])

    def condition(self, node: str, kind: str) -> dict[str, Any] | None:
        return next((c for c in self.node(node)["status"].get("conditions", []) if c["type"] == kind), None)

    def taints(self, node: str) -> list[dict[str, Any]]:
        return self.node(node)["spec"].get("taints", [])

    def holders(self, namespace: str) -> dict[str, str]:
        """Lease name -> holderIdentity of the leases that have one."""
        with self.lock:
            return {name: lease["spec"]["holderIdentity"] for (ns, name), lease in self.leases.items()
                    if ns == namespace and lease.get("spec", {}).get("holderIdentity")}

    # --- request handling -----------------------------------------------------------------

    def handle(self, method: str, target: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, Any]]:
        parts = urlsplit(target)
        path, query = parts.path, {k: v[0] for k, v in parse_qs(parts.query).items()}
        with self.lock:
            self.requests.append((method, path, headers.get("content-type", "")))
        if headers.get("authorization") != f"Bearer {self.token}":
            return 401, status_body(401, "Unauthorized", "Unauthorized")
        discovery = _discovery(path)
        if discovery is not None:
            return 200, discovery
        node_match, lease_match = NODE_PATH.match(path), LEASE_PATH.match(path)
        if node_match:
            resource = "nodes/status" if node_match["status"] else "nodes"
            name, namespace = node_match["name"], None
        elif lease_match:
            resource, name, namespace = "leases", lease_match["name"], lease_match["ns"]
        else:
            return 404, status_body(404, "NotFound", "the server could not find the requested resource")
        verb = VERBS.get(method, method.lower())
        if verb == "get" and name is None:
            verb = "list"
        if (verb, resource) in self.forbidden:
            scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
            group = "coordination.k8s.io" if resource == "leases" else ""
            kind = resource.split("/")[0]
            return 403, status_body(403, "Forbidden", f'{kind} "{name or ""}" is forbidden: User "{USER}" cannot '
                                    f'{verb} resource "{resource}" in API group "{group}" {scope}',
                                    name=name or "", kind=kind)
        try:
            payload = json.loads(body) if body else None
        except ValueError as exc:
            return 400, status_body(400, "BadRequest", f"invalid JSON: {exc}")
        with self.lock:
            precondition = isinstance(payload, dict) and (payload.get("metadata") or {}).get("resourceVersion")
            if verb in ("update", "patch") and precondition and self.conflicts > 0:
                self.conflicts -= 1
                return 409, _conflict(resource, name or "")
            if node_match:
                return self._nodes(verb, name, bool(node_match["status"]), payload, headers, query)
            return self._leases(verb, namespace or "", name, payload, query)

    def _nodes(self, verb: str, name: str | None, status: bool, patch: Any, headers: dict[str, str],
               query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        if verb == "list":
            items = [n for n in self.nodes.values()
                     if selector_matches(query.get("labelSelector", ""), n["metadata"].get("labels", {}))]
            return 200, _list("NodeList", "v1", sorted(items, key=lambda n: n["metadata"]["name"]), query,
                              str(next(self._revision)))
        assert name is not None
        node = self.nodes.get(name)
        if node is None:
            return 404, status_body(404, "NotFound", f'nodes "{name}" not found', name=name, kind="nodes")
        if verb == "get":
            return 200, copy.deepcopy(node)
        if verb != "patch":
            return 405, status_body(405, "MethodNotAllowed", f"{verb} is not supported here")
        content_type = headers.get("content-type", "").split(";")[0]
        if content_type not in ("application/strategic-merge-patch+json", "application/merge-patch+json"):
            return 415, status_body(415, "UnsupportedMediaType", "the body of the request was in an unknown "
                                    "format - accepted media types include: application/json-patch+json, "
                                    "application/merge-patch+json, application/apply-patch+yaml, "
                                    "application/strategic-merge-patch+json")
        if not isinstance(patch, dict):
            return 400, status_body(400, "BadRequest", "a patch must be a JSON object")
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != node["metadata"]["resourceVersion"]:
            return 409, _conflict("nodes", name)
        patch = {k: v for k, v in patch.items() if (k == "status") == status}
        merge = strategic_merge if content_type.startswith("application/strategic") else json_merge
        updated = merge(node, patch)
        updated["metadata"]["resourceVersion"] = node["metadata"]["resourceVersion"]
        problem = _invalid_node(updated)
        if problem:
            return 422, status_body(422, "Invalid", f'Node "{name}" is invalid: {problem}', name=name, kind="Node")
        self.nodes[name] = self._stamp(updated)
        return 200, copy.deepcopy(self.nodes[name])

    def _leases(self, verb: str, namespace: str, name: str | None, body: Any,
                query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        if verb == "list":
            items = [lease for (ns, _), lease in sorted(self.leases.items()) if ns == namespace
                     and selector_matches(query.get("labelSelector", ""), lease["metadata"].get("labels", {}))]
            return 200, _list("LeaseList", "coordination.k8s.io/v1", items, query, str(next(self._revision)))
        if verb == "create":
            name = (body or {}).get("metadata", {}).get("name", "")
        assert name is not None
        key, existing = (namespace, name), self.leases.get((namespace, name))
        if verb == "get":
            if existing is None:
                return 404, _not_found(name)
            return 200, copy.deepcopy(existing)
        if verb == "delete":
            if existing is None:
                return 404, _not_found(name)
            del self.leases[key]
            return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
        if not isinstance(body, dict) or not DNS_NAME.match(name) or body.get("kind") not in ("Lease", None):
            return 422, status_body(422, "Invalid", f'Lease.coordination.k8s.io "{name}" is invalid')
        duration = (body.get("spec") or {}).get("leaseDurationSeconds")
        if duration is not None and (not isinstance(duration, int) or duration <= 0):
            return 422, status_body(422, "Invalid", f'Lease.coordination.k8s.io "{name}" is invalid: '
                                    f"spec.leaseDurationSeconds: Invalid value: {duration}: must be greater than 0")
        if verb == "create":
            if existing is not None:
                return 409, status_body(409, "AlreadyExists", f'leases.coordination.k8s.io "{name}" already exists',
                                        name=name, group="coordination.k8s.io", kind="leases")
            lease = copy.deepcopy(body)
            lease["metadata"].update(namespace=namespace, uid=str(uuid.uuid4()),
                                     creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            lease.setdefault("apiVersion", "coordination.k8s.io/v1")
            lease.setdefault("kind", "Lease")
            self.leases[key] = self._stamp(lease)
            return 201, copy.deepcopy(self.leases[key])
        if verb != "update":
            return 405, status_body(405, "MethodNotAllowed", f"{verb} is not supported here")
        if existing is None:
            return 404, _not_found(name)
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != existing["metadata"]["resourceVersion"]:
            return 409, _conflict("leases.coordination.k8s.io", name)
        lease = copy.deepcopy(body)
        lease["metadata"] = {**existing["metadata"], **{k: v for k, v in lease["metadata"].items()
                                                        if k in ("labels", "annotations")}}
        self.leases[key] = self._stamp(lease)
        return 200, copy.deepcopy(self.leases[key])


def _conflict(resource: str, name: str) -> dict[str, Any]:
    return status_body(409, "Conflict", f'Operation cannot be fulfilled on {resource} "{name}": the object has '
                       "been modified; please apply your changes to the latest version and try again",
                       name=name, kind=resource.split(".")[0])


def _not_found(name: str) -> dict[str, Any]:
    return status_body(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found', name=name,
                       group="coordination.k8s.io", kind="leases")


def _invalid_node(node: dict[str, Any]) -> str | None:
    for condition in node.get("status", {}).get("conditions", []):
        if condition.get("status") not in CONDITION_STATUSES:
            return f"status.conditions: Unsupported value: {condition.get('status')!r}"
    for taint in node.get("spec", {}).get("taints", []) or []:
        if taint.get("effect") not in TAINT_EFFECTS:
            return f"spec.taints: Unsupported value: {taint.get('effect')!r}"
    keys = [(t.get("key"), t.get("effect")) for t in node.get("spec", {}).get("taints", []) or []]
    if len(keys) != len(set(keys)):
        return "spec.taints: Duplicate value"
    return None


def _list(kind: str, api_version: str, items: list[dict[str, Any]], query: dict[str, str],
          revision: str) -> dict[str, Any]:
    start = int(query.get("continue") or 0)
    limit = int(query.get("limit") or 0) or len(items) or 1
    page = items[start:start + limit]
    metadata: dict[str, Any] = {"resourceVersion": revision}
    if start + limit < len(items):
        metadata["continue"] = str(start + limit)
        metadata["remainingItemCount"] = len(items) - start - limit
    return {"kind": kind, "apiVersion": api_version, "metadata": metadata, "items": copy.deepcopy(page)}


def _discovery(path: str) -> dict[str, Any] | None:
    if path == "/version":
        return {"major": "1", "minor": "30", "gitVersion": "v1.30.0", "platform": "linux/amd64"}
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}
    if path == "/apis":
        version = {"groupVersion": "coordination.k8s.io/v1", "version": "v1"}
        return {"kind": "APIGroupList", "apiVersion": "v1",
                "groups": [{"name": "coordination.k8s.io", "versions": [version], "preferredVersion": version}]}
    if path == "/api/v1":
        return {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            {"name": "nodes", "singularName": "node", "namespaced": False, "kind": "Node", "shortNames": ["no"],
             "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]},
            {"name": "nodes/status", "singularName": "", "namespaced": False, "kind": "Node",
             "verbs": ["get", "patch", "update"]}]}
    if path == "/apis/coordination.k8s.io/v1":
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "coordination.k8s.io/v1",
                "resources": [{"name": "leases", "singularName": "lease", "namespaced": True, "kind": "Lease",
                               "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}]}
    return None


def _handler(api: ApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
            pass

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if api.delay:
                time.sleep(api.delay)
            if api.down:
                self.close_connection = True
                self.connection.close()
                return
            headers = {k.lower(): v for k, v in self.headers.items()}
            code, answer = api.handle(self.command, self.path, headers, body)
            data = json.dumps(answer).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve  # noqa: N815 - http.server's naming

    return Handler
