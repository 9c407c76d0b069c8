#!/usr/bin/env python3
"""Measure what broken-state handling costs beside SQLite's own CLI and write the state section of BENCHMARKS.md.

Usage::

    python benchmarks/state.py [--mib 256] [--repeats 5] [--probes 2000] [--quick] [--output BENCHMARKS.md]

1. Start: ``open_db(repair=True)`` (the daemon's open: quick check, schema
   check, deletion of rows of the wrong shape) on an ``alerting.db`` whose
   outbox fills ``--mib`` MiB (``alerting.outbox_max_bytes``' default is 256).
   Anchor: ``sqlite3 FILE 'PRAGMA quick_check'`` on the same file.  Median of
   ``--repeats``, page cache warm.
2. State in memory and back: ``use_memory()`` then ``use_file()`` on a
   database at the in-memory bound (32 MiB).  Anchor: ``sqlite3 FILE
   '.backup COPY'`` of the same file, once each way.
3. The writability probe the daemon runs every interval: wall time per call,
   mean of ``--probes``, in a directory on the same file system.

Only the section between ``<!-- state:begin -->`` and ``<!-- state:end -->``
of the output file is rewritten.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from common import BENCHMARKS_MD, REPO_ROOT, cpu_model, write_section

sys.path.insert(0, str(REPO_ROOT))

from tpuwatch.alerting.db import DB_NAME, Notification  # noqa: E402
from tpuwatch.alerting.dbopen import open_db  # noqa: E402
from tpuwatch.alerting.sqlitefile import MEMORY_MAX_BYTES  # noqa: E402
from tpuwatch.statedir import probe  # noqa: E402

BODY = "x" * (64 << 10)


def progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def make_db(folder: Path, mib: int) -> Path:
    """An alerting.db whose outbox holds about ``mib`` MiB of 64 KiB messages."""
    folder.mkdir(parents=True, exist_ok=True)
    db = open_db(str(folder), (mib + 16) << 20)
    for start in range(0, mib * 16, 64):
        db.enqueue([Notification("hook", tuple(f'{{"n": {n}, "pad": "{BODY}"}}' for n in range(start, start + 64)))],
                   time.time())
    db.close()
    return folder / DB_NAME


def median_seconds(action: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def sqlite3_cli(*args: str) -> None:
    subprocess.run(["sqlite3", *args], check=True, capture_output=True, timeout=600)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="outbox size for the start figure (MiB)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--probes", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="smoke run: 32 MiB, 2 repeats, 200 probes")
    parser.add_argument("--output", type=Path, default=BENCHMARKS_MD)
    args = parser.parse_args()
    if args.quick:
        args.mib, args.repeats, args.probes = 32, 2, 200
    if shutil.which("sqlite3") is None:
        print("benchmarks/state.py needs the sqlite3 CLI (apt-get install sqlite3)", file=sys.stderr)
        return 2
    command = shlex.join(["python", "benchmarks/state.py", *sys.argv[1:]])
    with tempfile.TemporaryDirectory(prefix="tpuwatch-bench-state-") as scratch:
        root = Path(scratch)
        progress(f"filling a {args.mib} MiB alerting.db")
        big = make_db(root / "big", args.mib)
        size = big.stat().st_size
        sqlite3_cli(str(big), "PRAGMA quick_check")  # page cache warm for both
        ours = median_seconds(lambda: open_db(str(big.parent), (args.mib + 16) << 20, repair=True).close(),
                              args.repeats)
        anchor = median_seconds(lambda: sqlite3_cli(str(big), "PRAGMA quick_check"), args.repeats)
        progress(f"start: {ours:.3f} s, sqlite3 quick_check {anchor:.3f} s")

        small = make_db(root / "small", MEMORY_MAX_BYTES * 3 // 4 >> 20)  # well inside the in-memory bound
        small_size = small.stat().st_size
        db = open_db(str(small.parent), 64 << 20, repair=True)

        def round_trip() -> None:
            db.use_memory("benchmark")
            if not db.use_file():
                raise RuntimeError("use_file failed")

        trip = median_seconds(round_trip, args.repeats)
        messages = sum(n for n, _ in db.queue_stats().values())
        db.close()
        if messages != (MEMORY_MAX_BYTES * 3 // 4 >> 20) * 16:
            raise RuntimeError(f"the round trip lost messages: {messages} left")
        copy = root / "copy.db"

        def backup_once() -> None:
            copy.unlink(missing_ok=True)
            sqlite3_cli(str(small), f".backup {copy}")

        backup = median_seconds(backup_once, args.repeats)
        progress(f"memory and back: {trip:.3f} s, sqlite3 .backup {backup:.3f} s")

        probe_dir = root / "probe"
        started = time.perf_counter()
        for _ in range(args.probes):
            if probe(str(probe_dir)) is not None:
                raise RuntimeError("the probe failed")
        per_probe = (time.perf_counter() - started) / args.probes
        fs = subprocess.run(["stat", "-f", "-c", "%T", scratch], capture_output=True, text=True).stdout.strip()
    sqlite_version = subprocess.run(["sqlite3", "--version"], capture_output=True, text=True).stdout.split()[0]
    quick = "\n**--quick smoke run: do not quote these figures.**\n" if args.quick else ""
    section = f"""## Broken state: start, memory and back, the probe
{quick}
Machine: {os.cpu_count()} CPUs ({cpu_model()}), Linux {platform.release()}, Python {platform.python_version()},
scratch on {fs}. Anchor: the sqlite3 CLI {sqlite_version}, same run, same files.
Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC. Command: `{command}`.

| Figure | tpuwatch | sqlite3 (anchor) | Ratio | Target |
|---|---|---|---|---|
| Start: `open_db(repair=True)` on a {size / (1 << 20):.0f} MiB `alerting.db`, median of {args.repeats} | {ours * 1000:.0f} ms | {anchor * 1000:.0f} ms (`PRAGMA quick_check`) | {ours / anchor:.2f}x | <= 2.0x |
| State into memory and back (`use_memory()` + `use_file()`), {small_size / (1 << 20):.0f} MiB, every message kept | {trip * 1000:.0f} ms | {2 * backup * 1000:.0f} ms (`.backup`, twice) | {trip / (2 * backup):.2f}x | <= 2.0x |
| Writability probe, per call (mean of {args.probes}) | {per_probe * 1e6:.0f} µs | | | <= 0.1 % of a 10 s interval |

The start figure is what a daemon restart adds with a full outbox: SQLite's
quick check, which the anchor runs alone, then one scan of every table for
rows of the wrong shape (about as long again). Going into memory copies the
file once; coming back writes it once beside the file and renames it over.
"""
    write_section("state", section, args.output)
    progress(f"wrote the state section of {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
