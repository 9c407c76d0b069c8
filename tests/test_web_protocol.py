"""Request heads and responses, pure: literal bytes in, a Request or a one-line 4xx/5xx out; the eviction table."""

from __future__ import annotations

import pytest

from tpuwatch.httpd.protocol import (
    HttpError,
    Response,
    accepts_gzip,
    head_length,
    parse_head,
    response_head,
    strip_leading_blank_lines,
)
from tpuwatch.httpd.table import ConnectionTable

MAX = 8192


def parse(head: bytes) -> object:
    length = head_length(head, MAX)
    assert length == len(head), (length, len(head))
    return parse_head(head, 64)


def test_a_prometheus_scrape() -> None:
    # The head Prometheus 2.x sends (prometheus/scrape/scrape.go sets Accept, Accept-Encoding, User-Agent and
    # X-Prometheus-Scrape-Timeout-Seconds); Go's client adds Host.
    request = parse(b"GET /metrics HTTP/1.1\r\nHost: tpu-host-1:9847\r\nUser-Agent: Prometheus/2.45.0\r\n"
                    b"Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n"
                    b"Accept-Encoding: gzip\r\nX-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n")
    assert request.method == "GET" and request.path == "/metrics" and request.version == (1, 1)
    assert request.headers["accept-encoding"] == "gzip" and request.keep_alive


@pytest.mark.parametrize("head,path,keep_alive", [
    (b"HEAD /healthz?verbose=1 HTTP/1.0\r\n\r\n", "/healthz", False),
    (b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", "/", True),
    (b"GET /api/alerts HTTP/1.1\r\nConnection: close\r\n\r\n", "/api/alerts", False),
    (b"GET http://127.0.0.1:9847/metrics HTTP/1.1\r\n\r\n", "/metrics", True),
    (b"GET /metrics HTTP/1.1\nHost: x\n\n", "/metrics", True),  # bare LF, RFC 9112 section 2.2
    (b"GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", "/", True),
])
def test_requests_served(head: bytes, path: str, keep_alive: bool) -> None:
    request = parse(head)
    assert request.path == path and request.keep_alive is keep_alive


def test_repeated_headers_are_joined() -> None:
    request = parse(b"GET / HTTP/1.1\r\nAccept: text/plain\r\naccept: */*\r\n\r\n")
    assert request.headers["accept"] == "text/plain, */*"


@pytest.mark.parametrize("head,code,reason", [
    (b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\n", 405, "only GET and HEAD"),
    (b"OPTIONS * HTTP/1.1\r\n\r\n", 405, "only GET and HEAD"),
    (b"GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\n", 413, "request bodies"),
    (b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 413, "request bodies"),
    (b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400, "conflicting Content-Length"),
    (b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, "malformed Content-Length"),
    (b"GET / HTTP/2.0\r\n\r\n", 505, "only HTTP/1.0 and HTTP/1.1"),
    (b"PRI * HTTP/2.0\r\n\r\n", 505, "only HTTP/1.0"),
    (b"GET /\r\n\r\n", 400, "malformed request line"),
    (b"GET  / HTTP/1.1\r\n\r\n", 400, "malformed request line"),
    (b"GET / HTTP/1.1 extra\r\n\r\n", 400, "malformed request line"),
    (b"G\xc3\x89T / HTTP/1.1\r\n\r\n", 400, "malformed request line"),
    (b"GET /caf\xc3\xa9 HTTP/1.1\r\n\r\n", 400, "malformed request target"),
    (b"GET / HTTPS/1.1\r\n\r\n", 400, "malformed HTTP version"),
    (b"GET metrics HTTP/1.1\r\n\r\n", 400, "must be a path"),
    (b"GET / HTTP/1.1\r\nHost\r\n\r\n", 400, "without a colon"),
    (b"GET / HTTP/1.1\r\nHost : x\r\n\r\n", 400, "malformed header name"),
    (b"GET / HTTP/1.1\r\nA: b\r\n  folded\r\n\r\n", 400, "without a colon"),
    (b"GET / HTTP/1.1\r\nA: b\r\n continued: x\r\n\r\n", 400, "folded header line"),
    (b"GET / HTTP/1.1\r\nA: b\x00c\r\n\r\n", 400, "control character"),
    (b"GET / HTTP/1.1\r\nA: b\rc\r\n\r\n", 400, "control character"),
    (b"GET / HTTP/1.1\r\n" + b"A: b\r\n" * 65 + b"\r\n", 431, "more than 64 header lines"),
])
def test_requests_refused(head: bytes, code: int, reason: str) -> None:
    with pytest.raises(HttpError) as caught:
        parse(head)
    assert caught.value.code == code and reason in caught.value.reason
    assert "\n" not in str(caught.value)


def test_oversized_heads() -> None:
    assert head_length(b"GET /" + b"a" * 100, MAX) is None  # not yet complete
    with pytest.raises(HttpError) as line:
        head_length(b"GET /" + b"a" * MAX, MAX)
    with pytest.raises(HttpError) as headers:
        head_length(b"GET / HTTP/1.1\r\nX: " + b"a" * MAX, MAX)
    assert (line.value.code, headers.value.code) == (414, 431)
    # The blank line must fall within the limit, wherever the buffer ends.
    with pytest.raises(HttpError):
        head_length(b"GET / HTTP/1.1\r\nX: " + b"a" * MAX + b"\r\n\r\n", MAX)


def test_pipelined_requests_are_measured_one_by_one() -> None:
    buffer = bytearray(b"\r\nGET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n")
    strip_leading_blank_lines(buffer)
    first = head_length(buffer, MAX)
    assert first is not None and parse_head(bytes(buffer[:first]), 64).path == "/a"
    del buffer[:first]
    assert parse_head(bytes(buffer), 64).path == "/b"


@pytest.mark.parametrize("value,gzip", [("gzip", True), ("gzip, deflate, br", True), ("deflate", False),
                                        ("gzip;q=0", False), ("gzip; q=0.0", False), ("*", True),
                                        ("*;q=0, identity", False), ("gzip;q=0.5", True), ("", False),
                                        ("GZIP", True), ("gzip;q=bogus", False), ("x-gzip", True)])
def test_accept_encoding(value: str, gzip: bool) -> None:
    assert accepts_gzip(value) is gzip


def test_response_head() -> None:
    response = Response(200, b"hello\n", "text/plain", (("Content-Encoding", "gzip"),))
    head = response_head(response, keep_alive=True)
    lines = head.decode().removesuffix("\r\n\r\n").split("\r\n")
    assert lines[0] == "HTTP/1.1 200 OK" and head.endswith(b"\r\n\r\n")
    assert {"Content-Length: 6", "Content-Type: text/plain", "Content-Encoding: gzip"} <= set(lines)
    assert lines[1].startswith("Date: ") and lines[1].endswith(" GMT")
    assert not any(line.startswith("Connection") for line in lines)
    assert response_head(response, keep_alive=False).endswith(b"Connection: close\r\n\r\n")
    assert b"Connection: keep-alive" in response_head(response, True, (1, 0))


def test_eviction_takes_the_longest_waiting_of_that_client() -> None:
    table: ConnectionTable[str] = ConnectionTable(max_total=5, max_per_client=3)
    for name in ("a1", "a2", "a3"):
        table.add(name, "10.0.0.1")
    table.busy("a1")  # its request is being served: never evicted
    verdict = table.admit("10.0.0.1")
    assert verdict.admitted and verdict.victims == (("a2", "evicted_per_client"),)
    table.remove("a2")
    table.add("a4", "10.0.0.1")
    table.wait("a3")  # a3 answered and idle again: it waits from now, after a4
    assert table.admit("10.0.0.1").victims == (("a4", "evicted_per_client"),)
    # The total cap takes the longest-waiting overall; a lingering close goes first.
    table.add("b1", "10.0.0.2")
    table.add("b2", "10.0.0.2")
    assert table.admit("10.0.0.3").victims == (("a4", "evicted_total"),)
    table.doomed("b2")
    assert table.admit("10.0.0.3").victims == (("b2", "evicted_total"),)


def test_refused_only_when_every_connection_is_being_served() -> None:
    table: ConnectionTable[str] = ConnectionTable(max_total=2, max_per_client=1)
    table.add("a", "10.0.0.1")
    table.busy("a")
    assert table.admit("10.0.0.1").refusal == "refused_per_client"
    table.add("b", "10.0.0.2")
    table.busy("b")
    assert table.admit("10.0.0.3").refusal == "refused_total"
    table.remove("a")
    assert table.admit("10.0.0.1").admitted and len(table) == 1
