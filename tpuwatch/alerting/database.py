"""The alerting database's file: SQLite in WAL, or an in-memory copy of it while the file cannot be written.

One connection guarded by a lock serves every thread of the process; other
processes (``tpuwatch test-alert``) share the file safely through WAL, a busy
timeout and per-row claims.  A full disk (or ``alerting.outbox_max_bytes``)
makes writes fail with :class:`OutboxFull`; what is already stored is kept.
A file found corrupt while in use is moved aside (``recover``).  What the
tables hold, and how they are read and written, is ``db.AlertDB``'s.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from tpuwatch import statefile
from tpuwatch.alerting import sqlitefile

log = logging.getLogger(__name__)


class OutboxFull(RuntimeError):
    """The database cannot grow (disk full or outbox_max_bytes reached): new work is refused."""


class Database:
    """A database file with ``SCHEMA``, or an in-memory copy of it while the file cannot be written; ``MERGE``
    merges such a copy (attached as ``outage``) into a file it did not copy whole."""

    SCHEMA = ""
    MERGE: tuple[str, ...] = ()

    def __init__(self, path: str, max_bytes: int, memory: str | None = None, verify: bool = False) -> None:
        """Open ``path``; with ``memory`` (why the file cannot be written) an in-memory copy of what it holds.

        With ``verify`` a database that fails SQLite's quick check raises DatabaseError (SQLITE_CORRUPT).
        """
        self.path = path
        self.max_bytes = max_bytes
        self.problem = memory  # why the state is in memory only, None while it is in the file
        self._lock = threading.Lock()
        self._whole = True  # the memory copy holds all the file did (else the file is merged into, not replaced)
        self.recovered = False  # set by recover(): the file was replaced while in use, its rows must be written again
        self.repairs = False  # the daemon's (it holds the state_dir lock): only it replaces a file that went bad
        if memory is None:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            self._conn = sqlitefile.connect_file(path, self.SCHEMA, max_bytes, verify)
        else:
            self._conn, self._whole = sqlitefile.memory_copy(path, self.SCHEMA, max_bytes)
            self._say_partial()
        self._reconnected()

    def _reconnected(self) -> None:
        """Called after the connection is opened, moved into memory or back to the file (not after ``recover``:
        a fresh file holds no rows)."""

    @property
    def in_memory(self) -> bool:
        """True while the database lives in memory (state_dir unwritable)."""
        return self.problem is not None

    def _say_partial(self) -> None:
        if not self._whole and self.problem is not None:
            self.problem += (f"; what {self.path} holds is not copied into memory (too large or unreadable), it "
                             "is kept there and merged with what happens meanwhile")

    def use_memory(self, reason: str) -> None:
        """Go on in memory, with a copy of what the file holds (reading works on a full or read-only disk)."""
        with self._lock:
            if self.problem is None:
                memory, self._whole = sqlitefile.copy_to_memory(self._conn, self.path, self.SCHEMA, self.max_bytes)
                sqlitefile.close_quietly(self._conn)
                self._conn = memory
            self.problem = reason
            self._say_partial()
            self._reconnected()

    def use_file(self) -> bool:
        """Back to the file: the in-memory database written over it (or merged into it, when the copy was not
        whole); False (still in memory) if the file cannot be written yet."""
        with self._lock:
            if self.problem is None:
                return True
            try:
                conn = self._merged() if not self._whole else None
                if conn is None:
                    sqlitefile.write_over(self._conn, self.path)
                    conn = sqlitefile.connect_file(self.path, self.SCHEMA, self.max_bytes, verify=False)
            except (OSError, sqlite3.Error):
                return False
            sqlitefile.close_quietly(self._conn)
            self._conn, self.problem, self._whole = conn, None, True
            self._reconnected()
            return True

    def _merged(self) -> sqlite3.Connection | None:
        """The file with what memory holds merged in; None if the file is corrupt (moved aside: write over)."""
        try:
            return sqlitefile.merge_into(self._conn, self.path, self.SCHEMA, self.max_bytes, self.MERGE)
        except sqlite3.DatabaseError as exc:
            if not sqlitefile.corrupt(exc):
                raise
        moved = sqlitefile.move_aside(self.path)
        log.error("alerting database %s is corrupt (moved aside as %s): alert state written afresh from memory",
                  self.path, moved)
        return None

    def recover(self, exc: sqlite3.DatabaseError) -> bool:
        """After ``exc``: if it says the file went bad while in use (overwritten, damaged by something else),
        move it aside and go on in a fresh one; True if so (``recovered`` is then set until taken).

        What the process holds (alert state, counters) is written afresh by its owner; queued notifications are
        lost with the file.  A file that cannot be replaced leaves the database in memory.
        """
        if not self.repairs or not sqlitefile.went_bad(exc):
            return False
        with self._lock:
            if self.problem is not None:
                return False
            sqlitefile.close_quietly(self._conn)
            try:
                moved = sqlitefile.move_aside(self.path)
                self._conn = sqlitefile.connect_file(self.path, self.SCHEMA, self.max_bytes, verify=False)
                # Outbox ids go on above any the old file gave: a message claimed from it is never taken
                # for another one's.
                self._conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('outbox', ?)",
                                   (int(time.time() * 1e6),))
            except (OSError, sqlite3.Error) as err:
                self._conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
                self._conn.executescript(self.SCHEMA)
                self._whole = True
                self.problem = f"{self.path} went corrupt ({exc}) and cannot be replaced ({err})"
                log.error("alerting database %s: kept in memory", self.problem)
                moved = None
            if moved is not None:
                log.error("alerting database %s went corrupt while in use (%s): moved aside as %s; alert state is "
                          "written afresh from memory, queued notifications are lost", self.path, exc, moved)
                statefile.LEDGER.discard(Path(self.path), f"corrupt ({exc}), moved aside as {os.path.basename(moved)}")
            self.recovered = True
            return True

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._conn.close()

    def _write(self, statements: Iterable[tuple[str, tuple[object, ...]]]) -> None:
        statements = list(statements)
        if not statements:
            return
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                for sql, params in statements:
                    self._conn.execute(sql, params)
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.OperationalError) and "full" in str(exc):
                    raise OutboxFull(str(exc)) from None
                raise

