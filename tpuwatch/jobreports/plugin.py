"""The probe socket as a plugin: its config section, metrics and fire drill."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from tpuwatch.metricspec import MetricSpec
from tpuwatch.pluginspec import Drill, Plugin
from tpuwatch.probewire import DEFAULT_SOCKET, MAX_REPORT_BYTES
from tpuwatch.schema import Duration, FilePath, Range


@dataclass(frozen=True)
class ProbeConfig:
    """The socket in-job probes (tpuwatch.probe) report to, and what one process may send (docs/probe.md)."""

    enabled: bool = True
    socket: Annotated[str, FilePath()] = DEFAULT_SOCKET
    max_report_bytes: Annotated[int, Range(1024, MAX_REPORT_BYTES)] = MAX_REPORT_BYTES
    reports_per_minute: Annotated[int, Range(1, 600)] = 12  # per process; as many may come at once
    max_connections: Annotated[int, Range(1, 1024)] = 32
    read_timeout: Annotated[float, Duration(minimum=0.1, maximum=60.0)] = 2.0
    # Reports of other processes this recent are the chips' peers (their fingerprints count in the majority).
    peer_window: Annotated[float, Duration(minimum=1.0)] = 900.0


PLUGIN = Plugin(
    name="probe",
    settings=ProbeConfig,
    hooks="tpuwatch.jobreports.hooks",
    metrics=(
        MetricSpec("tpuwatch_probe_socket_up", "gauge",
                   "1 while the daemon listens for in-job probe reports on probe.socket, 0 if it cannot."),
        MetricSpec("tpuwatch_probe_reports_total", "counter", "Probe reports accepted, judged and recorded."),
        MetricSpec("tpuwatch_probe_reports_rejected_total", "counter",
                   "Probe reports refused, by reason (busy, rate_limited, timeout, oversized, malformed, "
                   "not_holder, unknown_chip).", ("reason",)),
    ),
    rebuild_on=("paths", "state_dir", "devices"),
    # The simulated job (drill.py) holds the simulated chips' device files and reports a wrong result on one.
    drills=(Drill("probe-sdc", "probe",
                  lambda section: None if section.enabled else "probe.enabled is false",
                  needs_jax=True, device_files=True,
                  not_checked="`tpuwatch check` starts no job, and only the in-job probe of a running one sees the "
                              "probe-sdc drill's wrong numbers: `tpuwatch run --simulate probe-sdc` runs it"),),
    uses_canary_book=lambda section: section.enabled,
)
