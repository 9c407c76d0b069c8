"""HTTP/1.x request heads and responses, pure: bytes in, a Request or an HttpError out (RFC 9112).

The endpoint serves GET and HEAD only, so a request is its head: any body is
refused.  Every error is a status code and a one-line reason for the client.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Protocol

REASONS = {
    200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
    408: "Request Timeout", 413: "Content Too Large", 414: "URI Too Long", 431: "Request Header Fields Too Large",
    500: "Internal Server Error", 503: "Service Unavailable", 505: "HTTP Version Not Supported",
}
METHODS = ("GET", "HEAD")

_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VERSION = re.compile(rb"HTTP/([0-9])\.([0-9])")
_TARGET = re.compile(rb"[\x21-\x7e]+")
_ABSOLUTE = re.compile(rb"https?://[^/?#]*", re.IGNORECASE)
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_BLANK_LINE = re.compile(rb"\r?\n\r?\n")


class HttpError(Exception):
    """A request the endpoint refuses: the status code and a one-line reason."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"{code} {REASONS[code]}: {reason}")
        self.code = code
        self.reason = reason


@dataclass(frozen=True)
class Request:
    """A parsed request head; header names are lower case, repeated ones joined with ', '."""

    method: str
    target: str
    version: tuple[int, int]
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def path(self) -> str:
        """The target without its query."""
        return self.target.split("?", 1)[0]

    @property
    def shown_path(self) -> str:
        """The path as logged and echoed in error answers: cut to 80 characters."""
        return self.path if len(self.path) <= 80 else self.path[:77] + "..."

    @property
    def keep_alive(self) -> bool:
        """Whether the client wants the connection kept open after the response."""
        tokens = {t.strip().lower() for t in self.headers.get("connection", "").split(",")}
        return "keep-alive" in tokens if self.version < (1, 1) else "close" not in tokens


def strip_leading_blank_lines(buffer: bytearray) -> None:
    """Drop the empty lines a client may send before a request line (RFC 9112 section 2.2)."""
    start = 0
    while buffer[start:start + 1] in (b"\r", b"\n"):
        start += 1
    if start:
        del buffer[:start]


def head_length(buffer: bytes | bytearray, max_bytes: int) -> int | None:
    """Length of the complete head at the start of ``buffer``, or None while it is incomplete.

    Raises 414 if no request line fits in ``max_bytes``, 431 if the head does not.
    """
    match = _BLANK_LINE.search(buffer, 0, max_bytes)
    if match is not None:
        return match.end()
    if len(buffer) < max_bytes:
        return None
    if b"\n" not in buffer[:max_bytes]:
        raise HttpError(414, f"request line longer than {max_bytes} bytes")
    raise HttpError(431, f"request head longer than {max_bytes} bytes")


def parse_head(head: bytes, max_headers: int) -> Request:
    """The request in a complete head (as measured by ``head_length``); HttpError if it is not one we serve."""
    lines = head.rstrip(b"\r\n").split(b"\n")
    request_line = lines[0].removesuffix(b"\r")
    parts = request_line.split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]):
        raise HttpError(400, "malformed request line")
    method, target, version_text = parts
    version = _VERSION.fullmatch(version_text)
    if version is None:
        raise HttpError(400, "malformed HTTP version")
    if version.group(1) != b"1":
        raise HttpError(505, "only HTTP/1.0 and HTTP/1.1 are served")
    if not _TARGET.fullmatch(target):
        raise HttpError(400, "malformed request target")
    if method.decode() not in METHODS:
        raise HttpError(405, "only GET and HEAD are served")
    headers = _parse_headers(lines[1:], max_headers)
    _refuse_body(headers)
    return Request(method.decode(), _origin_form(target), (1, int(version.group(2))), headers)


def _parse_headers(lines: list[bytes], max_headers: int) -> dict[str, str]:
    if len(lines) > max_headers:
        raise HttpError(431, f"more than {max_headers} header lines")
    headers: dict[str, str] = {}
    for line in lines:
        line = line.removesuffix(b"\r")
        name, colon, value = line.partition(b":")
        if not colon:
            raise HttpError(400, "header line without a colon")
        if not _TOKEN.fullmatch(name):
            raise HttpError(400, "malformed header name" if name[:1] not in (b" ", b"\t") else "folded header line")
        value = value.strip(b" \t")
        if _BAD_VALUE.search(value):
            raise HttpError(400, "control character in a header value")
        key, text = name.decode().lower(), value.decode("latin-1")
        if key == "content-length" and key in headers and headers[key] != text:
            raise HttpError(400, "conflicting Content-Length headers")
        headers[key] = f"{headers[key]}, {text}" if key in headers and key != "content-length" else text
    return headers


def _refuse_body(headers: dict[str, str]) -> None:
    if "transfer-encoding" in headers:
        raise HttpError(413, "request bodies are not accepted")
    length = headers.get("content-length")
    if length is not None:
        if not length.isdigit() or not length.isascii():
            raise HttpError(400, "malformed Content-Length")
        if int(length) > 0:
            raise HttpError(413, "request bodies are not accepted")


def _origin_form(target: bytes) -> str:
    """The path and query of a target; the absolute form (RFC 9112 section 3.2.2) is reduced to them."""
    if target.startswith(b"/"):
        return target.decode()
    absolute = _ABSOLUTE.match(target)
    if absolute is None:
        raise HttpError(400, "the request target must be a path")
    return target[absolute.end():].decode() or "/"


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding value allows gzip: listed (or ``*``) with a q-value above 0."""
    weights: dict[str, float] = {}
    for item in accept_encoding.split(","):
        coding, *params = (p.strip() for p in item.split(";"))
        weights[coding.lower()] = _qvalue(params)
    weight = weights.get("gzip", weights.get("x-gzip", weights.get("*", 0.0)))
    return weight > 0


def _qvalue(params: list[str]) -> float:
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            try:
                return float(value)
            except ValueError:
                return 0.0
    return 1.0


@dataclass(frozen=True)
class Response:
    """What a route answers; the server adds Date, Content-Length and Connection."""

    code: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


class App(Protocol):
    """What a server serves: the routes, run in lanes of workers."""

    lanes: tuple[str, ...]

    def lane(self, request: Request) -> str:
        """Which lane's workers run the request."""
        ...

    def handle(self, request: Request, client: str) -> Response:
        """Answer one request (in a worker thread)."""
        ...


def error_response(error: HttpError, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    """A one-line plain-text answer for a refused request."""
    return Response(error.code, f"{error}\n".encode(), headers=headers)


class _DateCache:
    """The Date header's value, formatted once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._value = ""

    def __call__(self) -> str:
        now = int(time.time())
        if now != self._second:
            self._second, self._value = now, formatdate(now, usegmt=True)
        return self._value


http_date = _DateCache()


def response_head(response: Response, keep_alive: bool, version: tuple[int, int] = (1, 1)) -> bytes:
    """The status line and headers of ``response`` on the wire; the body follows unless the request was HEAD."""
    lines = [f"HTTP/1.1 {response.code} {REASONS.get(response.code, 'Unknown')}", f"Date: {http_date()}",
             f"Content-Type: {response.content_type}", f"Content-Length: {len(response.body)}"]
    lines += [f"{name}: {value}" for name, value in response.headers]
    if not keep_alive:
        lines.append("Connection: close")
    elif version < (1, 1):
        lines.append("Connection: keep-alive")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
