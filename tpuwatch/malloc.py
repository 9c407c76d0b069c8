"""Giving the memory a cycle freed back to the system (glibc's ``malloc_trim``).

Each cycle and each status page rendition allocate and free a few MiB of
short-lived objects (64 chips: a 430 KB page and its document).  glibc keeps
what is freed in its arenas, so the resident size settles at the highest such
peak, not at what the daemon holds.  ``malloc_trim(0)`` returns every free
page of every arena (about 0.1 ms when there is little to return, 1-2 ms
after a peak); the daemon calls it after each cycle and each status page
build, at most once per ``every`` seconds, from either thread (glibc locks
its arenas).  Where the C library is not glibc (musl has no ``malloc_trim``)
it does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

TRIM_EVERY_S = 1.0


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


class Trimmer:
    """Call after a burst of allocations: returns free memory to the system, at most once per ``every`` seconds."""

    def __init__(self, every: float = TRIM_EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self._clock = clock
        self._trim = _malloc_trim()
        self._last = -float("inf")
        self.trims = 0
        if self._trim is None:
            log.debug("no malloc_trim in this C library: freed memory stays with the allocator")

    @property
    def available(self) -> bool:
        """Whether the C library can return free memory (glibc)."""
        return self._trim is not None

    def __call__(self) -> None:
        now = self._clock()
        if self._trim is None or now - self._last < self.every:
            return
        self._last = now
        self._trim(0)
        self.trims += 1
