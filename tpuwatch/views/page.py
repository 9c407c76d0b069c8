"""Serving the status page and its JSON: built at most once per sampling cycle, sent with strict headers.

On the first request after a sampling cycle ends, the document is built (in a thread of its own) and the page,
``/api/status`` and ``/api/series`` made from it, plain and gzip, then the document is dropped: what is kept
until the next cycle is those bodies, so that the cost is bounded by the sampling rate whatever the
number of viewers, and the memory by the bodies' size.  If building fails, the last good bodies are served and
the failure logged once per cycle.
"""

from __future__ import annotations

import gzip
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any

from tpuwatch.httpd.protocol import Request, Response, accepts_gzip
from tpuwatch.views.document import api_series, api_status, build_status
from tpuwatch.views.readers import StatusReaders
from tpuwatch.views.render import render_page
from tpuwatch.web import Page

log = logging.getLogger(__name__)

# The page loads its script and style sheet from the daemon and fetches itself again; nothing else is allowed.
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                           "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = (("Content-Security-Policy", CONTENT_SECURITY_POLICY), ("X-Content-Type-Options", "nosniff"),
           ("Referrer-Policy", "no-referrer"), ("Cache-Control", "no-store"))
GZIP_LEVEL = 1  # a page refreshed every cycle: level 1 costs a seventh of level 6's CPU for a fifth more bytes
_JSON = "application/json"
_STATIC = {"/status.js": ("status.js", "text/javascript; charset=utf-8"),
           "/status.css": ("status.css", "text/css; charset=utf-8")}


def _dumps(payload: Any) -> str:
    return json.dumps(payload, separators=(",", ":"), allow_nan=False)


def status_body(doc: dict[str, Any]) -> bytes:
    """``/api/status``: compact JSON."""
    return (_dumps(api_status(doc)) + "\n").encode()


def series_body(doc: dict[str, Any]) -> bytes:
    """``/api/series``: compact JSON, encoded a chip at a time (the encoder holds a fragment per number it
    writes until it joins them: whole, the points of every chip would be held at once)."""
    series = api_series(doc)
    chips = ",".join(_dumps(chip) for chip in series.pop("chips"))
    return (_dumps(series)[:-1] + f',"chips":[{chips}]}}\n').encode()


_BODIES: dict[str, tuple[Callable[[dict[str, Any]], bytes], str]] = {
    "/": (lambda doc: render_page(doc).encode(), "text/html; charset=utf-8"),
    "/api/status": (status_body, _JSON),
    "/api/series": (series_body, _JSON),
}


class _Rendition:
    """One cycle's bodies, each route's made at once from the document (which is then dropped) and kept gzip
    compressed only: browsers take them so, and the rare client that does not gets them decompressed."""

    def __init__(self, key: float | None, document: dict[str, Any]) -> None:
        self.key = key
        self.gzipped = {path: gzip.compress(make(document), GZIP_LEVEL) for path, (make, _) in _BODIES.items()}


class StatusPage:
    """The status page's routes over ``readers``; ``cycle`` returns when the last sampling cycle ended."""

    def __init__(self, readers: StatusReaders, cycle: Callable[[], float | None], host: str | None = None,
                 clock: Callable[[], float] = time.time, after_build: Callable[[], None] = lambda: None) -> None:
        self.readers = readers
        self._after_build = after_build  # called once a new rendition replaced the old (the daemon: a malloc trim)
        self._cycle = cycle
        self._host = host or socket.gethostname()
        self._clock = clock
        self._lock = threading.Lock()
        # Builds run in one thread of their own, so that only its allocator arena holds their high-water mark.
        self._builder = ThreadPoolExecutor(1, thread_name_prefix="status-page")
        self._rendition: _Rendition | None = None
        self._failed: float | None = None
        folder = resources.files("tpuwatch.views").joinpath("static")
        self._static = {path: folder.joinpath(name).read_bytes() for path, (name, _) in _STATIC.items()}

    def routes(self) -> dict[str, Page]:
        """``/``, ``/status.js``, ``/status.css``, ``/api/status`` and ``/api/series``."""
        return {path: Page(self._answer) for path in (*_BODIES, *_STATIC)}

    def _current(self) -> _Rendition:
        key = self._cycle()
        with self._lock:
            rendition = self._rendition
            if rendition is not None and key is not None and rendition.key == key:
                return rendition
            try:
                fresh = self._builder.submit(self._build, key).result()
            except Exception as exc:  # noqa: BLE001 - the page keeps its last good state
                if rendition is None:
                    raise
                if self._failed != key:
                    log.error("building the status page failed, serving the previous one: %s: %s",
                              type(exc).__name__, exc)
                    self._failed = key
                return rendition
            self._rendition = fresh
            del rendition  # the old rendition's last reference: freed before after_build
            self._after_build()
            return fresh

    def _build(self, key: float | None) -> _Rendition:
        return _Rendition(key, build_status(self.readers, self._clock(), self._host))

    def _answer(self, request: Request) -> Response:
        path = request.path
        if path in _STATIC:
            return Response(200, self._static[path], _STATIC[path][1], HEADERS)
        body = self._current().gzipped[path]
        if accepts_gzip(request.headers.get("accept-encoding", "")):
            return Response(200, body, _BODIES[path][1], (*HEADERS, ("Content-Encoding", "gzip")))
        return Response(200, gzip.decompress(body), _BODIES[path][1], HEADERS)
