#!/usr/bin/env python3
"""``tpuwatch analyze`` on a long recorded series beside ``awk`` reading the same file.

Usage::

    python benchmarks/analyze.py [--rows N] [--quick] [--output BENCHMARKS.md]

Writes a CSV of ``N`` rows (default 3,000,000: 347 days at 10 s) of HBM in
use on a 16 GiB chip: an allocator sawtooth with noise, and a leak of
0.1 GiB/h in the last tenth.  Then, in the same run, best of 3 on one core
(``taskset -c 0`` where available), it times the whole process of:

* ``tpuwatch analyze FILE --json``: samples per second and peak RSS
  (``ru_maxrss`` of the child);
* the anchor, ``awk -F, '{n++; s += $2} END {print s / n}' FILE``: the cost
  of merely reading and splitting the same rows;

and rewrites the ``analyze`` section of BENCHMARKS.md.  Targets: at least
200,000 samples/s for the whole process, at most 100 MB RSS.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BENCHMARKS_MD, REPO_ROOT, cpu_model, write_section  # noqa: E402

GIB = 1 << 30
START = 1_767_225_600
TARGET_RATE = 200_000
TARGET_RSS_MB = 100


def write_series(path: Path, rows: int, seed: int = 1) -> None:
    """The benchmark's CSV: ``timestamp,value,capacity`` every 10 s."""
    rng = random.Random(seed)
    leak_from = int(rows * 0.9)
    with path.open("w") as out:
        out.write("timestamp,value,capacity\n")
        for k in range(rows):
            used = 6 * GIB + 2 * GIB * ((k % 18) / 18) + rng.gauss(0, 0.01 * GIB)
            if k >= leak_from:
                used += 0.1 * GIB * (k - leak_from) * 10 / 3600
            out.write(f"{START + 10 * k},{used:.0f},{16 * GIB}\n")


def timed(command: list[str]) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (MB, this child's own ``ru_maxrss``) and stdout of one run of ``command``."""
    with tempfile.TemporaryFile() as out:
        started = time.perf_counter()
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.DEVNULL, cwd=REPO_ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode()
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{shlex.join(command)} failed with status {proc.returncode}")
    return wall, usage.ru_maxrss / 1024, text


def best_of(runs: int, command: list[str]) -> tuple[float, float, str]:
    """The fastest of ``runs`` runs (wall, rss of that run, stdout)."""
    results = [timed(command) for _ in range(runs)]
    return min(results, key=lambda r: r[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--quick", action="store_true", help="300,000 rows, one run each: figures not to quote")
    parser.add_argument("--output", type=Path, default=BENCHMARKS_MD)
    args = parser.parse_args()
    rows = 300_000 if args.quick else args.rows
    runs = 1 if args.quick else 3
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    with tempfile.TemporaryDirectory(prefix="tpuwatch-bench-analyze-") as tmp:
        path = Path(tmp) / "series.csv"
        print(f"writing {rows:,} rows to {path}", file=sys.stderr, flush=True)
        write_series(path, rows)
        size_mb = path.stat().st_size / 1e6
        awk = shutil.which("mawk") or shutil.which("awk") or "awk"
        print("timing awk", file=sys.stderr, flush=True)
        awk_wall, awk_rss, _ = best_of(runs, [*pin, awk, "-F,", "NR > 1 {n++; s += $2} END {print s / n}",
                                              str(path)])
        print("timing tpuwatch analyze", file=sys.stderr, flush=True)
        wall, rss, out = best_of(runs, [*pin, sys.executable, "-m", "tpuwatch", "analyze", str(path), "--json"])
    [series] = json.loads(out)["series"]
    rate = rows / wall
    leak_start = START + 10 * int(rows * 0.9)
    delay = (series["first_alert_at"] - leak_start) / 60 if series["first_alert_at"] else math.nan
    command = shlex.join(["python", "benchmarks/analyze.py", *sys.argv[1:]])
    lines = [
        "## `tpuwatch analyze` on a long series beside awk",
        "",
        f"A {rows:,}-row CSV ({size_mb:.0f} MB; 10 s samples, an allocator sawtooth, a 0.1 GiB/h leak in the last "
        "tenth) replayed by `tpuwatch analyze FILE --json`, whole process, beside `awk` reading and splitting the "
        f"same rows; best of {runs} on one core. Ratios are tpuwatch / awk.",
        "",
        "| Figure | tpuwatch analyze | awk (anchor) | Ratio | Target | Met |",
        "|---|---:|---:|---:|---|---|",
        f"| Wall time (s) | {wall:.2f} | {awk_wall:.2f} | {wall / awk_wall:.1f}x | context | |",
        f"| Samples per second, whole process | {rate:,.0f} | {rows / awk_wall:,.0f} | {awk_wall / wall:.2f}x "
        f"| >= {TARGET_RATE:,} | {'yes' if rate >= TARGET_RATE else 'NO'} |",
        f"| Peak RSS (MB) | {rss:.1f} | {awk_rss:.1f} | {rss / awk_rss:.1f}x | <= {TARGET_RSS_MB} "
        f"| {'yes' if rss <= TARGET_RSS_MB else 'NO'} |",
        "",
        f"- Verdict: {series['verdict']}, first alert {delay:.0f} min after the leak began; growth over the whole "
        f"series {series['slope_bytes_per_second'] * 3600 / 2**20:.1f} MiB/h.",
        f"- Machine: {os.cpu_count()} CPUs ({cpu_model()}), Python {platform.python_version()}, "
        f"{datetime.now(timezone.utc):%Y-%m-%d}. Command: `{command}`"
        + (" (quick: not to quote)." if args.quick else "."),
    ]
    write_section("analyze", "\n".join(lines), args.output)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
