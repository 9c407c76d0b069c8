"""The probe's side of the daemon's socket: reports queued by the job, sent by one background thread.

A step only puts a report in a small queue (never blocking: when the queue is
full the oldest report is dropped and counted), so a slow, absent or hostile
daemon never stalls the job.  The thread connects, sends one line, reads the
one-line answer, each within ``TIMEOUT_S``.  A daemon that cannot be reached is
said once at WARNING (and once more when it is reached again); a refusal is
said once per reason.  Standard library only.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import socket
import threading
from typing import Any

from tpuwatch import probewire as protocol

log = logging.getLogger("tpuwatch.probe")

QUEUED = 4
TIMEOUT_S = 2.0


def socket_path(path: str | None, environ: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """The socket to report to: ``path``, else $TPUWATCH_PROBE_SOCKET, else the daemon's default."""
    return path or environ.get(protocol.SOCKET_ENV) or protocol.DEFAULT_SOCKET


def exchange(path: str, report: dict[str, Any], timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """Send ``report`` to the daemon at ``path`` and return its answer; OSError or ValueError when there is none."""
    data = json.dumps(report, separators=(",", ":")).encode() + b"\n"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(path)
        try:
            conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)
        except OSError as exc:  # refused before it read (busy, rate_limited): its answer may be waiting
            sent: OSError | None = exc
        else:
            sent = None
        answer = b""
        try:
            while len(answer) <= protocol.MAX_ANSWER_BYTES:
                chunk = conn.recv(protocol.MAX_ANSWER_BYTES)
                if not chunk:
                    break
                answer += chunk
        except OSError:
            if not answer:
                raise sent or OSError("no answer") from None
    if not answer and sent is not None:
        raise sent
    parsed = json.loads(answer.split(b"\n", 1)[0] or b"null")
    if not isinstance(parsed, dict):
        raise ValueError("the daemon's answer is not a JSON object")
    return parsed


class Channel:
    """Reports on their way to the daemon; ``last_answer`` is the daemon's latest answer (None before one)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sent = 0
        self.failed = 0
        self.dropped = 0
        self.last_answer: dict[str, Any] | None = None
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(QUEUED)
        self._reachable: bool | None = None
        self._refusals: set[str] = set()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._flushed = threading.Event()

    def send(self, report: dict[str, Any]) -> None:
        """Queue ``report``; returns at once."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tpuwatch-probe-channel", daemon=True)
                self._thread.start()
            while True:
                try:
                    self._queue.put_nowait(report)
                    return
                except queue.Full:
                    try:
                        self._queue.get_nowait()
                        self.dropped += 1
                    except queue.Empty:
                        pass

    def flush(self, timeout: float = 2 * TIMEOUT_S + 1) -> None:
        """Wait (at most ``timeout``) until every queued report has been sent or given up on."""
        with self._lock:
            if self._thread is None:
                return
            done = self._flushed = threading.Event()
        try:
            self._queue.put(None, timeout=timeout)  # a marker: the thread sets ``done`` when it reaches it
        except queue.Full:
            return
        done.wait(timeout)

    def _run(self) -> None:
        while True:
            report = self._queue.get()
            if report is None:
                self._flushed.set()
                continue
            try:
                answer = exchange(self.path, report)
            except (OSError, ValueError) as exc:
                self.failed += 1
                if self._reachable is not False:
                    log.warning("tpuwatch probe: the daemon is not reachable at %s (%s); the job goes on and "
                                "results stay in this process", self.path, getattr(exc, "strerror", None) or exc)
                self._reachable = False
                continue
            self.sent += 1
            self.last_answer = answer
            if self._reachable is False:
                log.warning("tpuwatch probe: reached the daemon at %s again", self.path)
            self._reachable = True
            reason = answer.get("reason")
            if answer.get("accepted") is False and reason not in self._refusals:
                self._refusals.add(str(reason))
                log.warning("tpuwatch probe: the daemon refused a report: %s: %s", reason, answer.get("detail"))
