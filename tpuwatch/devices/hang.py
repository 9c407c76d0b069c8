"""Hang detection: a chip held by a process that makes no progress while work waits for it.

No public document says what a hung TPU core looks like, so the verdict combines the signals libtpu's
runtime gives, each of which can be turned off (``devices.hang``), and asks all of those present to agree:

- ``sequencers``: the status RPC's sequencer positions (pc, program id, run id of every sequencer of the
  chip's cores) unchanged since the previous read, while programs are queued;
- ``duty_cycle``: the TensorCore duty cycle at or below ``duty_cycle_below``;
- ``tensorcore_idle``: the TensorCore idle duration grown by at least half the time between two reads;
  one that went down shows the core worked (it restarts from 0), one that did not move says nothing (the
  runtime may update it less often than tpuwatch reads);
- ``hlo_execution``: the HLO execution timing distribution empty (count 0; a changed count is progress,
  an unchanged non-zero one says nothing, as the distribution may be a window).

A chip is *stalled* on a read when a process holds it, work waits for it (programs queued in the status,
or an HLO queue above 0; with ``require_queued`` off, unknown will do), at least one signal is present and
no present signal shows progress.  An absent signal (older libtpu, a metric not answered) counts neither
way; nothing queued means idle, not hung: a job in host code (input pipeline, checkpoint) holds its chip
without using it.  A chip stalled without a break for ``after`` is hung.  The judgement is pure: the
previous ``Track`` and one ``Observation`` in, the next track and a ``HangVerdict`` out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from tpuwatch.config import HangConfig
from tpuwatch.devices.base import DeviceReading
from tpuwatch.devices.progress import ChipStatus, HangVerdict, Position

Signal = Literal["progress", "stalled"]


@dataclass(frozen=True)
class Observation:
    """What one read says of one chip; None where the runtime did not say."""

    holder: tuple[int, str] | None      # (pid, command) of the process holding the chip
    status: ChipStatus | None = None
    utilization: float | None = None
    idle_seconds: float | None = None
    hlo_queue: float | None = None
    hlo_executions: float | None = None


@dataclass(frozen=True)
class Track:
    """What the detector keeps of a chip between reads."""

    at: float
    holder: int
    stalled_since: float | None
    positions: tuple[Position, ...] | None
    idle_seconds: float | None
    hlo_executions: float | None



def signals(previous: Track | None, obs: Observation, now: float, config: HangConfig) -> dict[str, Signal]:
    """The signals present on this read, each progress or stalled (absent ones left out)."""
    found: dict[str, Signal] = {}
    if config.sequencers and obs.status is not None and obs.status.positions and previous is not None \
            and previous.positions is not None:
        found["sequencers"] = "stalled" if obs.status.positions == previous.positions else "progress"
    if config.duty_cycle and obs.utilization is not None:
        found["duty_cycle"] = "stalled" if obs.utilization <= config.duty_cycle_below else "progress"
    if config.tensorcore_idle and obs.idle_seconds is not None and previous is not None \
            and previous.idle_seconds is not None and now > previous.at:
        grown = obs.idle_seconds - previous.idle_seconds
        if grown < 0:
            found["tensorcore_idle"] = "progress"
        elif grown > 0 and grown >= 0.5 * (now - previous.at):
            found["tensorcore_idle"] = "stalled"
    if config.hlo_execution and obs.hlo_executions is not None:
        if obs.hlo_executions == 0:
            found["hlo_execution"] = "stalled"
        elif previous is not None and previous.hlo_executions is not None \
                and obs.hlo_executions != previous.hlo_executions:
            found["hlo_execution"] = "progress"
    return found


def queued(obs: Observation) -> float | None:
    """Programs waiting for the chip: the status's queued programs or the HLO queue, the larger; None unknown."""
    known = [q for q in (obs.status.queued if obs.status else None, obs.hlo_queue) if q is not None]
    return max(known) if known else None


def judge(previous: Track | None, obs: Observation, now: float,
          config: HangConfig) -> tuple[Track | None, HangVerdict | None]:
    """The next track and the verdict; (None, None) where the chip is not held or nothing can be judged."""
    if obs.holder is None or not config.enabled:
        return None, None
    pid, command = obs.holder
    if previous is not None and previous.holder != pid:
        previous = None  # another process: its history is not this one's
    found = signals(previous, obs, now, config)
    waiting = queued(obs)
    work_waits = waiting > 0 if waiting is not None else not config.require_queued
    stalled = work_waits and bool(found) and "progress" not in found.values()
    since = None
    if stalled:
        since = previous.stalled_since if previous is not None and previous.stalled_since is not None else (
            previous.at if previous is not None else now)
    track = Track(now, pid, since, obs.status.positions if obs.status is not None else None, obs.idle_seconds,
                  obs.hlo_executions)
    if not found and waiting is None:
        return track, None
    stalled_for = now - since if since is not None else 0.0
    return track, HangVerdict(since is not None and stalled_for >= config.after, stalled_for, pid, command,
                              tuple(sorted(found)) if stalled else (), waiting)


def observe(reading: DeviceReading) -> Observation:
    """A reading's signals; the holder is the process whose runtime answers for the chip, else the first."""
    processes = reading.processes or ()
    holder = next((p for p in processes if p.device_memory_bytes is not None), processes[0] if processes else None)
    executions = reading.hlo_execution_seconds
    return Observation((holder.pid, holder.command) if holder else None, reading.runtime_status,
                       reading.utilization_ratio, reading.tensorcore_idle_seconds, reading.hlo_queue_size,
                       executions.count if executions is not None else None)


class HangWatch:
    """The detector over every chip's readings, keeping one track per chip that is held."""

    def __init__(self, config: HangConfig) -> None:
        self.config = config
        self._tracks: dict[str, Track] = {}

    def apply(self, readings: list[DeviceReading], now: float) -> list[DeviceReading]:
        """The readings with their hang verdicts; tracks of chips no longer held are dropped."""
        out, tracks = [], {}
        for reading in readings:
            track, verdict = judge(self._tracks.get(reading.device), observe(reading), now, self.config)
            if track is not None:
                tracks[reading.device] = track
            out.append(replace(reading, hang=verdict) if verdict is not None else reading)
        self._tracks = tracks
        return out
