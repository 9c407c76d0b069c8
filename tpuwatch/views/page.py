"""Serving the status page and its JSON: built at most once per sampling cycle, sent with strict headers.

The document is built on the first request after a cycle ends and kept until the next one, so that its cost is
bounded by the sampling rate whatever the number of viewers; each body (the page, ``/api/status``,
``/api/series``, plain or gzip) is made from it once, when first asked for.  If building fails, the last good
one is served and the failure logged once per cycle.
"""

from __future__ import annotations

import gzip
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from importlib import resources
from typing import Any

from tpuwatch.httpd.protocol import Request, Response, accepts_gzip
from tpuwatch.views.document import api_series, api_status, build_status
from tpuwatch.views.render import render_page
from tpuwatch.views.sources import StatusSources
from tpuwatch.web import Page

log = logging.getLogger(__name__)

# The page loads its script and style sheet from the daemon and fetches itself again; nothing else is allowed.
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                           "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = (("Content-Security-Policy", CONTENT_SECURITY_POLICY), ("X-Content-Type-Options", "nosniff"),
           ("Referrer-Policy", "no-referrer"), ("Cache-Control", "no-store"))
GZIP_LEVEL = 6
_JSON = "application/json"
_STATIC = {"/status.js": ("status.js", "text/javascript; charset=utf-8"),
           "/status.css": ("status.css", "text/css; charset=utf-8")}


def _json(payload: dict[str, Any]) -> bytes:
    return (json.dumps(payload, separators=(",", ":"), allow_nan=False) + "\n").encode()


_BODIES: dict[str, tuple[Callable[[dict[str, Any]], bytes], str]] = {
    "/": (lambda doc: render_page(doc).encode(), "text/html; charset=utf-8"),
    "/api/status": (lambda doc: _json(api_status(doc)), _JSON),
    "/api/series": (lambda doc: _json(api_series(doc)), _JSON),
}


class _Rendition:
    """One cycle's document and the bodies made from it so far."""

    def __init__(self, key: float | None, document: dict[str, Any]) -> None:
        self.key = key
        self.document = document
        self.lock = threading.Lock()
        self.bodies: dict[tuple[str, bool], bytes] = {}

    def body(self, path: str, compressed: bool) -> bytes:
        with self.lock:
            body = self.bodies.get((path, compressed))
            if body is None:
                plain = self.bodies.get((path, False))
                if plain is None:
                    plain = self.bodies[(path, False)] = _BODIES[path][0](self.document)
                body = self.bodies[(path, True)] = gzip.compress(plain, GZIP_LEVEL) if compressed else plain
            return body


class StatusPage:
    """The status page's routes over ``sources``; ``cycle`` returns when the last sampling cycle ended."""

    def __init__(self, sources: StatusSources, cycle: Callable[[], float | None], host: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.sources = sources
        self._cycle = cycle
        self._host = host or socket.gethostname()
        self._clock = clock
        self._lock = threading.Lock()
        self._rendition: _Rendition | None = None
        self._failed: float | None = None
        folder = resources.files("tpuwatch.views").joinpath("static")
        self._static = {path: folder.joinpath(name).read_bytes() for path, (name, _) in _STATIC.items()}

    def routes(self) -> dict[str, Page]:
        """``/``, ``/status.js``, ``/status.css``, ``/api/status`` and ``/api/series``."""
        return {path: Page(self._answer) for path in (*_BODIES, *_STATIC)}

    def document(self) -> dict[str, Any]:
        """This cycle's status document (built now if this cycle has none yet)."""
        return self._current().document

    def _current(self) -> _Rendition:
        key = self._cycle()
        with self._lock:
            rendition = self._rendition
            if rendition is not None and key is not None and rendition.key == key:
                return rendition
            try:
                fresh = _Rendition(key, build_status(self.sources, self._clock(), self._host))
            except Exception as exc:  # noqa: BLE001 - the page keeps its last good state
                if rendition is None:
                    raise
                if self._failed != key:
                    log.error("building the status page failed, serving the previous one: %s: %s",
                              type(exc).__name__, exc)
                    self._failed = key
                return rendition
            self._rendition = fresh
            return fresh

    def _answer(self, request: Request) -> Response:
        path = request.path
        if path in _STATIC:
            return Response(200, self._static[path], _STATIC[path][1], HEADERS)
        compressed = accepts_gzip(request.headers.get("accept-encoding", ""))
        body = self._current().body(path, compressed)
        encoding = (("Content-Encoding", "gzip"),) if compressed else ()
        return Response(200, body, _BODIES[path][1], HEADERS + encoding)
