"""The maintenance plugin's hooks: which cloud this VM is on, and what its notices add to each view."""

from __future__ import annotations

import logging
from typing import Any

from tpuwatch.cloud.collector import MaintenanceCollector, MaintenanceDrill, read_dmi
from tpuwatch.cloud.ec2 import Ec2Watch
from tpuwatch.cloud.events import describe, detect
from tpuwatch.cloud.gce import GceWatch
from tpuwatch.cloud.plugin import MaintenanceConfig
from tpuwatch.cloud.watch import Watch
from tpuwatch.config import Config
from tpuwatch.plugincontext import Context
from tpuwatch.samples import Sample

log = logging.getLogger(__name__)

FIRST_ANSWER_SHARE = 0.5  # of the collector deadline, waited once for the first answers


def build(config: Config, context: Context) -> tuple[MaintenanceCollector | None, str]:
    """The maintenance source ``config`` asks for, and one sentence on what was chosen (logged)."""
    collector, note = _choose(config)
    log.info("%s", note)
    return collector, note


def _choose(config: Config) -> tuple[MaintenanceCollector | None, str]:
    settings = config.section(MaintenanceConfig)
    first_wait = config.collector_deadline * FIRST_ANSWER_SHARE
    sim = config.devices.sim
    if config.drill == "maintenance" and settings.cloud != "off":
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


def healthz(collector: MaintenanceCollector, now: float) -> dict[str, Any]:
    """The /healthz check: whether maintenance is scheduled, and each notice."""
    notices = collector.notices()
    return {"status": "scheduled" if notices else "none",
            "notices": [{**n.to_json(), "text": n.sentence(now)} for n in notices]}


def report(collector: MaintenanceCollector, now: float) -> tuple[Any, list[str]]:
    """``tpuwatch check``'s ``maintenance`` list, and one warning per pending maintenance."""
    notices = collector.notices()
    return [n.to_json() for n in notices], [f"{n.cloud} maintenance scheduled: {n.sentence(now)}" for n in notices]


def notices(current: list[Sample], now: float) -> list[tuple[str, str]]:
    """The status page's and ``tpuwatch top``'s lines, from the store: (headline, details) per notice."""
    return [(f"{dict(s.labels).get('cloud', '')} maintenance scheduled", describe(dict(s.labels), now))
            for s in current if s.name == "tpuwatch_maintenance_scheduled"]
