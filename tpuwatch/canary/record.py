"""What the daemon remembers of each chip's canary across restarts: ``state_dir/canary/proven.json``.

Per chip: when it was last proven right by each path (scheduled, job), how
many runs found it deviating (fail or suspect: a repeat offender shows), and
whether a confirmed wrong result still holds it unhealthy.  A chip that
computed wrong numbers stays unhealthy until CLEAN_TO_CLEAR clean runs in a
row, never on a restart alone.  ``tpuwatch check`` reads the same file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tpuwatch import statefile

PATHS = ("scheduled", "job")
CLEAN_TO_CLEAR = 3
_FIELDS = (*PATHS, "deviations", "clean", "unhealthy")
SHAPE = statefile.MapOf(statefile.MapOf(statefile.Int(), max_items=len(_FIELDS), key_chars=16),
                        max_items=4096, key_chars=8)
Proven = dict[tuple[str, str], float]  # (chip, path) -> Unix time


def record_path(state_dir: str) -> Path:
    """Where the daemon keeps its chips' canary record."""
    return Path(state_dir) / "canary" / "proven.json"


@dataclass
class ChipRecord:
    """One chip's lasting canary state."""

    proven: dict[str, float] = field(default_factory=dict)  # path -> Unix time last proven right
    deviations: int = 0
    clean: int = 0
    unhealthy: bool = False

    def saw(self, status: str, path: str, at: float) -> None:
        """Take one measured outcome (pass, slow, fail, suspect, error) on ``path`` at ``at``."""
        if status in ("pass", "slow"):
            self.proven[path] = at
            self.clean += 1
            if self.clean >= CLEAN_TO_CLEAR:
                self.unhealthy = False
        elif status in ("fail", "suspect"):
            self.deviations += 1
            self.clean = 0
            self.unhealthy = self.unhealthy or status == "fail"


def load(path: Path | None) -> dict[str, ChipRecord]:
    """The records at ``path`` (none when it is missing or unfit, or for None)."""
    found = statefile.load(path, "canary chip record", SHAPE) or {} if path is not None else {}
    return {chip: ChipRecord({p: float(v[p]) for p in PATHS if p in v}, v.get("deviations", 0), v.get("clean", 0),
                             bool(v.get("unhealthy", 0))) for chip, v in found.items()}


def save(path: Path | None, records: dict[str, ChipRecord]) -> None:
    """Write ``records`` (a full or read-only disk is logged once by statefile and otherwise survived)."""
    statefile.save(path, {chip: {**{p: int(at) for p, at in r.proven.items()}, "deviations": r.deviations,
                                 "clean": r.clean, "unhealthy": int(r.unhealthy)} for chip, r in records.items()})


def proven(records: dict[str, ChipRecord]) -> Proven:
    """(chip, path) -> when the chip was last proven right on that path."""
    return {(chip, p): at for chip, r in records.items() for p, at in r.proven.items()}
