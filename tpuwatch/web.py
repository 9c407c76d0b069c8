"""The HTTP endpoint: /metrics, JSON routes (/healthz, /api/alerts) and a landing page, with optional TLS
and basic auth.

Each connection is handled (and its TLS handshake done) in its own thread, with
a socket timeout and a cap on concurrent connections, so a slow client cannot
stall scraping.
"""

from __future__ import annotations

import errno
import json
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry

from tpuwatch.exporter import Exposition, RenderedRegistry
from tpuwatch.schema import parse_listen_address
from tpuwatch.webconfig import WebConfig

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 32
CONNECTION_TIMEOUT_S = 10.0

# A JSON endpoint: returns the HTTP status and the body.
JsonRoute = Callable[[], tuple[int, Any]]

_LANDING = b"""<!doctype html><html><head><title>tpuwatch</title></head><body>
<h1>tpuwatch</h1><p><a href="/metrics">/metrics</a> &middot; <a href="/healthz">/healthz</a>
&middot; <a href="/api/alerts">/api/alerts</a></p>
</body></html>
"""


class StartupError(RuntimeError):
    """The endpoint cannot start; the message is one line for the user."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], family: socket.AddressFamily, registry: CollectorRegistry,
                 routes: dict[str, JsonRoute], web: WebConfig) -> None:
        self.address_family = family
        self.exposition = registry.exposition if isinstance(registry, RenderedRegistry) else Exposition(registry)
        self.routes = routes
        self.web = web
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            request.settimeout(CONNECTION_TIMEOUT_S)
            context = self.web.ssl_context
            if context is not None:
                try:
                    request = context.wrap_socket(request, server_side=True)
                except (ssl.SSLError, OSError) as exc:
                    log.debug("TLS handshake with %s failed: %s", client_address[0], exc)
                    self.shutdown_request(request)
                    return
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s ended with an error", client_address[0], exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body leave at once: no 40 ms delayed-ACK stall

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if not self.server.web.authorized(self.headers.get("Authorization")):
            self._send(401, b"Unauthorized\n", "text/plain; charset=utf-8",
                       {"WWW-Authenticate": 'Basic realm="tpuwatch"'})
            return
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            compressed = "gzip" in self.headers.get("Accept-Encoding", "")
            body, content_type = self.server.exposition.body(self.headers.get("Accept", ""), compressed)
            self._send(200, body, content_type, {"Content-Encoding": "gzip"} if compressed else {})
        elif path in self.server.routes:
            code, payload = self.server.routes[path]()
            self._send(code, (json.dumps(payload, indent=2) + "\n").encode(), "application/json")
        elif path == "/":
            self._send(200, _LANDING, "text/html; charset=utf-8")
        else:
            self._send(404, b"Not found\n", "text/plain; charset=utf-8")

    def _send(self, code: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        log.debug("%s %s", self.address_string(), format % args)


class Endpoint:
    """A running HTTP endpoint in a background thread."""

    def __init__(self, listen: str, registry: CollectorRegistry, routes: dict[str, JsonRoute],
                 web: WebConfig) -> None:
        host, port = parse_listen_address(listen)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._server = _Server((host, port), family, registry, routes, web)
        except OSError as exc:
            reason = "address already in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
            raise StartupError(f"listen {listen}: {reason}") from None
        self.listen = listen
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)
        self._thread.start()

    @property
    def scheme(self) -> str:
        """http or https."""
        return "https" if self._server.web.ssl_context is not None else "http"

    def set_web_config(self, web: WebConfig) -> None:
        """Use new TLS and auth settings for connections from now on."""
        self._server.web = web

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
