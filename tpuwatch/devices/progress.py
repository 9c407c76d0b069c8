"""What a chip's runtime says of its progress, and the hang detector's verdict on it: plain data.

``tpuwatch.devices.tpustatus`` parses the runtime status into these, ``tpuwatch.devices.hang`` judges them,
and a ``DeviceReading`` carries both.
"""

from __future__ import annotations

from dataclasses import dataclass

Position = tuple[int, int, int, int, int, int]  # (core, sequencer type, sequencer index, pc, program id, run id)


@dataclass(frozen=True)
class ChipStatus:
    """What the runtime status says of one chip's cores: where their sequencers are, how many programs wait,
    and the error messages of its cores as (global core id, message)."""

    positions: tuple[Position, ...]
    queued: int
    errors: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True)
class HangVerdict:
    """Whether the chip is hung, how long it has been stalled, by whom it is held and which signals agreed."""

    hung: bool
    stalled_seconds: float
    pid: int
    command: str
    evidence: tuple[str, ...] = ()
    queued: float | None = None
