"""One sampling cycle: the pipeline's stages in order, each part behind its guard, everything into the store.

A cycle runs its stages one after the other: the devices, then the other
sources (host, kernel log, canary results), then analysis (trend detectors, tpuwatch's own
metrics), then alerting, then actions.  The collectors of one stage run
concurrently under one deadline; a stage starts once the samples of the
stages before it are in the store, so it sees this cycle's data.  The first
stage hands what it found to the later ones through a ``Handoff`` (the
devices' inventory, tpuwatch.devices.inventory.Board): opened before it and
sealed after it, so that a first-stage call past its deadline hands nothing
to a cycle already under way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

from tpuwatch.collectors import Collector, GuardedCollector
from tpuwatch.samples import Sample, sample
from tpuwatch.store import SeriesStore


class Stage:
    """A step of the pipeline after the sources, run as a collector of its own: ``step()`` reads what the earlier
    stages stored and returns its own samples (trend findings, alert counters; [] for an action)."""

    def __init__(self, name: str, step: Callable[[], list[Sample]]) -> None:
        self.name = name
        self._step = step

    def collect(self) -> list[Sample]:
        """Run the step."""
        return self._step()


class Handoff(Protocol):
    """What the first stage publishes for the later ones: accepted between ``begin()`` and ``seal()``."""

    def begin(self) -> None:
        """A cycle starts: the first stage may publish."""

    def seal(self) -> None:
        """The first stage is over: what it published stands for the rest of the cycle."""


class Sampler:
    """Runs the stages in order into the store; ``handoff`` is opened around the first stage (``stages[0]``,
    empty or not)."""

    def __init__(self, stages: Sequence[Sequence[Collector]], store: SeriesStore, timeout: float,
                 handoff: Handoff | None = None) -> None:
        self.stages = [[GuardedCollector(c) for c in stage] for stage in stages]
        self.guards = [guard for stage in self.stages for guard in stage]
        self.store = store
        self.timeout = timeout
        self.handoff = handoff
        self.last_cycle_end: float | None = None

    def run_once(self) -> None:
        """Run every stage once; failed collectors contribute no samples this cycle."""
        now = time.time()
        if self.handoff is not None:
            self.handoff.begin()
        for index, stage in enumerate(self.stages):
            for guard in stage:
                guard.start()
            deadline = time.monotonic() + self.timeout
            for guard in stage:
                readings = guard.finish(deadline)
                self.store.replace(guard.name, readings or (), now)
            if index == 0 and self.handoff is not None:
                self.handoff.seal()
        self.last_cycle_end = time.time()

    def guard(self, name: str) -> GuardedCollector | None:
        """The guard of the named collector, if enabled."""
        return next((g for g in self.guards if g.name == name), None)

    def samples(self) -> list[Sample]:
        """How each collector did (success, duration, samples, failures, dropped readings) and the last cycle."""
        out = []
        for guard in self.guards:
            status, name = guard.status, guard.name
            if status.success is not None:
                out.append(sample("tpuwatch_collector_success", 1 if status.success else 0, collector=name))
                out.append(sample("tpuwatch_collector_duration_seconds", status.duration_seconds, collector=name))
                out.append(sample("tpuwatch_collector_samples", status.samples, collector=name))
            out += [sample("tpuwatch_collector_errors_total", n, collector=name, reason=r)
                    for r, n in status.errors.items()]
            out += [sample("tpuwatch_readings_dropped_total", n, collector=name, reason=r)
                    for r, n in status.dropped.items()]
        if self.last_cycle_end is not None:
            out.append(sample("tpuwatch_last_sample_timestamp_seconds", self.last_cycle_end))
        return out
