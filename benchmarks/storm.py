#!/usr/bin/env python3
"""A kernel-log storm: how soon the critical record after 1 M storm lines is counted, beside grep on the same backlog.

Usage::

    python benchmarks/storm.py [--lines N] [--rate LINES_PER_S] [--quick] [--output BENCHMARKS.md]

For two file formats the kernel_log collector follows (syslog ``kern.log`` lines
and raw ``/dev/kmsg`` records with their continuation lines), in the same run:

* **Storm, in real time**: a writer process (on the other core where there is
  one) appends ``N`` (default 1,000,000) Xid 79 lines for one GPU at ``--rate``
  lines/s (default 100,000), then one Xid 79 of another GPU, the "follower".
  The collector, built from a config as the daemon builds it
  (``collector_deadline`` of the interval), runs every ``interval`` seconds
  (10 s, the default, and 1 s) on one core.  Reported: how long after it was
  written the follower was counted and in which cycle, the longest cycle
  beside the deadline the guard gives it (a cycle past it would time out),
  and how many storm lines were read or passed over (counted).
* **Catch-up throughput**: the same backlog read by a collector with no time
  budget (every line matched), lines/s, best of 3; the anchor is ``grep -c -F
  'NVRM: Xid'`` over the same file pinned to the same core, best of 3.

Ratios: collector lines/s to grep's; follower latency to the time grep needs
for one pass over the backlog.  The target is the follower counted in the
first cycle after it is written (latency under one interval plus that cycle).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's tpuwatch, not an installed one
from tpuwatch.config import parse  # noqa: E402
from tpuwatch.kernel_log.collector import BUDGET_SHARE, KernelLogCollector, build_collector  # noqa: E402
from tpuwatch.kernel_log.filesource import FileSource  # noqa: E402
from tpuwatch.kernel_log.rulefile import load_rules  # noqa: E402

from common import BENCHMARKS_MD, cpu_model, write_section  # noqa: E402

CHIPS = {"0000:18:00.0": "0", "0000:3b:00.0": "1"}
FOLLOWER_KEY = ("tpuwatch_kernel_events_total", (("device", "0"), ("rule", "nvidia_xid"), ("severity", "critical")))
STORM_KEY = ("tpuwatch_kernel_events_total", (("device", "1"), ("rule", "nvidia_xid"), ("severity", "critical")))
XID = "NVRM: Xid (PCI:0000:{bus}:00): 79, pid={pid}, name=python3, GPU has fallen off the bus."
FORMATS = {
    "syslog (kern.log)": "Nov 30 04:37:39 gpu-host-7 kernel: [{sec:12.6f}] {text}\n",
    "raw kmsg records": "2,{seq},{usec},-;{text}\n SUBSYSTEM=pci\n DEVICE=+pci:0000:{bus}:00.0\n",
}

# The writer: N storm lines at RATE lines/s in 10 ms batches, then the follower; prints when the follower was written.
WRITER = """
import sys, time
path, shape, lines, rate = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
xid = {xid!r}
def line(i, bus):
    return shape.format(sec=i / 1e4, usec=i * 100, seq=i, bus=bus, text=xid.format(bus=bus, pid=i))
batch = max(1, int(rate / 100))
start = time.monotonic()
with open(path, "a") as out:
    for first in range(0, lines, batch):
        out.write("".join(line(i, "3b") for i in range(first, min(lines, first + batch))))
        out.flush()
        pause = start + (first + batch) / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    out.write(line(lines, "18"))
    out.flush()
print(time.time(), flush=True)
""".format(xid=XID)


@dataclass
class StormRun:
    """What one real-time storm run saw."""

    interval: float
    deadline: float
    latency: float
    cycle: int  # 1: counted by the first cycle after the follower was written
    longest: float
    read: int
    passed: int
    storm_counted: int
    collect_s: float


def values(collector: KernelLogCollector) -> dict:  # type: ignore[type-arg]
    return {(s.name, s.labels): s.value for s in collector.collect()}


def storm(tmp: Path, shape: str, lines: int, rate: float, interval: float, writer_pin: list[str]) -> StormRun:
    """One real-time run: cycles every ``interval`` while the writer storms, until the follower is counted."""
    log = tmp / "kern.log"
    log.write_text("")
    config = parse(f"interval: {interval}s\nstate_dir: {tmp}/state\n"
                   f"kernel_log: {{source: file, path: {log}, rules_dirs: []}}")
    collector, _ = build_collector(config, CHIPS.get)
    assert collector is not None
    values(collector)
    writer = subprocess.Popen([*writer_pin, sys.executable, "-c", WRITER, str(log), shape, str(lines), str(rate)],
                              stdout=subprocess.PIPE, text=True)
    written_at: float | None = None
    longest = collect_s = 0.0
    cycles_after = 0
    next_cycle = time.monotonic() + interval
    while True:
        time.sleep(max(0.0, next_cycle - time.monotonic()))
        next_cycle += interval
        if written_at is None and writer.poll() is not None:
            written_at = float(writer.stdout.read().strip()) if writer.stdout else None
        started = time.perf_counter()
        got = values(collector)
        took = time.perf_counter() - started
        longest, collect_s = max(longest, took), collect_s + took
        if written_at is not None:
            cycles_after += 1
        if got.get(FOLLOWER_KEY, 0) >= 1:
            counted_at = time.time()
            break
        if cycles_after > 100:
            raise SystemExit("the follower was never counted")
    if written_at is None:  # counted in the very cycle the writer finished in
        writer.wait()
        written_at = float(writer.stdout.read().strip()) if writer.stdout else counted_at
        cycles_after = 1
    collector.close()
    return StormRun(interval, config.collector_deadline, counted_at - written_at, cycles_after, longest,
                    int(got[("tpuwatch_kernel_log_records_total", (("source", "file"),))]),
                    int(got[("tpuwatch_kernel_log_skipped_total", (("reason", "backlog"), ("source", "file")))]),
                    int(got.get(STORM_KEY, 0)), collect_s)


def backlog(path: Path, shape: str, lines: int) -> None:
    """The storm and the follower, written at once."""
    with open(path, "w") as out:
        for first in range(0, lines, 10_000):
            out.write("".join(shape.format(sec=i / 1e4, usec=i * 100, seq=i, bus="3b", text=XID.format(bus="3b", pid=i))
                              for i in range(first, min(lines, first + 10_000))))
        out.write(shape.format(sec=0, usec=0, seq=lines, bus="18", text=XID.format(bus="18", pid=lines)))


def full_pass(path: Path) -> tuple[float, int]:
    """Seconds for a collector without a time budget to read the whole file, and what it read."""
    state = path.with_name("from-the-start.json")  # a saved position at offset 0: read the file from its start
    st = path.stat()
    state.write_text(json.dumps({"path": str(path), "dev": st.st_dev, "ino": st.st_ino, "offset": 0}))
    collector = KernelLogCollector(FileSource(str(path), state), load_rules([]), CHIPS.get, 60.0, deadline=1e9)
    started = time.perf_counter()
    got = values(collector)
    took = time.perf_counter() - started
    assert got[FOLLOWER_KEY] == 1
    return took, int(got[("tpuwatch_kernel_log_records_total", (("source", "file"),))])


def grep_pass(path: Path, pin: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run([*pin, "grep", "-c", "-F", "NVRM: Xid", str(path)], check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> int:
    """Measure both formats, report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--rate", type=float, default=100_000.0)
    parser.add_argument("--quick", action="store_true", help="100,000 lines, interval 1 s only: figures not to quote")
    parser.add_argument("--output", type=Path, default=BENCHMARKS_MD)
    args = parser.parse_args()
    lines = 100_000 if args.quick else args.lines
    intervals = [1.0] if args.quick else [10.0, 1.0]
    repeats = 1 if args.quick else 3
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[0]})
    pin = ["taskset", "-c", str(cores[0])] if shutil.which("taskset") else []
    writer_pin = ["taskset", "-c", str(cores[-1])] if shutil.which("taskset") and len(cores) > 1 else []
    rows, storms = [], []
    for name, shape in FORMATS.items():
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp, "backlog.log")
            backlog(path, shape, lines)
            size = path.stat().st_size
            passes = [full_pass(path) for _ in range(repeats)]
            greps = [grep_pass(path, pin) for _ in range(repeats)]
        ours, grep = min(p[0] for p in passes), min(greps)
        rows.append((name, size, passes[0][1], ours, grep))
        print(f"{name}: collector {lines / ours:,.0f} lines/s, grep {lines / grep:,.0f} lines/s", file=sys.stderr)
        for interval in intervals:
            with tempfile.TemporaryDirectory() as tmp:
                run = storm(Path(tmp), shape, lines, args.rate, interval, writer_pin)
            storms.append((name, run, grep))
            print(f"{name} @ {interval:g}s: follower after {run.latency:.2f}s (cycle {run.cycle}), longest cycle "
                  f"{run.longest:.2f}s of {run.deadline:g}s", file=sys.stderr)
    command = "python benchmarks/storm.py" + (" --quick" if args.quick else "") + (
        f" --lines {args.lines}" if args.lines != 1_000_000 else "") + (f" --rate {args.rate:g}"
                                                                         if args.rate != 100_000 else "")
    table = "\n".join(
        f"| {name} | {interval_row(run)} | {run.latency:.2f} s ({run.latency / run.interval:.2f} interval) | "
        f"{run.cycle} | {run.latency / grep:.1f}x | {run.longest:.2f} s of {run.deadline:g} s | "
        f"{run.storm_counted:,} / {run.passed:,} |"
        for name, run, grep in storms)
    passes_table = "\n".join(
        f"| {name} | {size / 1e6:.0f} MB | {lines / ours:,.0f} | {lines / grep:,.0f} | {grep / ours:.3f}x |"
        for name, size, _, ours, grep in rows)
    report = f"""## Kernel log: a storm of {lines:,} lines, and the next critical record

{"**Quick run: figures not to quote.**" if args.quick else ""}
`{command}` on {os.cpu_count()} CPUs ({cpu_model()}), Python {platform.python_version()},
{datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}. The collector runs on one core, the storm writer on
{"another" if writer_pin else "the same (no taskset or one core)"}; grep is pinned to the collector's core.

A writer appends {lines:,} Xid 79 lines of GPU 1 at {args.rate:,.0f} lines/s, then one Xid 79 of GPU 0 (the
follower); the kernel_log collector (built from a config as the daemon builds it) runs every interval.
Latency is from the follower's write to the end of the cycle that counted it; "cycle" 1 means the first cycle
after the write (the target); grep's figure is one `grep -c -F 'NVRM: Xid'` pass over the same backlog.

| Format | Interval (deadline) | Follower counted after | Cycle | Latency / grep pass | Longest cycle | Storm records read (each counted) / passed over (counted) |
|---|---|---|---|---|---|---|
{table}

Catch-up throughput on the same backlog written at once: a collector without a time budget matching every line,
best of {repeats}, beside grep over the same file on the same core, best of {repeats}.

| Format | Backlog | Collector lines/s | grep -c lines/s | Ratio to grep |
|---|---|---|---|---|
{passes_table}

A cycle works for {BUDGET_SHARE:.0%} of its deadline: half reading from where it was, then, if the backlog is larger than
it can read, it passes over the middle (counted in `tpuwatch_kernel_log_skipped_total{{reason="backlog"}}`) and
reads the newest records with the other half. What it passes over is sieved first, for at most a quarter of
the time left: lines a critical rule may match are read after all, once per message (see docs/kernel_log.md).
So a cycle never runs into the deadline (a guard timeout), the storm's own counter stays exact for the lines
read, and the record after the storm is counted one cycle later.
"""
    write_section("storm", report, args.output)
    return 0 if all(run.cycle == 1 for _, run, _ in storms) else 1


def interval_row(run: StormRun) -> str:
    return f"{run.interval:g} s ({run.deadline:g} s)"


if __name__ == "__main__":
    raise SystemExit(main())
