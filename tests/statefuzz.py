"""Broken state files for the fuzz tests: from a good file, truncations, flipped and random bytes, and valid JSON
or SQLite of the wrong shape.  Deterministic for a seed.

``TPUWATCH_FUZZ_CASES`` (default 1000 per file) and ``TPUWATCH_FUZZ_SEED`` (default 14) set the run; CI uses
the defaults, a longer run is e.g. ``TPUWATCH_FUZZ_CASES=20000 TPUWATCH_FUZZ_SEED=$RANDOM``.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

CASES = int(os.environ.get("TPUWATCH_FUZZ_CASES", "1000"))
SEED = int(os.environ.get("TPUWATCH_FUZZ_SEED", "14"))

EXTREMES: list[Any] = [None, True, False, 0, -1, -10**20, 10**20, 2**63, 2**64, -2**63, 1.5, float("nan"),
                       float("inf"), float("-inf"), "", "x" * 5000, "\u0000\ud7ff\uffff", [], {}, [[]], {"": {}},
                       "-10", "1e400", "../../etc/passwd"]
KEYS = ["seq", "boot_id", "offset", "dev", "ino", "path", "cursor", "version", "saved_at", "leaks", "drifts",
        "labels", "last_seen", "detector", "0", "k", ""]


def random_value(rng: random.Random, depth: int = 0) -> Any:
    """A JSON value of any type, extremes often."""
    kind = rng.randrange(6 if depth < 3 else 3)
    if kind == 0:
        return rng.choice(EXTREMES)
    if kind == 1:
        return rng.randint(-2**70, 2**70)
    if kind == 2:
        return "".join(chr(rng.randrange(1, 0x3000)) for _ in range(rng.randrange(12)))
    if kind == 3:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 4:  # keys the real files use, so that wrong values meet the code that reads them
        return {rng.choice(KEYS): random_value(rng, depth + 1) for _ in range(rng.randrange(4))}
    return rng.random() * 10 ** rng.randrange(-5, 300)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += _paths(item, (*prefix, i))
    return out


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _replace(copy[path[0]], path[1:], new)
    return copy


def _drop(value: Any, path: tuple[Any, ...]) -> Any:
    if len(path) == 1:
        copy = dict(value) if isinstance(value, dict) else list(value)
        del copy[path[0]]
        return copy
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _drop(copy[path[0]], path[1:])
    return copy


def byte_mutation(good: bytes, rng: random.Random) -> tuple[str, bytes]:
    """Truncated, flipped, spliced or random bytes."""
    kind = rng.randrange(5)
    if kind == 0 and good:
        return "truncated", good[:rng.randrange(len(good))]
    if kind == 1 and good:
        data = bytearray(good)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return "flipped", bytes(data)
    if kind == 2 and good:
        at = rng.randrange(len(good))
        return "spliced", good[:at] + rng.randbytes(rng.randrange(1, 64)) + good[at:]
    if kind == 3:
        return "empty-ish", rng.choice([b"", b"\n", b"\x00" * 4096, b"null", b"\xff\xfe{", b"[" * 100_000])
    return "random", rng.randbytes(rng.randrange(1, 5000))


def json_cases(good: Any, rng: random.Random, count: int = CASES) -> Iterator[tuple[str, bytes]]:
    """``count`` broken variants of the JSON document ``good``: wrong shapes first among them, then bytes."""
    text = json.dumps(good).encode()
    for i in range(count):
        kind = rng.randrange(4)
        if kind == 0:  # one node replaced by a value of any type
            path = rng.choice(_paths(good))
            yield f"{i}:leaf {path}", json.dumps(_replace(good, path, random_value(rng))).encode()
        elif kind == 1:
            paths = _paths(good)[1:]
            if paths:
                path = rng.choice(paths)
                yield f"{i}:dropped {path}", json.dumps(_drop(good, path)).encode()
            else:
                yield f"{i}:other", json.dumps(random_value(rng)).encode()
        elif kind == 2:
            yield f"{i}:other document", json.dumps(random_value(rng)).encode()
        else:
            name, data = byte_mutation(text, rng)
            yield f"{i}:{name}", data


def sqlite_files(make: Callable[[Path], None], folder: Path) -> dict[str, bytes]:
    """The files of a database ``make(path)`` writes, copied while its WAL still holds frames (suffix -> bytes),
    and under "whole" the database file once the WAL is checkpointed into it."""
    path = folder / "good.db"
    keep_open = sqlite3.connect(path, isolation_level=None)
    keep_open.execute("PRAGMA journal_mode=WAL")
    keep_open.execute("BEGIN")  # a reader: the writer's close cannot checkpoint the WAL away
    keep_open.execute("SELECT count(*) FROM sqlite_master").fetchall()
    make(path)
    files = {suffix: Path(f"{path}{suffix}").read_bytes() for suffix in ("", "-wal", "-shm")
             if Path(f"{path}{suffix}").exists()}
    keep_open.close()
    files["whole"] = path.read_bytes()
    return files


def wrong_shape_db(rng: random.Random, good: dict[str, bytes], folder: Path, tables: dict[str, list[str]]) -> bytes:
    """A whole SQLite database of the wrong shape: rows of random types, other columns, foreign objects."""
    path = folder / "wrong.db"
    path.unlink(missing_ok=True)
    path.write_bytes(good["whole"])
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=DELETE")
    kind = rng.randrange(4)
    table = rng.choice(list(tables))
    columns = tables[table]
    if kind == 0:
        for _ in range(rng.randint(1, 3)):
            values = [rng.choice([None, rng.randint(-2**63, 2**63 - 1), rng.random(), rng.randbytes(4),
                                  json.dumps(random_value(rng)), "firing", "pending", "resolved"])
                      for _ in columns]
            try:
                conn.execute(f"INSERT OR REPLACE INTO {table} VALUES ({', '.join('?' * len(columns))})", values)
            except sqlite3.IntegrityError:
                pass  # NOT NULL, or a non-integer id: SQLite keeps those out itself
    elif kind == 1:
        conn.execute(f"DROP TABLE {table}")
        conn.execute(f"CREATE TABLE {table} ({', '.join(rng.sample(columns, rng.randint(1, len(columns))))})")
    elif kind == 2:
        conn.execute(f"CREATE TRIGGER refuse BEFORE INSERT ON {table} BEGIN SELECT RAISE(ABORT, 'no'); END")
    else:
        conn.execute(f"DROP TABLE {table}")
        conn.execute(f"CREATE VIEW {table} AS SELECT 1 AS x")
    conn.commit()
    conn.close()
    return path.read_bytes()


def sqlite_cases(good: dict[str, bytes], rng: random.Random, folder: Path, tables: dict[str, list[str]],
                 count: int = CASES) -> Iterator[tuple[str, dict[str, bytes | None]]]:
    """``count`` broken sets of database, -wal and -shm (None: file absent)."""
    for i in range(count):
        files: dict[str, bytes | None] = {"": good[""], "-wal": good.get("-wal"), "-shm": good.get("-shm")}
        kind = rng.randrange(6)
        if kind == 5:
            files = {"": wrong_shape_db(rng, good, folder, tables), "-wal": None, "-shm": None}
            yield f"{i}:wrong shape", files
            continue
        broken = rng.sample(["", "-wal", "-shm"], rng.randint(1, 3))
        names = []
        for suffix in broken:
            if rng.random() < 0.15:
                files[suffix] = None
                names.append(f"{suffix or 'db'} absent")
                continue
            name, data = byte_mutation(files[suffix] or good[""], rng)
            files[suffix] = data
            names.append(f"{suffix or 'db'} {name}")
        yield f"{i}:{', '.join(names)}", files
