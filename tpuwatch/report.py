"""``tpuwatch check``: one pass of every collector, as a JSON-ready verdict and a readable table."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from tpuwatch.canary import record as chip_record
from tpuwatch.config import Config
from tpuwatch.devices.base import sources_line
from tpuwatch.drills.needs import NOT_CHECKED, blocked_drill, not_checked
from tpuwatch.health import (
    collector_problems,
    collector_warnings,
    device_problems,
    missing_problems,
    state_dir_warnings,
)
from tpuwatch.hw.units import GIB
from tpuwatch.kernel_log.collector import event_problems
from tpuwatch.plugincontext import Context
from tpuwatch.plugins import PLUGINS
from tpuwatch.registry import build_collectors, build_plugins, close, hooks
from tpuwatch.sampler import Sampler
from tpuwatch.store import SeriesStore
from tpuwatch.units import PATH_WORDS, duration, reading_texts


def check_once(config: Config) -> dict[str, Any]:
    """Sample once and judge: the ``tpuwatch check --json`` object (docs: README, Commands)."""
    collectors = build_collectors(config, persist=False)
    host_collector = collectors.by_name.get("host")
    plugins, notes = build_plugins(config, Context(collectors.inventory, None, getattr(host_collector, "pods", None),
                                                   persist=False))
    store = SeriesStore(points_per_series=2, max_series=100_000)
    devices_stage, others = collectors.stages()
    sampler = Sampler([devices_stage, [*others, *plugins.values()]], store, config.collector_deadline,
                      collectors.inventory)
    sampler.run_once()
    devices, kernel_log = collectors.devices, collectors.kernel_log
    readings = collectors.device_readings()
    events = kernel_log.recent_events() if kernel_log else []
    crashed = collectors.previous_boot.recent_events() if collectors.previous_boot else []
    problems = (device_problems(readings) + missing_problems(devices) + event_problems(events)
                + collector_problems(sampler.guards))
    if devices is not None and devices.degraded:
        problems.append(f"device backend {devices.backend.name}: {devices.degraded}")
    drill = blocked_drill(config)
    if drill is not None:
        problems.append(drill.sentence())
    current = store.current()
    now = time.time()
    added = {p.name: hook(plugins[p.name], now) for p in PLUGINS
             if p.name in plugins and (hook := hooks(p).report) is not None}
    for plugin in plugins.values():
        close(plugin)
    host = {s.name.removeprefix("tpuwatch_host_"): s.value for s in current if s.name.startswith("tpuwatch_host_")}
    holders = [{**dict(s.labels), "resident_memory_bytes": s.value} for s in current
               if s.name == "tpuwatch_holder_process_resident_memory_bytes"]
    proven = chip_record.proven(chip_record.load(chip_record.record_path(config.state_dir)))
    return {
        "status": "unhealthy" if problems else "healthy",
        "backend": devices.backend.name if devices else "none",
        "notes": collectors.notes + notes,
        "devices": [{**dataclasses.asdict(r), "proven": {p: at for (chip, p), at in sorted(proven.items())
                                                         if chip == r.device}} for r in readings],
        "host": host,
        "holders": holders,
        "collectors": [
            {"collector": g.name, "success": g.status.success, "duration_seconds": g.status.duration_seconds,
             "samples": g.status.samples, "error": g.status.last_error}
            for g in sampler.guards
        ],
        "kernel_events": [e.to_json() for e in [*crashed, *events]],
        **{name: value for name, (value, _) in added.items()},
        "problems": problems,
        "warnings": ([f"{e.message.splitlines()[0]}: {' | '.join(e.message.splitlines()[1:3])}" for e in crashed]
                     + [w for _, warnings in added.values() for w in warnings]
                     + collector_warnings(sampler.guards) + state_dir_warnings(config.state_dir)
                     + ([] if problems else not_checked(config))),
    }


def _fmt(value: Any, unit: str = "", scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value / scale:.{digits}f}{unit}"


def _proven_lines(devices: list[dict[str, Any]], now: float) -> list[str]:
    """When each chip was last proven right and by which path, as the daemon recorded it."""
    def last(proven: dict[str, float]) -> str:
        if not proven:
            return "never"
        path, at = max(proven.items(), key=lambda item: item[1])
        return f"{duration(now - at)} ago by {PATH_WORDS.get(path, path)}"

    return ["canary, last proven right (as the daemon recorded it; `tpuwatch canary` runs it now): "
            + ", ".join(f"chip {d['device']} {last(d.get('proven') or {})}" for d in devices)]


def render_check(result: dict[str, Any]) -> str:
    """The check result as a table per device and a verdict line."""
    lines = [f"backend: {result['backend']}"] + [f"  {note}" for note in result["notes"]]
    if result["devices"]:
        header = ("DEVICE", "CHIP", "PCI", "UP", "MEMORY", "UTIL", "TEMP", "POWER", "ECC CE/UE")
        rows = [header]
        for d in result["devices"]:
            texts = reading_texts(d)  # as the status page and tpuwatch top write them
            rows.append((d["device"], d["chip"], d["pci"] or "-", "yes" if d["up"] else "NO", texts["memory"],
                         texts["utilization"], texts["temperature"], texts["power"], texts["ecc"]))
        widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
        lines.append("")
        lines += ["  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
        details = [(d["device"], sources_line(d["sources"])) for d in result["devices"] if d.get("sources")]
        if details:
            lines.append("")
            lines += [f"device {device} read from {line}" for device, line in details]
        lines.append("")
        lines += _proven_lines(result["devices"], time.time())
    host = result["host"]
    if "memory_total_bytes" in host:
        lines.append("")
        lines.append(f"host: {_fmt(host.get('memory_available_bytes'), scale=GIB)} of "
                     f"{_fmt(host['memory_total_bytes'], scale=GIB)} GiB memory available")
    for h in result["holders"]:
        pod = f" in pod {h['namespace']}/{h['pod']}" if h.get("pod") else ""
        lines.append(f"holder: pid {h['pid']} ({h['command']}){pod} "
                     f"{_fmt(h['resident_memory_bytes'], scale=GIB, digits=2)} GiB resident")
    if result["kernel_events"]:
        lines.append(f"kernel log: {len(result['kernel_events'])} event(s) this boot, "
                     f"{sum(e['severity'] == 'critical' for e in result['kernel_events'])} critical")
    lines.append("collectors: " + ", ".join(
        f"{c['collector']} {'ok' if c['success'] else 'FAILED'} {c['duration_seconds'] * 1000:.1f}ms"
        for c in result["collectors"]))
    lines.append("")
    lines += [f"warning: {w}" for w in result["warnings"]]
    if result["problems"]:
        lines.append(f"UNHEALTHY: {len(result['problems'])} problem(s)")
        lines += [f"  - {p}" for p in result["problems"]]
    elif any(w in NOT_CHECKED.values() for w in result["warnings"]):
        lines.append("HEALTHY by the readings only: the drill's fault is not among them (see the warning above)")
    else:
        lines.append("HEALTHY")
    return "\n".join(lines)
