"""Every bound on the endpoint's connections, requests and the work behind them (docs/endpoint.md)."""

from __future__ import annotations

from dataclasses import dataclass

# Connections.
MAX_CONNECTIONS = 512  # open at once; well under systemd's default soft RLIMIT_NOFILE of 1024
MAX_CONNECTIONS_PER_CLIENT = 128  # from one IP address
LISTEN_BACKLOG = 4096  # the kernel's accept queue (capped by net.core.somaxconn)
ACCEPT_BATCH = 32  # connections accepted per loop turn, so accepting never starves reading
ACCEPT_PAUSE_S = 0.25  # how long accepting pauses when the process is out of file descriptors

# Time.
HEADER_TIMEOUT_S = 5.0  # total, from accept (TLS handshake included) or a request's first byte to its blank line
IDLE_TIMEOUT_S = 120.0  # a keep-alive connection between requests; covers Prometheus's 1m default interval
WRITE_TIMEOUT_S = 10.0  # total, for one response to leave; a client that reads slowly loses the connection
ROUTE_TIMEOUT_S = 10.0  # a route that has not answered by then is answered 503 for it
LINGER_S = 2.0  # after the last response, unread input is drained this long before closing
SWEEP_S = 0.25  # how often deadlines are checked: each is kept to within this

# Size.
MAX_HEAD_BYTES = 8192  # request line and headers together
MAX_HEADERS = 64
LINGER_BYTES = 65536  # unread input drained at most on a lingering close

# Work.
WORKERS_PER_LANE = 2  # lanes: /metrics, the other routes, unverified credentials (tpuwatch.web)
QUEUE_PER_LANE = 32  # complete requests waiting for a worker; beyond that 503 at once


@dataclass(frozen=True)
class Limits:
    """The limits one endpoint runs under; the defaults are the constants above."""

    max_connections: int = MAX_CONNECTIONS
    max_connections_per_client: int = MAX_CONNECTIONS_PER_CLIENT
    header_timeout: float = HEADER_TIMEOUT_S
    idle_timeout: float = IDLE_TIMEOUT_S
    write_timeout: float = WRITE_TIMEOUT_S
    route_timeout: float = ROUTE_TIMEOUT_S
    linger: float = LINGER_S
    sweep: float = SWEEP_S
    max_head_bytes: int = MAX_HEAD_BYTES
    max_headers: int = MAX_HEADERS
    workers_per_lane: int = WORKERS_PER_LANE
    queue_per_lane: int = QUEUE_PER_LANE
