"""Verdicts on the latest readings (what is wrong, and on which chip) and the daemon's /healthz report.

A view: it reads the running parts and changes nothing.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from tpuwatch import __version__, statefile
from tpuwatch.collectors import GuardedCollector
from tpuwatch.devices import DeviceReading
from tpuwatch.devices.collector import DeviceCollector
from tpuwatch.drills.needs import blocked_drills
from tpuwatch.hw.recovery import action_words
from tpuwatch.kernel_log.collector import event_problems
from tpuwatch.plugins import PLUGINS
from tpuwatch.registry import hooks
from tpuwatch.statedir import StateDir, holder, probe
from tpuwatch.units import celsius, duration

if TYPE_CHECKING:
    from tpuwatch.assembly import Parts

TEMPERATURE_LIMIT_C = 85.0
MEMORY_FULL_RATIO = 0.98


def device_problems(readings: Iterable[DeviceReading]) -> list[str]:
    """One sentence per problem seen on a chip."""
    problems = []
    for r in readings:
        where = f"device {r.device} ({r.chip}{', pci ' + r.pci if r.pci else ''})"
        if not r.up:
            problems.append(f"{where} is down: {r.problem}" if r.problem else f"{where} is down or lost")
            continue
        if r.status is not None and r.status != "ALIVE":
            problems.append(f"{where}: driver status {r.status}")
        if r.row_remap_failed:
            problems.append(f"{where}: row remapping failed (memory cannot be repaired, replace the GPU)")
        elif r.memory_repair_pending:
            problems.append(f"{where}: memory repair pending (page retirement or row remap needs a GPU reset)")
        if r.recovery_action:
            problems.append(f"{where}: the driver asks for a recovery action: {action_words(r.recovery_action)}")
        if r.fabric is not None and r.fabric.problem:
            problems.append(f"{where}: {r.fabric.problem}")
        problems += [f"{where}: {field} could not be read ({error})" for field, error in sorted(r.read_errors.items())]
        if r.ecc_uncorrected_total:
            problems.append(f"{where}: {int(r.ecc_uncorrected_total)} uncorrectable ECC error(s) "
                            "since the driver loaded")
        if r.temperature_celsius is not None and r.temperature_celsius >= TEMPERATURE_LIMIT_C:
            problems.append(f"{where}: temperature {celsius(r.temperature_celsius)} "
                            f"(limit {celsius(TEMPERATURE_LIMIT_C)})")
        for sensor in r.sensors or ():
            if sensor.margin_celsius <= 0:
                limit = sensor.celsius + sensor.margin_celsius
                problems.append(f"{where}: {sensor.sensor} temperature {celsius(sensor.celsius)} at or over its "
                                f"limit {celsius(limit)} ({sensor.limit_source})")
        if r.memory_used_bytes is not None and r.memory_total_bytes:
            ratio = r.memory_used_bytes / r.memory_total_bytes
            if ratio >= MEMORY_FULL_RATIO:
                problems.append(f"{where}: memory {ratio:.0%} full")
        if r.hang is not None and r.hang.hung:
            problems.append(f"{where}: hung: no progress for {duration(r.hang.stalled_seconds)}"
                            + (f" with {r.hang.queued:g} program(s) queued" if r.hang.queued else "")
                            + f" ({', '.join(r.hang.evidence)}), held by process {r.hang.pid} ({r.hang.command})")
        for core, error in r.runtime_status.errors if r.runtime_status is not None else ():
            problems.append(f"{where}: libtpu runtime reports an error on core {core}: {error}")
    return problems


def missing_problems(devices: DeviceCollector | None) -> list[str]:
    """The sentence naming the expected chips the backend does not report (devices.expected), if any."""
    return [devices.missing_problem] if devices is not None and devices.missing_problem else []


def collector_problems(guards: Iterable[GuardedCollector]) -> list[str]:
    """One sentence per collector whose last run failed."""
    return [f"collector {g.name} failed: {g.status.last_error}" for g in guards if g.status.success is False]


def collector_warnings(guards: Iterable[GuardedCollector]) -> list[str]:
    """One sentence per collector that runs but cannot see everything it should (degraded)."""
    return [f"collector {g.name} degraded: {g.status.degraded}" for g in guards
            if g.status.degraded and g.status.success is not False]


DISCARD_NOTICE_S = 3600.0  # a state file found unfit keeps the status degraded this long


def state_warnings(state_dir: str, reason: str | None, db_problem: str | None, failing: dict[str, str],
                   discarded: Iterable[tuple[float, str, str]], now: float) -> list[str]:
    """One sentence per state trouble: state_dir unwritable, alert state in memory, a file not saved, one that
    was found unfit (discarded) within the last hour.  Monitoring goes on through all of them."""
    out = []
    if reason is not None:
        out.append(f"state_dir {state_dir} cannot be written ({reason}): state is kept in memory, "
                   "and lost at a restart")
    elif db_problem is not None:
        out.append(f"alert state and outbox kept in memory: {db_problem}")
    if reason is None:
        out += [f"state file {path} not saved: {why}" for path, why in sorted(failing.items())]
    out += [f"state file {path} not used ({why}), {now - at:.0f} s ago" for at, path, why in discarded
            if now - at <= DISCARD_NOTICE_S]
    return out


def state_dir_warnings(state_dir: str) -> list[str]:
    """For ``tpuwatch check``, which writes nothing: whether a daemon could keep its state in ``state_dir``."""
    problem = probe(state_dir, create=False)
    if problem is None:
        return []
    running = holder(state_dir)
    return [f"state_dir {state_dir} cannot be written ({problem}): "
            + (f"the daemon (pid {running}) keeps its state in memory" if running else
               "a daemon would keep its state in memory only")]


def sampling_fresh(parts: Parts, now: float) -> bool:
    """Whether a sampling cycle ended recently enough (three intervals and a deadline)."""
    last = parts.sampler.last_cycle_end
    return last is not None and now - last <= 3 * parts.config.interval + parts.config.collector_deadline


def status_line(parts: Parts) -> str:
    """systemd's STATUS=: chips up and how many problems."""
    devices = parts.device_readings()
    up = sum(1 for r in devices if r.up)
    problems = (device_problems(devices) + missing_problems(parts.collectors.devices)
                + collector_problems(parts.sampler.guards))
    state = f"{len(problems)} problem(s)" if problems else "healthy"
    return f"{up}/{len(devices)} devices up, {state}"


def state_writable(parts: Parts, state: StateDir) -> bool:
    """True when state is kept on disk (state_dir writable and the alert database in its file)."""
    return state.writable and not parts.alerting.db.in_memory


def state_check(parts: Parts, state: StateDir, now: float) -> dict[str, Any]:
    """The ``state`` entry of /healthz: where state is kept and what went wrong with it."""
    failing, discarded, _ = statefile.LEDGER.view()
    warnings = state_warnings(state.path, state.reason, parts.alerting.state_problem, failing, discarded, now)
    return {"status": "degraded" if warnings else "ok", "dir": state.path, "writable": state_writable(parts, state),
            "reason": state.reason, "alerting_db": "memory" if parts.alerting.db.in_memory else "file",
            "warnings": warnings,
            "discarded": [{"file": path, "at": at, "reason": why} for at, path, why in discarded]}


RELOAD_ERROR_CHARS = 300  # of a refused reload's reason, in /healthz


def health_report(parts: Parts, state: StateDir, reload_ok: bool, started_at: float,
                  reload_error: str | None = None) -> tuple[bool, dict[str, Any]]:
    """(healthy, report) for /healthz: healthy means tpuwatch itself can monitor; degraded, that it can but
    misses something (each in ``warnings``), a refused reload included (``reload_error``: why)."""
    now = time.time()
    fresh = sampling_fresh(parts, now)
    last = parts.sampler.last_cycle_end
    checks: dict[str, Any] = {
        "sampling": {"status": "ok" if fresh else "stale",
                     "last_sample_age_seconds": round(now - last, 3) if last else None},
        "config": {"status": "ok" if reload_ok else "reload_failed",
                   **({} if reload_ok or reload_error is None else {"error": reload_error[:RELOAD_ERROR_CHARS]})},
    }
    for guard in parts.sampler.guards:
        status = {True: "ok", False: "failing", None: "pending"}[guard.status.success]
        checks[f"collector:{guard.name}"] = {
            "status": "degraded" if status == "ok" and guard.status.degraded else status,
            "duration_seconds": round(guard.status.duration_seconds, 6),
            "error": guard.status.last_error,
            **({"degraded": guard.status.degraded} if guard.status.degraded else {}),
        }
    problems = device_problems(parts.device_readings()) + missing_problems(parts.collectors.devices)
    checks["devices"] = {"status": "problems" if problems else "ok", "problems": problems}
    previous_boot = parts.collectors.previous_boot
    if previous_boot is not None:
        crashed = previous_boot.recent_events()
        checks["previous_boot"] = {"status": "crashed" if crashed else "ok",
                                   "events": [e.to_json() for e in crashed]}
    kernel_log = parts.collectors.kernel_log
    if kernel_log is not None:
        events = kernel_log.recent_events()
        checks["kernel_log"] = {"status": "critical_events" if event_problems(events) else "ok",
                                "recent_events": [e.to_json() for e in events]}
    for plugin in PLUGINS:
        collector, check = parts.plugins.get(plugin.name), hooks(plugin).healthz
        if collector is not None and check is not None:
            checks[plugin.name] = check(collector, now)
    checks["state"] = state_check(parts, state, now)
    drills = blocked_drills(parts.store.current())
    if drills:
        checks["drill"] = {"status": "cannot_run", "drills": [dataclasses.asdict(d) for d in drills]}
    healthy = fresh and all(g.status.success for g in parts.sampler.guards)
    refused = [] if reload_ok else [
        "config reload refused, the config loaded before still runs"
        + (f": {reload_error[:RELOAD_ERROR_CHARS]}" if reload_error else "")
        + " (fix the file, `tpuwatch config check`, and reload again)"]
    warnings = (refused + collector_warnings(parts.sampler.guards) + [d.sentence() for d in drills]
                + checks["state"]["warnings"])
    report = {"status": ("degraded" if warnings else "healthy") if healthy else "unhealthy", "warnings": warnings,
              "uptime_seconds": round(now - started_at, 3), "version": __version__, "checks": checks}
    return healthy, report
