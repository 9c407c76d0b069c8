"""A metadata server on 127.0.0.1 that answers as Compute Engine's and EC2's do: the drill's and the tests'.

Shaped after the documented protocols, not after tpuwatch's client:

- Compute Engine (https://cloud.google.com/compute/docs/metadata/querying-metadata): ``/computeMetadata/v1/``
  answers only requests with ``Metadata-Flavor: Google`` (403 without, as the docs say it is refused); every
  value carries an ``ETag``; ``?wait_for_change=true&last_etag=E&timeout_sec=N`` hangs until the ETag differs
  from E or N seconds passed, then answers the current value.  ``instance/upcoming-maintenance`` with nothing
  scheduled answers ``{ }`` (or, set so, a 503 with an error body, as some hosts do).
- EC2 IMDSv2 (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-instance-metadata-service.html):
  ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds`` (1-21600) gives a token; a GET without
  a valid one is answered 401; ``/latest/meta-data/events/maintenance/scheduled`` is the events' JSON list.

Faults for the tests: ``delay`` (seconds before any answer) and ``garbage`` (keys answered with bytes that are
not the documented shape).
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

GCE_PREFIX = "/computeMetadata/v1/instance/"
NOTHING_SCHEDULED = (200, b"{ }")
UNAVAILABLE = (503, b"Error: upcoming maintenance: no maintenance scheduled for this instance\n")
REQUESTS_KEPT = 1000


class MetadataStandIn:
    """Both clouds' metadata answers, changed by ``set_gce`` / ``set_ec2_events``; ``close()`` ends it."""

    def __init__(self) -> None:
        self.gce: dict[str, tuple[int, bytes]] = {"maintenance-event": (200, b"NONE"),
                                                  "upcoming-maintenance": NOTHING_SCHEDULED,
                                                  "scheduling/on-host-maintenance": (200, b"MIGRATE")}
        self.ec2_events = b"[]"
        self.delay = 0.0
        self.garbage: set[str] = set()
        self.tokens: dict[str, float] = {}  # token -> expiry (monotonic)
        # method, path with query, headers: the last REQUESTS_KEPT (the drill's stand-in runs as long as the daemon)
        self.requests: deque[tuple[str, str, dict[str, str]]] = deque(maxlen=REQUESTS_KEPT)
        self.closed = False
        self.changed = threading.Condition()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="metadata-standin", daemon=True)
        self._thread.start()

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT``, as GCE_METADATA_HOST takes it."""
        return f"127.0.0.1:{self._server.server_address[1]}"

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT/``, as AWS_EC2_METADATA_SERVICE_ENDPOINT takes it."""
        return f"http://{self.host}/"

    def set_gce(self, key: str, status: int, body: bytes) -> None:
        """Change a Compute Engine value; hanging watches of it answer."""
        with self.changed:
            self.gce[key] = (status, body)
            self.changed.notify_all()

    def set_ec2_events(self, body: bytes) -> None:
        """Change EC2's scheduled events."""
        with self.changed:
            self.ec2_events = body

    def expire_tokens(self) -> None:
        """Every EC2 token issued so far expires now."""
        with self.changed:
            self.tokens.clear()

    def close(self) -> None:
        """Stop serving; hanging watches are woken and answered."""
        with self.changed:
            self.closed = True
            self.changed.notify_all()
        self._server.shutdown()
        self._server.server_close()

    def gce_answer(self, key: str, query: dict[str, list[str]]) -> tuple[int, bytes, str]:
        """The value of ``key``: (status, body, ETag), after waiting for a change if the query asks to."""
        deadline = time.monotonic() + float((query.get("timeout_sec") or ["300"])[0])
        last = (query.get("last_etag") or [""])[0]
        with self.changed:
            while True:
                status, body = self.gce.get(key, (404, b"not found"))
                etag = hashlib.sha256(b"%d:" % status + body).hexdigest()[:16]
                left = deadline - time.monotonic()
                if (query.get("wait_for_change") or [""])[0] != "true" or etag != last or left <= 0 \
                        or self.closed:
                    return status, body, etag
                self.changed.wait(min(left, 1.0))


def _handler(standin: MetadataStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass

        def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for name, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
                self.send_header(name, value)
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (its deadline, or stop())
                self.close_connection = True

        def _begin(self) -> tuple[str, dict[str, list[str]]]:
            parts = urlsplit(self.path)
            standin.requests.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
            if standin.delay:
                time.sleep(standin.delay)
            return parts.path, parse_qs(parts.query)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path, query = self._begin()
            if path.startswith(GCE_PREFIX):
                if self.headers.get("Metadata-Flavor") != "Google":
                    self._send(403, b"Missing required header: Metadata-Flavor\n")
                    return
                key = path.removeprefix(GCE_PREFIX)
                status, body, etag = standin.gce_answer(key, query)
                if key in standin.garbage:
                    body = b"\x00\xff{not json" * 3
                self._send(status, body, {"ETag": etag, "Metadata-Flavor": "Google"} if status == 200 else None)
            elif path.startswith("/latest/meta-data/"):
                token = self.headers.get("X-aws-ec2-metadata-token", "")
                if standin.tokens.get(token, 0.0) <= time.monotonic():
                    self._send(401, b"")
                elif path == "/latest/meta-data/events/maintenance/scheduled":
                    garbage = "scheduled-events" in standin.garbage
                    self._send(200, b"[{\"Code\": 42" if garbage else standin.ec2_events)
                else:
                    self._send(404, b"Not Found")
            else:
                self._send(404, b"Not Found")

        def do_PUT(self) -> None:  # noqa: N802 - http.server's name
            path, _ = self._begin()
            ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
            if path != "/latest/api/token":
                self._send(404, b"Not Found")
            elif not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                self._send(400, b"")
            else:
                token = secrets.token_urlsafe(24)
                with standin.changed:
                    standin.tokens[token] = time.monotonic() + int(ttl)
                self._send(200, token.encode())

    return Handler
