"""One request to a metadata server: a deadline on the whole exchange, a bound on the answer, abortable.

The standard library's http.client, as the notifiers use (no requests on the daemon's path).  A watch that
hangs for a minute must end at once on shutdown or reload: ``Link.abort()`` shuts down the socket of the
request in flight from another thread.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from tpuwatch.cloud.events import MAX_ANSWER

CONNECT_TIMEOUT_S = 5.0  # a metadata server is on the link: one that does not accept in 5 s is unreachable


class Failed(Exception):
    """No usable HTTP answer: ``result`` is ``timeout``, ``unreachable`` or ``too_large``; the message says why."""

    def __init__(self, result: str, why: str) -> None:
        super().__init__(why)
        self.result = result


@dataclass(frozen=True)
class Answer:
    """An HTTP answer: status, headers (lowercase names), body."""

    status: int
    headers: dict[str, str]
    body: bytes


class Link:
    """Requests to one base URL (``http://host[:port]/prefix``) from any thread, all abortable from another."""

    def __init__(self, base: str) -> None:
        parts = urlsplit(base if "://" in base else f"http://{base}")
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"not an http:// address: {base[:80]!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.base = f"http://{parts.netloc}{self.prefix}"
        self._lock = threading.Lock()
        self._conns: set[http.client.HTTPConnection] = set()
        self._aborted = False

    def request(self, method: str, path: str, headers: dict[str, str], timeout: float,
                limit: int = MAX_ANSWER) -> Answer:
        """One exchange, done within ``timeout`` seconds; Failed if it is not."""
        deadline = time.monotonic() + timeout
        conn = http.client.HTTPConnection(self.host, self.port, timeout=min(timeout, CONNECT_TIMEOUT_S))
        with self._lock:
            if self._aborted:
                raise Failed("unreachable", "stopped")
            self._conns.add(conn)
        try:
            conn.connect()
            with self._lock:
                if self._aborted:  # stopped while connecting: abort() saw no socket to shut down
                    raise Failed("unreachable", "stopped")
            self._left(conn, deadline)
            conn.request(method, self.prefix + path, headers=headers)
            self._left(conn, deadline)
            response = conn.getresponse()
            chunks, size = [], 0
            while True:
                self._left(conn, deadline)
                chunk = response.read1(min(16384, limit + 1 - size)) if size <= limit else b""
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > limit:
                    raise Failed("too_large", f"answer over {limit} bytes")
            return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, b"".join(chunks))
        except (TimeoutError, socket.timeout):
            raise Failed("timeout", f"no answer within {timeout:g}s") from None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise Failed("unreachable", f"{type(exc).__name__}: {str(exc)[:120]}") from None
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    @staticmethod
    def _left(conn: http.client.HTTPConnection, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        if conn.sock is not None:
            conn.sock.settimeout(left)

    def abort(self) -> None:
        """End the requests in flight (they fail at once) and refuse new ones."""
        with self._lock:
            self._aborted = True
            conns = list(self._conns)
        for conn in conns:
            try:
                if conn.sock is not None:
                    conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
