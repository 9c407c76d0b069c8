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
import ctypes
import math
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import requests

from common import BENCHMARKS_MD, REPO_ROOT, checkout_env, cpu_model, write_section

sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "tests")]  # this checkout's tpuwatch, whatever else is installed
import tpuwatch  # noqa: E402
from tpuwatch import config as config_module  # noqa: E402
from tpuwatch.config import Config  # noqa: E402
from tpuwatch.hw.procfs import scan_holders  # noqa: E402
from tpuwatch.registry import build_collectors  # noqa: E402
from tpuwatch.sampler import Sampler  # noqa: E402
from tpuwatch.store import SeriesStore  # noqa: E402

from conftest import free_port  # noqa: E402

NODE_EXPORTER_NAMES = ("prometheus-node-exporter", "node_exporter")
SIM_CHIPS = 8
INTERVAL_S = 10.0
SCRAPE_INTERVAL_S = 15.0
SCRAPE_TIMEOUT_S = 10.0
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
WARMUP_CYCLES = 20
HOLDER_SCAN_RUNS = 20
CLK_TCK = os.sysconf("SC_CLK_TCK")
PR_SET_PDEATHSIG = 1
MIB = 1024.0
# What Prometheus 2.x sends, so each server picks the encoding it would use in production.
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
TARGETS = {"scrape_ratio": 1.0, "cycle_ms": 5.0}  # RSS: footprint.py and soak.py judge it in MiB


class BenchmarkError(RuntimeError):
    """The benchmark cannot go on; the message says why."""


@dataclass(frozen=True)
class Plan:
    """How long and how much to measure."""

    soak: float
    growth: float
    scrapes: int
    cycles: int
    quick: bool

    @property
    def rss_period(self) -> float:
        """Seconds between RSS samples of figure 4 (60 s, less for short windows)."""
        return min(60.0, self.growth / 12)

    @property
    def slope_from(self) -> float:
        """Start of the slope fit of figure 4 (minute 5, earlier for short windows)."""
        return min(300.0, self.growth / 4)

    @property
    def mark(self) -> float:
        """The early reference point of figure 4 (minute 10, earlier for short windows)."""
        return min(600.0, self.growth / 2)


@dataclass
class Child:
    """A measured server process."""

    name: str
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self.process.pid

    def log_tail(self, lines: int = 15) -> str:
        """The last lines the process wrote to stdout/stderr."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"

    def ensure_alive(self) -> None:
        """Raise BenchmarkError, with the log tail, if the process has exited."""
        code = self.process.poll()
        if code is not None:
            raise BenchmarkError(f"{self.name} exited with status {code}; last log lines:\n{self.log_tail()}")


@dataclass(frozen=True)
class ScrapeCost:
    """Figure 2 for one server."""

    per_scrape_ms: float
    burst_cpu_s: float
    burst_wall_s: float
    idle_cpu_ms_per_s: float


@dataclass(frozen=True)
class Fit:
    """Least-squares RSS slope with its standard error, both in KiB/hour."""

    slope: float
    stderr: float


@dataclass
class Results:
    """Everything the report shows."""

    config: Config = field(default_factory=Config)
    cycle_ms: float = 0.0
    cycle_devices_ms: float = 0.0
    holder_scan_ms: float = 0.0
    soak_rss_kib: dict[str, int] = field(default_factory=dict)
    scrape: dict[str, ScrapeCost] = field(default_factory=dict)
    idle_window_s: float = 0.0
    rss_samples: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    store_series: int = 0
    scrapes_ok: Counter[str] = field(default_factory=Counter)
    scrapes_failed: Counter[str] = field(default_factory=Counter)


# --- progress and machine facts ------------------------------------------------


def progress(message: str) -> None:
    """One progress line on stderr, stamped with the wall clock."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def node_exporter_binary() -> str:
    """Path of the node_exporter binary."""
    for name in NODE_EXPORTER_NAMES:
        path = shutil.which(name)
        if path:
            return path
    raise BenchmarkError(f"node_exporter not found on PATH (tried {', '.join(NODE_EXPORTER_NAMES)})")




def command_output(argv: Sequence[str]) -> str:
    """First line of a command's combined output, or 'unknown'."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, cwd=REPO_ROOT, check=False)
    except OSError:
        return "unknown"
    lines = (done.stdout + done.stderr).strip().splitlines()
    return lines[0] if lines and done.returncode == 0 else "unknown"


def machine_facts(node_exporter: str) -> dict[str, str]:
    """What the figures depend on: CPUs, software versions."""
    return {
        "nproc": str(len(os.sched_getaffinity(0))),
        "CPU": cpu_model(),
        "Kernel": platform.release(),
        "Python": platform.python_version(),
        "node_exporter": command_output([node_exporter, "--version"]),
        "tpuwatch": f"{tpuwatch.__version__} (git {command_output(['git', 'describe', '--always', '--dirty'])})",
    }


# --- /proc readings -----------------------------------------------------------


def rss_kib(pid: int) -> int:
    """VmRSS of a process in KiB, from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise BenchmarkError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a whole process (all threads) in seconds, from /proc/PID/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()  # fields from 3 (state) on
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


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


def die_with_parent() -> None:
    """In the child before exec: get SIGTERM if this script dies, even by SIGKILL."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def start_child(name: str, argv: list[str], port: int, workdir: Path) -> Child:
    """Start a server with its output in a log file under ``workdir``."""
    log_path = workdir / f"{name}.log"
    with open(log_path, "wb") as log:
        env = checkout_env()  # the tpuwatch of this checkout, whatever else is installed
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   cwd=workdir, env=env, preexec_fn=die_with_parent)
    progress(f"started {name} (pid {process.pid}) on 127.0.0.1:{port}: {shlex.join(argv)}")
    return Child(name, process, f"http://127.0.0.1:{port}/metrics", log_path)


def scrape(session: requests.Session, child: Child) -> bytes:
    """One /metrics scrape as Prometheus makes it; the body."""
    response = session.get(child.url, headers={"Accept": PROMETHEUS_ACCEPT}, timeout=SCRAPE_TIMEOUT_S)
    response.raise_for_status()
    return response.content


def wait_ready(child: Child) -> None:
    """Wait until the server answers /metrics."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    with requests.Session() as session:
        while time.monotonic() < deadline:
            child.ensure_alive()
            try:
                scrape(session, child)
                return
            except requests.RequestException:
                time.sleep(0.2)
    raise BenchmarkError(f"{child.name} did not serve {child.url} within {READY_TIMEOUT_S:g}s; "
                         f"last log lines:\n{child.log_tail()}")


def stop_children(children: list[Child]) -> None:
    """SIGTERM every child, SIGKILL those that linger."""
    for child in children:
        if child.process.poll() is None:
            child.process.terminate()
    for child in children:
        try:
            child.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()
        progress(f"stopped {child.name} (pid {child.pid})")


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


def scrape_burst(child: Child, count: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) the server spent on ``count`` sequential scrapes."""
    with requests.Session() as session:
        cpu, wall = cpu_seconds(child.pid), time.monotonic()
        for _ in range(count):
            scrape(session, child)
        return cpu_seconds(child.pid) - cpu, time.monotonic() - wall


def idle_cpu_rates(children: list[Child], seconds: float) -> dict[str, float]:
    """CPU seconds per second each server uses over ``seconds`` without scrapes."""
    before = {child.name: cpu_seconds(child.pid) for child in children}
    time.sleep(seconds)
    return {child.name: (cpu_seconds(child.pid) - before[child.name]) / seconds for child in children}


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


# --- the report -----------------------------------------------------------------------


def least_squares(points: list[tuple[float, float]]) -> Fit:
    """Slope (per hour) and its standard error of (seconds, KiB) points."""
    n = len(points)
    if n < 3:
        return Fit(math.nan, math.nan)
    xs = [t / 3600 for t, _ in points]
    ys = [v for _, v in points]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    residuals = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys))
    return Fit(slope, math.sqrt(residuals / (n - 2) / sxx))


def rss_fit(results: Results, name: str, start: float) -> Fit:
    """The RSS slope of one server over samples from ``start`` seconds on."""
    return least_squares([(t, row[name]) for t, row in results.rss_samples if t >= start])


def nearest_sample(results: Results, seconds: float) -> tuple[float, dict[str, int]]:
    """The RSS sample (time, KiB per server) nearest to ``seconds``."""
    return min(results.rss_samples, key=lambda sample: abs(sample[0] - seconds))


def rss_at(results: Results, name: str, seconds: float) -> int:
    """One server's RSS (KiB) in the sample nearest to ``seconds``."""
    return nearest_sample(results, seconds)[1][name]


def duration(seconds: float) -> str:
    """'10 min' or '30 s'."""
    return f"{seconds / 60:g} min" if seconds >= 120 and seconds % 60 == 0 else f"{seconds:g} s"


def ratio(value: float, anchor: float) -> str:
    """``value / anchor`` as '1.23x'."""
    return f"{value / anchor:.2f}x" if anchor > 0 else "n/a"


def verdict(ok: bool) -> str:
    """Whether a target is met, in the table."""
    return "yes" if ok else "**no**"


def figure_rows(plan: Plan, results: Results) -> list[str]:
    """The rows of the results table."""
    tw, ne = results.soak_rss_kib["tpuwatch"], results.soak_rss_kib["node_exporter"]
    scrape_tw, scrape_ne = results.scrape["tpuwatch"].per_scrape_ms, results.scrape["node_exporter"].per_scrape_ms
    fit_tw, fit_ne = (rss_fit(results, name, plan.slope_from) for name in ("tpuwatch", "node_exporter"))
    noise = abs(fit_ne.slope) + 2 * fit_ne.stderr
    end = results.rss_samples[-1][0]
    mark = nearest_sample(results, plan.mark)[0]
    return [
        f"| 1 | Resident memory after {duration(plan.soak)} soak (MiB) | {tw / MIB:.1f} | {ne / MIB:.1f} "
        f"| {ratio(tw, ne)} | context (footprint.py: <= 40 MiB) | |",
        f"| 2 | CPU per /metrics scrape (ms) | {scrape_tw:.3f} | {scrape_ne:.3f} | {ratio(scrape_tw, scrape_ne)} "
        f"| <= {TARGETS['scrape_ratio']:.1f}x | {verdict(scrape_tw <= TARGETS['scrape_ratio'] * scrape_ne)} |",
        f"| 3 | CPU per sampling cycle, {SIM_CHIPS} sim chips + host (ms) | {results.cycle_ms:.3f} "
        f"| {scrape_ne:.3f} (per scrape) | {ratio(results.cycle_ms, scrape_ne)} | <= {TARGETS['cycle_ms']:g} ms "
        f"| {verdict(results.cycle_ms <= TARGETS['cycle_ms'])} |",
        f"| 3 | CPU per sampling cycle, devices collector only (ms) | {results.cycle_devices_ms:.3f} "
        f"| {scrape_ne:.3f} (per scrape) | {ratio(results.cycle_devices_ms, scrape_ne)} | context | |",
        f"| 4 | RSS at {duration(mark)} (MiB) | {rss_at(results, 'tpuwatch', mark) / MIB:.1f} "
        f"| {rss_at(results, 'node_exporter', mark) / MIB:.1f} "
        f"| {ratio(rss_at(results, 'tpuwatch', mark), rss_at(results, 'node_exporter', mark))} | context | |",
        f"| 4 | RSS at end, {duration(end)} (MiB) | {rss_at(results, 'tpuwatch', end) / MIB:.1f} "
        f"| {rss_at(results, 'node_exporter', end) / MIB:.1f} "
        f"| {ratio(rss_at(results, 'tpuwatch', end), rss_at(results, 'node_exporter', end))} | context | |",
        f"| 4 | RSS slope from {duration(plan.slope_from)} to end (KiB/h, ± 2 SE) "
        f"| {fit_tw.slope:+.0f} ± {2 * fit_tw.stderr:.0f} | {fit_ne.slope:+.0f} ± {2 * fit_ne.stderr:.0f} | — "
        f"| 0 beyond noise | {verdict(abs(fit_tw.slope) <= noise)} (node_exporter's noise band ± {noise:.0f}) |",
    ]


def detail_lines(plan: Plan, results: Results) -> list[str]:
    """Bullet points on how the figures came about."""
    tw, ne = results.scrape["tpuwatch"], results.scrape["node_exporter"]
    scan_interval, points = results.config.host.holder_scan_interval, results.config.store.points_per_series
    ring_kib = results.store_series * points * 16 / 1024
    ok, failed = results.scrapes_ok, results.scrapes_failed
    return [
        f"- Prometheus-like scrapes every {SCRAPE_INTERVAL_S:g} s during the run: tpuwatch {ok['tpuwatch']} ok, "
        f"{failed['tpuwatch']} failed; node_exporter {ok['node_exporter']} ok, {failed['node_exporter']} failed.",
        f"- Figure 2: {plan.scrapes} scrapes took tpuwatch {tw.burst_cpu_s:.2f} s CPU in {tw.burst_wall_s:.2f} s "
        f"({tw.burst_wall_s / plan.scrapes * 1000:.1f} ms wall each), node_exporter {ne.burst_cpu_s:.2f} s CPU in "
        f"{ne.burst_wall_s:.2f} s ({ne.burst_wall_s / plan.scrapes * 1000:.1f} ms each). Idle CPU over a "
        f"{results.idle_window_s:g} s window without scrapes (tpuwatch still sampling): tpuwatch "
        f"{tw.idle_cpu_ms_per_s:.2f} ms/s, node_exporter {ne.idle_cpu_ms_per_s:.2f} ms/s, each subtracted over "
        f"its burst. /proc CPU times tick at {1000 / CLK_TCK:g} ms, so the idle rates are good to "
        f"± {1000 / CLK_TCK / results.idle_window_s:.2f} ms/s.",
        f"- Figure 3: {plan.cycles} cycles after {WARMUP_CYCLES} warm-up, `time.process_time()` of this process "
        f"(all threads, including the per-collector threads the guard starts). The host collector's /proc "
        f"device-holder scan runs at most every {scan_interval:g} s, so the back-to-back "
        f"cycles barely include it; alone it costs {results.holder_scan_ms:.3f} ms, about "
        f"{results.holder_scan_ms * INTERVAL_S / scan_interval:.3f} ms per cycle amortized at {INTERVAL_S:g} s.",
        f"- Figure 4: RSS sampled every {plan.rss_period:g} s; slope by least squares from "
        f"{duration(plan.slope_from)} on. Within noise means abs(tpuwatch slope) <= abs(node_exporter slope) + "
        f"2 SE of node_exporter's slope, its noise band.",
        f"- tpuwatch's store keeps {points} points per series, allocated whole when a series first appears: "
        f"{results.store_series} series x {points} x 16 B = {ring_kib:.0f} KiB of history rings.",
    ]


def rss_table(results: Results) -> list[str]:
    """Every RSS sample, in a collapsed block."""
    rows = [f"| {t:g} | {row['tpuwatch']} | {row['node_exporter']} |" for t, row in results.rss_samples]
    return ["<details><summary>RSS samples (KiB)</summary>", "", "| t (s) | tpuwatch | node_exporter |",
            "|---:|---:|---:|", *rows, "", "</details>"]


def render(plan: Plan, results: Results, facts: dict[str, str], started: datetime, command: str) -> str:
    """BENCHMARKS.md."""
    lines = ["## Daemon footprint beside node_exporter", ""]
    if plan.quick:
        lines += [f"> **QUICK MODE: smoke run only** (soak {duration(plan.soak)}, growth window "
                  f"{duration(plan.growth)}, {plan.scrapes} scrapes, {plan.cycles} cycles). These figures only "
                  "show that the benchmark runs; do not quote them.", ""]
    lines += [
        f"tpuwatch runs {SIM_CHIPS} simulated chips (`devices.backend: sim`, scenario healthy) at interval "
        f"{INTERVAL_S:g} s; node_exporter runs with its default collectors. Both ran side by side in the same "
        "run on the same machine; node_exporter is the anchor and ratios are tpuwatch / node_exporter.",
        "",
        "| # | Figure | tpuwatch | node_exporter (anchor) | Ratio | Target | Met |",
        "|---|---|---:|---:|---:|---|---|",
        *figure_rows(plan, results),
        "",
        "### Notes",
        "",
        *detail_lines(plan, results),
        "",
        *rss_table(results),
        "",
        "### Machine",
        "",
        *[f"- {key}: {value}" for key, value in facts.items()],
        f"- Date: {started.strftime('%Y-%m-%d %H:%M UTC')}",
        "",
        "### Command",
        "",
        "```",
        command,
        "```",
        "",
    ]
    return "\n".join(lines)


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


def interrupt(signum: int, frame: object) -> None:
    """SIGTERM behaves like Ctrl-C, so the servers are stopped on the way out."""
    raise KeyboardInterrupt


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
