"""Freed memory goes back to the system after a cycle (glibc's malloc_trim), at most once per period."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tpuwatch.malloc import Trimmer

ROOT = Path(__file__).resolve().parent.parent

# Holds 40 MB of small blocks, frees all but every 64th (so glibc cannot give the pages back by itself: the
# survivors pin them), then trims; prints the RSS drop in KiB.
PEAK = """
import sys
from tpuwatch.malloc import Trimmer
def rss():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("RssAnon"))
blocks = [bytearray(600) for _ in range(65_000)]
keep = blocks[::64]
del blocks
before = rss()
trim = Trimmer(every=0.0)
trim()
print(before - rss(), trim.trims, trim.available)
"""


def test_a_trim_after_a_transient_peak_gives_the_freed_pages_back() -> None:
    out = subprocess.run([sys.executable, "-c", PEAK], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "MALLOC_ARENA_MAX": "2"}).stdout.split()
    dropped_kib, trims, available = int(out[0]), int(out[1]), out[2] == "True"
    assert available and trims == 1
    assert dropped_kib > 20_000  # of the ~40 MB freed: most pages hold no survivor


def test_trims_come_at_most_once_per_period() -> None:
    now = [100.0]
    trim = Trimmer(every=10.0, clock=lambda: now[0])
    for step in (0.0, 3.0, 6.0, 1.5, 0.0, 8.0):
        now[0] += step
        trim()
    assert trim.trims == 2  # at 100 and at 110.5: 103 and 109 fall within the period, and so does 118.5
