"""One sampling cycle: run every collector behind its guard and store what they read.

A cycle has stages.  Collectors of one stage run concurrently under one
deadline; a later stage (analysis, alert evaluation) starts once the readings
of the earlier ones are in the store, so it sees this cycle's data.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from tpuwatch.collectors import Collector, GuardedCollector
from tpuwatch.samples import Sample
from tpuwatch.store import SeriesStore


class Stage:
    """A derived collector: ``step`` applied to what the earlier stage just stored (analysis, alert rules)."""

    def __init__(self, name: str, step: Callable[[list[Sample]], list[Sample]],
                 current: Callable[[], list[Sample]]) -> None:
        self.name = name
        self._step = step
        self._current = current

    def collect(self) -> list[Sample]:
        """Run the step over the current samples; its own samples."""
        return self._step(self._current())


class Sampler:
    """Runs the collectors stage by stage into the store."""

    def __init__(self, collectors: Sequence[Collector], store: SeriesStore, timeout: float,
                 derived: Sequence[Collector] = ()) -> None:
        self.stages = [[GuardedCollector(c) for c in stage] for stage in (collectors, derived) if stage]
        self.guards = [guard for stage in self.stages for guard in stage]
        self.store = store
        self.timeout = timeout
        self.cycles = 0
        self.last_cycle_end: float | None = None

    def run_once(self) -> None:
        """Sample every collector once; failed ones contribute no readings this cycle."""
        now = time.time()
        for stage in self.stages:
            for guard in stage:
                guard.start()
            deadline = time.monotonic() + self.timeout
            for guard in stage:
                readings = guard.finish(deadline)
                self.store.replace(guard.name, readings or (), now)
        self.cycles += 1
        self.last_cycle_end = time.time()

    def close(self) -> None:
        """Release the collectors' resources (file descriptors, channels) once this sampler is replaced."""
        for guard in self.guards:
            close = getattr(guard.collector, "close", None)
            if close is not None:
                close()

    def guard(self, name: str) -> GuardedCollector | None:
        """The guard of the named collector, if enabled."""
        return next((g for g in self.guards if g.name == name), None)
