"""A slowloris flood on real sockets: idle and trickling connections, plain or TLS, kept up as the server closes them.

Used by the endpoint's tests and by benchmarks/flood.py.  One thread with a
selector holds every connection: ``idle`` ones connect (over TLS, every other
one also completes the handshake) and then send nothing; ``trickle`` ones send
a request head that never ends, one byte every ``period`` seconds.  A
connection the server closes is opened again, at most ``reopen_rate`` a
second, as a slowloris tool would.
"""

from __future__ import annotations

import resource
import selectors
import socket
import ssl
import threading
import time
from collections import deque
from dataclasses import dataclass, field

TRICKLE_HEAD = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Trickle: " + b"a" * 4000
TICK_S = 0.05


@dataclass(eq=False)
class _Flooder:
    kind: str  # "idle" or "trickle"
    tls: bool  # completes a TLS handshake once connected
    source: str
    sock: socket.socket | None = None
    connected: bool = False
    ready: bool = False
    sent: int = 0
    next_send: float = 0.0


@dataclass
class FloodCounts:
    """What the flood saw."""

    opened: int = 0
    closed_by_server: int = 0
    failed: int = 0
    bytes_sent: int = 0
    open_now: dict[str, int] = field(default_factory=lambda: {"idle": 0, "trickle": 0})


def attacker_tls() -> ssl.SSLContext:
    """A client TLS context that, like an attacker's, checks nothing about the server."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _raise_fd_limit() -> None:
    """Let this process hold the flood: the soft limit on open files up to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Flood:
    """``idle`` + ``trickle`` connections to ``port`` from ``sources`` (127.x addresses), until ``stop()``."""

    def __init__(self, port: int, idle: int, trickle: int, tls: ssl.SSLContext | None = None,
                 sources: tuple[str, ...] = ("127.0.0.1",), period: float = 1.0, reopen_rate: float = 200.0) -> None:
        self.port = port
        self.tls = tls
        self.period = period
        self.reopen_rate = reopen_rate
        self.counts = FloodCounts()
        _raise_fd_limit()
        flooders = [_Flooder("idle", tls is not None and i % 2 == 1, sources[i % len(sources)]) for i in range(idle)]
        flooders += [_Flooder("trickle", tls is not None, sources[i % len(sources)]) for i in range(trickle)]
        self._flooders = flooders
        self._to_open: deque[_Flooder] = deque(flooders)
        self._selector = selectors.DefaultSelector()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slowloris", daemon=True)

    def __enter__(self) -> Flood:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def open_connections(self) -> int:
        """Connections open now (as the flood sees them)."""
        return sum(self.counts.open_now.values())

    def stop(self) -> None:
        """Close every connection and end the thread."""
        self._stopped.set()
        self._thread.join(10)
        for flooder in self._flooders:
            if flooder.sock is not None:
                flooder.sock.close()
        self._selector.close()

    def _run(self) -> None:
        budget, last = 0.0, time.monotonic()
        first_round = len(self._to_open)
        while not self._stopped.is_set():
            now = time.monotonic()
            budget = min(budget + (now - last) * self.reopen_rate, self.reopen_rate)
            last = now
            while self._to_open and (first_round > 0 or budget >= 1):
                if first_round > 0:
                    first_round -= 1
                else:
                    budget -= 1
                self._open(self._to_open.popleft())
            for key, _ in self._selector.select(TICK_S):
                self._on_event(key.data)
            now = time.monotonic()
            for flooder in self._flooders:
                if flooder.kind == "trickle" and flooder.ready and now >= flooder.next_send:
                    self._trickle(flooder, now)

    def _open(self, flooder: _Flooder) -> None:
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        except OSError:  # out of file descriptors: try again later
            self.counts.failed += 1
            self._to_open.append(flooder)
            return
        try:
            sock.bind((flooder.source, 0))
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", self.port))
        except OSError:
            sock.close()
            self.counts.failed += 1
            self._to_open.append(flooder)
            return
        flooder.sock, flooder.connected, flooder.ready, flooder.sent = sock, False, False, 0
        self._selector.register(sock, selectors.EVENT_WRITE, flooder)
        self.counts.opened += 1
        self.counts.open_now[flooder.kind] += 1

    def _on_event(self, flooder: _Flooder) -> None:
        sock = flooder.sock
        assert sock is not None
        if not flooder.connected:
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self._lost(flooder, failed=True)
                return
            flooder.connected = True
            if flooder.tls and self.tls is not None:
                flooder.sock = self.tls.wrap_socket(sock, do_handshake_on_connect=False, server_hostname="127.0.0.1")
                self._selector.unregister(sock)
                self._selector.register(flooder.sock, selectors.EVENT_WRITE, flooder)
            else:
                self._ready(flooder)
                return
        if not flooder.ready:
            self._shake(flooder)
            return
        try:
            data = sock.recv(65536)
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except OSError:
            data = b""
        if not data:
            self._lost(flooder)

    def _shake(self, flooder: _Flooder) -> None:
        sock = flooder.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self._selector.modify(sock, selectors.EVENT_READ, flooder)
            return
        except ssl.SSLWantWriteError:
            self._selector.modify(sock, selectors.EVENT_WRITE, flooder)
            return
        except OSError:
            self._lost(flooder)
            return
        self._ready(flooder)

    def _ready(self, flooder: _Flooder) -> None:
        """Connected (and TLS done): a trickler sends its first byte at once, then one every period."""
        assert flooder.sock is not None
        flooder.ready = True
        flooder.next_send = time.monotonic()
        self._selector.modify(flooder.sock, selectors.EVENT_READ, flooder)

    def _trickle(self, flooder: _Flooder, now: float) -> None:
        assert flooder.sock is not None
        flooder.next_send = now + self.period
        try:
            flooder.sock.send(TRICKLE_HEAD[flooder.sent % len(TRICKLE_HEAD):][:1])
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except OSError:
            self._lost(flooder)
            return
        flooder.sent += 1
        self.counts.bytes_sent += 1

    def _lost(self, flooder: _Flooder, failed: bool = False) -> None:
        assert flooder.sock is not None
        self._selector.unregister(flooder.sock)
        flooder.sock.close()
        flooder.sock = None
        flooder.connected = flooder.ready = False
        self.counts.open_now[flooder.kind] -= 1
        if failed:
            self.counts.failed += 1
        else:
            self.counts.closed_by_server += 1
        self._to_open.append(flooder)
