"""Calls that may never return (a collector or a driver call stuck in the kernel), run off the caller's thread.

A ``Call`` runs one function in its own daemon thread; the caller waits for it
until a deadline.  A call that outlives its deadline is abandoned, not killed
(a thread stuck in the kernel cannot be).  ``Lanes`` keeps one outstanding
call per lane (one lane per chip, say): while a lane's call has not returned,
later calls in that lane fail at once instead of piling up threads, and the
other lanes carry on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class CallTimeout(Exception):
    """A call did not return within its deadline, or its lane is still stuck in an earlier one."""


class Call:
    """One call of ``fn`` in a daemon thread named ``name``: ``done`` once it returned or raised."""

    def __init__(self, name: str, fn: Callable[[], Any]) -> None:
        self.done = threading.Event()
        self.started = time.monotonic()
        self.finished = self.started
        self.result: Any = None
        self.error: BaseException | None = None
        self._fn = fn
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        try:
            self.result = self._fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
            self.error = exc
        finally:
            self.finished = time.monotonic()
            self.done.set()

    def wait(self, deadline: float) -> bool:
        """Wait until ``deadline`` (monotonic) at most; True once the call has returned or raised."""
        return self.done.wait(max(0.0, deadline - time.monotonic()))


class Lanes:
    """Runs calls with a deadline, one outstanding call per lane."""

    def __init__(self) -> None:
        self._calls: dict[str, Call] = {}
        self._lock = threading.Lock()

    def start(self, lane: str, fn: Callable[[], Any]) -> Call:
        """Begin ``fn`` in ``lane``; raise CallTimeout if the lane is still stuck in an earlier call."""
        with self._lock:
            previous = self._calls.get(lane)
            if previous is not None and not previous.done.is_set():
                raise CallTimeout(f"an earlier call has not returned for {time.monotonic() - previous.started:.1f}s")
            call = self._calls[lane] = Call(f"call-{lane}", fn)
        return call

    @staticmethod
    def wait(call: Call, deadline: float) -> Any:
        """The call's result once it returns before ``deadline`` (monotonic); its exception re-raised."""
        if not call.wait(deadline):
            raise CallTimeout(f"no answer within {deadline - call.started:.1f}s")
        if call.error is not None:
            raise call.error
        return call.result

    def call(self, lane: str, fn: Callable[[], Any], timeout: float) -> Any:
        """Run ``fn`` in ``lane`` and wait at most ``timeout`` seconds for it."""
        call = self.start(lane, fn)
        return self.wait(call, call.started + timeout)
