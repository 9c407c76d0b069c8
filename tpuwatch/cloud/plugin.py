"""The maintenance notices as a plugin: their config section, metrics, node condition and fire drill."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from tpuwatch.metricspec import MetricSpec
from tpuwatch.pluginspec import Condition, Drill, Plugin
from tpuwatch.schema import Duration


@dataclass(frozen=True)
class MaintenanceConfig:
    """The cloud's maintenance notices for this VM, from its metadata server (docs/maintenance.md)."""

    cloud: Literal["auto", "gce", "ec2", "off"] = "auto"
    watch_timeout: Annotated[float, Duration(minimum=1.0, maximum=3600.0)] = 60.0
    poll_interval: Annotated[float, Duration(minimum=1.0, maximum=86400.0)] = 300.0
    request_timeout: Annotated[float, Duration(minimum=0.1, maximum=60.0)] = 5.0
    retry_max: Annotated[float, Duration(minimum=1.0, maximum=3600.0)] = 300.0
    # HostMaintenanceScheduled on the Node while a notice is pending (needs kubernetes.node_conditions): off by
    # default, as a notice is not a fault and a True condition is what remediation ladders and schedulers act on.
    node_condition: bool = False


PLUGIN = Plugin(
    name="maintenance",
    settings=MaintenanceConfig,
    hooks="tpuwatch.cloud.hooks",
    metrics=(
        MetricSpec("tpuwatch_maintenance_scheduled", "gauge",
                   "1 while the cloud announces maintenance for this VM: kind (migrate, terminate, reboot, stop, "
                   "retirement, maintenance, scheduled), the window in words and its start (Unix seconds) where "
                   "known.", ("cloud", "kind", "event", "event_id", "window", "start")),
        MetricSpec("tpuwatch_maintenance_start_timestamp_seconds", "gauge",
                   "Start of the announced maintenance window (absent when the cloud gives none).",
                   ("cloud", "kind", "event_id")),
        MetricSpec("tpuwatch_maintenance_errors_total", "counter",
                   "Failed requests to the cloud's metadata server by result (timeout, unreachable, too_large, "
                   "http_error, garbage).", ("cloud", "result")),
    ),
    rebuild_on=("paths", "collector_timeout", "interval", "devices"),
    conditions=(Condition("HostMaintenanceScheduled", (("MaintenanceScheduled", "MaintenanceScheduled"),),
                          "node_condition"),),
    # The notice comes from a stand-in metadata server the daemon starts (hooks.MaintenanceDrill).
    drills=(Drill("maintenance", "maintenance source",
                  lambda section: "maintenance.cloud is off" if section.cloud == "off" else None),),
)
