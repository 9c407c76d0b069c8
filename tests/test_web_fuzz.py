"""Fuzzing the endpoint with generated requests against a real daemon: every answer is well formed, one line when
it is an error, no traceback is logged, and the daemon still serves a real scrape afterwards.

The seed is fixed, so CI runs the same cases each time.  A longer run::

    TPUWATCH_FUZZ_CASES=100000 TPUWATCH_FUZZ_SEED=7 python -m pytest tests/test_web_fuzz.py
"""

from __future__ import annotations

import base64
import os
import random
import re
import socket
import ssl
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from certs import TlsFiles, make_tls_files
from conftest import SIM_FAST, DaemonProcess
from test_web import PASSWORD, hashed, web_config

CASES = int(os.environ.get("TPUWATCH_FUZZ_CASES", "1000"))
SEED = int(os.environ.get("TPUWATCH_FUZZ_SEED", "1414"))
STATUS = re.compile(rb"HTTP/1\.1 (200|400|401|404|405|408|413|414|431|503|505) [A-Za-z ]+\r\n")

# (usual, odd) choices for each part of a request.
METHODS = ([b"GET", b"HEAD"], [b"POST", b"PUT", b"DELETE", b"OPTIONS", b"TRACE", b"CONNECT", b"PRI", b"get", b"G ET",
                               b"", b"GET\x00", b"\xff\xfe"])
PATHS = ([b"/metrics", b"/healthz", b"/api/alerts", b"/", b"/nowhere", b"/metrics?x=1&y=%00",
          b"/%2e%2e/%2e%2e/etc/passwd", b"http://127.0.0.1/metrics", b"//metrics"],
         [b"*", b"metrics", b"https://[::1]:1/healthz", b"/caf\xc3\xa9", b"/\x7f", b"/a b"])
VERSIONS = ([b"HTTP/1.1", b"HTTP/1.0"],
            [b"HTTP/2.0", b"HTTP/0.9", b"HTTP/1.1 ", b"http/1.1", b"HTTP/1.11", b"HTTP/x.y", b"HTTP/1", b""])
HEADER_NAMES = ([b"Host", b"Accept", b"Accept-Encoding", b"Connection", b"Authorization", b"User-Agent",
                 b"X-Prometheus-Scrape-Timeout-Seconds", b"Expect", b"Upgrade", b"Content-Length"],
                [b"Transfer-Encoding", b"Bad Name", b"", b"X\x00", b"\xc3\xa9"])
HEADER_VALUES = ([b"127.0.0.1", b"application/openmetrics-text; version=1.0.0", b"text/plain;version=0.0.4;q=0.5",
                  b"application/openmetrics-text; version=abc", b"text/plain; version=1.0.0; escaping=values",
                  b"gzip", b"gzip;q=0", b"*", b"close", b"keep-alive", b"0", b"100-continue", b"h2c", b"", b" \t ",
                  b"\xff" * 10, b"Basic " + base64.b64encode(b"prometheus:" + PASSWORD.encode()), b"Basic !!!",
                  b"Basic " + base64.b64encode(b"\xff\xfe:\x00"), b"Bearer x"],
                 [b"5", b"-1", b"18446744073709551616", b"chunked", b"a\x00b"])
ENDINGS = [b"\r\n", b"\n", b"\r", b"\r\r\n"]
LAST_REQUEST = b"\r\nGET /nowhere HTTP/1.1\r\nConnection: close\r\n\r\n"


def pick(rng: random.Random, choices: tuple[list[bytes], list[bytes]], odd: float, garbage: int = 0) -> bytes:
    """A usual choice, an odd one with probability ``odd``, or (as often) up to ``garbage`` random bytes."""
    roll = rng.random()
    if roll < odd:
        return rng.choice(choices[1])
    if garbage and roll < 2 * odd:
        return rng.randbytes(rng.randint(0, garbage))
    return rng.choice(choices[0])


def generate(rng: random.Random) -> bytes:
    """One request: mostly valid or nearly, with mutations of every part; sometimes no HTTP at all."""
    kind = rng.random()
    if kind < 0.04:
        return rng.randbytes(rng.randint(0, 300))
    if kind < 0.06:
        return rng.choice([b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
                           b"\r\n" * rng.randint(1, 5000)])
    end = rng.choice(ENDINGS) if rng.random() < 0.1 else b"\r\n"
    line = b" ".join([pick(rng, METHODS, 0.08), pick(rng, PATHS, 0.05, 20), pick(rng, VERSIONS, 0.05)])
    if rng.random() < 0.02:
        line += b"a" * rng.randint(8000, 20000)
    headers = []
    for _ in range(70 if rng.random() < 0.03 else rng.randint(0, 8)):
        separator = rng.choice([b":", b" : ", b"", b":\t"]) if rng.random() < 0.03 else b": "
        headers.append(pick(rng, HEADER_NAMES, 0.02, 10) + separator + pick(rng, HEADER_VALUES, 0.03, 40))
    if rng.random() < 0.02:
        headers.append(b"X-Big: " + b"b" * rng.randint(8000, 20000))
    if rng.random() < 0.02:
        headers.append(b" folded")
    data = end.join([line, *headers]) + end + end
    if rng.random() < 0.05:
        data += rng.randbytes(rng.randint(1, 2000))  # a body, or a pipelined tail of garbage
    if rng.random() < 0.05:
        data = data[:rng.randint(0, len(data))]  # cut short
    if rng.random() < 0.05 and data:
        flipped = bytearray(data)
        flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        data = bytes(flipped)
    if rng.random() < 0.05:
        data = data * rng.randint(2, 4)  # pipelined
    return data


def send(port: int, data: bytes, rng: random.Random, context: ssl.SSLContext | None) -> bytes:
    """Send ``data`` in random pieces, half-close, and read everything the server answers."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock = context.wrap_socket(raw, server_hostname="127.0.0.1") if context else raw
    with sock:
        try:
            at = 0
            while at < len(data):
                step = rng.randint(1, 4096)
                sock.sendall(data[at:at + step])
                at += step
            if context is None:
                sock.shutdown(socket.SHUT_WR)  # the server answers what is complete, then closes
            else:  # TLS has no half-close (OpenSSL 3 fails the connection on a bare EOF): a last request
                sock.sendall(LAST_REQUEST)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before reading it all
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except (ConnectionResetError, ssl.SSLError):
            pass
        return answer


def check(answer: bytes, data: bytes) -> None:
    """Every response in ``answer`` has a known status line; an error's body is one line."""
    for response in re.split(rb"(?=HTTP/1\.1 \d{3} )", answer):
        if not response:
            continue
        assert STATUS.match(response), (data[:300], answer[:300])
        head, _, body = response.partition(b"\r\n\r\n")
        if not response.startswith(b"HTTP/1.1 200"):
            assert body.count(b"\n") <= 1 and b"Traceback" not in body, (data[:300], body)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.mark.parametrize("mode,cases", [("plain", CASES), ("tls+auth", max(1, CASES // 4))])
def test_fuzzed_requests(start_daemon: Callable[..., DaemonProcess], tls: TlsFiles, tmp_path: Path,
                         mode: str, cases: int) -> None:
    secure = mode == "tls+auth"
    web = web_config(tmp_path / "web.yml", tls if secure else None,
                     users={"prometheus": hashed(PASSWORD)} if secure else None)
    daemon = start_daemon({**SIM_FAST, "web_config": str(web)})
    scheme = "https" if secure else "http"
    daemon.wait_ready(scheme=scheme, verify=str(tls.ca_cert))
    context = ssl.create_default_context(cafile=str(tls.ca_cert)) if secure else None
    rng = random.Random(SEED + secure)
    answered = 0
    for _ in range(cases):
        data = generate(rng)
        answer = send(daemon.port, data, rng, context)
        check(answer, data)
        answered += bool(answer)
    print(f"{mode}: {cases} cases, {answered} answered")
    assert answered > cases // 2
    assert daemon.proc.poll() is None
    log = daemon.log()
    assert "Traceback" not in log and "internal error" not in log and "route raised" not in log, log[-3000:]
    scrape = requests.get(f"{scheme}://127.0.0.1:{daemon.port}/metrics", verify=str(tls.ca_cert), timeout=10,
                          auth=("prometheus", PASSWORD) if secure else None)
    assert scrape.status_code == 200 and "tpuwatch_device_up" in scrape.text
