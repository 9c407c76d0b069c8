"""Small JSON state files under the state directory, written atomically so that a crash never leaves half a file."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def save(path: Path | None, state: dict[str, Any]) -> None:
    """Write ``state`` as JSON to ``path`` atomically (temp file, fsync, rename); nothing for None."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(path.name + ".tmp")
    try:
        with open(temp, "w", encoding="utf-8") as handle:
            json.dump(state, handle, separators=(",", ":"))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except OSError:
        temp.unlink(missing_ok=True)  # a full disk keeps no half-written file
        raise


def load(path: Path | None, what: str) -> dict[str, Any] | None:
    """The state saved at ``path``; None if there is none or it is unreadable (logged, naming ``what``)."""
    if path is None:
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable %s file %s: %s", what, path, exc)
        return None
    return state if isinstance(state, dict) else None
