"""The status document: one pure function from its readers to a plain, JSON-ready dict (docs/status.md).

It is what the page draws, what ``/api/status`` and ``/api/series`` answer, and what ``tpuwatch top`` shows.
Every list in it is bounded: the chips the backend reports, at most ``MAX_KERNEL_EVENTS`` kernel events,
``MAX_ALERTS`` alerts, ``MAX_CANARY_RUNS`` canary runs, and at most ``2 x MAX_BUCKETS`` points per series.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable
from typing import Any

from tpuwatch import __version__
from tpuwatch.analysis.leak import LeakView
from tpuwatch.canary.judge import CanaryResult, DeviceOutcome
from tpuwatch.devices.base import DeviceReading
from tpuwatch.drills.needs import blocked_drills
from tpuwatch.plugins import PLUGINS
from tpuwatch.registry import hooks
from tpuwatch.samples import Sample
from tpuwatch.views.readers import StatusReaders
from tpuwatch.views.series import decimate
from tpuwatch.views.verdict import chip_verdict, worst

VERSION = 1
SERIES = {"memory_used_bytes": "tpuwatch_device_memory_used_bytes",
          "utilization_ratio": "tpuwatch_device_utilization_ratio",
          "temperature_celsius": "tpuwatch_device_temperature_celsius"}
MAX_KERNEL_EVENTS = 20
MAX_ALERTS = 100
MAX_CANARY_RUNS = 24
MAX_BUCKETS, MIN_BUCKETS, BUCKET_BUDGET = 60, 20, 480  # per series; the budget is shared by every chip
_HOST_MEMORY = (("memory", "host"),)


def hbm_labels(device: str) -> tuple[tuple[str, str], ...]:
    """The trend analyzer's labels of a chip's device memory (tpuwatch.analysis.trend.memory_series)."""
    return (("device", device), ("memory", "hbm"))


def build_status(readers: StatusReaders, now: float, host: str) -> dict[str, Any]:
    """The status document of ``host`` at ``now`` (Unix time), read from ``readers``."""
    readings = readers.readings()
    current = readers.current()
    alerts = _sorted_alerts(readers.alerts())
    events = readers.kernel_events()
    results = readers.canary()
    window = readers.window()
    since = now - window
    buckets = max(MIN_BUCKETS, min(MAX_BUCKETS, BUCKET_BUDGET // max(1, len(readings))))
    proven: dict[str, dict[str, float]] = {}
    for s in current:
        if s.name == "tpuwatch_canary_last_success_timestamp_seconds":
            labels = dict(s.labels)
            proven.setdefault(labels.get("device", ""), {})[labels.get("path", "")] = s.value
    chips = [{**_chip(r, readers, alerts, events, results, since, now, buckets), "proven": proven.get(r.device, {})}
             for r in readings]
    counts = Counter(c["verdict"]["status"] for c in chips)
    drills = [{**dataclasses.asdict(d), "text": d.sentence()} for d in blocked_drills(current)]
    return {
        "version": VERSION,
        "host": host,
        "tpuwatch": __version__,
        "generated_at": round(now, 3),
        "window_seconds": window,
        "interval_seconds": readers.interval(),
        "status": worst([*counts, *("warning" for _ in drills)]),
        "counts": {"chips": len(chips), **{level: counts[level] for level in ("ok", "warning", "critical")}},
        "drills": drills,
        "chips": chips,
        "host_resources": _host(current, readers.leak(_HOST_MEMORY, now), now),
        "alerts": alerts[:MAX_ALERTS],
        "alerts_total": len(alerts),
        "kernel_events": [e.to_json() for e in reversed(events[-MAX_KERNEL_EVENTS:])],
        "canary_runs": [{"finished_at": r.finished_at, "path": r.path, "job": r.job, "status": r.status,
                         "reason": r.reason, "wall_seconds": r.wall_seconds}
                        for r in reversed(results[-MAX_CANARY_RUNS:])],
        "monitor": _monitor(readers.health(), current),
    }


def _chip(reading: DeviceReading, readers: StatusReaders, alerts: list[dict[str, Any]], events: list[Any],
          results: list[CanaryResult], since: float, now: float, buckets: int) -> dict[str, Any]:
    device = reading.device
    runs = _canary_runs(device, results)
    latest = next((o for _, o in reversed(runs) if o.status != "skipped"), None)
    view = readers.leak(hbm_labels(device), since)
    series_labels = (("device", device),)
    return {
        "device": device,
        "chip": reading.chip,
        "pci": reading.pci,
        "up": reading.up,
        "verdict": chip_verdict(reading, alerts, events, latest, view.state if view else None),
        "reading": _finite(dataclasses.asdict(reading)),
        "holders": _holders(reading),
        "leak": _leak(view, now) if view is not None else None,
        "canary": [{"finished_at": r.finished_at, "path": r.path, "status": o.status,
                    "duration_seconds": o.duration_seconds,
                    "max_abs_error": o.max_abs_error, "reason": o.reason, "check": o.check}
                   for r, o in reversed(runs[-MAX_CANARY_RUNS:])],
        "series": {key: decimate(readers.history(name, series_labels), since, now, buckets)
                   for key, name in SERIES.items()},
    }



def _holders(reading: Any) -> list[str] | None:
    """Who holds the chip, as "PID (command)": its device files' holders, else the processes the backend says use
    it (NVML's, the hung drill's simulated job); None where neither was looked at."""
    if reading.owners is not None:
        return list(reading.owners)
    if reading.processes is not None:
        return [f"{p.pid} ({p.command})" for p in reading.processes]
    return None

def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinity (a broken driver's answer) as None: JSON has neither."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _canary_runs(device: str, results: Iterable[CanaryResult]) -> list[tuple[CanaryResult, DeviceOutcome]]:
    """The chip's outcome in each kept run, oldest first; a run that failed before any chip counts as an error."""
    out = []
    for result in results:
        outcome = next((o for o in result.devices if o.device == device), None)
        if outcome is None and not result.devices and result.status == "error":
            outcome = DeviceOutcome(device, "error", reason=result.reason)
        if outcome is not None:
            out.append((result, outcome))
    return out


def _leak(view: LeakView, now: float) -> dict[str, Any]:
    """The detector's floor, and while a leak is suspected its forecast: from the high now, at the slope found,
    up to the capacity."""
    state = view.state
    forecast = None
    if state.firing and state.slope and state.slope > 0 and view.capacity is not None and view.high is not None:
        reach = max(0.0, (view.capacity - view.high) / state.slope)
        forecast = [[round(now, 3), view.high], [round(now + reach, 3), view.capacity]]
    return {"suspected": state.firing, "severity": state.severity, "slope_bytes_per_second": state.slope,
            "eta_seconds": state.eta, "confidence": state.confidence, "since": state.since,
            "capacity_bytes": view.capacity, "high_bytes": view.high, "floor_window_seconds": view.floor_window,
            "floor": list(view.floor), "forecast": forecast}


def _host(current: list[Sample], leak: LeakView | None, now: float) -> dict[str, Any]:
    values = {s.name.removeprefix("tpuwatch_host_"): s.value for s in current if s.name.startswith("tpuwatch_host_")}
    files: dict[str, list[str]] = {}
    for s in current:
        if s.name == "tpuwatch_device_holder_info":
            labels = dict(s.labels)
            files.setdefault(labels.get("pid", ""), []).append(labels.get("device_file", ""))
    holders = [{"pid": dict(s.labels).get("pid"), "command": dict(s.labels).get("command"),
                "resident_memory_bytes": s.value, "device_files": sorted(files.get(dict(s.labels).get("pid", ""), []))}
               for s in current if s.name == "tpuwatch_holder_process_resident_memory_bytes"]
    notices = [{"headline": headline, "text": text} for plugin in PLUGINS
               if (hook := hooks(plugin).notices) is not None for headline, text in hook(current, now)]
    return {"memory_total_bytes": values.get("memory_total_bytes"),
            "memory_available_bytes": values.get("memory_available_bytes"),
            "cpu_utilization_ratio": values.get("cpu_utilization_ratio"),
            "memory_leak_suspected": leak.state.firing if leak is not None else None,
            "holders": holders, "notices": notices}


def _monitor(health: tuple[bool, dict[str, Any]] | None, current: list[Sample]) -> dict[str, Any]:
    """tpuwatch's own health, from its /healthz report, and the notification queue per receiver."""
    queue: dict[str, dict[str, Any]] = {}
    fields = {"tpuwatch_notification_queue_length": "queued",
              "tpuwatch_notification_queue_oldest_age_seconds": "oldest_age_seconds",
              "tpuwatch_notifier_circuit_open": "circuit_open"}
    for s in current:
        if s.name in fields:
            receiver = dict(s.labels).get("receiver", "")
            queue.setdefault(receiver, {"receiver": receiver})[fields[s.name]] = s.value
    notifications = [queue[name] for name in sorted(queue)]
    if health is None:
        return {"status": None, "warnings": [], "collectors": [], "last_cycle_age_seconds": None, "state": None,
                "notifications": notifications, "uptime_seconds": None}
    _, report = health
    checks = report.get("checks", {})
    collectors = [{"collector": key.removeprefix("collector:"), "status": check.get("status"),
                   "duration_seconds": check.get("duration_seconds"), "error": check.get("error"),
                   "degraded": check.get("degraded")}
                  for key, check in checks.items() if key.startswith("collector:")]
    state = checks.get("state", {})
    return {"status": report.get("status"), "warnings": report.get("warnings", []), "collectors": collectors,
            "last_cycle_age_seconds": checks.get("sampling", {}).get("last_sample_age_seconds"),
            "state": {"writable": state.get("writable"), "dir": state.get("dir"),
                      "alerting_db": state.get("alerting_db")} if state else None,
            "notifications": notifications, "uptime_seconds": report.get("uptime_seconds")}


def _sorted_alerts(alerts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Firing before pending, critical before warning, then oldest first (the order they came in)."""
    def key(alert: dict[str, Any]) -> tuple[int, int]:
        return (0 if alert.get("state") == "firing" else 1,
                0 if alert.get("labels", {}).get("severity") == "critical" else 1)
    return sorted(alerts, key=key)


def api_status(document: dict[str, Any]) -> dict[str, Any]:
    """``/api/status``: the document without the recorded series and the leak floor (``/api/series`` has them)."""
    chips = [{**{k: v for k, v in chip.items() if k != "series"},
              "leak": {k: v for k, v in chip["leak"].items() if k != "floor"} if chip["leak"] else None}
             for chip in document["chips"]]
    return {**document, "chips": chips}


def api_series(document: dict[str, Any]) -> dict[str, Any]:
    """``/api/series``: per chip, the points the page plots, and the leak floor and forecast."""
    return {"version": document["version"], "generated_at": document["generated_at"],
            "window_seconds": document["window_seconds"],
            "chips": [{"device": chip["device"], "series": chip["series"],
                       "leak_floor": chip["leak"]["floor"] if chip["leak"] else [],
                       "leak_forecast": chip["leak"]["forecast"] if chip["leak"] else None}
                      for chip in document["chips"]]}
