"""The endpoint's limits on real sockets: deadlines, keep-alive, eviction order, bad requests, slow routes and readers.

Each test runs an Endpoint in this process with limits shortened to a second
or so, and talks to it over 127.0.0.1 with raw sockets.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tpuwatch.exporter import build_registry
from tpuwatch.httpd.limits import Limits
from tpuwatch.samples import sample
from tpuwatch.web import Endpoint, JsonRoute
from tpuwatch.webconfig import NO_WEB_CONFIG, WebConfig, load_web_config

from conftest import free_port, wait_until
from test_web import PASSWORD, hashed, web_config

SCRAPE = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"

MakeEndpoint = Callable[..., Endpoint]


@pytest.fixture
def endpoint() -> Iterator[MakeEndpoint]:
    started: list[Endpoint] = []

    def start(routes: dict[str, JsonRoute] | None = None, web: WebConfig = NO_WEB_CONFIG, **limits: float) -> Endpoint:
        registry = build_registry(lambda: [sample("tpuwatch_store_series", 3)])
        registry.render()
        started.append(Endpoint(f"127.0.0.1:{free_port()}", registry, routes or {}, web,
                                Limits(**limits)))  # type: ignore[arg-type]
        return started[-1]

    yield start
    for ep in started:
        ep.close()


def connect(ep: Endpoint, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", ep.port))
    sock.settimeout(10)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def read_response(sock: socket.socket) -> bytes:
    """One response with a Content-Length body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.startswith(b"Content-Length"))
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def is_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.settimeout(10)


def scrape_ok(ep: Endpoint) -> bool:
    return requests.get(f"http://127.0.0.1:{ep.port}/metrics", timeout=10).status_code == 200


def open_connections(ep: Endpoint) -> int:
    return sum(ep.stats.states.values())


def test_a_trickler_is_closed_at_the_header_deadline(endpoint: MakeEndpoint) -> None:
    ep = endpoint(header_timeout=1.0)
    sock = connect(ep)
    started = time.monotonic()
    sock.sendall(b"GET /metrics HTTP/1.1\r\n")
    closed = threading.Event()

    def trickle() -> None:  # a byte every 0.1 s: a per-read timeout would never fire
        while not closed.is_set():
            try:
                sock.send(b"X")
            except OSError:
                return
            closed.wait(0.1)

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        answer = read_until_closed(sock)
    finally:
        closed.set()
        thread.join()
    assert time.monotonic() - started >= 1.0
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n") and answer.endswith(b"not complete in time\n")
    assert ep.stats.closed["header_timeout"] == 1
    assert scrape_ok(ep)


def test_a_silent_connection_is_closed_at_the_header_deadline(endpoint: MakeEndpoint) -> None:
    ep = endpoint(header_timeout=1.0)
    sock = connect(ep)
    assert read_until_closed(sock) == b""
    assert ep.stats.closed["header_timeout"] == 1


def test_keep_alive_then_idle_timeout(endpoint: MakeEndpoint) -> None:
    ep = endpoint(idle_timeout=1.0, header_timeout=30.0)
    sock = connect(ep)
    for _ in range(3):  # the connection serves request after request
        sock.sendall(SCRAPE)
        assert read_response(sock).startswith(b"HTTP/1.1 200 OK\r\n")
    idle_since = time.monotonic()
    assert read_until_closed(sock) == b""
    assert time.monotonic() - idle_since >= 1.0
    assert ep.stats.closed["idle_timeout"] == 1 and ep.stats.answered[200] == 3


def test_pipelined_requests_and_head(endpoint: MakeEndpoint) -> None:
    ep = endpoint()
    sock = connect(ep)
    sock.sendall(SCRAPE + b"HEAD /metrics HTTP/1.1\r\n\r\nGET /nowhere HTTP/1.1\r\nConnection: close\r\n\r\n")
    answers = read_until_closed(sock)
    assert answers.count(b"HTTP/1.1 ") == 3
    first, second, third = (b"HTTP/1.1 " + a for a in answers.split(b"HTTP/1.1 ")[1:])
    assert first.startswith(b"HTTP/1.1 200") and b"tpuwatch_store_series 3.0" in first
    assert second.startswith(b"HTTP/1.1 200") and second.endswith(b"\r\n\r\n")  # HEAD: no body
    assert b"Content-Length: 0" not in second
    assert third.startswith(b"HTTP/1.1 404") and b"Connection: close" in third


def test_a_client_at_its_cap_loses_its_longest_waiting_connection(endpoint: MakeEndpoint) -> None:
    ep = endpoint(max_connections_per_client=4, header_timeout=30.0, idle_timeout=30.0)
    first, second, third, fourth = (connect(ep) for _ in range(4))
    wait_until(lambda: open_connections(ep) == 4, what="4 connections accepted")
    fifth = connect(ep)
    assert read_until_closed(first) == b""  # the oldest, not the new one
    assert all(is_open(s) for s in (second, third, fourth, fifth))
    second.sendall(SCRAPE)  # answered: it now waits from the end of its response, the newest
    assert read_response(second).startswith(b"HTTP/1.1 200")
    scraper = connect(ep)
    scraper.sendall(SCRAPE)
    assert read_response(scraper).startswith(b"HTTP/1.1 200")
    assert read_until_closed(third) == b""
    assert all(is_open(s) for s in (second, fourth, fifth))
    assert ep.stats.closed["evicted_per_client"] == 2


def test_the_total_cap_evicts_the_longest_waiting_of_any_client(endpoint: MakeEndpoint) -> None:
    ep = endpoint(max_connections=3, header_timeout=30.0)
    old = connect(ep, "127.0.0.2")
    others = [connect(ep, "127.0.0.3"), connect(ep, "127.0.0.4")]
    wait_until(lambda: open_connections(ep) == 3, what="3 connections accepted")
    assert scrape_ok(ep)
    assert read_until_closed(old) == b""
    assert all(is_open(s) for s in others)
    assert ep.stats.closed["evicted_total"] >= 1


@pytest.mark.parametrize("data,status", [
    (b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n", b"431"),
    (b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n", b"414"),
    (b"POST /metrics HTTP/1.1\r\nContent-Length: 100000\r\n\r\n" + b"x" * 100000, b"405"),
    (b"GET /metrics HTTP/1.1\r\nContent-Length: 100000\r\n\r\n" + b"x" * 100000, b"413"),
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"505"),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)) + b"\r\n\r\n", b"400"),
    (b"GET / HTTP/1.1\r\nbroken header\r\n\r\n", b"400"),
])
def test_bad_requests_get_one_line_answers(endpoint: MakeEndpoint, data: bytes, status: bytes) -> None:
    ep = endpoint()
    sock = connect(ep)
    sock.sendall(data)  # the server answers before reading it all, then drains the rest before closing
    answer = read_until_closed(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 " + status) and b"Connection: close" in head
    assert body.startswith(status) and body.count(b"\n") == 1, body
    assert scrape_ok(ep)


def test_a_hung_route_cannot_delay_metrics(endpoint: MakeEndpoint) -> None:
    release = threading.Event()

    def hung() -> tuple[int, object]:
        release.wait(30)
        return 200, {}

    ep = endpoint({"/hung": hung}, route_timeout=1.0, workers_per_lane=1, queue_per_lane=1)
    try:
        waiting = [connect(ep) for _ in range(2)]
        for sock in waiting:  # one runs, one waits for the worker
            sock.sendall(b"GET /hung HTTP/1.1\r\n\r\n")
        wait_until(lambda: ep.stats.states["busy"] == 2, what="two requests in the lane")
        overflow = connect(ep)
        overflow.sendall(b"GET /hung HTTP/1.1\r\n\r\n")
        assert read_until_closed(overflow).startswith(b"HTTP/1.1 503")
        assert scrape_ok(ep)  # /metrics has a lane of its own
        for sock in waiting:
            assert read_until_closed(sock).startswith(b"HTTP/1.1 503 Service Unavailable")
        assert ep.stats.closed["route_timeout"] == 2 and ep.stats.closed["overloaded"] == 1
    finally:
        release.set()


def test_a_failing_route_answers_500(endpoint: MakeEndpoint, caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> tuple[int, object]:
        raise KeyError("device")

    ep = endpoint({"/broken": broken})
    with caplog.at_level(logging.INFO):
        response = requests.get(f"http://127.0.0.1:{ep.port}/broken", timeout=10)
    assert response.status_code == 500 and response.text == "500 Internal Server Error: /broken failed\n"
    assert "route raised an error (answered 500) (route_error): 1 time(s); last /broken: KeyError" in caplog.text
    assert "Traceback" not in caplog.text
    assert scrape_ok(ep)


def test_a_slow_reader_cannot_hold_its_response(endpoint: MakeEndpoint) -> None:
    ep = endpoint({"/big": lambda: (200, "x" * 16_000_000)}, write_timeout=1.0)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", ep.port))
    sock.sendall(b"GET /big HTTP/1.1\r\n\r\n")  # and never read
    wait_until(lambda: ep.stats.states["writing"] == 1, what="the response to block")
    assert scrape_ok(ep)
    wait_until(lambda: ep.stats.closed["write_timeout"] == 1, what="the write deadline")
    sock.close()


def test_wrong_passwords_cannot_crowd_out_known_credentials(endpoint: MakeEndpoint, tmp_path: Path) -> None:
    web = load_web_config(str(web_config(tmp_path / "web.yml", users={"prometheus": hashed(PASSWORD)})))
    ep = endpoint(web=web, workers_per_lane=1, queue_per_lane=1)
    url = f"http://127.0.0.1:{ep.port}/metrics"
    assert requests.get(url, auth=("prometheus", PASSWORD), timeout=10).status_code == 200  # now known
    stop = threading.Event()

    def guess() -> None:  # an unknown user costs a full bcrypt check of the dummy hash
        while not stop.is_set():
            requests.get(url, auth=("nobody", "guess"), timeout=30)

    with ThreadPoolExecutor(8) as pool:
        guessers = [pool.submit(guess) for _ in range(8)]
        try:
            wait_until(lambda: ep.stats.closed["overloaded"] > 0, timeout=30, what="the guesses to fill their lane")
            for _ in range(5):
                assert requests.get(url, auth=("prometheus", PASSWORD), timeout=10).status_code == 200
            assert requests.get(url, auth=("prometheus", "wrong"), timeout=10).status_code in (401, 503)
        finally:
            stop.set()
        for guesser in guessers:
            guesser.result()
