"""What the endpoint refused, evicted and timed out: counters for /metrics, logged at most once a minute each."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

from tpuwatch.httpd.limits import Limits
from tpuwatch.samples import Sample, sample

log = logging.getLogger("tpuwatch.web")

LOG_EVERY_S = 60.0
STATES = ("handshake", "reading", "idle", "busy", "writing", "closing")


def _reasons(limits: Limits) -> dict[str, tuple[int, str]]:
    """Reason label -> (log level, what happened)."""
    return {
        "header_timeout": (logging.WARNING, f"request head (and TLS handshake) not complete within "
                                            f"{limits.header_timeout:g} s"),
        "idle_timeout": (logging.DEBUG, f"keep-alive connection idle for {limits.idle_timeout:g} s"),
        "write_timeout": (logging.WARNING, f"response not taken by the client within {limits.write_timeout:g} s"),
        "route_timeout": (logging.WARNING, f"route did not answer within {limits.route_timeout:g} s (answered 503)"),
        "evicted_per_client": (logging.WARNING, f"a client's longest-waiting connection closed to admit its new one "
                                                f"({limits.max_connections_per_client} per client)"),
        "evicted_total": (logging.WARNING, f"the longest-waiting connection closed to admit a new one "
                                           f"({limits.max_connections} open)"),
        "refused_per_client": (logging.WARNING, f"new connection refused: the client has "
                                                f"{limits.max_connections_per_client} open, all being served"),
        "refused_total": (logging.WARNING, f"new connection refused: {limits.max_connections} open, all being served"),
        "overloaded": (logging.WARNING, "request answered 503: its workers and their queue are full"),
        "tls_handshake_failed": (logging.WARNING, "TLS handshake failed"),
        "accept_failed": (logging.ERROR, "accepting a connection failed"),
        "bad_request": (logging.INFO, "malformed or refused request answered 4xx"),
        "route_error": (logging.ERROR, "route raised an error (answered 500)"),
        "internal_error": (logging.ERROR, "internal error on a connection (closed)"),
    }


class HttpStats:
    """Counters of one endpoint; written by its loop thread, read by the exposition."""

    def __init__(self, limits: Limits) -> None:
        self._reasons = _reasons(limits)
        self._lock = threading.Lock()
        self.closed: Counter[str] = Counter({reason: 0 for reason in self._reasons})
        self.answered: Counter[int] = Counter()
        self.states: Counter[str] = Counter({state: 0 for state in STATES})
        self._pending: Counter[str] = Counter()
        self._last_detail: dict[str, str] = {}
        self._logged_at: dict[str, float] = {}

    def count(self, reason: str, detail: str = "") -> None:
        """One more connection or request ``reason``; logged now if that reason was not logged this minute."""
        with self._lock:
            self.closed[reason] += 1
            self._pending[reason] += 1
            self._last_detail[reason] = detail
        self.flush(reason)

    def answer(self, code: int) -> None:
        """One more response with status ``code``."""
        with self._lock:
            self.answered[code] += 1

    def move(self, old: str | None, new: str | None) -> None:
        """A connection changed state (None: opened or closed)."""
        with self._lock:
            if old is not None:
                self.states[old] -= 1
            if new is not None:
                self.states[new] += 1

    def flush(self, only: str | None = None, now: float | None = None) -> None:
        """Log what was counted and not yet logged, for each reason not logged in the last minute."""
        now = time.monotonic() if now is None else now
        for reason in [only] if only else list(self._pending):
            with self._lock:
                count = self._pending[reason]
                last = self._logged_at.get(reason)
                if not count or (last is not None and now - last < LOG_EVERY_S):
                    continue
                self._pending[reason] = 0
                self._logged_at[reason] = now
                detail = self._last_detail.get(reason, "")
            level, what = self._reasons[reason]
            since = "" if last is None else f" in the last {now - last:.0f} s"
            log.log(level, "http: %s (%s): %d time(s)%s%s; counted in tpuwatch_http_connections_closed_total, "
                           "logged at most once a minute", what, reason, count, since,
                    f"; last {detail}" if detail else "")

    def samples(self) -> list[Sample]:
        """The endpoint's metrics."""
        with self._lock:
            closed, answered, states = dict(self.closed), dict(self.answered), dict(self.states)
        return ([sample("tpuwatch_http_connections_closed_total", n, reason=r) for r, n in sorted(closed.items())]
                + [sample("tpuwatch_http_requests_total", n, code=str(c)) for c, n in sorted(answered.items())]
                + [sample("tpuwatch_http_connections", n, state=s) for s, n in states.items()])
