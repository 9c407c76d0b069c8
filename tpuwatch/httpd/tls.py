"""Non-blocking TLS for the event loop: one handshake step at a time."""

from __future__ import annotations

import socket
import ssl
from typing import Literal

Step = Literal["read", "write", "done", "gone", "failed"]


def peek(sock: socket.socket) -> bool | None:
    """Whether the client has sent anything yet (its ClientHello); None when it has already left."""
    try:
        return bool(sock.recv(1, socket.MSG_PEEK)) or None
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return None


def handshake(sock: ssl.SSLSocket) -> tuple[Step, str]:
    """Advance the handshake: wait to read or write, done, the client gone, or failed (with the reason)."""
    try:
        sock.do_handshake()
    except ssl.SSLWantReadError:
        return "read", ""
    except ssl.SSLWantWriteError:
        return "write", ""
    except (ssl.SSLEOFError, ssl.SSLZeroReturnError, ConnectionError):
        return "gone", ""
    except OSError as exc:
        return "failed", getattr(exc, "reason", None) or exc.strerror or str(exc)
    return "done", ""
