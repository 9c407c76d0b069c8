"""The HTTP endpoint: /metrics, JSON routes (/healthz, /api/alerts), pages (the status page), the shipped
runbooks (/runbooks/NAME) and a landing page where no page is given, with optional TLS and basic auth on every
route.

Connections are handled by tpuwatch.httpd (one event loop, bounded workers,
deadlines and caps on everything), so no number of idle, slow or hostile
clients locks a scraper out; docs/endpoint.md has the limits.
"""

from __future__ import annotations

import errno
import hashlib
import json
import socket
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from tpuwatch.alerting import runbooks
from tpuwatch.exporter import Exposition, RenderedRegistry
from tpuwatch.httpd.limits import LISTEN_BACKLOG, Limits
from tpuwatch.httpd.protocol import Request, Response, accepts_gzip
from tpuwatch.httpd.server import Server
from tpuwatch.httpd.stats import HttpStats
from tpuwatch.samples import Sample
from tpuwatch.syntax import parse_listen_address
from tpuwatch.webconfig import WebConfig

# A JSON endpoint: returns the HTTP status and the body.
JsonRoute = Callable[[], tuple[int, Any]]


@dataclass(frozen=True)
class Page:
    """A route that makes its whole response from the request (HTML, scripts, styles: their own headers)."""

    answer: Callable[[Request], Response]


Route = JsonRoute | Page

_LANDING = b"""<!doctype html><html><head><title>tpuwatch</title></head><body>
<h1>tpuwatch</h1><p><a href="/metrics">/metrics</a> &middot; <a href="/healthz">/healthz</a>
&middot; <a href="/api/alerts">/api/alerts</a> &middot; <a href="/runbooks/">/runbooks/</a></p>
</body></html>
"""
_UNAUTHORIZED = Response(401, b"401 Unauthorized\n", headers=(("WWW-Authenticate", 'Basic realm="tpuwatch"'),))
_NOT_FOUND = Response(404, b"404 Not Found\n")
_VERIFIED_LANE_SIZE = 16  # Authorization headers remembered for routing (not for auth: every request is checked)


class StartupError(RuntimeError):
    """The endpoint cannot start; the message is one line for the user."""


class _Routes:
    """What each path answers, in three lanes of workers.

    /metrics has a lane of its own, so slow routes never delay it.  With basic auth, a request whose
    Authorization header has not passed before goes to the "unverified" lane: a flood of wrong passwords
    (a bcrypt check each) fills only that lane, while scrapes with known credentials go on.
    """

    lanes: tuple[str, ...] = ("metrics", "routes", "unverified")

    def __init__(self, exposition: Exposition, routes: Mapping[str, Route], web: Callable[[], WebConfig]) -> None:
        self._exposition = exposition
        self._routes = routes
        self._web = web
        self._lock = threading.Lock()
        self._verified: OrderedDict[bytes, None] = OrderedDict()  # digests of Authorization headers that passed

    def forget_credentials(self) -> None:
        """The users may have changed: credentials go to the unverified lane until they pass again."""
        with self._lock:
            self._verified.clear()

    def lane(self, request: Request) -> str:
        if self._web().requires_auth:
            digest = hashlib.sha256(request.headers.get("authorization", "").encode()).digest()
            with self._lock:
                if digest not in self._verified:
                    return "unverified"
        return "metrics" if request.path == "/metrics" else "routes"

    def handle(self, request: Request, client: str) -> Response:
        header = request.headers.get("authorization")
        if not self._web().authorized(header):
            return _UNAUTHORIZED
        if header is not None:
            with self._lock:
                self._verified[hashlib.sha256(header.encode()).digest()] = None
                if len(self._verified) > _VERIFIED_LANE_SIZE:
                    self._verified.popitem(last=False)
        path = request.path
        if path == "/metrics":
            compressed = accepts_gzip(request.headers.get("accept-encoding", ""))
            body, content_type = self._exposition.body(request.headers.get("accept", ""), compressed)
            return Response(200, body, content_type, (("Content-Encoding", "gzip"),) if compressed else ())
        route = self._routes.get(path)
        if isinstance(route, Page):
            return route.answer(request)
        if route is not None:
            code, payload = route()
            return Response(code, (json.dumps(payload, indent=2) + "\n").encode(), "application/json")
        if path == "/":
            return Response(200, _LANDING, "text/html; charset=utf-8")
        if path.startswith(runbooks.PREFIX):
            return runbooks.answer(path)
        return _NOT_FOUND


class Endpoint:
    """A running HTTP endpoint in a background thread."""

    def __init__(self, listen: str, registry: CollectorRegistry, routes: Mapping[str, Route],
                 web: WebConfig, limits: Limits | None = None) -> None:
        host, port = parse_listen_address(listen)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, port))
            listener.listen(LISTEN_BACKLOG)
        except OSError as exc:
            listener.close()
            reason = "address already in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
            raise StartupError(f"listen {listen}: {reason}") from None
        self.listen = listen
        self.port = listener.getsockname()[1]
        self._web = web
        limits = limits or Limits()
        self.stats = HttpStats(limits)
        exposition = registry.exposition if isinstance(registry, RenderedRegistry) else Exposition(registry)
        self._routes = _Routes(exposition, routes, lambda: self._web)
        self._server = Server(listener, self._routes, lambda: self._web.ssl_context, limits, self.stats)

    @property
    def scheme(self) -> str:
        """http or https."""
        return "https" if self._web.ssl_context is not None else "http"

    def set_web_config(self, web: WebConfig) -> None:
        """Use new TLS settings for connections from now on, and new auth settings for requests from now on."""
        self._web = web
        self._routes.forget_credentials()

    def samples(self) -> list[Sample]:
        """The endpoint's own metrics: connections closed by reason, requests by status, connections by state."""
        return self.stats.samples()

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.close()
