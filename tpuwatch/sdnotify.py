"""systemd's notify protocol (sd_notify) over $NOTIFY_SOCKET; a no-op outside systemd."""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


def notify(*fields: str) -> bool:
    """Send ``KEY=VALUE`` fields (READY=1, STATUS=..., WATCHDOG=1); False when not under systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto("\n".join(fields).encode(), address)
    except OSError as exc:
        log.debug("sd_notify to %s failed: %s", address, exc)
        return False
    return True


def watchdog_interval() -> float | None:
    """Seconds between WATCHDOG=1 pings (half of WATCHDOG_USEC) when systemd asks for them."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec.isdigit() or int(usec) == 0 or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2e6
