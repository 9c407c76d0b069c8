"""A checked report judged as the scheduled canary's runs are: reference, the host's chips, the chip's history.

The run's own chips are each other's peers, and so are this host's other
chips that other processes reported on the same stack within ``peer_window``
(a job per chip is common on GPUs).  The fingerprint history is the canary's
file, keyed by model, dtype, chip kind and stack, so a job and the scheduled
canary on the same stack check each other.  A fire drill (``drill``) is judged
and recorded like the scheduled canary's drills, and never writes the history.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace

from tpuwatch.canary.history import FingerprintHistory, history_path
from tpuwatch.canary.judge import CanaryResult, Drill, history_key, judge
from tpuwatch.jobreports.message import Report


class Judge:
    """Judges reports against the history under ``state_dir`` and the host's recent reports."""

    def __init__(self, state_dir: str, peer_window: float, clock: Callable[[], float] = time.time) -> None:
        self.history = FingerprintHistory(history_path(state_dir))
        self.peer_window = peer_window
        self.clock = clock
        self._recent: dict[str, tuple[str, str, float]] = {}  # chip -> (history key, fingerprint, when)
        self._lock = threading.Lock()

    def judge(self, report: Report, chips: dict[str, str], job: str, known: set[str]) -> CanaryResult:
        """The verdict on ``report``, its chips renamed by ``chips`` (report name -> host chip); ``job`` names
        the process; ``known`` are the host's chips now (the recent reports of others are kept for them only)."""
        key = history_key(report.stack, report.chip, report.dtype)
        results = [{"event": "result", **r, "device": chips[r["device"]]} for r in report.results]
        ours = {r["device"] for r in results}
        now = self.clock()
        with self._lock:
            self._recent = {c: v for c, v in self._recent.items() if c in known and now - v[2] <= self.peer_window}
            peers = tuple(fp for chip, (k, fp, _) in self._recent.items() if k == key and chip not in ours)
        start = {"event": "start", "platform": report.platform, "chip": report.chip, "stack": report.stack,
                 "dtype": report.dtype, "scale": report.scale}  # no device list: read only of a run cut short
        drill = Drill(report.drill[0], chips[report.drill[1]]) if report.drill else None
        result = self.history.update(lambda history: judge([start, *results], None, history, drill, peers))
        if drill is None:
            with self._lock:
                self._recent.update({o.device: (key, o.fingerprint, now) for o in result.devices
                                     if o.status == "pass" and o.fingerprint})
        return replace(result, path="job", job=job)
