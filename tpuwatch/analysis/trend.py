"""The daemon's trend hook: leak and drift detectors fed with every sampling cycle's readings.

``TrendAnalyzer.observe(samples, timestamp)`` takes one cycle's samples (what
the store's ``current()`` returns) and returns the trend samples to export,
which the alert rules read (``AcceleratorMemoryLeak``, ``AcceleratorDrift``, ...).  Series:

* memory: HBM in use per chip against its capacity; host memory in use
  (total - available) against the total; resident memory of each process
  holding a chip against host memory; device memory of each process on a
  chip against the chip's capacity (``process_hbm``).  Process series carry
  the process's command and, under Kubernetes, its namespace, pod and
  container, so that a leak names who leaks;
* drift: canary latency and canary error per chip (fed only when a new canary
  result arrives, i.e. when the value changes), and chip temperature per
  utilization band of 0.2, labelled like ``band="0.6-0.8"`` ("temperature at comparable utilization").

Detectors of series not seen for ``forget_after`` seconds are dropped, and at
most ``max_series`` are kept, so memory is bounded.  ``snapshot()`` and
``restore()`` carry what the detectors have learned across a restart.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from tpuwatch.analysis.drift import DriftDetector
from tpuwatch.analysis.fast import FastParams
from tpuwatch.analysis.leak import LeakDetector, LeakParams, LeakView
from tpuwatch.analysis.params import FAST_INTERVAL
from tpuwatch.config import Config, TrendConfig
from tpuwatch.samples import Labels, Sample, sample

SNAPSHOT_VERSION = 1
CLOCK_TOLERANCE_S = 60.0
DRIFT_SIGNALS = {"canary_latency": "tpuwatch_canary_duration_seconds",
                 "canary_error": "tpuwatch_canary_max_abs_error"}
UTILIZATION_BANDS = 5
TEMPERATURE_BUCKET_S = 60.0  # temperature drift is judged on per-minute means


def config_warnings(config: Config) -> list[str]:
    """What ``tpuwatch config check`` warns about the trend analysis: readings too sparse for the fast check."""
    if config.interval <= FAST_INTERVAL:
        return []
    horizon = FastParams().horizon / 60
    return [f"interval: {config.interval:g}s: the fast leak check (a chip full within {horizon:g} min) is tuned for "
            f"{FAST_INTERVAL:g}s or less; sampled less often it pages later, and more warm-ups (docs/trend.md, Limits)"]


@dataclass
class _Tracked:
    detector: Any
    last_seen: float
    last_value: float | None = None
    minute: int | None = None  # temperature: the minute being averaged, its sum and count
    total: float = 0.0
    count: int = 0
    partial: bool = False  # the minute began before the first reading: its mean is not judged


PROCESS_LABELS = ("command", "namespace", "pod", "container")


def _process_labels(labels: Labels, memory: str, *keep: str) -> Labels:
    given = dict(labels)
    named = [(name, given.get(name, "")) for name in (*keep, *PROCESS_LABELS)]
    return tuple(sorted([("memory", memory), *((k, v) for k, v in named if v)]))


def memory_series(samples: list[Sample]) -> dict[Labels, tuple[float, float | None]]:
    """(used, capacity) per memory series, keyed by the trend labels (memory, device, pid; a process's
    command, namespace, pod and container where known)."""
    by_name: dict[str, dict[Labels, float]] = {}
    for s in samples:
        by_name.setdefault(s.name, {})[s.labels] = s.value
    out: dict[Labels, tuple[float, float | None]] = {}
    # A chip's own series; a MIG instance's (gpu_instance) is part of the chip's and not a series of its own here.
    totals = {labels: total for labels, total in by_name.get("tpuwatch_device_memory_total_bytes", {}).items()
              if "gpu_instance" not in dict(labels)}
    for labels, used in by_name.get("tpuwatch_device_memory_used_bytes", {}).items():
        if "gpu_instance" in dict(labels):
            continue
        device = dict(labels).get("device", "")
        out[(("device", device), ("memory", "hbm"))] = (used, totals.get(labels))
    host_total = by_name.get("tpuwatch_host_memory_total_bytes", {}).get(())
    host_available = by_name.get("tpuwatch_host_memory_available_bytes", {}).get(())
    if host_total is not None and host_available is not None:
        out[(("memory", "host"),)] = (host_total - host_available, host_total)
    for labels, rss in by_name.get("tpuwatch_holder_process_resident_memory_bytes", {}).items():
        out[_process_labels(labels, "process", "pid")] = (rss, host_total)
    capacity = {dict(labels).get("device"): total for labels, total in totals.items()}
    for labels, used in by_name.get("tpuwatch_process_device_memory_used_bytes", {}).items():
        out[_process_labels(labels, "process_hbm", "device", "pid")] = (used, capacity.get(dict(labels).get("device")))
    return out


def drift_series(samples: list[Sample]) -> dict[Labels, float]:
    """Drift inputs keyed by (device, series[, band]): canary latency and error, banded temperature."""
    out: dict[Labels, float] = {}
    names = {metric: series for series, metric in DRIFT_SIGNALS.items()}
    utilization = {s.labels: s.value for s in samples if s.name == "tpuwatch_device_utilization_ratio"}
    for s in samples:
        device = dict(s.labels).get("device", "")
        if s.name in names:
            out[(("device", device), ("series", names[s.name]))] = s.value
        elif s.name == "tpuwatch_device_temperature_celsius" and s.labels in utilization:
            band = min(UTILIZATION_BANDS - 1, int(utilization[s.labels] * UTILIZATION_BANDS))
            span = f"{band / UTILIZATION_BANDS:.1f}-{(band + 1) / UTILIZATION_BANDS:.1f}"
            out[(("band", span), ("device", device), ("series", "temperature"))] = s.value
    return out


class TrendAnalyzer:
    """Leak and drift detectors for every series the daemon samples."""

    def __init__(self, config: TrendConfig, forget_after: float = 3600.0, max_series: int = 1000) -> None:
        self.params = LeakParams(critical_eta=config.critical_eta, max_eta=config.max_eta)
        self.forget_after = forget_after
        self.max_series = max_series
        self._leaks: dict[Labels, _Tracked] = {}
        self._drifts: dict[Labels, _Tracked] = {}
        self._lock = threading.Lock()  # observe() runs in the sampler's thread, snapshot() in another

    def observe(self, samples: list[Sample], timestamp: float) -> list[Sample]:
        """Feed one cycle's readings taken at ``timestamp``; return the trend samples to export."""
        with self._lock:
            self._observe(samples, timestamp)
        return self.samples()

    def _observe(self, samples: list[Sample], timestamp: float) -> None:
        for labels, (used, capacity) in memory_series(samples).items():
            tracked = self._track(self._leaks, labels, timestamp, lambda: LeakDetector(self.params))
            if tracked is not None:
                tracked.detector.update(timestamp, used, capacity)
        for labels, value in drift_series(samples).items():
            tracked = self._track(self._drifts, labels, timestamp, DriftDetector)
            if tracked is None:
                continue
            if dict(labels)["series"] == "temperature":
                self._temperature(tracked, value, timestamp)
            elif tracked.last_value != value:
                tracked.last_value = value
                tracked.detector.update(value)
        for table in (self._leaks, self._drifts):
            for labels in [k for k, t in table.items() if timestamp - t.last_seen > self.forget_after]:
                del table[labels]

    @staticmethod
    def _temperature(tracked: _Tracked, value: float, timestamp: float) -> None:
        """Feed the drift detector one mean per minute: its warm-up then spans half an hour whatever the sampling
        interval, and the minute's mean evens out the load moving within the band (samples seconds apart follow
        each other, and a baseline learned in 30 of them drifts as the load cycles).  The minute a series is first
        seen in (a start, a restart carrying learned state) is not judged: a part of a minute can sit apart from
        whole minutes that a load in step with the clock makes alike."""
        minute = int(timestamp // TEMPERATURE_BUCKET_S)
        if tracked.minute is None:
            tracked.partial = True
        elif minute != tracked.minute and tracked.count:
            if not tracked.partial:
                tracked.last_value = tracked.total / tracked.count
                tracked.detector.update(tracked.last_value)
            tracked.total, tracked.count, tracked.partial = 0.0, 0, False
        tracked.minute = minute
        tracked.total += value
        tracked.count += 1

    def snapshot(self, now: float) -> dict[str, Any]:
        """Every detector's learned state as JSON data, for ``restore()`` after a restart."""
        with self._lock:
            return {
                "version": SNAPSHOT_VERSION,
                "saved_at": now,
                "leaks": [{"labels": labels, "last_seen": t.last_seen, "detector": t.detector.snapshot()}
                          for labels, t in self._leaks.items()],
                "drifts": [{"labels": labels, "last_seen": t.last_seen, "last_value": t.last_value,
                            "detector": t.detector.snapshot()} for labels, t in self._drifts.items()],
            }

    def restore(self, snapshot: dict[str, Any], now: float) -> int:
        """Carry on from ``snapshot()``; the number of series restored.

        Series not seen for ``forget_after`` before ``now`` are left out, as
        ``observe()`` would have dropped them.  Raises KeyError, TypeError or
        ValueError, changing nothing, if the snapshot does not fit: another
        version, other floor settings, or saved after ``now`` (a clock that
        went back would fold new readings into old minutes).
        """
        if snapshot.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"snapshot version {snapshot.get('version')!r}, not {SNAPSHOT_VERSION}")
        if float(snapshot["saved_at"]) > now + CLOCK_TOLERANCE_S:
            raise ValueError(f"saved {float(snapshot['saved_at']) - now:.0f} s in the future (clock set back?)")

        def fresh(entries: list[dict[str, Any]], room: int) -> list[dict[str, Any]]:
            return [entry for entry in entries if now - float(entry["last_seen"]) <= self.forget_after][:room]

        leaks = {_labels(entry["labels"]): _Tracked(LeakDetector.restore(entry["detector"], self.params),
                                                    float(entry["last_seen"]))
                 for entry in fresh(snapshot["leaks"], self.max_series)}
        drifts = {_labels(entry["labels"]): _Tracked(DriftDetector.restore(entry["detector"]),
                                                     float(entry["last_seen"]), entry["last_value"])
                  for entry in fresh(snapshot["drifts"], self.max_series - len(leaks))}
        with self._lock:
            self._leaks, self._drifts = leaks, drifts
        return len(leaks) + len(drifts)

    def _track(self, table: dict[Labels, _Tracked], labels: Labels, timestamp: float,
               factory: Any) -> _Tracked | None:
        tracked = table.get(labels)
        if tracked is None:
            if len(self._leaks) + len(self._drifts) >= self.max_series:
                return None
            tracked = table[labels] = _Tracked(factory(), timestamp)
        tracked.last_seen = timestamp
        return tracked

    def leak_view(self, labels: Labels, since: float) -> LeakView | None:
        """The leak detector's view of one memory series (labels as in ``memory_series``), or None if untracked."""
        with self._lock:
            tracked = self._leaks.get(labels)
            return tracked.detector.view(since) if tracked is not None else None

    def samples(self) -> list[Sample]:
        """Current trend metrics; growth and exhaustion time only where a leak is suspected."""
        out: list[Sample] = []
        for labels, tracked in self._leaks.items():
            state = tracked.detector.state
            out.append(sample("tpuwatch_memory_leak_suspected", 1 if state.firing else 0, **dict(labels)))
            if state.firing:
                out.append(sample("tpuwatch_memory_growth_bytes_per_second", state.slope, **dict(labels)))
                if state.eta is not None:
                    out.append(sample("tpuwatch_memory_exhaustion_eta_seconds", state.eta, **dict(labels)))
        for labels, tracked in self._drifts.items():
            state = tracked.detector.state
            if state.baseline is None:
                continue
            out.append(sample("tpuwatch_drift_suspected", 1 if state.drifting else 0, **dict(labels)))
            out.append(sample("tpuwatch_drift_baseline", state.baseline, **dict(labels)))
            if state.drifting:
                out.append(sample("tpuwatch_drift_shift", state.shift, **dict(labels)))
        return out


def _labels(pairs: list[list[str]]) -> Labels:
    return tuple((str(name), str(value)) for name, value in pairs)
