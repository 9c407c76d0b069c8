"""The canary in the daemon: ``run_once()`` on the canary schedule, ``collect()`` on the sampling one.

``run_once()`` blocks for the whole worker subprocess (up to ``canary.timeout``),
so schedule it as its own job, never inside the sampler.  ``record()`` keeps a
judged run from either path: the scheduled worker's (``run_once``) or a job's
probe report (tpuwatch.jobreports), so each chip has one verdict, its latest.
``collect()`` only turns what the runs found into samples and never waits for
a run.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tpuwatch.canary import record as chip_record
from tpuwatch.canary.judge import CanaryResult, DeviceOutcome
from tpuwatch.canary.runner import STOPPED, run_canary
from tpuwatch.config import Config
from tpuwatch.samples import Sample, sample

log = logging.getLogger(__name__)

KEPT_RESULTS = 100
KEPT_JOBS = 4  # per chip, the processes whose verdict counters are kept (the most recent reporters)

RESULTS = ("pass", "fail", "suspect", "slow", "skipped", "error")
PATHS = chip_record.PATHS

# The job-path counters of a chip carry its process: (pid, command, namespace, pod), "" where unknown.
JobLabels = tuple[str, str, str, str]
_JOB_LABELS = ("pid", "command", "namespace", "pod")


@dataclass(frozen=True)
class _ChipState:
    """A chip's latest measured outcome from either path (skipped runs leave it unchanged)."""

    outcome: DeviceOutcome
    stack: str
    chip: str
    path: str


class CanaryCollector:
    """Runs the canary when asked, keeps what either path found (``record``) and exports it."""

    name = "canary"

    def __init__(self, config: Config, known_devices: Callable[[], Iterable[str]] = tuple,
                 proven: Path | None = None) -> None:
        """``known_devices`` names the chips the device backend sees: their run counters exist at 0 from the start,
        so that Prometheus's ``increase()`` sees a chip's very first failure.  ``proven`` is the file that keeps
        each chip's lasting record (canary/record.py; None: kept in memory only)."""
        self.config = config
        self._proven = proven
        self.known_devices = known_devices  # replaced when the device backend is rebuilt on reload
        self._lock = threading.Lock()
        self._results: deque[CanaryResult] = deque(maxlen=KEPT_RESULTS)  # for the status page's history
        self._runs: Counter[tuple[str, str]] = Counter()  # (result, path)
        self._chip_runs: dict[str, Counter[str]] = {}  # the scheduled path's verdicts per chip
        self._job_runs: dict[str, dict[JobLabels, Counter[str]]] = {}  # the job path's, per chip and process
        self._chips: dict[str, _ChipState] = {}
        self._records = chip_record.load(proven)
        self.runnable: str | None = None  # why the scheduled canary cannot run here (None: it can)

    def run_once(self, inject: str | None = None, inject_device: int = 0,
                 env: Mapping[str, str] | None = None) -> CanaryResult:
        """One canary run (blocks until the worker ends or times out); the result is kept.

        ``inject``, ``inject_device`` and ``env`` are for fire drills (the simulator's sdc scenario); a drill
        is judged against the fingerprint history but never writes it.
        """
        result = run_canary(self.config, inject, inject_device, env=env)
        if result.reason == STOPPED:
            log.info("canary: %s", STOPPED)
        elif result.status != "pass":
            log.warning("canary %s: %s", result.status, result.reason)
        self.record(result)
        return result

    def record(self, result: CanaryResult, job: JobLabels | None = None) -> None:
        """Keep what ``result`` found: run counters, each chip's latest outcome, the bounded run history.

        ``job`` labels the job-path counters with the reporting process."""
        with self._lock:
            self._results.append(result)
            self._runs[(result.status, result.path)] += 1
            for outcome in result.devices:
                self._count(outcome, job if result.path == "job" else None)
                if outcome.status == "skipped":
                    continue
                self._records.setdefault(outcome.device, chip_record.ChipRecord()).saw(
                    outcome.status, result.path, result.finished_at)
                self._chips[outcome.device] = _ChipState(outcome, result.stack or "", result.chip or "", result.path)
            if self._proven is not None and any(o.status != "skipped" for o in result.devices):
                chip_record.save(self._proven, self._records)

    def _count(self, outcome: DeviceOutcome, job: JobLabels | None) -> None:
        if job is None:
            self._chip_runs.setdefault(outcome.device, Counter())[outcome.status] += 1
            return
        jobs = self._job_runs.setdefault(outcome.device, {})
        counts = jobs.pop(job, Counter())
        counts[outcome.status] += 1
        jobs[job] = counts  # the most recent reporter last
        while len(jobs) > KEPT_JOBS:
            del jobs[next(iter(jobs))]

    def last_success(self) -> chip_record.Proven:
        """When each chip last passed, by path: (chip, path) -> Unix time."""
        with self._lock:
            return chip_record.proven(self._records)

    def results(self) -> list[CanaryResult]:
        """The last KEPT_RESULTS runs, oldest first (the status page's canary history)."""
        with self._lock:
            return list(self._results)

    def collect(self) -> list[Sample]:
        """Run counters and each chip's latest outcome; before the first run only counters at 0, if chips are known."""
        known = set(self.known_devices())
        with self._lock:
            # The scheduled path's counters exist (at 0) where it can run; the job path's once a job reported.
            ran = {p for _, p in self._runs}
            scheduled = "scheduled" in ran or (self.runnable is None and bool(known))
            devices = sorted(known | set(self._chip_runs)) if scheduled else []
            paths = ["scheduled"] * scheduled + ["job"] * ("job" in ran)
            if not paths:
                return []
            seen = sorted({r for r, _ in self._runs} - set(RESULTS))  # a fire drill's "undetected", once seen
            out = [sample("tpuwatch_canary_runs_total", self._runs[(r, p)], result=r, path=p)
                   for p in paths for r in (*RESULTS, *seen)]
            out += [sample("tpuwatch_canary_device_runs_total", self._chip_runs.get(device, Counter())[r],
                           device=device, result=r, path="scheduled") for device in devices for r in RESULTS]
            out += [sample("tpuwatch_canary_device_runs_total", counts[r], device=device, result=r, path="job",
                           **{k: v for k, v in zip(_JOB_LABELS, job) if v})
                    for device, jobs in sorted(self._job_runs.items()) for job, counts in jobs.items()
                    for r in RESULTS]
            for device, state in sorted(self._chips.items()):
                outcome = state.outcome
                held = device in self._records and self._records[device].unhealthy
                out.append(sample("tpuwatch_canary_healthy", outcome.status in ("pass", "slow") and not held,
                                  device=device))
                if outcome.fingerprint is not None:
                    out.append(sample("tpuwatch_canary_info", 1, device=device, fingerprint=outcome.fingerprint,
                                      stack=state.stack, chip=state.chip, path=state.path))
                if outcome.duration_seconds is not None:
                    out.append(sample("tpuwatch_canary_duration_seconds", outcome.duration_seconds, device=device))
                if outcome.max_abs_error is not None:
                    out.append(sample("tpuwatch_canary_max_abs_error", outcome.max_abs_error, device=device))
            out += [sample("tpuwatch_canary_last_success_timestamp_seconds", at, device=device, path=path)
                    for (device, path), at in sorted(chip_record.proven(self._records).items())]
            out += [sample("tpuwatch_canary_deviating_runs_total", r.deviations, device=device)
                    for device, r in sorted(self._records.items())]
            return out
