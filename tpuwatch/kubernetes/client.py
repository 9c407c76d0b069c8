"""The few Kubernetes API calls tpuwatch makes, over plain HTTPS: no client library.

The official Python client costs the daemon about 37 MiB of resident memory (docs/kubernetes.md, measured);
these calls need a few hundred lines.  Credentials come from the pod's service account (token, CA,
``KUBERNETES_SERVICE_HOST``/``_PORT``), the way client-go's ``rest.InClusterConfig`` finds them, or from a
kubeconfig file.  Every call has a deadline and a bounded answer; a failure is an ``ApiError`` carrying the
HTTP code and the ``reason`` of the metav1.Status body (Conflict, AlreadyExists, Forbidden, NotFound), or
code 0 when the server could not be reached at all.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

from tpuwatch import __version__, yamlfile
from tpuwatch.schema import ConfigError

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MAX_ANSWER_BYTES = 16 << 20
MAX_SECRET_BYTES = 64 << 10
STRATEGIC_MERGE = "application/strategic-merge-patch+json"


class ApiError(Exception):
    """A failed call: ``code`` is the HTTP status (0: unreachable, timed out), ``reason`` metav1.Status's."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        self.code, self.reason, self.message = code, reason, message
        super().__init__(f"{code or 'no answer'} {reason}: {message}")


@dataclass(frozen=True)
class Credentials:
    """Where the API server is and how to prove who we are."""

    server: str
    ca_file: str | None = None
    verify: bool = True
    token: str | None = None
    token_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    scratch: str | None = None  # a private directory of decoded inline files, removed by ``KubeClient.close``


def in_cluster(env: dict[str, str] | None = None, root: Path = SERVICE_ACCOUNT) -> Credentials:
    """The pod's service account credentials; ConfigError if this is not a pod with one."""
    env = dict(os.environ) if env is None else env
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise ConfigError("kubernetes.kubeconfig", "not in a pod (KUBERNETES_SERVICE_HOST unset): "
                          "name a kubeconfig file")
    if not (root / "token").is_file():
        raise ConfigError("kubernetes.kubeconfig", f"no service account token at {root / 'token'} "
                          "(automountServiceAccountToken off?)")
    host = f"[{host}]" if ":" in host else host
    ca = root / "ca.crt"
    return Credentials(f"https://{host}:{port}", str(ca) if ca.is_file() else None,
                       token_file=str(root / "token"))


def in_cluster_namespace(root: Path = SERVICE_ACCOUNT) -> str | None:
    """The pod's namespace from its service account, if mounted."""
    try:
        return (root / "namespace").read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def from_kubeconfig(path: str) -> Credentials:
    """The current context's cluster and user of a kubeconfig file; ConfigError naming what is wrong.

    The file is read by the bounded loader of every YAML file (``tpuwatch.yamlfile``).  Inline ``*-data``
    certificates and keys are written to files in a private temp dir, made only for them and removed by
    ``KubeClient.close``.
    """
    where = "kubernetes.kubeconfig"
    try:
        data = yamlfile.read(path)
    except ConfigError as exc:  # "PATH: cannot read: ...", "PATH: line L, column C: ..."
        raise ConfigError(where, str(exc)) from None
    if not isinstance(data, dict):
        raise ConfigError(where, f"{path} is not a kubeconfig")

    def named(kind: str, name: Any) -> dict[str, Any]:
        for entry in data.get(kind) or []:
            if isinstance(entry, dict) and entry.get("name") == name:
                return entry.get(kind[:-1]) or {}
        raise ConfigError(where, f"{path}: no {kind[:-1]} named {name!r}")

    context = named("contexts", data.get("current-context"))
    cluster, user = named("clusters", context.get("cluster")), named("users", context.get("user"))
    if not cluster.get("server"):
        raise ConfigError(where, f"{path}: cluster {context.get('cluster')!r} has no server")
    base = Path(path).resolve().parent
    files = (("certificate-authority", cluster), ("client-certificate", user), ("client-key", user))
    scratch = Path(tempfile.mkdtemp(prefix="tpuwatch-kube-")) if any(
        entry.get(f"{key}-data") for key, entry in files) else None

    def file_of(key: str, entry: dict[str, Any]) -> str | None:
        if scratch is not None and entry.get(f"{key}-data"):
            target = scratch / key
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(base64.b64decode(entry[f"{key}-data"]))
            return str(target)
        value = entry.get(key)
        return str(base / value) if value else None

    try:
        ca_file, cert_file, key_file = (file_of(key, entry) for key, entry in files)
    except BaseException:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        raise
    return Credentials(str(cluster["server"]).rstrip("/"), ca_file, not cluster.get("insecure-skip-tls-verify", False),
                       user.get("token"), str(base / user["tokenFile"]) if user.get("tokenFile") else None,
                       cert_file, key_file, str(scratch) if scratch is not None else None)


class KubeClient:
    """Node, Node status and Lease calls against one API server."""

    def __init__(self, credentials: Credentials, timeout: float) -> None:
        self.credentials = credentials
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers["User-Agent"] = f"tpuwatch/{__version__}"
        # Passed with every request: a session-wide setting loses to $REQUESTS_CA_BUNDLE in requests.
        self.verify: bool | str = (credentials.ca_file or True) if credentials.verify else False
        if credentials.cert_file and credentials.key_file:
            self.session.cert = (credentials.cert_file, credentials.key_file)

    def close(self) -> None:
        """Close pooled connections; remove the decoded inline credentials."""
        self.session.close()
        if self.credentials.scratch:
            shutil.rmtree(self.credentials.scratch, ignore_errors=True)

    def _token(self) -> str | None:
        if self.credentials.token_file:  # projected tokens rotate: read it afresh every call
            try:
                with open(self.credentials.token_file, "rb") as handle:
                    return handle.read(MAX_SECRET_BYTES).decode().strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise ApiError(0, "TokenUnreadable", f"{self.credentials.token_file}: {exc}") from None
        return self.credentials.token

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                params: dict[str, str] | None = None) -> dict[str, Any]:
        """One call; its JSON answer, or ApiError."""
        headers = {"Accept": "application/json"}
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        try:
            with self.session.request(method, self.credentials.server + path, data=data, headers=headers,
                                      params=params, timeout=self.timeout, stream=True,
                                      verify=self.verify) as response:
                raw = response.raw.read(MAX_ANSWER_BYTES + 1, decode_content=True)
                status = response.status_code
        except requests.Timeout as exc:
            raise ApiError(0, "Timeout", str(exc)) from None
        except (requests.RequestException, OSError) as exc:
            raise ApiError(0, "Unavailable", str(exc)) from None
        if len(raw) > MAX_ANSWER_BYTES:
            raise ApiError(status, "TooLarge", f"answer over {MAX_ANSWER_BYTES} bytes")
        try:
            answer = json.loads(raw) if raw else {}
        except ValueError:
            answer = {"message": raw[:200].decode(errors="replace")}
        if not isinstance(answer, dict):
            answer = {}
        if status >= 300:
            raise ApiError(status, str(answer.get("reason") or f"HTTP{status}"), str(answer.get("message", "")))
        return answer

    # --- nodes ---------------------------------------------------------------------

    def get_node(self, name: str) -> dict[str, Any]:
        """GET /api/v1/nodes/NAME."""
        return self.request("GET", f"/api/v1/nodes/{quote(name)}")

    def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """Strategic merge patch of the Node (spec, metadata)."""
        return self.request("PATCH", f"/api/v1/nodes/{quote(name)}", patch, STRATEGIC_MERGE)

    def patch_node_status(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """Strategic merge patch of the Node's status subresource (conditions merge by type)."""
        return self.request("PATCH", f"/api/v1/nodes/{quote(name)}/status", patch, STRATEGIC_MERGE)

    def count_nodes(self, selector: str, max_pages: int = 100) -> int:
        """Nodes matching the label selector: one item and ``remainingItemCount`` where the server gives it."""
        params = {"limit": "1", **({"labelSelector": selector} if selector else {})}
        answer = self.request("GET", "/api/v1/nodes", params=params)
        remaining = (answer.get("metadata") or {}).get("remainingItemCount")
        count = len(answer.get("items") or [])
        if isinstance(remaining, int):
            return count + remaining
        params["limit"] = "500"
        for _ in range(max_pages):
            token = (answer.get("metadata") or {}).get("continue")
            if not token:
                return count
            answer = self.request("GET", "/api/v1/nodes", params={**params, "continue": token})
            count += len(answer.get("items") or [])
        raise ApiError(200, "TooLarge", f"more than {max_pages} pages of nodes")

    # --- leases --------------------------------------------------------------------

    def _lease_path(self, namespace: str, name: str = "") -> str:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace)}/leases"
        return f"{path}/{quote(name)}" if name else path

    def list_leases(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """Leases of a namespace matching a label selector."""
        answer = self.request("GET", self._lease_path(namespace), params={"labelSelector": selector})
        return [item for item in answer.get("items") or [] if isinstance(item, dict)]

    def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
        """GET one Lease (ApiError 404 if there is none)."""
        return self.request("GET", self._lease_path(namespace, name))

    def create_lease(self, namespace: str, lease: dict[str, Any]) -> dict[str, Any]:
        """POST a new Lease (409 AlreadyExists if another got there first)."""
        return self.request("POST", self._lease_path(namespace), lease)

    def replace_lease(self, namespace: str, lease: dict[str, Any]) -> dict[str, Any]:
        """PUT a Lease carrying the resourceVersion read (409 Conflict if it changed since)."""
        return self.request("PUT", self._lease_path(namespace, lease["metadata"]["name"]), lease)


def connect(kubeconfig: str | None, timeout: float) -> KubeClient:
    """A client from the kubeconfig file, or from the pod's service account; ConfigError if neither works."""
    return KubeClient(from_kubeconfig(kubeconfig) if kubeconfig else in_cluster(), timeout)
