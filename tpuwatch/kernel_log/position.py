"""A kernel log source's saved position: validated when loaded, never trusted blindly, saved without failing.

The position is a small JSON object under ``state_dir/kernel_log``.  One that
cannot be read, is too large, is not JSON, or has the wrong shape (a check
function names the problem) is ignored, logged and recorded as discarded
(``statefile``): the source starts as if none was saved.  A save that fails (a
full or read-only disk) is counted in ``failures``, logged once per outage and
tried again at the next save; it never raises, so counting never depends on a
write succeeding.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpuwatch import statefile

MAX_POSITION_BYTES = 4096
WHAT = "kernel log position"
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

    def load(self) -> dict[str, Any] | None:
        """The saved position if it is usable, else None (the reason logged and recorded as discarded)."""
        state = statefile.load(self.path, WHAT, shape=None, max_bytes=MAX_POSITION_BYTES)
        problem = self._check(state) if state is not None else None
        if problem is not None:
            statefile.discard(self.path, WHAT, f"wrong shape: {problem}")  # type: ignore[arg-type] # path is set
            return None
        self._saved = state
        return state

    def save(self, state: dict[str, Any]) -> bool:
        """Save ``state`` atomically unless it is what was saved last; False when the write failed (counted)."""
        if self.path is None or state == self._saved:
            return True
        if not statefile.save(self.path, state):  # logged once per outage there
            self.failures += 1
            return False
        self._saved = dict(state)
        return True
