"""Bounded lanes of worker threads whose results come back to the event loop through a wake-up socket."""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

T = TypeVar("T")


class Workers(Generic[T]):
    """``per_lane`` threads for each lane, and at most ``queue_per_lane`` more jobs waiting for them."""

    def __init__(self, lanes: tuple[str, ...], per_lane: int, queue_per_lane: int) -> None:
        self._pools = {lane: ThreadPoolExecutor(per_lane, thread_name_prefix=f"http-{lane}") for lane in lanes}
        self._limit = per_lane + queue_per_lane
        self._inflight = dict.fromkeys(lanes, 0)
        self._done: deque[tuple[str, T]] = deque()
        self.wakeup, self._wake_w = socket.socketpair()
        self.wakeup.setblocking(False)
        self._wake_w.setblocking(False)

    def full(self, lane: str) -> bool:
        """Whether the lane's threads and queue are all taken (by jobs running, waiting or hung)."""
        return self._inflight[lane] >= self._limit

    def submit(self, lane: str, job: Callable[[], T]) -> None:
        """Run ``job`` in the lane; its result comes out of ``results()``.  Call from the loop thread."""
        self._inflight[lane] += 1
        self._pools[lane].submit(self._run, lane, job)

    def results(self) -> Iterator[T]:
        """The results of finished jobs, oldest first.  Call from the loop thread."""
        while self._done:
            lane, result = self._done.popleft()
            self._inflight[lane] -= 1
            yield result

    def wake(self) -> None:
        """Wake the loop (its selector watches ``wakeup``)."""
        try:
            self._wake_w.send(b"\0")
        except OSError:  # full (a wake-up is pending anyway) or closed
            pass

    def woken(self) -> None:
        """Empty the wake-up socket."""
        try:
            self.wakeup.recv(4096)
        except OSError:
            pass

    def close(self) -> None:
        """Stop taking jobs; jobs still running (a hung route) are not waited for."""
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
        self.wakeup.close()
        self._wake_w.close()

    def _run(self, lane: str, job: Callable[[], T]) -> None:
        self._done.append((lane, job()))
        self.wake()
