"""The daemon's Unix socket for probe reports: one thread, every connection bounded in count, size, time and rate.

Each connection carries one report and gets one answer.  The peer's pid and
uid come from the kernel (``SO_PEERCRED``, as of ``connect()``), never from
the report.  Before a byte is read, a connection is answered ``busy`` when
``max_connections`` are open, or a quarter of them for its user, and
``rate_limited`` when its process is over its share (a token bucket per pid:
``reports_per_minute``, as many at once) or its user over UID_SHARE times
that (a user cannot escape the limit by forking).  A report not whole within
``read_timeout`` is ``timeout``, one over ``max_report_bytes`` ``oversized``;
a connection closed before it sent anything is neither answered nor counted
(a liveness check).  What is read whole goes to ``handle(peer, data)``, which
answers (a report it fails on is closed unanswered, and the failure logged).
Out of descriptors, the listener is set aside a tick at a time.  All of it runs
in this one thread: sampling and alerting never wait on it, and a hostile user
costs at most its share of reads and parses.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import selectors
import socket
import stat
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

MAX_TRACKED_PIDS = 4096
TICK_S = 0.2
UID_SHARE = 8  # a user's reports a minute: this many processes' worth
UID_CONNECTIONS = 4  # a user may hold at most 1/UID_CONNECTIONS of the connections
_CRED = struct.Struct("3i")


@dataclass(frozen=True)
class Peer:
    """Who is on the other end, from the kernel: its pid (0 when not visible in our PID namespace) and uid."""

    pid: int
    uid: int


@dataclass(frozen=True)
class Limits:
    """The server's bounds (ProbeConfig's)."""

    max_connections: int
    max_report_bytes: int
    read_timeout: float
    reports_per_minute: int


@dataclass
class _Conn:
    sock: socket.socket
    peer: Peer
    deadline: float
    data: bytearray = field(default_factory=bytearray)


Handler = Callable[[Peer, bytes], dict[str, Any]]
Refuse = Callable[[str], None]


class _Buckets:
    """A token bucket per pid, at most MAX_TRACKED_PIDS of them (the least recently seen forgotten)."""

    def __init__(self, per_minute: int, clock: Callable[[], float]) -> None:
        self.rate = per_minute / 60.0
        self.burst = float(per_minute)
        self.clock = clock
        self._buckets: OrderedDict[int, tuple[float, float]] = OrderedDict()

    def take(self, pid: int) -> bool:
        now = self.clock()
        tokens, since = self._buckets.pop(pid, (self.burst, now))
        tokens = min(self.burst, tokens + (now - since) * self.rate)
        allowed = tokens >= 1.0
        self._buckets[pid] = (tokens - 1.0 if allowed else tokens, now)
        while len(self._buckets) > MAX_TRACKED_PIDS:
            self._buckets.popitem(last=False)
        return allowed


def _answer(sock: socket.socket, answer: dict[str, Any]) -> None:
    try:
        sock.send(json.dumps(answer).encode() + b"\n", socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
    except OSError:
        pass  # the peer left or does not read: nothing owed to it


def _refusal(reason: str, detail: str) -> dict[str, Any]:
    return {"accepted": False, "reason": reason, "detail": detail}


def bind(path: str) -> socket.socket:
    """A listening socket at ``path`` (mode 0666: the daemon checks every peer itself); a stale socket file
    left by a killed daemon is replaced, a live one is not (OSError EADDRINUSE)."""
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                try:
                    probe.connect(path)
                except OSError:
                    os.unlink(path)  # nobody listens: left by a daemon that died
                else:
                    raise OSError(errno.EADDRINUSE, "another process listens there")
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(path, 0o666)
        sock.listen(64)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class ReportServer:
    """Serves ``listener`` in its own thread until ``stop()``; refusals go to ``refuse(reason)``."""

    def __init__(self, listener: socket.socket, limits: Limits, handle: Handler, refuse: Refuse,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.listener = listener
        self.limits = limits
        self.handle = handle
        self.refuse = refuse
        self.clock = clock
        self._buckets = _Buckets(limits.reports_per_minute, clock)
        self._user_buckets = _Buckets(limits.reports_per_minute * UID_SHARE, clock)
        self._conns: dict[int, _Conn] = {}
        self._failing = False  # accept() failed (and said so) since it last worked
        self._paused: float | None = None  # when the listener was set aside after accept() failed
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tpuwatch-probe-socket", daemon=True)

    def start(self) -> None:
        """Start serving."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close every connection and the listener (within about TICK_S; a thread stuck in
        ``handle`` is waited for 5 s at most, then left to end on its own)."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(5.0)
        for conn in list(self._conns.values()):
            conn.sock.close()
        self._conns.clear()
        self.listener.close()

    def _run(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self.listener, selectors.EVENT_READ)
            while not self._stopping.is_set():
                try:
                    ready = selector.select(TICK_S)
                    for key, _ in ready:
                        if key.fileobj is self.listener:
                            self._accept(selector)
                        else:
                            self._read(selector, self._conns[key.fd])
                    self._expire(selector)
                    if self._paused is not None and time.monotonic() - self._paused >= TICK_S:
                        selector.register(self.listener, selectors.EVENT_READ)  # polls it afresh: the backlog
                        self._paused = None
                except Exception:  # noqa: BLE001 - the socket thread must outlive any one connection
                    log.exception("probe socket: unexpected error, serving on")

    def _accept(self, selector: selectors.BaseSelector) -> None:
        for _ in range(64):  # a batch per wake-up; the rest wait in the backlog
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: leave them in the backlog and look again in a tick
                # (the listener stays readable: watched meanwhile, it would wake this thread at once, again and again)
                if not self._failing:
                    log.warning("probe socket: cannot accept: %s (trying again every %gs)", exc.strerror or exc,
                                TICK_S)
                self._failing = True
                selector.unregister(self.listener)
                self._paused = time.monotonic()
                return
            if self._failing:
                log.info("probe socket: accepting again")
                self._failing = False
            pid, uid, _ = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
            peer = Peer(pid, uid)
            mine = sum(conn.peer.uid == uid for conn in self._conns.values())
            if len(self._conns) >= self.limits.max_connections:
                self._close(sock, "busy", f"{len(self._conns)} connections open, the limit")
            elif mine >= max(1, self.limits.max_connections // UID_CONNECTIONS):
                self._close(sock, "busy", f"uid {uid} holds {mine} connections, its share")
            elif not self._buckets.take(pid):
                self._close(sock, "rate_limited", f"pid {pid} sent over {self.limits.reports_per_minute} "
                                                  "reports a minute")
            elif not self._user_buckets.take(uid):
                self._close(sock, "rate_limited", f"uid {uid} sent over "
                                                  f"{self.limits.reports_per_minute * UID_SHARE} reports a minute")
            else:
                sock.setblocking(False)
                self._conns[sock.fileno()] = _Conn(sock, peer, self.clock() + self.limits.read_timeout)
                selector.register(sock, selectors.EVENT_READ)

    def _close(self, sock: socket.socket, reason: str, detail: str) -> None:
        self.refuse(reason)
        _answer(sock, _refusal(reason, detail))
        sock.close()

    def _read(self, selector: selectors.BaseSelector, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(self.limits.max_report_bytes + 1 - len(conn.data))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        conn.data += chunk
        if len(conn.data) > self.limits.max_report_bytes:
            self._drop(selector, conn, ("oversized", f"over {self.limits.max_report_bytes} bytes"))
            return
        line, newline, _ = conn.data.partition(b"\n")
        if not newline and not chunk and not conn.data:
            self._drop(selector, conn, None, None)  # closed before a byte: a liveness check, not a report
        elif newline or not chunk:
            try:
                answer = self.handle(conn.peer, bytes(line))
            except Exception:  # noqa: BLE001 - left open, the connection would fail again at every wake-up
                log.exception("probe socket: cannot handle the report of pid %d (closed without an answer)",
                              conn.peer.pid)
                answer = None
            self._drop(selector, conn, None, answer)

    def _expire(self, selector: selectors.BaseSelector) -> None:
        now = self.clock()
        for conn in [c for c in self._conns.values() if c.deadline <= now]:
            self._drop(selector, conn, ("timeout", f"no whole report within {self.limits.read_timeout:g}s"))

    def _drop(self, selector: selectors.BaseSelector, conn: _Conn, refused: tuple[str, str] | None,
              answer: dict[str, Any] | None = None) -> None:
        selector.unregister(conn.sock)
        del self._conns[conn.sock.fileno()]
        if refused is not None:
            self._close(conn.sock, *refused)
        else:
            if answer is not None:
                _answer(conn.sock, answer)
            conn.sock.close()
