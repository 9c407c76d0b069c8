"""The event loop: one thread owns every connection; workers only run routes.

A connection moves handshake (TLS) -> reading -> busy (a worker runs its route)
-> writing -> idle (keep-alive) -> reading ... or -> closing (drain, then
close).  Each state but busy waits on the client, under a deadline, and can be
evicted (tpuwatch.httpd.table) when a cap is reached.
"""

from __future__ import annotations

import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable

from tpuwatch.httpd import protocol, tls
from tpuwatch.httpd.connection import Connection
from tpuwatch.httpd.limits import ACCEPT_BATCH, ACCEPT_PAUSE_S, LINGER_BYTES, Limits
from tpuwatch.httpd.protocol import App, HttpError, Request, Response, error_response
from tpuwatch.httpd.stats import HttpStats
from tpuwatch.httpd.table import ConnectionTable
from tpuwatch.httpd.workers import Workers

log = logging.getLogger("tpuwatch.web")

READ_CHUNK = 65536  # when draining a lingering close; a head is read at most max_head_bytes + 1 at a time
WRITE_CHUNK = 262144
CLOSE_JOIN_S = 5.0
_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE
_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
_ALLOW = (("Allow", "GET, HEAD"),)


class Server:
    """Serves ``app`` on a bound, listening socket until ``close()``."""

    def __init__(self, listener: socket.socket, app: App, tls: Callable[[], ssl.SSLContext | None], limits: Limits,
                 stats: HttpStats) -> None:
        self.limits = limits
        self.stats = stats
        self._listener = listener
        self._app = app
        self._tls = tls
        self._table: ConnectionTable[Connection] = ConnectionTable(limits.max_connections,
                                                              limits.max_connections_per_client)
        self._conns: set[Connection] = set()
        self._workers: Workers[tuple[Connection, int, Response]] = Workers(app.lanes, limits.workers_per_lane,
                                                                      limits.queue_per_lane)
        self._selector = selectors.DefaultSelector()
        listener.setblocking(False)
        self._selector.register(listener, _READ, listener)
        self._selector.register(self._workers.wakeup, _READ, None)
        self._accept_paused_until = 0.0
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving, close every connection and the listening socket; hung routes are not waited for."""
        self._stopping = True
        self._workers.wake()
        self._thread.join(CLOSE_JOIN_S)

    # --- the loop -------------------------------------------------------------

    def _run(self) -> None:
        next_sweep = time.monotonic() + self.limits.sweep
        try:
            while not self._stopping:
                try:
                    next_sweep = self._turn(next_sweep)
                except Exception as exc:  # noqa: BLE001 - a bug must not end the endpoint
                    self.stats.count("internal_error", f"{type(exc).__name__}: {exc}")
                    log.debug("http: internal error in the loop", exc_info=True)
                    time.sleep(self.limits.sweep)
        finally:
            for conn in list(self._conns):
                self._close(conn)
            self._selector.close()
            self._listener.close()
            self._workers.close()

    def _turn(self, next_sweep: float) -> float:
        """One turn of the loop: ready sockets, finished routes, and every ``sweep`` the deadlines."""
        for key, _ in self._selector.select(max(0.0, next_sweep - time.monotonic())):
            if key.data is self._listener:
                self._guarded(None, self._accept)
            elif key.data is None:
                self._workers.woken()
            else:
                self._guarded(key.data, self._on_event, key.data)
        for conn, generation, response in self._workers.results():
            self._guarded(conn, self._finish, conn, generation, response)
        now = time.monotonic()
        if now < next_sweep:
            return next_sweep
        self._sweep(now)
        return now + self.limits.sweep

    def _guarded(self, conn: Connection | None, step: Callable[..., None], *args: object) -> None:
        """Run one step; a bug in it closes that connection, is counted and logged, and the loop goes on."""
        try:
            step(*args)
        except Exception as exc:  # noqa: BLE001 - the endpoint must outlive any one connection
            self.stats.count("internal_error", f"{type(exc).__name__}: {exc}")
            log.debug("http: internal error", exc_info=True)
            if conn is not None:
                self._close(conn)

    def _sweep(self, now: float) -> None:
        for conn in [c for c in self._conns if c.deadline <= now]:
            self._guarded(conn, self._expire, conn)
        if self._accept_paused_until and now >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            self._selector.register(self._listener, _READ, self._listener)
        self.stats.flush(now=now)

    def _expire(self, conn: Connection) -> None:
        state = conn.state
        if state == "idle":
            self._close(conn, "idle_timeout", f"from {conn.client}")
        elif state in ("handshake", "reading"):
            if state == "reading" and conn.inbuf:  # answered, then closed lingering: read before a reset
                self._send_once(conn, error_response(HttpError(408, "request head not complete in time")))
                self.stats.count("header_timeout", f"from {conn.client}")
                self._linger(conn)
                return
            self._close(conn, "header_timeout", f"from {conn.client}")
        elif state == "busy":
            path = conn.request.shown_path if conn.request else "?"
            self.stats.count("route_timeout", f"{path} for {conn.client}")
            self._respond(conn, error_response(HttpError(503, f"{path} did not answer in time")), False, False)
        elif state == "writing":
            self._close(conn, "write_timeout", f"to {conn.client}")
        else:
            self._close(conn)

    # --- connections ----------------------------------------------------------

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:  # out of file descriptors or memory: the kernel keeps the queue meanwhile
                self.stats.count("accept_failed", exc.strerror or str(exc))
                self._selector.unregister(self._listener)
                self._accept_paused_until = time.monotonic() + ACCEPT_PAUSE_S
                return
            conn = self._admit(sock, str(address[0]))
            if conn is not None:
                self._guarded(conn, self._start, conn)

    def _admit(self, sock: socket.socket, client: str) -> Connection | None:
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # reset before it was accepted
            sock.close()
            return None
        admission = self._table.admit(client)
        if not admission.admitted:
            self.stats.count(admission.refusal, f"from {client}")
            sock.close()
            return None
        for victim, reason in admission.victims:
            self._close(victim, reason, f"from {victim.client}")
        conn = Connection(sock, client, time.monotonic() + self.limits.header_timeout)
        self._conns.add(conn)
        self._table.add(conn, client)
        return conn

    def _start(self, conn: Connection) -> None:
        """Read at once what a new connection sent (usually its whole request), or start its TLS handshake."""
        context = self._tls()
        if context is None:
            self._set_state(conn, "reading")
            self._read(conn)
            return
        self._set_state(conn, "handshake")
        pending = tls.peek(conn.sock)
        if pending is None:
            self._close(conn)
            return
        try:
            conn.sock = context.wrap_socket(conn.sock, server_side=True, do_handshake_on_connect=False)
        except OSError as exc:
            self._close(conn, "tls_handshake_failed", f"{exc} from {conn.client}")
            return
        if pending:
            self._handshake(conn)
        else:
            conn.want(self._selector, _READ)

    def _on_event(self, conn: Connection) -> None:
        if conn.state == "handshake":
            self._handshake(conn)
        elif conn.state in ("reading", "idle"):
            self._read(conn)
        elif conn.state == "writing":
            self._write(conn)
        elif conn.state == "closing":
            self._drain(conn)

    def _handshake(self, conn: Connection) -> None:
        assert isinstance(conn.sock, ssl.SSLSocket)
        step, reason = tls.handshake(conn.sock)
        if step in ("read", "write"):
            conn.want(self._selector, _READ if step == "read" else _WRITE)
        elif step == "done":
            self._set_state(conn, "reading")
            self._read(conn)
        else:
            self._close(conn, "tls_handshake_failed" if step == "failed" else None, f"{reason} from {conn.client}")

    def _read(self, conn: Connection) -> None:
        while len(conn.inbuf) <= self.limits.max_head_bytes and not conn.eof:
            try:
                data = conn.sock.recv(self.limits.max_head_bytes + 1 - len(conn.inbuf))
            except ssl.SSLWantWriteError:
                conn.want(self._selector, _WRITE)
                return
            except _WOULD_BLOCK:
                break
            except OSError:  # reset, or TLS closed without close_notify
                data = b""
            if not data:
                conn.eof = True
                break
            if conn.state == "idle":
                self._set_state(conn, "reading")
                conn.deadline = time.monotonic() + self.limits.header_timeout
            conn.inbuf += data
        self._parse(conn)

    def _parse(self, conn: Connection) -> None:
        protocol.strip_leading_blank_lines(conn.inbuf)
        try:
            length = protocol.head_length(conn.inbuf, self.limits.max_head_bytes)
            if length is None:
                if conn.eof:
                    self._close(conn)
                else:
                    conn.want(self._selector, _READ)
                return
            head = bytes(conn.inbuf[:length])
            del conn.inbuf[:length]
            request = protocol.parse_head(head, self.limits.max_headers)
        except HttpError as exc:
            self.stats.count("bad_request", f"{exc} from {conn.client}")
            self._respond(conn, error_response(exc, _ALLOW if exc.code == 405 else ()), False, False)
            return
        lane = self._app.lane(request)
        if self._workers.full(lane):
            self.stats.count("overloaded", f"{request.shown_path} for {conn.client}")
            overloaded = error_response(HttpError(503, "too many requests in progress"), (("Retry-After", "1"),))
            self._respond(conn, overloaded, request.method == "HEAD", False)
            return
        conn.request = request
        self._set_state(conn, "busy")
        self._table.busy(conn)
        conn.unwant(self._selector)
        conn.deadline = time.monotonic() + self.limits.route_timeout
        generation, client = conn.generation, conn.client
        self._workers.submit(lane, lambda: (conn, generation, self._route(request, client)))

    def _route(self, request: Request, client: str) -> Response:
        """In a worker: the route's answer; 500 if it fails."""
        try:
            return self._app.handle(request, client)
        except Exception as exc:  # noqa: BLE001 - a failing route answers 500, the endpoint stays up
            path = request.shown_path
            self.stats.count("route_error", f"{path}: {type(exc).__name__}: {exc}")
            log.debug("http: route %s failed", path, exc_info=True)
            return error_response(HttpError(500, f"{path} failed"))

    def _finish(self, conn: Connection, generation: int, response: Response) -> None:
        if conn.closed or conn.generation != generation or conn.request is None:
            return  # answered 503 meanwhile, or gone
        request = conn.request
        self._respond(conn, response, request.method == "HEAD", request.keep_alive and not conn.eof)

    def _respond(self, conn: Connection, response: Response, head_only: bool, keep_alive: bool) -> None:
        conn.generation += 1
        self.stats.answer(response.code)
        version = conn.request.version if conn.request else (1, 1)
        conn.out = [memoryview(protocol.response_head(response, keep_alive, version))]
        if not head_only and response.body:
            conn.out.append(memoryview(response.body))
        conn.close_after = not keep_alive
        self._set_state(conn, "writing")
        self._table.wait(conn)
        conn.deadline = time.monotonic() + self.limits.write_timeout
        self._write(conn)

    def _write(self, conn: Connection) -> None:
        while conn.out:
            try:
                sent = conn.sock.send(conn.out[0][:WRITE_CHUNK])
            except ssl.SSLWantReadError:
                conn.want(self._selector, _READ)
                return
            except _WOULD_BLOCK:
                conn.want(self._selector, _WRITE)
                return
            except OSError:
                self._close(conn)
                return
            conn.out[0] = conn.out[0][sent:]
            if not conn.out[0]:
                conn.out.pop(0)
        if conn.close_after:
            self._linger(conn)
            return
        conn.request = None
        self._set_state(conn, "reading" if conn.inbuf else "idle")  # pipelined requests are read at once
        self._table.wait(conn)
        conn.deadline = time.monotonic() + (self.limits.header_timeout if conn.inbuf else self.limits.idle_timeout)
        self._read(conn)

    def _linger(self, conn: Connection) -> None:
        """Half-close and drain what the client still sends, so that it reads the response before a reset."""
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        self._set_state(conn, "closing")
        self._table.doomed(conn)
        conn.inbuf.clear()
        conn.deadline = time.monotonic() + self.limits.linger
        self._drain(conn)

    def _drain(self, conn: Connection) -> None:
        while conn.drained <= LINGER_BYTES:
            try:
                data = conn.sock.recv(READ_CHUNK)
            except _WOULD_BLOCK:
                conn.want(self._selector, _READ)
                return
            except OSError:
                break
            if not data:
                break
            conn.drained += len(data)
        self._close(conn)

    def _send_once(self, conn: Connection, response: Response) -> None:
        """Best effort, for a connection about to close: one non-blocking send."""
        self.stats.answer(response.code)
        try:
            conn.sock.send(protocol.response_head(response, False) + response.body)
        except OSError:
            pass

    def _close(self, conn: Connection, reason: str | None = None, detail: str = "") -> None:
        if conn.closed:
            return
        conn.closed = True
        conn.unwant(self._selector)
        self._table.remove(conn)
        self._conns.discard(conn)
        self._set_state(conn, None)
        if reason:  # before the client can see the close
            self.stats.count(reason, detail)
        try:
            conn.sock.close()
        except OSError:
            pass

    def _set_state(self, conn: Connection, state: str | None) -> None:
        self.stats.move(conn.state, state)
        conn.state = state
