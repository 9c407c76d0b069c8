"""The trend detectors' learned state on disk: restored at start, saved every few minutes and at stop.

Without it every restart or upgrade would leave the leak detector blind for
its 2 h learning period.  The file is ``trend.json`` in the state directory,
sealed with the SHA-256 of its content (``statefile.seal``: a damaged digit of
a learned baseline would otherwise be restored as a drift or a leak that is
not there); series not seen for an hour before the restart are not restored.
A file from before the digest is still restored, and sealed at the next save.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from tpuwatch import statefile
from tpuwatch.analysis.trend import TrendAnalyzer
from tpuwatch.samples import Sample, sample

log = logging.getLogger(__name__)

FILE_NAME = "trend.json"
SAVE_EVERY_S = 300.0
MAX_BYTES = 64 << 20  # a leak series at its longest holds about 47 KiB, for the analyzer's 1000 at most


class TrendStateFile:
    """``restore(trend, now)`` once at start, ``save(trend, now)`` periodically; failures counted, logged once.

    A file that does not fit (not JSON, failing its integrity check, wrong shape, another version) is not used,
    and is recorded as discarded.
    """

    def __init__(self, state_dir: str) -> None:
        self.path = Path(state_dir) / FILE_NAME
        self.save_failures = 0
        self._lock = threading.Lock()  # the periodic job and stop() may save at the same moment

    def restore(self, trend: TrendAnalyzer, now: float) -> int:
        """Load the saved state into ``trend``; the number of series carried on (0 if none or unfit)."""
        snapshot = statefile.load(self.path, "trend state", shape=None, max_bytes=MAX_BYTES)
        if snapshot is None:
            return 0
        try:
            count = trend.restore(snapshot, now)
        except Exception as exc:  # whatever a damaged file holds, the daemon starts, with detectors learning afresh
            statefile.discard(self.path, "trend state", f"{type(exc).__name__}: {str(exc)[:200]}; the detectors "
                                                        "learn afresh")
            return 0
        log.info("trend: %d series carried on from %s, saved %.0f s ago", count, self.path,
                 now - float(snapshot["saved_at"]))
        return count

    def save(self, trend: TrendAnalyzer, now: float) -> None:
        """Write ``trend``'s state atomically; a failure (full disk, read-only) is counted and logged once."""
        with self._lock:
            if not statefile.save(self.path, trend.snapshot(now)):  # logged there, once until it works
                self.save_failures += 1

    def samples(self) -> list[Sample]:
        """How many saves failed."""
        return [sample("tpuwatch_trend_state_save_failures_total", self.save_failures)]
