"""SQLite in ``state_dir`` (WAL): alert state, what each receiver was told, counter memory, and the outbox.

One connection guarded by a lock serves every thread of the process; other
processes (``tpuwatch test-alert``) share the file safely through WAL, a busy
timeout and per-row claims.  A full disk (or ``alerting.outbox_max_bytes``)
makes writes fail with :class:`OutboxFull`; what is already stored is kept.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from tpuwatch.alerting.state import Alert, fingerprint
from tpuwatch.alerting.tracker import Row
from tpuwatch.schema import ConfigError

DB_NAME = "alerting.db"
log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS alerts (
    fingerprint TEXT PRIMARY KEY, labels TEXT NOT NULL, annotations TEXT NOT NULL, state TEXT NOT NULL,
    active_at REAL NOT NULL, fired_at REAL, resolved_at REAL, value REAL NOT NULL);
CREATE TABLE IF NOT EXISTS notified (
    receiver TEXT NOT NULL, fingerprint TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY (receiver, fingerprint));
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT, receiver TEXT NOT NULL, key TEXT NOT NULL, body TEXT NOT NULL,
    created REAL NOT NULL, next_attempt REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
    claimed_until REAL NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS outbox_by_receiver ON outbox (receiver, id);
CREATE TABLE IF NOT EXISTS alert_keys (fingerprint TEXT PRIMARY KEY, told_as TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS counters (
    name TEXT NOT NULL, labels TEXT NOT NULL, boot TEXT NOT NULL, last REAL NOT NULL, seen_at REAL NOT NULL,
    total REAL NOT NULL, changed_at REAL NOT NULL, points TEXT NOT NULL, born REAL NOT NULL, born_at REAL,
    PRIMARY KEY (name, labels));
"""


class OutboxFull(RuntimeError):
    """The database cannot grow (disk full or outbox_max_bytes reached): new work is refused."""


@dataclass(frozen=True)
class Message:
    """One queued notification: a JSON body for one receiver, with an id stable across retries."""

    id: int
    receiver: str
    key: str
    body: str
    created: float
    attempts: int


@dataclass(frozen=True)
class Notification:
    """Bodies to queue for one receiver (PagerDuty: one per alert), and what it will then have been told."""

    receiver: str
    bodies: tuple[str, ...]
    told_firing: tuple[str, ...] = ()
    told_resolved: tuple[str, ...] = ()
    supersede: bool = False


class AlertDB:
    """The alerting database file."""

    def __init__(self, path: str, max_bytes: int) -> None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(path, timeout=10.0, check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(_SCHEMA)
        page_size = self._conn.execute("PRAGMA page_size").fetchone()[0]
        self._conn.execute(f"PRAGMA max_page_count={max(64, max_bytes // page_size)}")

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
            except sqlite3.OperationalError as exc:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                if "full" in str(exc):
                    raise OutboxFull(str(exc)) from None
                raise

    # --- alert state -------------------------------------------------------

    def load_alerts(self) -> list[Alert]:
        """Every stored alert with what each receiver was told about it.

        Rows stored by an older tpuwatch (another fingerprint, empty label values)
        are re-keyed to today's fingerprint in the same transaction; an alert a
        receiver was already told about keeps the id it was told (``told_as``).
        """
        with self._lock:
            rows = self._conn.execute("SELECT fingerprint, labels, annotations, state, active_at, fired_at, "
                                      "resolved_at, value FROM alerts").fetchall()
            told = self._conn.execute("SELECT receiver, fingerprint, at FROM notified").fetchall()
            keys = dict(self._conn.execute("SELECT fingerprint, told_as FROM alert_keys").fetchall())
        alerts: dict[str, Alert] = {}
        for r in rows:
            alerts[r[0]] = Alert(r[0], json.loads(r[1]), json.loads(r[2]), r[3], r[4], r[5], r[6], r[7],
                                 told_as=keys.get(r[0]))
        for receiver, fp, at in told:
            if fp in alerts:
                alerts[fp].notified[receiver] = at
        moves = self._rekey(alerts)
        try:
            self._write(moves)
        except OutboxFull as exc:
            log.error("cannot re-key %d stored alert(s) to today's fingerprints (%s); done again at the next start",
                      len(moves), exc)
        return list(alerts.values())

    @staticmethod
    def _rekey(alerts: dict[str, Alert]) -> list[tuple[str, tuple[object, ...]]]:
        """Statements that move rows of ``alerts`` (changed in place) to today's fingerprints."""
        statements: list[tuple[str, tuple[object, ...]]] = []
        for old, alert in list(alerts.items()):
            labels = {k: v for k, v in alert.labels.items() if v != ""}
            new = fingerprint(labels)
            if new == old:
                continue
            del alerts[old]
            statements += _deletions(old)
            if new in alerts:  # two old rows for one label set: the first one stands
                statements.append(("DELETE FROM notified WHERE fingerprint = ?", (old,)))
                continue
            statements += _moved(old, new)
            alert.told_as = alert.key if alert.notified else None
            alert.fingerprint, alert.labels = new, labels
            alerts[new] = alert
            statements += _alert_rows(alert)
        return statements

    def save_alerts(self, alerts: Iterable[Alert], moved: Iterable[tuple[str, str]] = ()) -> None:
        """Store changed alerts, with what receivers were told moved from old to new ids for ``moved``
        (old, new) pairs; a pending alert that went away is deleted."""
        statements: list[tuple[str, tuple[object, ...]]] = []
        for a in alerts:
            if a.state == "resolved" and a.fired_at is None:
                statements += _deletions(a.fingerprint)
                continue
            statements += _alert_rows(a)
        for old, new in moved:
            statements = _deletions(old) + _moved(old, new) + statements
        self._write(statements)

    def delete_alerts(self, fingerprints: Iterable[str]) -> None:
        """Forget alerts for good."""
        self._write(s for fp in fingerprints for s in _deletions(fp))

    # --- counter memory ----------------------------------------------------------

    def load_counters(self) -> list[Row]:
        """Every counter's saved state."""
        with self._lock:
            rows = self._conn.execute("SELECT name, labels, boot, last, seen_at, total, changed_at, points, born, "
                                      "born_at FROM counters").fetchall()
        return [Row(*r) for r in rows]

    def save_counters(self, rows: Iterable[Row], forgotten: Iterable[tuple[str, str]]) -> None:
        """Store changed counters and delete forgotten ones, in one transaction."""
        statements: list[tuple[str, tuple[object, ...]]] = [
            ("INSERT OR REPLACE INTO counters VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
             (r.name, r.labels, r.boot, r.last, r.seen_at, r.total, r.changed_at, r.points, r.born, r.born_at))
            for r in rows]
        statements += [("DELETE FROM counters WHERE name = ? AND labels = ?", key) for key in forgotten]
        self._write(statements)

    def forget_receivers(self, keep: set[str]) -> None:
        """Forget what receivers no longer configured were told (their queued messages expire)."""
        marks = ", ".join("?" * len(keep))
        self._write([(f"DELETE FROM notified WHERE receiver NOT IN ({marks})", tuple(keep))])

    # --- outbox ----------------------------------------------------------------

    def enqueue(self, notifications: list[Notification], now: float) -> None:
        """Queue notifications and record what they tell, in one transaction (all or nothing)."""
        statements: list[tuple[str, tuple[object, ...]]] = []
        for n in notifications:
            if n.supersede:
                statements.append(("DELETE FROM outbox WHERE receiver = ? AND claimed_until < ?", (n.receiver, now)))
            statements += [("INSERT INTO outbox (receiver, key, body, created, next_attempt) VALUES (?, ?, ?, ?, ?)",
                            (n.receiver, uuid.uuid4().hex, body, now, now)) for body in n.bodies]
            statements += [("INSERT OR REPLACE INTO notified VALUES (?, ?, ?)", (n.receiver, fp, now))
                           for fp in n.told_firing]
            statements += [("DELETE FROM notified WHERE receiver = ? AND fingerprint = ?", (n.receiver, fp))
                           for fp in n.told_resolved]
        self._write(statements)

    def claim(self, receiver: str, now: float, hold: float) -> tuple[Message | None, float | None]:
        """Claim the receiver's oldest message if it is due: (message, None), else (None, when it is due).

        Messages of one receiver go out strictly in order, so a resolve never
        overtakes the firing notification it answers.
        """
        with self._lock:
            row = self._conn.execute(
                "SELECT id, receiver, key, body, created, attempts, next_attempt, claimed_until FROM outbox "
                "WHERE receiver = ? ORDER BY id LIMIT 1", (receiver,)).fetchone()
            if row is None:
                return None, None
            due = max(row[6], row[7])
            if due > now:
                return None, due
            updated = self._conn.execute("UPDATE outbox SET claimed_until = ? WHERE id = ? AND claimed_until = ?",
                                         (now + hold, row[0], row[7])).rowcount
        if not updated:
            return None, now
        return Message(row[0], row[1], row[2], row[3], row[4], row[5]), None

    def insert_claimed(self, receiver: str, body: str, now: float, hold: float) -> Message:
        """Queue one message already claimed by the caller (test-alert delivers it itself)."""
        key = uuid.uuid4().hex
        with self._lock:
            cursor = self._conn.execute(
                "INSERT INTO outbox (receiver, key, body, created, next_attempt, claimed_until) "
                "VALUES (?, ?, ?, ?, ?, ?)", (receiver, key, body, now, now, now + hold))
        return Message(int(cursor.lastrowid or 0), receiver, key, body, now, 0)

    def delete(self, message_id: int) -> None:
        """Remove a message (delivered, rejected or expired)."""
        with self._lock:
            self._conn.execute("DELETE FROM outbox WHERE id = ?", (message_id,))

    def retry_later(self, message_id: int, at: float) -> None:
        """Release a claim after a failed attempt, due again at ``at``."""
        with self._lock:
            self._conn.execute("UPDATE outbox SET attempts = attempts + 1, next_attempt = ?, claimed_until = 0 "
                               "WHERE id = ?", (at, message_id))

    def expire(self, before: float) -> list[tuple[str, int]]:
        """Delete messages created before ``before``; (receiver, count) of what went."""
        with self._lock:
            counts = self._conn.execute("SELECT receiver, COUNT(*) FROM outbox WHERE created < ? "
                                        "GROUP BY receiver", (before,)).fetchall()
            if counts:
                self._conn.execute("DELETE FROM outbox WHERE created < ?", (before,))
        return [(r, int(n)) for r, n in counts]

    def queue_stats(self) -> dict[str, tuple[int, float]]:
        """receiver -> (queued messages, creation time of the oldest)."""
        with self._lock:
            rows = self._conn.execute("SELECT receiver, COUNT(*), MIN(created) FROM outbox GROUP BY receiver")
            return {r: (int(n), float(oldest)) for r, n, oldest in rows.fetchall()}


def _alert_rows(a: Alert) -> list[tuple[str, tuple[object, ...]]]:
    rows: list[tuple[str, tuple[object, ...]]] = [(
        "INSERT OR REPLACE INTO alerts VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (a.fingerprint, json.dumps(a.labels), json.dumps(a.annotations), a.state, a.active_at, a.fired_at,
         a.resolved_at, a.value))]
    if a.told_as:
        rows.append(("INSERT OR REPLACE INTO alert_keys VALUES (?, ?)", (a.fingerprint, a.told_as)))
    else:
        rows.append(("DELETE FROM alert_keys WHERE fingerprint = ?", (a.fingerprint,)))
    return rows


def _moved(old: str, new: str) -> list[tuple[str, tuple[object, ...]]]:
    return [("UPDATE OR REPLACE notified SET fingerprint = ? WHERE fingerprint = ?", (new, old))]


def _deletions(fp: str) -> list[tuple[str, tuple[object, ...]]]:
    return [(f"DELETE FROM {table} WHERE fingerprint = ?", (fp,)) for table in ("alerts", "alert_keys")]


def open_db(state_dir: str, max_bytes: int) -> AlertDB:
    """The alerting database in ``state_dir``; ConfigError naming state_dir when it cannot be used."""
    path = os.path.join(state_dir, DB_NAME)
    try:
        return AlertDB(path, max_bytes)
    except (OSError, sqlite3.Error) as exc:
        raise ConfigError("state_dir", f"cannot open {path}: {exc}") from None
