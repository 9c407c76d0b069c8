"""What the Compute Engine and EC2 watchers share: their threads, the notices they hold, failures counted.

Each watched key runs a loop in a daemon thread of its own, never the sampler's: a round is one request with
its deadline; a round that fails (no answer, a slow one, garbage) is counted by result, logged once until a
round succeeds, and retried after a backoff that doubles up to ``retry_max``.  ``stop()`` aborts the request
in flight, so that shutdown and reload never wait for a hanging watch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

from tpuwatch.cloud.events import Maintenance
from tpuwatch.cloud.http import Failed, Link
from tpuwatch.cloud.plugin import MaintenanceConfig

log = logging.getLogger(__name__)

RESULTS = ("timeout", "unreachable", "too_large", "http_error", "garbage")
BACKOFF_INITIAL_S = 1.0
MIN_ROUND_S = 1.0  # a round that ends sooner waits out the rest: a server answering at once never spins a loop


class HttpError(Exception):
    """An HTTP status the protocol does not expect (the message names it)."""


class Watch:
    """The notices of one cloud, kept up to date by one thread per watched key (``loops``)."""

    cloud = ""

    def __init__(self, settings: MaintenanceConfig, link: Link) -> None:
        self.settings, self.link = settings, link
        self.errors: Counter[str] = Counter(dict.fromkeys(RESULTS, 0))
        self.answered = threading.Event()  # every key answered once (or failed once)
        self._notices: dict[str, list[Maintenance]] = {}
        self._failing: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._tried: set[str] = set()
        self._keys: set[str] = set()

    def loops(self) -> dict[str, Callable[[], float]]:
        """Each watched key's round: one exchange, returning how long to wait before the next (0: at once)."""
        raise NotImplementedError

    def start(self) -> None:
        """Start one thread per key."""
        loops = self.loops()
        self._keys = set(loops)
        for key, round_ in loops.items():
            thread = threading.Thread(target=self._run, args=(key, round_), name=f"maintenance-{self.cloud}-{key}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the threads: the request in flight is aborted, so this returns at once."""
        self._stop.set()
        self.link.abort()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads = []

    def notices(self) -> list[Maintenance]:
        """The pending maintenance, as of the latest answers."""
        with self._lock:
            return self.merge({k: list(v) for k, v in self._notices.items()})

    def merge(self, by_key: dict[str, list[Maintenance]]) -> list[Maintenance]:
        """The notices of every key as one list (Compute Engine's two keys describe one event)."""
        return [n for notices in by_key.values() for n in notices]

    def degraded(self) -> str | None:
        """Why the notices may be stale (the metadata server failing), or None."""
        with self._lock:
            failing = dict(self._failing)
        return "; ".join(f"{self.cloud} metadata {k}: {why}" for k, why in sorted(failing.items())) or None

    def _set(self, key: str, notices: list[Maintenance]) -> None:
        with self._lock:
            self._notices[key] = notices

    def _run(self, key: str, round_: Callable[[], float]) -> None:
        backoff = BACKOFF_INITIAL_S
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                wait = round_()
            except Exception as exc:  # noqa: BLE001 - anything an answer provokes is counted; the watch goes on
                if self._stop.is_set():
                    return
                result = exc.result if isinstance(exc, Failed) else "http_error" if isinstance(exc, HttpError) \
                    else "garbage"
                self._failed(key, result, str(exc))
                wait, backoff = backoff, min(backoff * 2, self.settings.retry_max)
            else:
                backoff = BACKOFF_INITIAL_S
                self._recovered(key)
            self._answered(key)
            self._stop.wait(max(wait, MIN_ROUND_S - (time.monotonic() - began)))

    def _failed(self, key: str, result: str, why: str) -> None:
        with self._lock:
            self.errors[result] += 1
            first = key not in self._failing
            self._failing[key] = f"{result}: {why}"[:300]
        if first:
            log.warning("maintenance: %s metadata %s failed (%s: %s); kept trying, backing off up to %gs",
                        self.cloud, key, result, why, self.settings.retry_max)

    def _recovered(self, key: str) -> None:
        with self._lock:
            was = self._failing.pop(key, None)
        if was is not None:
            log.info("maintenance: %s metadata %s answers again", self.cloud, key)

    def _answered(self, key: str) -> None:
        self._tried.add(key)
        if self._tried >= self._keys:
            self.answered.set()
