"""Verdicts on the latest readings: what is wrong, and on which chip."""

from __future__ import annotations

from collections.abc import Iterable

from tpuwatch.collectors import GuardedCollector
from tpuwatch.devices import DeviceReading
from tpuwatch.statedir import holder, probe

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
        if r.ecc_uncorrected_total:
            problems.append(f"{where}: {int(r.ecc_uncorrected_total)} uncorrectable ECC error(s) "
                            "since the driver loaded")
        if r.temperature_celsius is not None and r.temperature_celsius >= TEMPERATURE_LIMIT_C:
            problems.append(f"{where}: temperature {r.temperature_celsius:.1f} C "
                            f"(limit {TEMPERATURE_LIMIT_C:.0f} C)")
        if r.memory_used_bytes is not None and r.memory_total_bytes:
            ratio = r.memory_used_bytes / r.memory_total_bytes
            if ratio >= MEMORY_FULL_RATIO:
                problems.append(f"{where}: memory {ratio:.0%} full")
    return problems


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
