#!/usr/bin/env python3
"""Measure tpuwatch side by side with node_exporter and write BENCHMARKS.md.

Usage::

    python benchmarks/daemon.py [--soak SECONDS] [--growth SECONDS] [--quick] [--output BENCHMARKS.md]

The script starts ``tpuwatch run`` (8 simulated chips, interval 10 s) and
``prometheus-node-exporter`` on free 127.0.0.1 ports, scrapes both every 15 s
as Prometheus would, and measures both in the same run:

1. resident memory after ``--soak`` seconds;
2. CPU per /metrics scrape (200 sequential scrapes, idle CPU subtracted);
3. CPU per sampling cycle, in-process (2000 cycles of ``Sampler.run_once``);
4. resident memory growth over ``--growth`` seconds (the soak is its start);
   figure 2 is measured after this window.

``--quick`` is a smoke run (soak 30 s, growth 60 s, 20 scrapes, 200 cycles).
Progress goes to stderr; every child process is stopped on exit.  See
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import math
import re
import shlex
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import requests

from common import BENCHMARKS_MD, REPO_ROOT, write_section

sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "tests")]  # this checkout's tpuwatch, whatever else is installed
from daemon_report import (  # noqa: E402
    INTERVAL_S,
    MIB,
    SCRAPE_INTERVAL_S,
    SIM_CHIPS,
    WARMUP_CYCLES,
    Plan,
    Results,
    ScrapeCost,
    render,
)
from servers import (  # noqa: E402
    SCRAPE_TIMEOUT_S,
    BenchmarkError,
    Child,
    free_port,
    idle_cpu_rates,
    interrupt,
    machine_facts,
    node_exporter_binary,
    progress,
    rss_kib,
    scrape,
    scrape_burst,
    start_child,
    stop_children,
    wait_ready,
)

from tpuwatch import config as config_module  # noqa: E402
from tpuwatch.config import Config  # noqa: E402
from tpuwatch.hw.procfs import scan_holders  # noqa: E402
from tpuwatch.registry import build_collectors  # noqa: E402
from tpuwatch.sampler import Sampler  # noqa: E402
from tpuwatch.store import SeriesStore  # noqa: E402

HOLDER_SCAN_RUNS = 20


# --- figure 3: in-process sampling cycles --------------------------------------


def daemon_config(port: int, state_dir: str) -> str:
    """The YAML config of the measured daemon."""
    return (f'listen: "127.0.0.1:{port}"\n'
            f"interval: {INTERVAL_S:g}s\n"
            f'state_dir: "{state_dir}"\n'
            "devices:\n"
            "  backend: sim\n"
            "  sim:\n"
            f"    count: {SIM_CHIPS}\n"
            "    scenario: healthy\n")


def cycle_cpu_ms(config: Config, cycles: int, only: str | None = None) -> float:
    """Mean process CPU (ms) of one ``Sampler.run_once()``, with all collectors or only the named one, laid out as
    the daemon's sources are (the devices first, publishing the cycle's inventory)."""
    collectors = build_collectors(config)
    stages = [[c for c in stage if only is None or c.name == only] for stage in collectors.stages()]
    sampler = Sampler(stages, SeriesStore(config.store.points_per_series, config.store.max_series),
                      config.collector_deadline, collectors.inventory)
    for _ in range(WARMUP_CYCLES):
        sampler.run_once()
    failing = [g.name for g in sampler.guards if not g.status.success]
    if failing:
        raise BenchmarkError(f"collectors failing in the cycle benchmark: {', '.join(failing)}")
    start = time.process_time()
    for _ in range(cycles):
        sampler.run_once()
    return (time.process_time() - start) / cycles * 1000


def holder_scan_ms(config: Config) -> float:
    """Mean CPU (ms) of one /proc device-holder scan (the cycle's one, done by the devices stage)."""
    start = time.process_time()
    for _ in range(HOLDER_SCAN_RUNS):
        scan_holders(config.paths.procfs, config.paths.dev, config.host.device_files)
    return (time.process_time() - start) / HOLDER_SCAN_RUNS * 1000


def measure_cycles(config: Config, plan: Plan, results: Results) -> None:
    """Figure 3, run before any server starts so nothing else uses this process's CPU."""
    progress(f"figure 3: {plan.cycles} sampling cycles, {SIM_CHIPS} sim chips + host")
    results.cycle_ms = cycle_cpu_ms(config, plan.cycles)
    progress(f"figure 3: {plan.cycles} sampling cycles, devices collector only")
    results.cycle_devices_ms = cycle_cpu_ms(config, plan.cycles, only="devices")
    results.holder_scan_ms = holder_scan_ms(config)
    progress(f"figure 3: {results.cycle_ms:.3f} ms/cycle, devices only {results.cycle_devices_ms:.3f} ms, "
             f"holder scan {results.holder_scan_ms:.3f} ms")


# --- the servers ----------------------------------------------------------------


def store_series(child: Child) -> int:
    """tpuwatch's ``tpuwatch_store_series`` as it serves it now."""
    with requests.Session() as session:
        text = scrape(session, child).decode()
    match = re.search(r"^tpuwatch_store_series(?:\{\})? (\S+)$", text, re.MULTILINE)
    return int(float(match.group(1))) if match else 0


class PrometheusScraper(threading.Thread):
    """Scrapes every server each 15 s, as Prometheus would.  Hold ``lock`` to pause it."""

    def __init__(self, children: list[Child], results: Results) -> None:
        super().__init__(name="prometheus-scraper", daemon=True)
        self.children = children
        self.results = results
        self.lock = threading.Lock()
        self.stopped = threading.Event()

    def run(self) -> None:
        sessions = {child.name: requests.Session() for child in self.children}
        while not self.stopped.is_set():
            with self.lock:
                for child in self.children:
                    try:
                        scrape(sessions[child.name], child)
                        self.results.scrapes_ok[child.name] += 1
                    except requests.RequestException:
                        self.results.scrapes_failed[child.name] += 1
            self.stopped.wait(SCRAPE_INTERVAL_S)
        for session in sessions.values():
            session.close()


class RssRecorder(threading.Thread):
    """Records every server's RSS each ``period`` seconds from ``t0`` to ``t0 + end``; prints progress."""

    def __init__(self, children: list[Child], results: Results, t0: float, period: float, end: float) -> None:
        super().__init__(name="rss-recorder", daemon=True)
        self.children = children
        self.results = results
        self.t0, self.period, self.end = t0, period, end
        self.stopped = threading.Event()
        self.error: OSError | None = None

    def run(self) -> None:
        ticks = math.floor(self.end / self.period + 1e-9)
        for tick in range(ticks + 1):
            at = tick * self.period
            if self.stopped.wait(max(0.0, self.t0 + at - time.monotonic())):
                return
            try:
                row = {child.name: rss_kib(child.pid) for child in self.children}
            except OSError as exc:
                self.error = exc
                return
            self.results.rss_samples.append((at, row))
            ok, failed = self.results.scrapes_ok, self.results.scrapes_failed
            progress(f"t={at:.0f}s/{self.end:.0f}s RSS "
                     + ", ".join(f"{name} {kib / MIB:.1f} MiB" for name, kib in row.items())
                     + "; 15 s scrapes " + ", ".join(f"{c.name} {ok[c.name]} ok/{failed[c.name]} failed"
                                                    for c in self.children))


def wait_until(deadline: float, children: list[Child], recorder: RssRecorder) -> None:
    """Sleep until the monotonic ``deadline``, failing early if a server or the recorder dies."""
    while (left := deadline - time.monotonic()) > 0:
        for child in children:
            child.ensure_alive()
        if recorder.error is not None:
            raise BenchmarkError(f"reading RSS failed: {recorder.error}")
        time.sleep(min(1.0, left))


# --- figure 2: CPU per scrape -----------------------------------------------------


def measure_scrapes(children: list[Child], count: int, results: Results) -> None:
    """Figure 2: bursts of sequential scrapes, less the CPU the server uses idle over as long.

    The idle window is the longest burst rounded up to whole sampling
    intervals, so it holds a whole number of tpuwatch's sampling cycles.
    """
    bursts: dict[str, tuple[float, float]] = {}
    for child in children:
        progress(f"figure 2: {count} sequential scrapes of {child.name}")
        bursts[child.name] = scrape_burst(child, count)
    results.idle_window_s = math.ceil(max(wall for _, wall in bursts.values()) / INTERVAL_S) * INTERVAL_S
    progress(f"figure 2: {results.idle_window_s:g}s idle window without scrapes")
    idle = idle_cpu_rates(children, results.idle_window_s)
    for name, (cpu, wall) in bursts.items():
        per_scrape = (cpu - idle[name] * wall) / count * 1000
        results.scrape[name] = ScrapeCost(per_scrape, cpu, wall, idle[name] * 1000)
        progress(f"figure 2: {name} {per_scrape:.3f} ms CPU per scrape (idle {idle[name] * 1000:.2f} ms/s)")


# --- the run -----------------------------------------------------------------------


def measure_servers(plan: Plan, workdir: Path, node_exporter: str, results: Results) -> None:
    """Figures 1, 2 and 4 with both servers side by side; they are stopped on any exit."""
    tpuwatch_port, node_port = free_port(), free_port()
    config_path = workdir / "tpuwatch.yaml"
    config_path.write_text(daemon_config(tpuwatch_port, str(workdir)))
    children: list[Child] = []
    try:
        children.append(start_child("tpuwatch", [sys.executable, "-m", "tpuwatch", "run", "--config",
                                                 str(config_path)], tpuwatch_port, workdir))
        children.append(start_child("node_exporter", [node_exporter, f"--web.listen-address=127.0.0.1:{node_port}"],
                                    node_port, workdir))
        for child in children:
            wait_ready(child)
        observe(plan, children, results)
    finally:
        stop_children(children)


def observe(plan: Plan, children: list[Child], results: Results) -> None:
    """Scrape every 15 s and record RSS over the growth window (the soak is its start); figure 2 after it, so that
    its burst of scrapes does not sit in the growth fit."""
    t0 = time.monotonic()
    scraper = PrometheusScraper(children, results)
    recorder = RssRecorder(children, results, t0, plan.rss_period, plan.growth)
    scraper.start()
    recorder.start()
    try:
        progress(f"figure 1: soaking {plan.soak:g}s")
        wait_until(t0 + plan.soak, children, recorder)
        results.soak_rss_kib = {child.name: rss_kib(child.pid) for child in children}
        results.store_series = store_series(children[0])
        progress(f"figure 4: recording RSS until t={plan.growth:g}s")
        wait_until(t0 + plan.growth, children, recorder)
        recorder.join()
        with scraper.lock:
            measure_scrapes(children, plan.scrapes, results)
    finally:
        scraper.stopped.set()
        recorder.stopped.set()
        recorder.join()
        scraper.join(SCRAPE_TIMEOUT_S * len(children))
    if recorder.error is not None:
        raise BenchmarkError(f"reading RSS failed: {recorder.error}")


def run(plan: Plan) -> tuple[Results, dict[str, str]]:
    """Measure everything; (results, machine facts)."""
    node_exporter = node_exporter_binary()
    facts = machine_facts(node_exporter)
    results = Results()
    with tempfile.TemporaryDirectory(prefix="tpuwatch-bench-") as tmp:
        workdir = Path(tmp)
        results.config = config_module.parse(daemon_config(free_port(), tmp), "benchmark config")
        measure_cycles(results.config, plan, results)
        measure_servers(plan, workdir, node_exporter, results)
    return results, facts


# --- command line ------------------------------------------------------------------------


def parse_plan(argv: Sequence[str] | None) -> tuple[Plan, Path]:
    """The plan and output path from the command line."""
    parser = argparse.ArgumentParser(description="Benchmark tpuwatch side by side with node_exporter.")
    parser.add_argument("--soak", type=float, metavar="SECONDS",
                        help="run time before the memory reading of figure 1 (default 600, quick 30)")
    parser.add_argument("--growth", type=float, metavar="SECONDS",
                        help="length of the memory-growth window of figure 4, soak included (default 3600, quick 60)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: soak 30 s, growth 60 s, 20 scrapes, 200 cycles")
    parser.add_argument("--output", type=Path, default=BENCHMARKS_MD, metavar="PATH",
                        help="markdown file whose daemon section is written (default BENCHMARKS.md at the "
                             "repository root)")
    args = parser.parse_args(argv)
    soak = args.soak if args.soak is not None else (30.0 if args.quick else 600.0)
    growth = args.growth if args.growth is not None else (60.0 if args.quick else 3600.0)
    if soak <= 0 or growth < soak:
        parser.error("need 0 < --soak <= --growth")
    plan = Plan(soak, growth, scrapes=20 if args.quick else 200, cycles=200 if args.quick else 2000,
                quick=args.quick)
    return plan, args.output


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and write the report; exit 1 on failure, 130 when interrupted."""
    plan, output = parse_plan(argv)
    signal.signal(signal.SIGTERM, interrupt)
    started = datetime.now(timezone.utc)
    command = shlex.join(["python", *sys.argv])
    try:
        results, facts = run(plan)
    except KeyboardInterrupt:
        progress("interrupted: servers stopped, no report written")
        return 130
    except (BenchmarkError, requests.RequestException, OSError) as exc:
        progress(f"benchmark failed: {exc}")
        return 1
    write_section("daemon", render(plan, results, facts, started, command), output)
    progress(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
