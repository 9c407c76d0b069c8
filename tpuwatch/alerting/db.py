"""The alerting database's tables (SQLite in ``state_dir``): alert state, what each receiver was told, counter memory,
and the outbox.  Where they live (the file, or memory while it cannot be written) is ``database.Database``'s."""

from __future__ import annotations

import json
import logging
import sqlite3
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from tpuwatch.alerting import sqlitefile
from tpuwatch.alerting.database import Database, OutboxFull
from tpuwatch.alerting.state import Alert, fingerprint
from tpuwatch.alerting.tracker import Row

log = logging.getLogger(__name__)

DB_NAME = "alerting.db"

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
CREATE TABLE IF NOT EXISTS outbox_rank (
    id INTEGER PRIMARY KEY, receiver TEXT NOT NULL, priority INTEGER NOT NULL, grp TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS outbox_rank_order ON outbox_rank (receiver, priority, id);
CREATE INDEX IF NOT EXISTS outbox_rank_group ON outbox_rank (receiver, grp, id);
CREATE TRIGGER IF NOT EXISTS outbox_rank_gone AFTER DELETE ON outbox BEGIN
    DELETE FROM outbox_rank WHERE id = old.id;
END;
CREATE TABLE IF NOT EXISTS counters (
    name TEXT NOT NULL, labels TEXT NOT NULL, boot TEXT NOT NULL, last REAL NOT NULL, seen_at REAL NOT NULL,
    total REAL NOT NULL, changed_at REAL NOT NULL, points TEXT NOT NULL, born REAL NOT NULL, born_at REAL,
    PRIMARY KEY (name, labels));
"""

# Merging an in-memory database (attached as ``outage``) into a file it did not copy whole.
_MERGE = (
    "INSERT OR REPLACE INTO main.alerts SELECT * FROM outage.alerts",
    "INSERT OR REPLACE INTO main.notified SELECT * FROM outage.notified",
    "INSERT OR REPLACE INTO main.alert_keys SELECT * FROM outage.alert_keys",
    "INSERT OR REPLACE INTO main.counters SELECT * FROM outage.counters",
    "INSERT INTO main.outbox (receiver, key, body, created, next_attempt, attempts) "
    "SELECT receiver, key, body, created, next_attempt, attempts FROM outage.outbox ORDER BY id",
)


@dataclass(frozen=True)
class Message:
    """One queued notification: a JSON body for one receiver, with an id stable across retries."""

    id: int
    receiver: str
    key: str
    body: str
    created: float
    attempts: int
    priority: int = 1


@dataclass(frozen=True)
class Notification:
    """Bodies to queue for one receiver (PagerDuty: one per alert), and what it will then have been told."""

    receiver: str
    bodies: tuple[str, ...]
    told_firing: tuple[str, ...] = ()
    told_resolved: tuple[str, ...] = ()
    supersede: bool = False
    # Delivery order across groups: lower first (critical 0, warning 1, others 2); a group's own messages keep
    # their order whatever their priority, so a resolve never overtakes the firing notification it answers.
    priority: int = 1
    group: str = ""


SEVERITY_PRIORITY = {"critical": 0, "warning": 1}
OTHER_PRIORITY = 2


def priority(severities: Iterable[str]) -> int:
    """The delivery priority of a message telling alerts of these severities: its most urgent one's."""
    return min((SEVERITY_PRIORITY.get(s, OTHER_PRIORITY) for s in severities), default=OTHER_PRIORITY)


class AlertDB(Database):
    """The alerting database: its alerts, counters and outbox, read and written."""

    SCHEMA = _SCHEMA
    MERGE = _MERGE

    def _reconnected(self) -> None:
        """Give queued rows without a rank (written by a tpuwatch that kept none, or merged in from memory) the
        default one: one group per receiver, so they keep their order among themselves."""
        try:
            self._conn.execute("INSERT OR IGNORE INTO outbox_rank (id, receiver, priority, grp) "
                               "SELECT id, receiver, 1, '' FROM outbox WHERE id NOT IN (SELECT id FROM outbox_rank)")
        except sqlite3.Error as exc:  # a read-only file: claim() still finds them (their rank is the default)
            log.debug("cannot rank queued notifications: %s", exc)

    # --- alert state -------------------------------------------------------

    @sqlitefile.recovering
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

    @sqlitefile.recovering
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

    @sqlitefile.recovering
    def delete_alerts(self, fingerprints: Iterable[str]) -> None:
        """Forget alerts for good."""
        self._write(s for fp in fingerprints for s in _deletions(fp))

    # --- counter memory ----------------------------------------------------------

    @sqlitefile.recovering
    def load_counters(self) -> list[Row]:
        """Every counter's saved state."""
        with self._lock:
            rows = self._conn.execute("SELECT name, labels, boot, last, seen_at, total, changed_at, points, born, "
                                      "born_at FROM counters").fetchall()
        return [Row(*r) for r in rows]

    @sqlitefile.recovering
    def save_counters(self, rows: Iterable[Row], forgotten: Iterable[tuple[str, str]]) -> None:
        """Store changed counters and delete forgotten ones, in one transaction."""
        statements: list[tuple[str, tuple[object, ...]]] = [
            ("INSERT OR REPLACE INTO counters VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
             (r.name, r.labels, r.boot, r.last, r.seen_at, r.total, r.changed_at, r.points, r.born, r.born_at))
            for r in rows]
        statements += [("DELETE FROM counters WHERE name = ? AND labels = ?", key) for key in forgotten]
        self._write(statements)

    @sqlitefile.recovering
    def forget_receivers(self, keep: set[str]) -> None:
        """Forget what receivers no longer configured were told (their queued messages expire)."""
        marks = ", ".join("?" * len(keep))
        self._write([(f"DELETE FROM notified WHERE receiver NOT IN ({marks})", tuple(keep))])

    # --- outbox ----------------------------------------------------------------

    @sqlitefile.recovering
    def enqueue(self, notifications: list[Notification], now: float) -> None:
        """Queue notifications and record what they tell, in one transaction (all or nothing)."""
        statements: list[tuple[str, tuple[object, ...]]] = []
        for n in notifications:
            if n.supersede:
                statements.append(("DELETE FROM outbox WHERE receiver = ? AND claimed_until < ?", (n.receiver, now)))
            for body in n.bodies:
                statements.append(("INSERT INTO outbox (receiver, key, body, created, next_attempt) "
                                   "VALUES (?, ?, ?, ?, ?)", (n.receiver, uuid.uuid4().hex, body, now, now)))
                statements.append(("INSERT INTO outbox_rank (id, receiver, priority, grp) "
                                   "VALUES (last_insert_rowid(), ?, ?, ?)", (n.receiver, n.priority, n.group)))
            statements += [("INSERT OR REPLACE INTO notified VALUES (?, ?, ?)", (n.receiver, fp, now))
                           for fp in n.told_firing]
            statements += [("DELETE FROM notified WHERE receiver = ? AND fingerprint = ?", (n.receiver, fp))
                           for fp in n.told_resolved]
        self._write(statements)

    @sqlitefile.recovering
    def claim(self, receiver: str, now: float, hold: float, trial: bool = False) -> tuple[Message | None,
                                                                                          float | None]:
        """Claim the receiver's most urgent message if it is due: (message, None), else (None, when it is due).

        The most urgent is the lowest priority (critical first), then the oldest, among the oldest message of
        each group: a group's messages go out strictly in order, so a resolve never overtakes the firing
        notification it answers.  ``trial``: the circuit breaker's trial, which goes now whatever the message's
        own retry time (one not claimed by another attempt).
        """
        with self._lock:
            row = self._conn.execute(
                "SELECT o.id, o.receiver, o.key, o.body, o.created, o.attempts, o.next_attempt, o.claimed_until, "
                "COALESCE(r.priority, 1) FROM outbox o LEFT JOIN outbox_rank r ON r.id = o.id "
                "WHERE o.id = COALESCE(("
                "  SELECT r.id FROM outbox_rank r WHERE r.receiver = ?1 AND NOT EXISTS ("
                "    SELECT 1 FROM outbox_rank e WHERE e.receiver = ?1 AND e.grp = r.grp AND e.id < r.id) "
                "  ORDER BY r.priority, r.id LIMIT 1), "
                "  (SELECT id FROM outbox WHERE receiver = ?1 ORDER BY id LIMIT 1))", (receiver,)).fetchone()
            if row is None:
                return None, None
            due = row[7] if trial else max(row[6], row[7])
            if due > now:
                return None, due
            updated = self._conn.execute("UPDATE outbox SET claimed_until = ? WHERE id = ? AND claimed_until = ?",
                                         (now + hold, row[0], row[7])).rowcount
        if not updated:
            return None, now
        return Message(row[0], row[1], row[2], row[3], row[4], row[5], row[8]), None

    @sqlitefile.recovering
    def release(self, receiver: str, now: float) -> None:
        """Make every message of the receiver due now (it answers again: its backlog need not wait out the
        backoff of attempts that failed while it was down)."""
        with self._lock:
            self._conn.execute("UPDATE outbox SET next_attempt = ? WHERE receiver = ? AND next_attempt > ?",
                               (now, receiver, now))

    @sqlitefile.recovering
    def insert_claimed(self, receiver: str, body: str, now: float, hold: float) -> Message:
        """Queue one message already claimed by the caller (test-alert delivers it itself)."""
        key = uuid.uuid4().hex
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                cursor = self._conn.execute(
                    "INSERT INTO outbox (receiver, key, body, created, next_attempt, claimed_until) "
                    "VALUES (?, ?, ?, ?, ?, ?)", (receiver, key, body, now, now, now + hold))
                self._conn.execute("INSERT INTO outbox_rank (id, receiver, priority, grp) VALUES (?, ?, ?, ?)",
                                   (cursor.lastrowid, receiver, OTHER_PRIORITY, ""))
                self._conn.execute("COMMIT")
            except sqlite3.Error:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
        return Message(int(cursor.lastrowid or 0), receiver, key, body, now, 0, OTHER_PRIORITY)

    @sqlitefile.recovering
    def delete(self, message_id: int) -> None:
        """Remove a message (delivered, rejected or expired)."""
        with self._lock:
            self._conn.execute("DELETE FROM outbox WHERE id = ?", (message_id,))

    @sqlitefile.recovering
    def retry_later(self, message_id: int, at: float) -> None:
        """Release a claim after a failed attempt, due again at ``at``."""
        with self._lock:
            self._conn.execute("UPDATE outbox SET attempts = attempts + 1, next_attempt = ?, claimed_until = 0 "
                               "WHERE id = ?", (at, message_id))

    @sqlitefile.recovering
    def expire(self, before: float) -> list[tuple[str, int]]:
        """Delete messages created before ``before``; (receiver, count) of what went."""
        with self._lock:
            counts = self._conn.execute("SELECT receiver, COUNT(*) FROM outbox WHERE created < ? "
                                        "GROUP BY receiver", (before,)).fetchall()
            if counts:
                self._conn.execute("DELETE FROM outbox WHERE created < ?", (before,))
        return [(r, int(n)) for r, n in counts]

    @sqlitefile.recovering
    def queue_stats(self) -> dict[str, tuple[int, float]]:
        """receiver -> (queued messages, creation time of the oldest)."""
        with self._lock:
            rows = self._conn.execute("SELECT receiver, COUNT(*), MIN(created) FROM outbox GROUP BY receiver")
            return {r: (int(n), float(oldest)) for r, n, oldest in rows.fetchall()}

    def delete_rows(self, where: dict[str, str]) -> int:
        """Delete, in one transaction, the rows of each table that match its SQL condition; how many went."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            dropped = sum(self._conn.execute(f"DELETE FROM {table} WHERE {condition}").rowcount
                          for table, condition in where.items())
            self._conn.execute("COMMIT")
        return dropped


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
