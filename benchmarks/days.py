#!/usr/bin/env python3
"""Whether the daemon's memory levels off: days of sampling cycles on a simulated clock, in minutes.

Usage::

    python benchmarks/days.py [--hours N] [--chips N] [--quick] [--output BENCHMARKS.md]

The daemon's structures that hold history are bounded, but several fill over
hours, not minutes: the leak detector keeps per-minute floors over its longest
scale plus its lookback (10 h), counters keep up to 64 points per longest
rule window, and the alert database's rows grow with them.  A real-time run
of an hour (``daemon.py``) sees only the start of that filling.  This script
replays ``--hours`` (default 48) of a daemon's life at interval 10 s in this
process: ``time.time`` and ``time.monotonic`` are replaced by a clock that
moves 10 s per cycle *before* tpuwatch is imported (so the simulated chips,
the trend analysis, the alert tracker and the alert database all live on it),
then the pipeline ``tpuwatch.assembly.assemble`` builds for the config below
runs cycle after cycle (``Sampler.run_once()`` and the /metrics render, as the
daemon's sampling job does).  The scheduler, the canary subprocess and the
HTTP server are not run.

Every simulated hour it records VmRSS and RssAnon, the interpreter's
allocated blocks (``sys.getallocatedblocks()``: Python objects), gc-tracked
objects and the size of the alert database.  It rewrites the ``days`` section
of BENCHMARKS.md.  Target: the last simulated day grows no faster than 1 % of
the RSS per day, and its slope is a small fraction of the first hours' (the
anchor is the same run's early growth: no external program runs on a
simulated clock).
"""

from __future__ import annotations

import time

_START = time.time()
_CLOCK = [_START]
_MONOTONIC_OFFSET = time.monotonic() - _START
time.time = lambda: _CLOCK[0]  # noqa: E731 - replaced before anything else is imported
time.monotonic = lambda: _CLOCK[0] + _MONOTONIC_OFFSET  # noqa: E731

import argparse  # noqa: E402
import gc  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import types  # noqa: E402
from collections.abc import Iterable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from common import BENCHMARKS_MD, REPO_ROOT, cpu_model, machine_and_command, write_section  # noqa: E402

sys.path.insert(0, str(REPO_ROOT))  # measure the tpuwatch of this checkout, whatever else is installed
from tpuwatch import config as config_module  # noqa: E402
from tpuwatch.assembly import assemble  # noqa: E402
from tpuwatch.exporter import build_registry  # noqa: E402

INTERVAL_S = 10.0
REPORT_HOURS = (1, 3, 6, 10, 12, 24, 36, 48, 72, 96)


@dataclass
class Hour:
    """What one simulated hour ended with."""

    hour: int
    rss_kib: int
    anon_kib: int
    blocks: int
    objects: int
    db_bytes: int
    series: int
    structures: dict[str, int]


# What the structures below are measured as: Python objects reachable from them (sys.getsizeof each, objects of
# the config and of modules, classes and functions not counted).
_BOUNDARY = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.CodeType)


def structures(parts: Any) -> dict[str, Any]:
    """The parts of the pipeline that hold history, by the name the report gives them."""
    alerting = parts.alerting
    return {"series store": parts.store, "trend analysis (leak, drift)": parts.trend,
            "alert tracker (counter points)": alerting.tracker, "alerts (book, dispatcher)": (alerting.book,
                                                                                          alerting.dispatcher),
            **{f"collector: {name}": collector for name, collector in parts.collectors.by_name.items()},
            "canary results": parts.canary}


def deep_size(root: object, shared: set[int]) -> int:
    """Bytes of the Python objects reachable from ``root`` that are not in ``shared`` (which it extends)."""
    total, stack = 0, [root]
    while stack:
        obj = stack.pop()
        if id(obj) in shared or isinstance(obj, _BOUNDARY):
            continue
        shared.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


def reachable(roots: Iterable[object]) -> set[int]:
    """Ids of every object reachable from ``roots`` (modules, classes and functions are not walked)."""
    seen: set[int] = set()
    for root in roots:
        deep_size(root, seen)
    return seen


def sizes(parts: Any) -> dict[str, int]:
    """Bytes held by each structure; what is reachable from the config (or from a structure listed earlier) is
    not counted again."""
    shared = reachable([parts.config, parts.web])
    return {name: deep_size(part, shared) for name, part in structures(parts).items()}


def status_kib(field: str) -> int:
    """A ``/proc/self/status`` figure in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def daemon_config(workdir: Path, chips: int) -> config_module.Config:
    """The config of the replayed daemon: simulated chips, the kernel log from an empty file, defaults else."""
    log = workdir / "kern.log"
    log.write_text("")
    return config_module.parse(f'listen: "127.0.0.1:9"\ninterval: {INTERVAL_S:g}s\nstate_dir: "{workdir}"\n'
                               f"devices:\n  backend: sim\n  sim:\n    count: {chips}\n    scenario: healthy\n"
                               f'kernel_log:\n  source: file\n  path: "{log}"\n')


def replay(workdir: Path, chips: int, hours: int) -> list[Hour]:
    """Run ``hours`` simulated hours of cycles; one ``Hour`` per hour, the first one at hour 0 after one cycle."""
    parts = assemble(daemon_config(workdir, chips), None, lambda: [])
    registry = build_registry(parts.store.current)
    per_hour = int(3600 / INTERVAL_S)
    out: list[Hour] = []
    started = time.perf_counter()  # perf_counter is not replaced: progress in real seconds
    for cycle in range(hours * per_hour + 1):
        _CLOCK[0] += INTERVAL_S
        parts.sampler.run_once()
        registry.render()
        if cycle % per_hour == 0:
            gc.collect()
            db = sum(p.stat().st_size for p in workdir.rglob("*.db*") if p.is_file())
            out.append(Hour(cycle // per_hour, status_kib("VmRSS"), status_kib("RssAnon"), sys.getallocatedblocks(),
                            len(gc.get_objects()), db, parts.store.series_count(), sizes(parts)))
            print(f"hour {cycle // per_hour}/{hours}: RSS {out[-1].rss_kib / 1024:.1f} MiB "
                  f"({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    return out


def slope_kib_per_hour(hours: list[Hour], first: int, last: int) -> float:
    """Least-squares slope of RSS over the hours ``first``..``last`` (inclusive)."""
    points = [(h.hour, h.rss_kib) for h in hours if first <= h.hour <= last]
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    return (sum((x - mean_x) * (y - mean_y) for x, y in points)
            / sum((x - mean_x) ** 2 for x, _ in points))


def levels_from(hours: list[Hour], name: str) -> int:
    """The first hour from which the structure stays within 5 % (and 16 KiB) of its final size."""
    final = hours[-1].structures[name]
    first = hours[-1].hour
    for h in reversed(hours):
        if abs(h.structures[name] - final) > max(0.05 * final, 16384):
            break
        first = h.hour
    return first


def structure_table(hours: list[Hour]) -> list[str]:
    """Rows of KiB per structure at the reported hours."""
    shown = [h for h in hours if h.hour in REPORT_HOURS or h.hour in (0, hours[-1].hour)]
    lines = ["| Structure | " + " | ".join(f"h{h.hour}" for h in shown) + " | Level from hour |",
             "|---|" + "---:|" * (len(shown) + 1)]
    for name in hours[-1].structures:
        lines.append(f"| {name} | " + " | ".join(f"{h.structures[name] / 1024:,.0f}" for h in shown)
                     + f" | {levels_from(hours, name)} |")
    return lines


def render(hours: list[Hour], chips: int, started: datetime, command: str) -> str:
    """The BENCHMARKS.md section."""
    total = hours[-1].hour
    early = slope_kib_per_hour(hours, 1, min(3, total))
    late_from = max(1, total - 24)
    late = slope_kib_per_hour(hours, late_from, total)
    per_day = late * 24 / hours[-1].rss_kib
    lines = [f"## Memory over {total} simulated hours", "",
             f"The whole pipeline (`assemble()` of {chips} simulated chips, scenario healthy, interval "
             f"{INTERVAL_S:g} s, kernel log from an empty file; `Sampler.run_once()` and the /metrics render "
             f"each cycle) on a simulated clock, {total * 3600 / INTERVAL_S:,.0f} cycles in this process. "
             "No external program runs on a simulated clock, so the anchor is the same run's early growth "
             "(hours 1-3), when the bounded histories are filling.", "",
             "| Simulated hour | VmRSS | RssAnon | Python blocks | gc objects | Alert database | Series |",
             "|---|---|---|---|---|---|---|"]
    for h in hours:
        if h.hour in REPORT_HOURS or h.hour in (0, total):
            lines.append(f"| {h.hour} | {h.rss_kib / 1024:.1f} MiB | {h.anon_kib / 1024:.1f} MiB | {h.blocks:,} | "
                         f"{h.objects:,} | {h.db_bytes / 1024:.0f} KiB | {h.series} |")
    verdict = "met" if per_day <= 0.01 and abs(late) <= 0.2 * max(early, 1.0) else "**not met**"
    lines += ["", f"RSS slope, least squares: hours 1-3 {early:+.0f} KiB/h; hours {late_from}-{total} "
              f"{late:+.1f} KiB/h = {late / max(early, 1.0):.2f}x the early slope, {per_day * 100:+.2f} % of "
              f"RSS per day. Target (last day <= 1 % of RSS per day and <= 0.2x the early slope): {verdict}.", "",
              "What each structure that keeps history holds (Python objects reachable from it, KiB), and the "
              "first simulated hour from which it stays within 5 % (and 16 KiB) of its final size:", "",
              *structure_table(hours), ""]
    facts = {"CPU": cpu_model(), "Python": sys.version.split()[0]}
    return "\n".join(lines + machine_and_command(facts, started, command))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=int, default=48)
    parser.add_argument("--chips", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="6 simulated hours: not to quote")
    parser.add_argument("--output", type=Path, default=BENCHMARKS_MD)
    args = parser.parse_args(argv)
    if args.quick:
        args.hours = 6
    if args.hours < 4:
        parser.error("--hours must be at least 4")
    started = datetime.now(timezone.utc)
    with tempfile.TemporaryDirectory(prefix="tpuwatch-bench-days-") as tmp:
        hours = replay(Path(tmp), args.chips, args.hours)
    command = "python benchmarks/days.py" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    section = render(hours, args.chips, started, command)
    if args.quick:
        section = section.replace("## Memory over", "## (quick run: not to quote) Memory over", 1)
    write_section("days", section, args.output)
    print(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
