"""Which connections are open, per client, and which one goes when a cap is reached.

A connection that waits on its client (TLS handshake, request head, keep-alive
idle, a response the client reads slowly, a lingering close) can be evicted; one
whose request a worker is serving cannot.  The one evicted is the one that has
waited longest: since it was accepted, or since its last response began or
ended, whatever trickle of bytes it sent meanwhile (lingering closes go
first).  A client that connects and sends its request at once is therefore
never the one evicted: it is the newest, and it stops waiting as soon as its
request is complete.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

C = TypeVar("C", bound=Hashable)


@dataclass(frozen=True)
class Admission(Generic[C]):
    """The verdict on a new connection: evict ``victims`` (with their reason) and admit it, or refuse it."""

    admitted: bool
    victims: tuple[tuple[C, str], ...] = ()
    refusal: str = ""


class ConnectionTable(Generic[C]):
    """Open connections by client, with the caps on both."""

    def __init__(self, max_total: int, max_per_client: int) -> None:
        self.max_total = max_total
        self.max_per_client = max_per_client
        self._client: dict[C, str] = {}
        self._per_client: dict[str, int] = {}
        self._waiting: OrderedDict[C, None] = OrderedDict()
        self._client_waiting: dict[str, OrderedDict[C, None]] = {}

    def __len__(self) -> int:
        return len(self._client)

    def admit(self, client: str) -> Admission[C]:
        """Make room for a new connection from ``client``, or say why there is none."""
        if self._per_client.get(client, 0) >= self.max_per_client:
            victim = next(iter(self._client_waiting[client]), None)
            if victim is None:
                return Admission(False, refusal="refused_per_client")
            return Admission(True, ((victim, "evicted_per_client"),))
        if len(self._client) >= self.max_total:
            victim = next(iter(self._waiting), None)
            if victim is None:
                return Admission(False, refusal="refused_total")
            return Admission(True, ((victim, "evicted_total"),))
        return Admission(True)

    def add(self, conn: C, client: str) -> None:
        """Count a newly admitted connection; it waits from now."""
        self._client[conn] = client
        self._per_client[client] = self._per_client.get(client, 0) + 1
        self._client_waiting.setdefault(client, OrderedDict())
        self.wait(conn)

    def wait(self, conn: C) -> None:
        """The connection begins to wait on its client: it is the last to be evicted for now."""
        self.busy(conn)
        self._waiting[conn] = None
        self._client_waiting[self._client[conn]][conn] = None

    def doomed(self, conn: C) -> None:
        """The connection only lingers before closing: it is the first to be evicted."""
        self.wait(conn)
        self._waiting.move_to_end(conn, last=False)
        self._client_waiting[self._client[conn]].move_to_end(conn, last=False)

    def busy(self, conn: C) -> None:
        """A worker serves the connection's request: it cannot be evicted."""
        self._waiting.pop(conn, None)
        self._client_waiting[self._client[conn]].pop(conn, None)

    def remove(self, conn: C) -> None:
        """Forget a closed connection."""
        if conn not in self._client:
            return
        self.busy(conn)
        client = self._client.pop(conn)
        self._per_client[client] -= 1
        if not self._per_client[client]:
            del self._per_client[client]
            del self._client_waiting[client]
