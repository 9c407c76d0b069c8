"""Exclusive ``flock(2)`` locks taken within a deadline, for files two processes share."""

from __future__ import annotations

import fcntl
import time


def flock_within(fd: int, timeout: float, poll: float = 0.02) -> bool:
    """Take an exclusive flock on ``fd``, retrying for ``timeout`` seconds; False if another process still has it.

    The lock goes with the open file: closing ``fd`` releases it, and so does the kernel when the holder dies.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(poll)
