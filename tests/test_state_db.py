"""The alerting database when its file is broken: corrupt ones moved aside and made afresh, rows of the wrong
shape deleted, an unwritable one kept in memory (with what the file held) and written back once it can be."""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from tpuwatch import statefile
from tpuwatch.alerting.db import DB_NAME, AlertDB, Notification
from tpuwatch.alerting.dbopen import open_db
from tpuwatch.alerting.sqlitefile import KEEP_MOVED_ASIDE, MEMORY_MAX_BYTES
from tpuwatch.alerting.state import Alert, fingerprint
from tpuwatch.schema import ConfigError

from conftest import Tmpfs

MAX = 1 << 20


def labels(device: str) -> dict[str, str]:
    return {"alertname": "AcceleratorEccUncorrectable", "device": device}


def fp(device: str) -> str:
    """The fingerprint of device's alert, as Alertmanager computes it (what load_alerts keys rows by)."""
    return fingerprint(labels(device))


def firing(device: str) -> Alert:
    return Alert(fp(device), labels(device), {"summary": "s"}, "firing", 1.0, fired_at=2.0)


def fill(db: AlertDB, device: str) -> None:
    """One firing alert and one queued message for it."""
    db.save_alerts([firing(device)])
    db.enqueue([Notification("hook", (f'{{"device": "{device}"}}',), told_firing=(fp(device),))], 3.0)


def contents(db: AlertDB) -> tuple[set[str], list[str]]:
    """(alert fingerprints, bodies queued for hook)."""
    bodies = []
    while True:
        message, _ = db.claim("hook", 1e12, 1.0)
        if message is None:
            return {a.fingerprint for a in db.load_alerts()}, bodies
        bodies.append(message.body)
        db.delete(message.id)


def moved_aside(state: Path) -> list[str]:
    return sorted(p.name for p in state.iterdir() if ".corrupt-" in p.name)


@pytest.mark.parametrize("damage", ["not a database", "truncated", "wrong columns", "a trigger"])
def test_a_corrupt_database_is_moved_aside_with_its_wal_and_made_afresh(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str) -> None:
    db = open_db(str(tmp_path), MAX)
    for device in "0123456789":
        fill(db, device)
    db.close()
    path = tmp_path / DB_NAME
    if damage == "not a database":
        path.write_bytes(os.urandom(8192))
        (tmp_path / f"{DB_NAME}-wal").write_bytes(os.urandom(100))
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:5000])
    else:
        conn = sqlite3.connect(path)
        conn.execute("DROP TABLE outbox" if damage == "wrong columns" else
                     "CREATE TRIGGER refuse BEFORE INSERT ON outbox BEGIN SELECT RAISE(ABORT, 'no'); END")
        if damage == "wrong columns":
            conn.execute("CREATE TABLE outbox (id INTEGER PRIMARY KEY, body TEXT)")
        conn.commit()
        conn.close()
    with caplog.at_level(logging.ERROR):
        db = open_db(str(tmp_path), MAX, repair=True)
    assert db.problem is None and not db.in_memory
    [moved] = [name for name in moved_aside(tmp_path) if "-" not in name.rsplit("corrupt-", 1)[1]]
    assert moved.startswith(f"{DB_NAME}.corrupt-20") and moved.endswith("Z")
    assert caplog.text.count("is corrupt") == 1 and moved in caplog.text
    assert str(path) in {p for _, p, _ in statefile.LEDGER.view()[1]}
    fill(db, "7")  # the fresh database takes new state
    assert contents(db) == ({fp("7")}, ['{"device": "7"}'])


def test_only_the_last_few_corrupt_databases_are_kept(tmp_path: Path) -> None:
    for _ in range(KEEP_MOVED_ASIDE + 3):
        (tmp_path / DB_NAME).write_bytes(b"garbage" * 1000)
        (tmp_path / f"{DB_NAME}-shm").write_bytes(b"garbage")
        open_db(str(tmp_path), MAX, repair=True).close()
    stamps = {name.split("corrupt-")[1].split("-")[0] for name in moved_aside(tmp_path)}
    assert len(stamps) == KEEP_MOVED_ASIDE


def test_rows_of_the_wrong_shape_are_deleted_and_the_rest_kept(tmp_path: Path) -> None:
    db = open_db(str(tmp_path), MAX)
    fill(db, "1")
    db.close()
    conn = sqlite3.connect(tmp_path / DB_NAME)
    conn.execute("INSERT INTO alerts VALUES ('bad1', '[1, 2]', '{}', 'firing', 1, 2, NULL, 1)")
    conn.execute("INSERT INTO alerts VALUES ('bad2', '{\"a\": 1}', '{}', 'firing', 1, 2, NULL, 1)")
    conn.execute("INSERT INTO alerts VALUES ('bad3', '{}', '{}', 'exploded', 1, 2, NULL, 1)")
    conn.execute("INSERT INTO alerts VALUES ('bad4', '{}', '{}', 'firing', 'soon', 2, NULL, 1)")
    conn.execute("INSERT INTO outbox (receiver, key, body, created, next_attempt) VALUES ('hook', 'k', x'00', 1, 1)")
    conn.execute("INSERT INTO notified VALUES ('hook', 'fp2', 'yesterday')")
    conn.commit()
    conn.close()
    db = open_db(str(tmp_path), MAX, repair=True)
    assert contents(db) == ({fp("1")}, ['{"device": "1"}'])
    assert moved_aside(tmp_path) == []
    assert "6 row(s) of the wrong shape deleted" in statefile.LEDGER.view()[1][-1][2]


def test_an_unwritable_database_goes_on_in_memory_with_what_the_file_held(tmpfs: Callable[..., Tmpfs]) -> None:
    fs = tmpfs()
    db = open_db(str(fs.path), MAX)
    fill(db, "1")
    db.close()
    fs.remount("ro")
    db = open_db(str(fs.path), MAX, repair=True)
    assert db.in_memory and (db.problem or "").startswith(f"cannot write {fs.path / DB_NAME}")
    fill(db, "2")  # writes go on, in memory
    assert contents(db) == ({fp("1"), fp("2")}, ['{"device": "1"}', '{"device": "2"}'])
    fs.remount("rw")
    fill(db, "3")
    assert db.use_file() and not db.in_memory and db.problem is None
    db.close()
    again = open_db(str(fs.path), MAX, repair=True)  # what memory held is in the file now
    assert contents(again) == ({fp("1"), fp("2"), fp("3")}, ['{"device": "3"}'])


def test_a_full_disk_moves_the_database_into_memory_and_back(tmpfs: Callable[..., Tmpfs]) -> None:
    fs = tmpfs(size="2m")
    db = open_db(str(fs.path), MAX, repair=True)
    fill(db, "1")
    filler = fs.fill()
    db.use_memory("state_dir full")
    for device in "23456789":
        fill(db, device)
    assert not db.use_file() and db.in_memory  # still full: it stays in memory, nothing lost
    filler.unlink()
    assert db.use_file()
    assert not (fs.path / f"{DB_NAME}.new").exists()
    db.close()
    db = open_db(str(fs.path), MAX, repair=True)
    alerts, bodies = contents(db)
    assert alerts == {fp(d) for d in "123456789"} and len(bodies) == 9


def test_a_database_that_cannot_even_be_made_is_in_memory(tmpfs: Callable[..., Tmpfs]) -> None:
    fs = tmpfs()
    fs.remount("ro")
    db = open_db(str(fs.path / "missing"), MAX, repair=True)
    assert db.in_memory
    fill(db, "1")
    assert contents(db) == ({fp("1")}, ['{"device": "1"}'])


def test_without_repair_a_broken_database_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / DB_NAME).write_bytes(b"garbage" * 1000)
    with pytest.raises(ConfigError, match="state_dir: cannot open .*file is not a database"):
        open_db(str(tmp_path), MAX)
    assert moved_aside(tmp_path) == []  # test-alert never moves the daemon's database


def test_a_database_too_large_for_memory_is_merged_into_not_replaced(tmpfs: Callable[..., Tmpfs]) -> None:
    fs = tmpfs(size="120m")
    db = open_db(str(fs.path), 256 << 20, repair=True)
    big = "x" * (1 << 20)
    for n in range(MEMORY_MAX_BYTES // len(big) + 2):
        db.enqueue([Notification("hook", (f'{{"n": {n}, "pad": "{big}"}}',))], 3.0)
    fill(db, "1")
    filler = fs.fill()
    db.use_memory("state_dir full")
    assert db.in_memory and "not copied into memory" in (db.problem or "")
    fill(db, "2")  # the outage's own state, in memory (bounded)
    filler.unlink()
    assert db.use_file() and db.problem is None
    alerts, bodies = contents(db)
    assert alerts == {fp("1"), fp("2")} and len(bodies) == MEMORY_MAX_BYTES // len(big) + 4
    assert bodies[-1] == '{"device": "2"}'


def test_the_write_ahead_log_stays_near_a_mebibyte_however_much_is_written(tmp_path: Path) -> None:
    """SQLite's default lets the -wal file grow to 4 MiB and stay that size; tpuwatch checkpoints every 256 pages
    and truncates the log to 1 MiB after."""
    db = open_db(str(tmp_path), 64 * MAX)
    wal = tmp_path / f"{DB_NAME}-wal"
    largest = 0
    for i in range(1500):  # about 6 MiB of pages written, one transaction each
        db.save_alerts([firing(str(i % 50))])
        largest = max(largest, wal.stat().st_size if wal.exists() else 0)
    assert 0 < largest <= 1.25 * MAX


def test_a_database_that_goes_corrupt_while_in_use_is_replaced_and_written_afresh(tmp_path: Path,
                                                                                  caplog: pytest.LogCaptureFixture
                                                                                  ) -> None:
    # Before, every call failed from then on (the alerting stage raised each cycle, alerts stopped, a reload
    # exited the daemon): only an open moved a corrupt file aside.
    db = open_db(str(tmp_path), MAX, repair=True)
    fill(db, "0")
    db._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    (tmp_path / DB_NAME).write_bytes(b"garbage, not SQLite " * 512)
    db._conn.execute("PRAGMA shrink_memory")  # the page cache let go, as it does in a long-running daemon
    with caplog.at_level(logging.ERROR):
        fill(db, "1")
    assert db.recovered and db.problem is None
    assert contents(db) == ({fp("1")}, ['{"device": "1"}'])
    assert len(moved_aside(tmp_path)) == 1
    assert sum("went corrupt while in use" in r.getMessage() for r in caplog.records) == 1


def test_only_the_daemons_database_is_replaced_and_only_when_sqlite_says_it_went_bad(tmp_path: Path) -> None:
    db = open_db(str(tmp_path), MAX, repair=True)
    fill(db, "0")
    with pytest.raises(sqlite3.IntegrityError):  # a constraint (a bug), not a damaged file
        db._write([("INSERT INTO counters (name) VALUES (?)", ("x",))])
    fill(db, "1")  # the failed write left no transaction open
    assert moved_aside(tmp_path) == [] and not db.recovered
    assert contents(db)[0] == {fp("0"), fp("1")}
    one_shot = open_db(str(tmp_path), MAX)  # test-alert's: it does not hold the state_dir lock
    one_shot._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    (tmp_path / DB_NAME).write_bytes(b"garbage, not SQLite " * 512)
    one_shot._conn.execute("PRAGMA shrink_memory")
    with pytest.raises(sqlite3.DatabaseError):
        fill(one_shot, "2")
    assert moved_aside(tmp_path) == [], "only the daemon moves its database aside"
