"""One client connection as the event loop keeps it: its socket, buffers, state and deadline."""

from __future__ import annotations

import selectors
import socket

from tpuwatch.httpd.protocol import Request


class Connection:
    """Touched by the loop thread only; the workers get its request and hand back a response."""

    def __init__(self, sock: socket.socket, client: str, deadline: float) -> None:
        self.sock = sock
        self.client = client
        self.deadline = deadline
        self.state: str | None = None
        self.inbuf = bytearray()
        self.out: list[memoryview] = []  # what is left to send: the head, then the body (shared, not copied)
        self.request: Request | None = None
        self.events = 0
        self.generation = 0  # counts responses, so that a route's late answer is dropped
        self.drained = 0
        self.close_after = False
        self.eof = False
        self.closed = False

    def want(self, selector: selectors.BaseSelector, events: int) -> None:
        """Wait for the socket to be readable or writable (``selectors.EVENT_READ`` or ``EVENT_WRITE``)."""
        if self.events == events:
            return
        if self.events:
            selector.modify(self.sock, events, self)
        else:
            selector.register(self.sock, events, self)
        self.events = events

    def unwant(self, selector: selectors.BaseSelector) -> None:
        """Stop waiting on the socket."""
        if self.events:
            self.events = 0
            try:
                selector.unregister(self.sock)
            except (KeyError, ValueError):
                pass
