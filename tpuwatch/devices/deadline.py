"""Calls that may never return (NVML on a GPU that fell off the bus), run off the caller's thread.

Each call runs in its own daemon thread, in a *lane* named by the caller (one
lane per chip).  The caller waits until a deadline; a call that outlives it is
abandoned, not killed (a thread stuck in the kernel cannot be), and its lane
stays busy until it returns: later calls in that lane fail at once instead of
piling up threads.  Other lanes carry on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class CallTimeout(Exception):
    """A call did not return within its deadline, or its lane is still stuck in an earlier one."""


class _Call:
    """One call in its own daemon thread."""

    def __init__(self, lane: str, fn: Callable[[], Any]) -> None:
        self.done = threading.Event()
        self.started = time.monotonic()
        self.result: Any = None
        self.error: BaseException | None = None
        self._fn = fn
        threading.Thread(target=self._run, name=f"call-{lane}", daemon=True).start()

    def _run(self) -> None:
        try:
            self.result = self._fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
            self.error = exc
        finally:
            self.done.set()


class Lanes:
    """Runs calls with a deadline, one outstanding call per lane."""

    def __init__(self) -> None:
        self._calls: dict[str, _Call] = {}
        self._lock = threading.Lock()

    def start(self, lane: str, fn: Callable[[], Any]) -> _Call:
        """Begin ``fn`` in ``lane``; raise CallTimeout if the lane is still stuck in an earlier call."""
        with self._lock:
            previous = self._calls.get(lane)
            if previous is not None and not previous.done.is_set():
                raise CallTimeout(f"an earlier call has not returned for {time.monotonic() - previous.started:.1f}s")
            call = self._calls[lane] = _Call(lane, fn)
        return call

    @staticmethod
    def wait(call: _Call, deadline: float) -> Any:
        """The call's result once it returns before ``deadline`` (monotonic); its exception re-raised."""
        if not call.done.wait(max(0.0, deadline - time.monotonic())):
            raise CallTimeout(f"no answer within {deadline - call.started:.1f}s")
        if call.error is not None:
            raise call.error
        return call.result

    def call(self, lane: str, fn: Callable[[], Any], timeout: float) -> Any:
        """Run ``fn`` in ``lane`` and wait at most ``timeout`` seconds for it."""
        call = self.start(lane, fn)
        return self.wait(call, call.started + timeout)
