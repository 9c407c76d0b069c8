"""Opening the alerting database: refused with the key to blame (``tpuwatch test-alert``), or repaired (the
daemon): a corrupt file moved aside, rows of the wrong shape deleted, an unwritable one kept in memory."""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path

from tpuwatch import statefile
from tpuwatch.alerting import sqlitefile
from tpuwatch.alerting.db import DB_NAME, AlertDB
from tpuwatch.schema import ConfigError

log = logging.getLogger(__name__)

# What each column must hold for the alerting code to use a row; other rows are deleted when the daemon opens
# the database.  "object": a JSON object of strings (labels, annotations).
_SHAPES = {
    "alerts": {"fingerprint": "text", "labels": "object", "annotations": "object", "state": "text",
               "active_at": "number", "fired_at": "number?", "resolved_at": "number?", "value": "number"},
    "notified": {"receiver": "text", "fingerprint": "text", "at": "number"},
    "outbox": {"receiver": "text", "key": "text", "body": "text", "created": "number", "next_attempt": "number",
               "attempts": "integer", "claimed_until": "number"},
    "alert_keys": {"fingerprint": "text", "told_as": "text"},
    "outbox_rank": {"id": "integer", "receiver": "text", "priority": "integer", "grp": "text"},
    "counters": {"name": "text", "labels": "text", "boot": "text", "last": "number", "seen_at": "number",
                 "total": "number", "changed_at": "number", "points": "text", "born": "number",
                 "born_at": "number?"},
}
_FITS = {
    "text": "typeof({c}) = 'text'",
    "integer": "typeof({c}) = 'integer'",
    "number": "typeof({c}) IN ('integer', 'real')",
    "number?": "typeof({c}) IN ('integer', 'real', 'null')",
    "object": "(CASE WHEN typeof({c}) = 'text' AND json_valid({c}) AND json_type({c}) = 'object' "
              "THEN NOT EXISTS (SELECT 1 FROM json_each({c}) WHERE type <> 'text') ELSE 0 END)",
}


def _malformed(table: str) -> str:
    fits = [_FITS[kind].format(c=column) for column, kind in _SHAPES[table].items()]
    if table == "alerts":
        fits.append("state IN ('pending', 'firing', 'resolved')")
    return " OR ".join(f"NOT {fit}" for fit in fits)


def open_db(state_dir: str, max_bytes: int, repair: bool = False) -> AlertDB:
    """The alerting database in ``state_dir``; ConfigError naming state_dir when it cannot be used.

    With ``repair`` (the daemon, which holds the state_dir lock) it never fails: a corrupt database (and its
    -wal/-shm) is moved aside and made afresh, rows of the wrong shape are deleted, and one that cannot be
    written is kept in memory, saying why in ``problem``.
    """
    path = os.path.join(state_dir, DB_NAME)
    if not repair:
        try:
            return AlertDB(path, max_bytes)
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError("state_dir", f"cannot open {path}: {exc}") from None
    db = _open_repaired(path, max_bytes)
    db.repairs = True
    return db


def _open_repaired(path: str, max_bytes: int) -> AlertDB:
    try:
        return _without_malformed(AlertDB(path, max_bytes, verify=True))
    except sqlite3.Error as exc:
        if not sqlitefile.corrupt(exc):
            return AlertDB(path, max_bytes, memory=f"cannot write {path}: {exc}")
        damage = str(exc)
    except OSError as exc:
        return AlertDB(path, max_bytes, memory=f"cannot write {path}: {exc.strerror or exc}")
    try:
        moved = sqlitefile.move_aside(path)
    except OSError as exc:
        log.error("alerting database %s is corrupt (%s) and cannot be moved aside (%s): alert state is kept in "
                  "memory", path, damage, exc.strerror or exc)
        return AlertDB(path, max_bytes, memory=f"{path} is corrupt ({damage}) and cannot be moved aside")
    log.error("alerting database %s is corrupt (%s): moved aside as %s, alert state starts afresh",
              path, damage, moved)
    statefile.LEDGER.discard(Path(path), f"corrupt ({damage}), moved aside as {os.path.basename(moved)}")
    try:
        return AlertDB(path, max_bytes, verify=True)
    except (OSError, sqlite3.Error) as exc:
        return AlertDB(path, max_bytes, memory=f"cannot write {path}: {exc}")


def _without_malformed(db: AlertDB) -> AlertDB:
    try:
        dropped = db.delete_rows({table: _malformed(table) for table in _SHAPES})
    except sqlite3.Error:
        db.close()
        raise
    if dropped:
        log.error("alerting database %s: %d row(s) of the wrong shape deleted", db.path, dropped)
        statefile.LEDGER.discard(Path(db.path), f"{dropped} row(s) of the wrong shape deleted")
    return db
