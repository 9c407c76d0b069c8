"""The maintenance source: its watcher's notices as samples, and the drill's stand-in metadata server.

The watcher's threads do the talking; ``collect()`` only reads what they hold, so sampling never waits on a
metadata server (the first cycle waits, within the collector's deadline, for the first answers).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tpuwatch.cloud.events import Maintenance
from tpuwatch.cloud.standin import MetadataStandIn
from tpuwatch.cloud.watch import RESULTS, Watch
from tpuwatch.samples import Sample, sample

DMI_FILES = ("product_name", "sys_vendor", "product_uuid", "board_asset_tag")
DRILL_WINDOW_IN_S = 2 * 3600.0 + 20 * 60.0
DRILL_WINDOW_S = 4 * 3600.0


def read_dmi(sysfs: str) -> dict[str, str]:
    """The DMI id files tpuwatch tells clouds by, under ``sysfs``/class/dmi/id (those readable, 256 bytes each)."""
    out = {}
    for name in DMI_FILES:
        try:
            with open(Path(sysfs, "class", "dmi", "id", name), "rb") as handle:
                out[name] = handle.read(256).decode("utf-8", "replace")
        except OSError:
            continue
    return out


class MaintenanceCollector:
    """``tpuwatch_maintenance_*`` from a cloud's watcher."""

    name = "maintenance"

    def __init__(self, watch: Watch, first_wait: float, drill: MaintenanceDrill | None = None) -> None:
        self.watch, self.first_wait, self.drill = watch, first_wait, drill
        self._waited = False
        watch.start()

    @property
    def degraded(self) -> str | None:
        """Why the notices may be stale: the metadata server failing."""
        return self.watch.degraded()

    def notices(self) -> list[Maintenance]:
        """The pending maintenance."""
        return self.watch.notices()

    def collect(self) -> list[Sample]:
        """The notices and the failures counted so far."""
        if not self._waited:
            self.watch.answered.wait(self.first_wait)
            self._waited = True
        cloud = self.watch.cloud
        out = [sample("tpuwatch_maintenance_errors_total", self.watch.errors[r], cloud=cloud, result=r)
               for r in RESULTS]
        for notice in self.notices():
            labels = notice.labels()
            out.append(sample("tpuwatch_maintenance_scheduled", 1, **labels))
            if notice.start is not None:
                out.append(sample("tpuwatch_maintenance_start_timestamp_seconds", notice.start,
                                  **{k: v for k, v in labels.items() if k in ("cloud", "kind", "event_id")}))
        return out

    def close(self) -> None:
        """Stop the watcher (and the drill's stand-in server)."""
        self.watch.stop()
        if self.drill is not None:
            self.drill.close()


class MaintenanceDrill:
    """``--simulate maintenance``: a stand-in Compute Engine metadata server in the daemon, which announces a
    terminating maintenance window ``fault_after`` into the run; the real watcher reads it."""

    def __init__(self, fault_after: float) -> None:
        self.standin = MetadataStandIn()
        self.standin.set_gce("scheduling/on-host-maintenance", 200, b"TERMINATE")
        self._timer = threading.Timer(fault_after, self._announce)
        self._timer.daemon = True
        self._timer.start()

    def _announce(self) -> None:
        start = time.time() + DRILL_WINDOW_IN_S
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start))
        end = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start + DRILL_WINDOW_S))
        body = (f'{{"type": "SCHEDULED", "can_reschedule": false, "window_start_time": "{stamp}", '
                f'"window_end_time": "{end}", "maintenance_status": "PENDING"}}').encode()
        self.standin.set_gce("upcoming-maintenance", 200, body)

    def close(self) -> None:
        """Stop the timer and the server."""
        self._timer.cancel()
        self.standin.close()
