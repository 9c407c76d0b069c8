"""The maintenance source: which cloud this VM is on, its watcher, and the notices as samples.

The watcher's threads do the talking; ``collect()`` only reads what they hold, so sampling never waits on a
metadata server (the first cycle waits, within the collector's deadline, for the first answers).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from tpuwatch.cloud.ec2 import Ec2Watch
from tpuwatch.cloud.events import Maintenance, detect
from tpuwatch.cloud.gce import GceWatch
from tpuwatch.cloud.standin import MetadataStandIn
from tpuwatch.cloud.watch import RESULTS, Watch
from tpuwatch.config import Config
from tpuwatch.samples import Sample, sample

log = logging.getLogger(__name__)

DMI_FILES = ("product_name", "sys_vendor", "product_uuid", "board_asset_tag")
FIRST_ANSWER_SHARE = 0.5  # of the collector deadline, waited once for the first answers
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


def problems(notices: list[Maintenance], now: float) -> list[str]:
    """One sentence per pending maintenance, for ``check`` and the status page."""
    return [f"{n.cloud} maintenance scheduled: {n.sentence(now)}" for n in notices]


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


def build(config: Config) -> tuple[MaintenanceCollector | None, str]:
    """The maintenance source ``config`` asks for, and one sentence on what was chosen (logged)."""
    collector, note = _choose(config)
    log.info("%s", note)
    return collector, note


def _choose(config: Config) -> tuple[MaintenanceCollector | None, str]:
    settings = config.maintenance
    first_wait = config.collector_deadline * FIRST_ANSWER_SHARE
    sim = config.devices.sim
    if config.devices.backend == "sim" and sim.scenario == "maintenance" and settings.cloud != "off":
        drill = MaintenanceDrill(sim.fault_after)
        return (MaintenanceCollector(GceWatch(settings, drill.standin.host), first_wait, drill),
                f"maintenance: drill, a stand-in Compute Engine metadata server at {drill.standin.host} announces "
                f"a window {sim.fault_after:g}s into the run")
    cloud: str = settings.cloud
    why = "maintenance.cloud"
    if cloud == "auto":
        found = detect(read_dmi(config.paths.sysfs))
        if found is None:
            return None, f"maintenance: off (no Compute Engine or EC2 in {config.paths.sysfs}/class/dmi/id)"
        cloud, why = found, f"DMI under {config.paths.sysfs}/class/dmi/id"
    if cloud == "off":
        return None, "maintenance: off (maintenance.cloud)"
    try:
        watch: Watch = GceWatch(settings) if cloud == "gce" else Ec2Watch(settings)
    except ValueError as exc:  # an environment variable naming no usable address
        return None, f"maintenance: off ({exc})"
    where = watch.link.base
    what = ("watching maintenance-event and upcoming-maintenance" if cloud == "gce"
            else f"polling scheduled events every {settings.poll_interval:g}s")
    return MaintenanceCollector(watch, first_wait), f"maintenance: {cloud} ({why}), {what} at {where}"
