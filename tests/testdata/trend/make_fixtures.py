"""Regenerate the trend fixtures: ``python tests/testdata/trend/make_fixtures.py``.

HBM of a 16 GiB chip under an allocator sawtooth (period 3 min), sampled every
30 s for 10 h from 2026-01-01 00:00 UTC: ``leak.csv`` leaks 0.2 GiB/h from 4 h on
(with a capacity column), ``ok.csv`` takes one step up at 4 h (no capacity
column); ``query_range.json`` holds both as two series of a Prometheus
query_range answer at a 60 s step.

Three captured leak-free traces of ``benchmarks/trend.py`` are not made here:

- ``periodic_turning.csv``: the first 3 h of seed 12, kind ``periodic``, 16
  GiB, a load cycle of over 2 h that had only been rising when the detector's
  learning ended;
- ``sawtooth_turning.csv``: 4 h of seed 4, trace 85 (``irregular_sawtooth``,
  95 GiB), up to 10 min after the detector without its ``end_slack`` check
  fired;
- ``warmup_levelling.csv``: seed 66, trace 176 (``warmup``, 95 GiB), up to
  30 min after the detector without its ``newest_ratio`` check fired.

and one of ``benchmarks/fastleaks.py``:

- ``warmup_steps_closing.csv``: seed 15, trace 227 (``warmup_steps``, 32
  GiB, under a sawtooth), up to 40 min after the warm-up began: its time to
  full closed in for three minutes, and the fast check without the raw
  readings' stricter test for a page short of its persistence paged it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

GIB = 1 << 30
START = 1_767_225_600
HERE = Path(__file__).resolve().parent


def trace(leak: bool, step: int) -> list[tuple[int, int]]:
    rng = random.Random(6 if leak else 7)
    points = []
    for k in range(0, 10 * 3600, step):
        used = 6 * GIB + 2 * GIB * ((k % 180) / 180) + rng.gauss(0, 0.01 * GIB)
        if k >= 4 * 3600:
            used += 0.2 * GIB * (k - 4 * 3600) / 3600 if leak else 1.5 * GIB
        points.append((START + k, round(used)))
    return points


def main() -> None:
    rows = [f"{t},{v},{16 * GIB}" for t, v in trace(True, 30)]
    (HERE / "leak.csv").write_text("timestamp,value,capacity\n" + "\n".join(rows) + "\n")
    rows = [f"{t},{v}" for t, v in trace(False, 30)]
    (HERE / "ok.csv").write_text("timestamp,value\n" + "\n".join(rows) + "\n")
    result = [{"metric": {"__name__": "tpuwatch_device_memory_used_bytes", "device": str(d)},
               "values": [[t, str(v)] for t, v in trace(leak, 60)]} for d, leak in ((0, True), (1, False))]
    document = {"status": "success", "data": {"resultType": "matrix", "result": result}}
    (HERE / "query_range.json").write_text(json.dumps(document) + "\n")


if __name__ == "__main__":
    main()
