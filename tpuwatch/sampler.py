"""One sampling cycle: run every collector behind its guard and store what they read."""

from __future__ import annotations

import time
from collections.abc import Sequence

from tpuwatch.collectors import Collector, GuardedCollector
from tpuwatch.store import SeriesStore


class Sampler:
    """Runs all collectors concurrently, each with the same deadline, into the store."""

    def __init__(self, collectors: Sequence[Collector], store: SeriesStore, timeout: float) -> None:
        self.guards = [GuardedCollector(c) for c in collectors]
        self.store = store
        self.timeout = timeout
        self.cycles = 0
        self.last_cycle_end: float | None = None

    def run_once(self) -> None:
        """Sample every collector once; failed ones contribute no readings this cycle."""
        for guard in self.guards:
            guard.start()
        deadline = time.monotonic() + self.timeout
        now = time.time()
        for guard in self.guards:
            readings = guard.finish(deadline)
            self.store.replace(guard.name, readings or (), now)
        self.cycles += 1
        self.last_cycle_end = time.time()

    def guard(self, name: str) -> GuardedCollector | None:
        """The guard of the named collector, if enabled."""
        return next((g for g in self.guards if g.name == name), None)
