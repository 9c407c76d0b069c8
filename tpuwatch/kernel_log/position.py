"""A kernel log source's saved position: validated when loaded, never trusted blindly, saved without failing.

The position is a small JSON object under ``state_dir/kernel_log``.  One that
cannot be read, is too large, is not JSON, or has the wrong shape (a check
function names the problem) is ignored and logged once: the source starts as
if none was saved.  A save that fails (a full or read-only disk) is counted in
``failures``, logged once per outage and tried again at the next save; it
never raises, so counting never depends on a write succeeding.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpuwatch import statefile

log = logging.getLogger(__name__)

MAX_POSITION_BYTES = 4096
INT64_MAX = (1 << 63) - 1

Check = Callable[[dict[str, Any]], "str | None"]


def is_count(value: Any, limit: int = INT64_MAX) -> bool:
    """True for an int (not a bool) in ``0..limit``."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= limit


class Position:
    """Where one source saves its position (``path`` None: neither loaded nor saved)."""

    def __init__(self, path: Path | None, check: Check) -> None:
        self.path = path
        self.failures = 0
        self._check = check
        self._saved: dict[str, Any] | None = None
        self._failing = False

    def load(self) -> dict[str, Any] | None:
        """The saved position if it is usable, else None (the reason logged)."""
        if self.path is None:
            return None
        try:
            with open(self.path, "rb") as handle:
                data = handle.read(MAX_POSITION_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return self._ignore(f"cannot read it: {exc.strerror or exc}")
        if len(data) > MAX_POSITION_BYTES:
            return self._ignore(f"larger than {MAX_POSITION_BYTES} bytes")
        try:
            state = json.loads(data.decode("utf-8"))
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            return self._ignore(f"not JSON ({type(exc).__name__})")
        problem = self._check(state) if isinstance(state, dict) else f"a JSON {type(state).__name__}, not an object"
        if problem is not None:
            return self._ignore(problem)
        self._saved = state
        return state

    def _ignore(self, reason: str) -> dict[str, Any] | None:
        log.warning("kernel log: ignoring the saved position %s: %s; starting as if none was saved", self.path, reason)
        return None  # as if none was saved

    def save(self, state: dict[str, Any]) -> bool:
        """Save ``state`` atomically unless it is what was saved last; False when the write failed."""
        if self.path is None or state == self._saved:
            return True
        try:
            statefile.save(self.path, state)
        except OSError as exc:
            self.failures += 1
            if not self._failing:
                log.warning("kernel log: cannot save the read position to %s: %s (counting goes on; the save is "
                            "retried every cycle and counted in tpuwatch_kernel_log_position_save_failures_total)",
                            self.path, exc.strerror or exc)
                self._failing = True
            return False
        if self._failing:
            log.info("kernel log: read position saved again to %s after %d failed saves", self.path, self.failures)
            self._failing = False
        self._saved = dict(state)
        return True
