#!/usr/bin/env python3
"""The daemon's footprint with 1, 8 and 64 simulated chips beside node_exporter, and where its memory goes.

Usage::

    python benchmarks/footprint.py [--soak SECONDS] [--scrapes N] [--cycles N] [--quick] [--output BENCHMARKS.md]

In one run, side by side on this machine:

* three ``tpuwatch run`` daemons (1, 8 and 64 simulated chips, interval 10 s,
  the config's defaults otherwise) and Debian's node_exporter (its default
  collectors), all on free 127.0.0.1 ports;
* after ``--soak`` seconds (default 300): each one's resident memory
  (VmRSS), then ``--scrapes`` sequential scrapes of each (Prometheus's Accept
  header, a new connection each) less the CPU it uses over as long an idle
  window: CPU per scrape;
* CPU per sampling cycle with the whole pipeline (sources, trend and
  self-metrics, alerting), in this process: ``tpuwatch.assembly.assemble`` of
  the same config, ``--cycles`` cycles after 20 warm-up ones, timed with
  ``time.process_time()``;
* where the 8-chip daemon's memory goes: its mappings from /proc/PID/smaps
  (anonymous memory and heap, libpython, libcrypto, ...), and what importing
  each library the daemon loads adds to a fresh interpreter's VmRSS, in the
  order the daemon imports them.

The daemons run with the environment the systemd unit sets (``Environment=``
lines, e.g. ``MALLOC_ARENA_MAX``).  It rewrites the ``footprint`` section of
BENCHMARKS.md.  Targets: the daemon's own heap (``Anonymous`` in
/proc/PID/smaps_rollup: what the process allocated, not the pages of the
libraries it maps) <= 32 MiB with 8 chips, <= 40 MiB with 64; RSS is recorded
beside it with its ratio to node_exporter; after a few minutes, not at the
plateau: ``benchmarks/soak.py`` measures that.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import yaml
from daemon_report import INTERVAL_S
from servers import (
    Child,
    cpu_seconds,
    free_port,
    machine_facts,
    node_exporter_binary,
    progress,
    rss_kib,
    scrape_burst,
    stop_children,
    wait_ready,
)
from soak import start, unit_environment, unit_environment_text

from common import BENCHMARKS_MD, REPO_ROOT, checkout_env, machine_and_command, write_section

sys.path.insert(0, str(REPO_ROOT))
from tpuwatch import config as config_module  # noqa: E402
from tpuwatch.assembly import assemble  # noqa: E402

CHIPS = (1, 8, 64)
WARMUP_CYCLES = 20
TARGET_MIB = {8: 32.0, 64: 40.0}  # the daemon's heap: Anonymous in /proc/PID/smaps_rollup
# What the daemon imports, in the order it imports them: each step's VmRSS is measured in a fresh interpreter.
IMPORTS = ["ssl", "yaml", "psutil", "sqlite3", "apscheduler.schedulers.background", "prometheus_client",
           "tpuwatch.config", "tpuwatch.registry", "tpuwatch.alerting.service", "tpuwatch.assembly",
           "tpuwatch.web", "tpuwatch.daemon"]
LIBRARIES = IMPORTS[:IMPORTS.index("prometheus_client") + 1]
_IMPORT_PROBE = """
import json, sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
steps = [("python", rss(), len(sys.modules))]
for name in sys.argv[1:]:
    __import__(name)
    steps.append((name, rss(), len(sys.modules)))
print(json.dumps(steps))
"""


@dataclass
class Footprint:
    """What one run measured."""

    rss_kib: dict[str, int] = field(default_factory=dict)
    heap_kib: dict[str, int] = field(default_factory=dict)
    scrape_ms: dict[str, float] = field(default_factory=dict)
    cycle_ms: dict[int, float] = field(default_factory=dict)
    series: dict[int, int] = field(default_factory=dict)
    mappings: list[tuple[str, int]] = field(default_factory=list)
    imports: list[tuple[str, int, int]] = field(default_factory=list)
    last: dict[str, int] = field(default_factory=dict)


def anonymous_kib(pid: int) -> int:
    """The process's anonymous memory (its heap and stacks, not mapped files), KiB, from smaps_rollup."""
    match = re.search(r"^Anonymous:\s+(\d+) kB", Path(f"/proc/{pid}/smaps_rollup").read_text(), re.M)
    return int(match.group(1)) if match else 0


def daemon_config(port: int, state_dir: Path, chips: int) -> str:
    """The measured daemon's config: simulated chips, defaults otherwise (as benchmarks/daemon.py)."""
    return yaml.safe_dump({"listen": f"127.0.0.1:{port}", "interval": f"{INTERVAL_S:g}s", "state_dir": str(state_dir),
                           "devices": {"backend": "sim", "sim": {"count": chips, "scenario": "healthy"}}})


def cycle_cpu_ms(chips: int, cycles: int, workdir: Path) -> tuple[float, int]:
    """(CPU ms of one whole-pipeline cycle, series in the store) for ``chips`` simulated chips, in this process."""
    state = workdir / f"cycles-{chips}"
    config = config_module.parse(daemon_config(1, state, chips), "benchmark")  # no endpoint is started here
    parts = assemble(config, None, lambda: [])
    for _ in range(WARMUP_CYCLES):
        parts.sampler.run_once()
    start = time.process_time()
    for _ in range(cycles):
        parts.sampler.run_once()
    spent = (time.process_time() - start) / cycles * 1000
    parts.collectors.close()
    return spent, parts.store.series_count()


def smaps(pid: int, top: int = 8) -> list[tuple[str, int]]:
    """Resident KiB per mapping (file name, [heap], anonymous), largest first."""
    sizes: dict[str, int] = {}
    current = "anonymous"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = re.match(r"^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+\s*(.*)$", line)
        if head:
            current = Path(head.group(1)).name if head.group(1).startswith("/") else (head.group(1) or "anonymous")
        elif line.startswith("Rss:"):
            sizes[current] = sizes.get(current, 0) + int(line.split()[1])
    return sorted(sizes.items(), key=lambda kv: -kv[1])[:top]


def import_steps(modules: list[str] = IMPORTS) -> list[tuple[str, int, int]]:
    """(module, VmRSS KiB after importing it, modules loaded) in a fresh interpreter, step by step."""
    out = subprocess.run([sys.executable, "-c", _IMPORT_PROBE, *modules], capture_output=True, text=True,
                         check=True, cwd=REPO_ROOT, env=checkout_env({"PATH": "/usr/bin:/bin"}))
    return [tuple(step) for step in json.loads(out.stdout)]  # type: ignore[misc]


def imported_last() -> dict[str, int]:
    """KiB each library adds when imported after all the others: what leaving it out alone would save."""
    costs = {}
    for library in LIBRARIES:
        steps = import_steps([*(other for other in LIBRARIES if other != library), library])
        costs[library] = steps[-1][1] - steps[-2][1]
    return costs


def measure(node_exporter: str, workdir: Path, soak: float, scrapes: int, results: Footprint) -> None:
    """Start the four servers, soak, take RSS and CPU per scrape; all are stopped on any exit."""
    children: list[Child] = []
    try:
        for chips in CHIPS:
            port = free_port()
            config = workdir / f"tpuwatch-{chips}.yaml"
            config.write_text(daemon_config(port, workdir / f"state-{chips}", chips))
            children.append(start(f"tpuwatch-{chips}", [sys.executable, "-m", "tpuwatch", "run", "--config",
                                                        str(config)], port, workdir,
                                  {**os.environ, **unit_environment()}))
        port = free_port()
        children.append(start("node_exporter", [node_exporter, f"--web.listen-address=127.0.0.1:{port}"], port,
                              workdir, checkout_env()))
        for child in children:
            wait_ready(child)
        progress(f"soaking {soak:g}s")
        end = time.monotonic() + soak
        while time.monotonic() < end:
            for child in children:
                child.ensure_alive()
            time.sleep(min(5.0, max(0.0, end - time.monotonic())))
        for child in children:
            results.rss_kib[child.name] = rss_kib(child.pid)
            results.heap_kib[child.name] = anonymous_kib(child.pid)
        results.mappings = smaps(children[CHIPS.index(8)].pid)
        for child in children:
            progress(f"{scrapes} scrapes of {child.name}")
            cpu, wall = scrape_burst(child, scrapes)
            idle_before = cpu_seconds(child.pid)
            time.sleep(wall)
            idle = cpu_seconds(child.pid) - idle_before
            results.scrape_ms[child.name] = max(0.0, cpu - idle) / scrapes * 1000
    finally:
        stop_children(children)


def render(results: Footprint, facts: dict[str, str], args: argparse.Namespace, started: datetime,
           command: str) -> str:
    """The BENCHMARKS.md section."""
    node_rss = results.rss_kib["node_exporter"] / 1024
    node_scrape = results.scrape_ms["node_exporter"]
    lines = ["## Footprint with 1, 8 and 64 chips beside node_exporter", "",
             f"Three `tpuwatch run` daemons (simulated chips, interval {INTERVAL_S:g} s, the config's defaults "
             "otherwise) and node_exporter (its default collectors) side by side on this machine; RSS after a "
             f"{args.soak:g} s soak (and the heap: `Anonymous` in /proc/PID/smaps_rollup), CPU per scrape from {args.scrapes} sequential scrapes less idle CPU over as "
             f"long, CPU per whole-pipeline sampling cycle in-process ({args.cycles} cycles). Ratios are "
             "tpuwatch / node_exporter.", "",
             "| Chips | Series in the store | Heap (MiB) | RSS (MiB) | RSS ratio | CPU per cycle (ms) "
             "| CPU per scrape (ms) | Scrape ratio |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for chips in CHIPS:
        rss = results.rss_kib[f"tpuwatch-{chips}"] / 1024
        scrape = results.scrape_ms[f"tpuwatch-{chips}"]
        heap = results.heap_kib[f"tpuwatch-{chips}"] / 1024
        lines.append(f"| {chips} | {results.series[chips]} | {heap:.1f} | {rss:.1f} | {rss / node_rss:.2f}x "
                     f"| {results.cycle_ms[chips]:.2f} | {scrape:.3f} | {scrape / node_scrape:.2f}x |")
    lines.append(f"| node_exporter (anchor) | | {results.heap_kib['node_exporter'] / 1024:.1f} | {node_rss:.1f} "
                 f"| 1.00x | | {node_scrape:.3f} | 1.00x |")
    verdicts = [f"{chips} chips <= {mib:g} MiB: " + ("met" if results.heap_kib[f"tpuwatch-{chips}"] / 1024 <= mib
                                                     else "**not met**")
                + f" ({results.heap_kib[f'tpuwatch-{chips}'] / 1024:.1f})" for chips, mib in TARGET_MIB.items()]
    lines += ["", f"Targets (the heap after the soak, daemons with the unit's environment "
                  f"`{unit_environment_text()}`): " + "; ".join(verdicts) + ".", "",
              "### Where the 8-chip daemon's memory goes", "",
              "Resident memory by mapping (/proc/PID/smaps):", "", "| Mapping | MiB |", "|---|---:|"]
    lines += [f"| {name} | {kib / 1024:.1f} |" for name, kib in results.mappings]
    lines += ["", "What each import adds to a fresh interpreter (in the order the daemon imports them; a step "
                  "counts what it loads that the steps before did not):", "",
              "| Import | Adds (MiB) | Total (MiB) | Modules loaded |", "|---|---:|---:|---:|"]
    previous = None
    for name, kib, modules in results.imports:
        added = "" if previous is None else f"{(kib - previous) / 1024:+.1f}"
        lines.append(f"| `{name}` | {added} | {kib / 1024:.1f} | {modules} |")
        previous = kib
    steps = {name: kib for name, kib, _ in results.imports}
    python, libraries, imported = steps["python"], steps["prometheus_client"], steps["tpuwatch.daemon"]
    running = results.rss_kib["tpuwatch-8"]
    lines += ["", f"So of the 8-chip daemon's {running / 1024:.1f} MiB: the interpreter {python / 1024:.1f}, the "
                  f"libraries it is built on (ssl, PyYAML, psutil, sqlite3, APScheduler, prometheus-client) "
                  f"{(libraries - python) / 1024:.1f}, tpuwatch's own modules {(imported - libraries) / 1024:.1f}, "
                  f"and what it holds while running (store, detectors, threads, buffers) "
                  f"{(running - imported) / 1024:.1f}. The libraries alone come to "
                  f"{libraries / results.rss_kib['node_exporter']:.2f}x node_exporter; APScheduler's step is the "
                  "largest (it loads importlib.metadata for its version, asyncio, multiprocessing and tzlocal).",
              "", "Imported after all the other libraries instead (what leaving that one library out would save; "
                  "a module the others load anyway, as ssl, adds nothing):", "",
              "| Library | Adds when imported last (MiB) |", "|---|---:|",
              *[f"| `{name}` | {kib / 1024:+.1f} |" for name, kib in results.last.items()],
              "", *machine_and_command(facts, started, command)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--soak", type=float, default=300.0, help="seconds before RSS is read")
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--cycles", type=int, default=500)
    parser.add_argument("--quick", action="store_true", help="soak 30 s, 40 scrapes, 50 cycles: not to quote")
    parser.add_argument("--output", type=Path, default=BENCHMARKS_MD)
    args = parser.parse_args(argv)
    if args.quick:
        args.soak, args.scrapes, args.cycles = 30.0, 40, 50
    started = datetime.now(timezone.utc)
    node_exporter = node_exporter_binary()
    results = Footprint()
    with tempfile.TemporaryDirectory(prefix="tpuwatch-bench-footprint-") as tmp:
        workdir = Path(tmp)
        for chips in CHIPS:
            progress(f"{args.cycles} whole-pipeline cycles with {chips} chips, in this process")
            results.cycle_ms[chips], results.series[chips] = cycle_cpu_ms(chips, args.cycles, workdir)
        results.imports = import_steps()
        results.last = imported_last()
        measure(node_exporter, workdir, args.soak, args.scrapes, results)
    command = "python benchmarks/footprint.py" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    section = render(results, machine_facts(node_exporter), args, started, command)
    if args.quick:
        section = section.replace("## Footprint", "## Footprint (quick run: not to quote)", 1)
    write_section("footprint", section, args.output)
    print(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
