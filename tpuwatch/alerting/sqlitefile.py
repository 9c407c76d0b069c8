"""SQLite database files that may be corrupt, full or read-only: open and verify, copy into memory, move aside.

Reading still works on a full or read-only disk, so a database that cannot be
written goes on as an in-memory copy; one that fails SQLite's quick check (or
is not a database at all) is moved aside with its -wal and -shm, at open and,
through ``recovering``, when it goes bad while in use.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import urllib.parse
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any, Protocol, TypeVar

KEEP_MOVED_ASIDE = 3  # sets of a corrupt database kept
MEMORY_MAX_BYTES = 32 << 20  # an in-memory database's bound; larger files are not copied into memory
SQLITE_CORRUPT = 11
SQLITE_NOTADB = 26
# A small database rewritten every minute: checkpoint the write-ahead log every 256 pages (1 MiB, not SQLite's
# 1000) and truncate it to that size after, and cache 256 KiB of pages (not 2 MiB) in each connection: the
# file is about 1.3 MiB, and what the cache misses the kernel's page cache holds.
WAL_BOUNDS = ("wal_autocheckpoint=256", "journal_size_limit=1048576", "cache_size=-256")
# Primary result codes that blame the disk or other processes, not the file: PERM, BUSY, LOCKED, NOMEM,
# READONLY, IOERR, FULL, CANTOPEN (https://www.sqlite.org/rescode.html).
_ENVIRONMENT = {3, 5, 6, 7, 8, 10, 13, 14}


def limit(conn: sqlite3.Connection, max_bytes: int) -> None:
    """Let the database grow to ``max_bytes`` at most (writes beyond fail with SQLITE_FULL)."""
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count={max(64, max_bytes // page_size)}")


def connect_file(path: str, schema: str, max_bytes: int, verify: bool) -> sqlite3.Connection:
    """The database file at ``path`` in WAL mode with ``schema``; ``verify`` runs the quick check first."""
    conn = sqlite3.connect(path, timeout=10.0, check_same_thread=False, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        for pragma in WAL_BOUNDS:
            conn.execute(f"PRAGMA {pragma}")
        if verify:
            quick_check(conn)
            check_schema(conn, schema)
        conn.executescript(schema)
        limit(conn, max_bytes)
    except BaseException:
        close_quietly(conn)
        raise
    return conn


def quick_check(conn: sqlite3.Connection) -> None:
    """Raise DatabaseError with SQLITE_CORRUPT unless SQLite's quick check finds the database whole."""
    rows = conn.execute("PRAGMA quick_check(5)").fetchall()
    if rows != [("ok",)]:
        error = sqlite3.DatabaseError("; ".join(str(r[0]) for r in rows)[:300] or "quick check failed")
        error.sqlite_errorcode = SQLITE_CORRUPT  # type: ignore[attr-defined]
        raise error


def _objects(conn: sqlite3.Connection) -> dict[tuple[str, str], list[tuple[object, ...]]]:
    """(type, name) -> columns (tables) of every schema object but SQLite's own."""
    rows = conn.execute("SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'").fetchall()
    return {(kind, name): [tuple(c[1:]) for c in conn.execute("SELECT * FROM pragma_table_info(?)", (name,))]
            if kind == "table" else [] for kind, name in rows}


def check_schema(conn: sqlite3.Connection, schema: str) -> None:
    """Raise DatabaseError with SQLITE_CORRUPT if the database holds anything ``schema`` does not make (a view,
    a trigger, another table) or a table of it with other columns; tables not there yet are fine."""
    expected = sqlite3.connect(":memory:")
    try:
        expected.executescript(schema)
        wanted = _objects(expected)
    finally:
        expected.close()
    for key, columns in _objects(conn).items():
        if wanted.get(key) != columns:
            error = sqlite3.DatabaseError(f"{key[0]} {key[1]} is not this version's")
            error.sqlite_errorcode = SQLITE_CORRUPT  # type: ignore[attr-defined]
            raise error


def connect_memory(schema: str, max_bytes: int) -> sqlite3.Connection:
    """An empty in-memory database with ``schema``, bounded by ``max_bytes`` and ``MEMORY_MAX_BYTES``."""
    conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
    conn.executescript(schema)
    limit(conn, min(max_bytes, MEMORY_MAX_BYTES))
    return conn


def _size(path: str) -> int:
    return sum(os.path.getsize(path + suffix) for suffix in ("", "-wal") if os.path.exists(path + suffix))


def memory_copy(path: str, schema: str, max_bytes: int) -> tuple[sqlite3.Connection, bool]:
    """An in-memory database holding what the file at ``path`` holds, and whether that is all of it.

    Empty and incomplete (False) when the file is larger than ``MEMORY_MAX_BYTES`` or exists but cannot be
    read; empty and complete when there is no file or it is corrupt (it holds nothing to keep).
    """
    if not os.path.exists(path):
        return connect_memory(schema, max_bytes), True
    if _size(path) > MEMORY_MAX_BYTES:
        return connect_memory(schema, max_bytes), False
    unreadable = False
    for query in ("mode=ro", "immutable=1"):  # immutable: a read-only directory where no -shm can be made
        memory = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        try:
            source = sqlite3.connect(f"file:{urllib.parse.quote(path)}?{query}", uri=True)
            try:
                source.backup(memory)
            finally:
                source.close()
            quick_check(memory)
            memory.executescript(schema)
            limit(memory, min(max_bytes, MEMORY_MAX_BYTES))
            return memory, True
        except sqlite3.Error as exc:
            memory.close()
            unreadable = unreadable or not corrupt(exc)
    return connect_memory(schema, max_bytes), not unreadable


def copy_to_memory(conn: sqlite3.Connection, path: str, schema: str, max_bytes: int
                   ) -> tuple[sqlite3.Connection, bool]:
    """An in-memory copy of ``conn``'s database (else of the file at ``path``), and whether it is complete."""
    pages, page_size = (conn.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "page_size"))
    if pages * page_size > MEMORY_MAX_BYTES:
        return connect_memory(schema, max_bytes), False
    memory = connect_memory(schema, max_bytes)
    try:
        conn.backup(memory)
    except sqlite3.Error:
        memory.close()
        return memory_copy(path, schema, max_bytes)
    return memory, True


def merge_into(conn: sqlite3.Connection, path: str, schema: str, max_bytes: int,
               statements: Sequence[str]) -> sqlite3.Connection:
    """Open the file at ``path`` and run ``statements`` on it in one transaction, with ``conn``'s database
    attached as ``outage``; the file's connection.  Raises OSError or sqlite3.Error."""
    temp = path + ".outage"
    remove(temp, temp + "-journal")
    try:
        target = sqlite3.connect(temp, isolation_level=None)
        try:
            conn.backup(target)
        finally:
            target.close()
        file = connect_file(path, schema, max_bytes, verify=True)
        try:
            file.execute("ATTACH DATABASE ? AS outage", (temp,))
            file.execute("BEGIN IMMEDIATE")
            for statement in statements:
                file.execute(statement)
            file.execute("COMMIT")
            file.execute("DETACH DATABASE outage")
        except BaseException:
            close_quietly(file)
            raise
    finally:
        try:
            remove(temp, temp + "-journal")
        except OSError:
            pass
    return file


def write_over(conn: sqlite3.Connection, path: str) -> None:
    """Replace the database file at ``path`` by a copy of ``conn``'s, in WAL mode; raises OSError or sqlite3.Error.

    The copy is made beside the file and renamed over it, so the file is whole at every moment.
    """
    temp = path + ".new"
    leftovers = (temp, temp + "-journal", temp + "-wal", temp + "-shm")
    try:
        remove(*leftovers)
        target = sqlite3.connect(temp, isolation_level=None)
        try:
            conn.backup(target)
            target.execute("PRAGMA journal_mode=WAL")
        finally:
            target.close()
        remove(path + "-wal", path + "-shm")  # an old WAL must never be replayed onto the copy
        os.replace(temp, path)
    except BaseException:
        try:
            remove(*leftovers)
        except OSError:
            pass
        raise


def close_quietly(conn: sqlite3.Connection) -> None:
    """Close ``conn``, ignoring errors."""
    try:
        conn.close()  # its checkpoint may fail on a full disk: the WAL then stays, to be removed or replayed
    except sqlite3.Error:
        pass


def remove(*paths: str) -> None:
    """Delete the files that exist of ``paths``."""
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


class Recovers(Protocol):
    """A database wrapper that can replace a file that went corrupt under it."""

    def recover(self, exc: sqlite3.DatabaseError) -> bool: ...


Method = TypeVar("Method", bound=Callable[..., Any])


def recovering(method: Method) -> Method:
    """``method`` of a ``Recovers``, tried again once after its file, found corrupt, was replaced."""
    @functools.wraps(method)
    def run(self: Recovers, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.DatabaseError as exc:
            if not self.recover(exc):
                raise
        return method(self, *args, **kwargs)
    return run  # type: ignore[return-value]


def went_bad(exc: sqlite3.Error) -> bool:
    """True only if SQLite itself says the file is damaged or not a database (CORRUPT, NOTADB): what a file
    that was fine at open can turn into under a running process; never a constraint, a busy file or a bug."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (SQLITE_CORRUPT, SQLITE_NOTADB)


def corrupt(exc: sqlite3.Error) -> bool:
    """True if ``exc`` blames the file (damaged, not a database, an unsupported format), not where it lies
    (read-only, full, locked, an I/O error)."""
    return (getattr(exc, "sqlite_errorcode", SQLITE_CORRUPT) & 0xFF) not in _ENVIRONMENT


def move_aside(path: str) -> str:
    """Move the database at ``path`` and its -wal and -shm aside as ``path.corrupt-<UTC time>``; that name.

    Only the last ``KEEP_MOVED_ASIDE`` sets moved aside are kept.  Raises OSError if they cannot be moved.
    """
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    target = f"{path}.corrupt-{stamp}"
    for suffix in ("", "-wal", "-shm"):
        if os.path.lexists(path + suffix):
            os.replace(path + suffix, target + suffix)
    folder, prefix = os.path.dirname(path) or ".", os.path.basename(path) + ".corrupt-"
    names = [n for n in os.listdir(folder) if n.startswith(prefix)]
    stamps = sorted({n[len(prefix):].removesuffix("-wal").removesuffix("-shm") for n in names})
    old = set(stamps[:-KEEP_MOVED_ASIDE])
    for name in names:
        if name[len(prefix):].removesuffix("-wal").removesuffix("-shm") in old:
            remove(os.path.join(folder, name))
    return target
