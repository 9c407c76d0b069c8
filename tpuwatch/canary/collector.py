"""The canary in the daemon: ``run_once()`` on the canary schedule, ``collect()`` on the sampling one.

``run_once()`` blocks for the whole worker subprocess (up to ``canary.timeout``),
so schedule it as its own job, never inside the sampler.  ``collect()`` only
turns what the runs found into samples and never waits for a run.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from tpuwatch.canary.judge import CanaryResult, DeviceOutcome
from tpuwatch.canary.runner import STOPPED, run_canary
from tpuwatch.config import Config
from tpuwatch.samples import Sample, sample

log = logging.getLogger(__name__)

KEPT_RESULTS = 100

RESULTS = ("pass", "fail", "skipped", "error")


@dataclass(frozen=True)
class _ChipState:
    """A chip's latest measured outcome (skipped runs leave it unchanged)."""

    outcome: DeviceOutcome
    stack: str
    chip: str
    last_success: float | None


class CanaryCollector:
    """Runs the canary when asked and exports what the runs found."""

    name = "canary"

    def __init__(self, config: Config, known_devices: Callable[[], Iterable[str]] = tuple) -> None:
        """``known_devices`` names the chips the device backend sees: their run counters exist at 0 from the start,
        so that Prometheus's ``increase()`` sees a chip's very first failure."""
        self.config = config
        self.known_devices = known_devices  # replaced when the device backend is rebuilt on reload
        self._lock = threading.Lock()
        self._results: deque[CanaryResult] = deque(maxlen=KEPT_RESULTS)  # for the status page's history
        self._runs: Counter[str] = Counter()
        self._chip_runs: dict[str, Counter[str]] = {}
        self._chips: dict[str, _ChipState] = {}

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

    def record(self, result: CanaryResult) -> None:
        """Keep what ``result`` found: run counters, each chip's latest outcome, the bounded run history."""
        with self._lock:
            self._results.append(result)
            self._runs[result.status] += 1
            for outcome in result.devices:
                self._chip_runs.setdefault(outcome.device, Counter())[outcome.status] += 1
                if outcome.status == "skipped":
                    continue
                before = self._chips.get(outcome.device)
                success = result.finished_at if outcome.status == "pass" else (before.last_success if before else None)
                self._chips[outcome.device] = _ChipState(outcome, result.stack or "", result.chip or "", success)

    def results(self) -> list[CanaryResult]:
        """The last KEPT_RESULTS runs, oldest first (the status page's canary history)."""
        with self._lock:
            return list(self._results)

    def collect(self) -> list[Sample]:
        """Run counters and each chip's latest outcome; before the first run only counters at 0, if chips are known."""
        known = set(self.known_devices())
        with self._lock:
            devices = sorted(known | set(self._chip_runs))
            if not self._runs and not devices:
                return []
            # A fire drill's "undetected" appears once one happened (only the simulator runs drills in the daemon).
            seen = sorted(set(self._runs) - set(RESULTS))
            out = [sample("tpuwatch_canary_runs_total", self._runs[r], result=r) for r in (*RESULTS, *seen)]
            out += [sample("tpuwatch_canary_device_runs_total", self._chip_runs.get(device, Counter())[r],
                           device=device, result=r) for device in devices for r in RESULTS]
            for device, state in sorted(self._chips.items()):
                outcome = state.outcome
                out.append(sample("tpuwatch_canary_healthy", outcome.status == "pass", device=device))
                if outcome.fingerprint is not None:
                    out.append(sample("tpuwatch_canary_info", 1, device=device, fingerprint=outcome.fingerprint,
                                      stack=state.stack, chip=state.chip))
                if outcome.duration_seconds is not None:
                    out.append(sample("tpuwatch_canary_duration_seconds", outcome.duration_seconds, device=device))
                if outcome.max_abs_error is not None:
                    out.append(sample("tpuwatch_canary_max_abs_error", outcome.max_abs_error, device=device))
                if state.last_success is not None:
                    out.append(sample("tpuwatch_canary_last_success_timestamp_seconds", state.last_success,
                                      device=device))
            return out
