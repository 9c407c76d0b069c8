"""The probe benchmark's daemon: ``tpuwatch run`` with the probe socket and 4 simulated chips whose device
files this process holds, its /metrics scraped, the holder's reports and their cost, windows of observation."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from tpuwatch.probe.channel import exchange

from common import checkout_env, wait_for_first_cycle
from probe_base import (
    DEVICES,
    GUARD,
    INTERVAL_S,
    REFUSALS,
    REPORTS_PER_MINUTE,
    SCRAPE_EVERY_S,
    BenchmarkError,
    cpu_seconds,
    free_port,
    progress,
)

# --- the daemon -----------------------------------------------------------------------------------------


@dataclass
class Daemon:
    """``tpuwatch run`` as a child, with its URL, probe socket and log."""

    process: subprocess.Popen[bytes]
    url: str
    socket: str
    log: Path

    def complaints(self) -> list[str]:
        """The distinct WARNING and ERROR messages of its log so far (timestamps dropped)."""
        lines = self.log.read_text(errors="replace").splitlines()
        found = [line.split(" ", 2)[-1] for line in lines if " WARNING " in line or " ERROR " in line]
        return list(dict.fromkeys(found))

    @property
    def pid(self) -> int:
        """The daemon's pid."""
        return self.process.pid

    def ensure_alive(self) -> None:
        """BenchmarkError with the log's tail if the daemon has exited."""
        if self.process.poll() is not None:
            raise BenchmarkError(f"the daemon exited ({self.process.returncode}): {self.log.read_text()[-3000:]}")


def hold_chips(dev: Path) -> list[Any]:
    """Create the simulated chips' device files and hold them open, as a job holds its chips."""
    dev.mkdir(parents=True)
    return [open(dev / f"accel{i}", "a") for i in range(DEVICES)]  # noqa: SIM115 - held until the end


def start_daemon(workdir: Path) -> Daemon:
    """Start ``tpuwatch run`` on a free port (config as JSON, which is YAML) and wait for its first cycle."""
    port = free_port()
    socket_path = str(workdir / "probe.sock")
    config = {"listen": f"127.0.0.1:{port}", "state_dir": str(workdir / "state"), "interval": f"{INTERVAL_S:g}s",
              "devices": {"backend": "sim", "sim": {"count": DEVICES, "device_dir": str(workdir / "dev")}},
              "canary": {"enabled": False}, "kernel_log": {"source": "file", "path": str(workdir / "empty.log")},
              "probe": {"socket": socket_path, "reports_per_minute": REPORTS_PER_MINUTE}}
    (workdir / "empty.log").touch()
    path = workdir / "config.yaml"
    path.write_text(json.dumps(config, indent=1))
    log = workdir / "daemon.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-c", GUARD, sys.executable, "-m", "tpuwatch", "run", "--config",
                                    str(path)], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                   env=checkout_env())
    daemon = Daemon(process, f"http://127.0.0.1:{port}", socket_path, log)
    wait_for_first_cycle(daemon.url, process, log)
    progress(f"daemon up (pid {process.pid}) on {daemon.url}, probe socket {daemon.socket}")
    return daemon


def stop_process(process: subprocess.Popen[Any]) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def scrape(url: str) -> tuple[float, dict[str, float] | None]:
    """One /metrics scrape on a new connection: its seconds and the samples by ``name{labels}`` (None: failed)."""
    started = time.perf_counter()
    try:
        response = requests.get(f"{url}/metrics", timeout=10)
        response.raise_for_status()
        text = response.text
    except requests.RequestException:
        return time.perf_counter() - started, None
    elapsed = time.perf_counter() - started
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                samples[key] = float(value)
            except ValueError:
                continue
    return elapsed, samples


def probe_counts(samples: dict[str, float]) -> Counter[str]:
    """The daemon's report counters: accepted and each refusal reason."""
    counts: Counter[str] = Counter({"accepted": int(samples.get("tpuwatch_probe_reports_total", 0))})
    for reason in REFUSALS:
        counts[reason] = int(samples.get(f'tpuwatch_probe_reports_rejected_total{{reason="{reason}"}}', 0))
    return counts


def settled(daemon: Daemon, window: Window | None = None) -> dict[str, float]:
    """The daemon's samples once its next cycles have rendered what came before; scraped every SCRAPE_EVERY_S
    meanwhile, so that ``window`` sees the cycles that ended at its very end (the exposition shows a cycle late)."""
    deadline = time.monotonic() + 2.5 * INTERVAL_S
    while True:
        _, samples = scrape(daemon.url)
        if samples is not None and window is not None:
            window.seen(samples)
        if time.monotonic() >= deadline:
            break
        time.sleep(SCRAPE_EVERY_S)
    if samples is None:
        raise BenchmarkError("cannot scrape the daemon")
    return samples


def holder_exchange(daemon: Daemon, report: dict[str, Any]) -> str:
    """Send ``report`` as the probe's channel does (``exchange``); "accepted", the refusal's reason, or the error
    (a refusal at accept, busy or rate_limited, reaches ``exchange`` as ECONNRESET or EPIPE when the daemon closes
    the connection before reading the report)."""
    try:
        answer = exchange(daemon.socket, report)
    except (OSError, ValueError) as exc:
        return type(exc).__name__
    return "accepted" if answer.get("accepted") else str(answer.get("reason"))


@dataclass
class ReportCost:
    """Figure 3a: valid reports from the holder, one after another."""

    count: int
    answers: Counter[str]
    seconds: float
    cpu: float
    idle_seconds: float
    idle_cpu: float
    latencies: list[float]

    @property
    def idle_rate(self) -> float:
        """The daemon's idle CPU seconds per second."""
        return self.idle_cpu / self.idle_seconds

    @property
    def per_report(self) -> float:
        """Daemon CPU seconds per report, the idle CPU over as long subtracted."""
        return (self.cpu - self.idle_rate * self.seconds) / self.count


def report_cost(daemon: Daemon, report: dict[str, Any], count: int, min_idle: float) -> ReportCost:
    """``count`` valid reports sent one after another from this process (it holds the chips), then as long idle."""
    answers: Counter[str] = Counter()
    latencies = []
    cpu0, started = cpu_seconds(daemon.pid), time.perf_counter()
    for _ in range(count):
        sent = time.perf_counter()
        answers[holder_exchange(daemon, report)] += 1
        latencies.append(time.perf_counter() - sent)
    seconds, cpu = time.perf_counter() - started, cpu_seconds(daemon.pid) - cpu0
    idle_seconds = max(seconds, min_idle)
    cpu0, started = cpu_seconds(daemon.pid), time.perf_counter()
    time.sleep(idle_seconds)
    idle_seconds, idle_cpu = time.perf_counter() - started, cpu_seconds(daemon.pid) - cpu0
    return ReportCost(count, answers, seconds, cpu, idle_seconds, idle_cpu, latencies)


@dataclass
class Window:
    """Scrapes every SCRAPE_EVERY_S over a window: latencies, failures, the cycles seen, the daemon's CPU."""

    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    failed: int = 0
    cycle_ends: list[float] = field(default_factory=list)
    cpu: float = 0.0
    collectors_failing: set[str] = field(default_factory=set)
    slowest: dict[str, float] = field(default_factory=dict)  # collector -> longest duration seen
    scheduler: dict[str, tuple[float, float]] = field(default_factory=dict)  # event -> (first, last) count seen
    unix: tuple[float, float] = (0.0, 0.0)

    def gaps(self) -> list[float]:
        """Seconds between consecutive cycle ends inside the window."""
        ends = self.cycles()
        return [b - a for a, b in zip(ends, ends[1:])]

    def scheduler_events(self) -> dict[str, int]:
        """Scheduler problems (missed, max_instances, error) counted during the window."""
        return {event: int(last - first) for event, (first, last) in self.scheduler.items() if last > first}

    def cycles(self) -> list[float]:
        """The distinct cycle end times inside the window (its scrapes and one after it seen them)."""
        return sorted({t for t in self.cycle_ends if self.unix[0] <= t <= self.unix[1]})

    def stretch(self) -> float:
        """The longest time inside the window without a cycle ending, its edges included."""
        points = [self.unix[0], *self.cycles(), self.unix[1]]
        return max(b - a for a, b in zip(points, points[1:]))

    def seen(self, samples: dict[str, float]) -> None:
        """Note the cycle end a scrape shows, the collectors' durations and the scheduler's problems."""
        for key, value in samples.items():
            if key.startswith("tpuwatch_collector_duration_seconds{"):
                name = key.split('"')[1]
                self.slowest[name] = max(self.slowest.get(name, 0.0), value)
            elif key.startswith("tpuwatch_scheduler_events_total{"):
                event = key.split('"')[1]
                first, _ = self.scheduler.get(event, (value, value))
                self.scheduler[event] = (first, value)
        if "tpuwatch_last_sample_timestamp_seconds" in samples:
            self.cycle_ends.append(samples["tpuwatch_last_sample_timestamp_seconds"])


def observe(daemon: Daemon, seconds: float, until: Callable[[], bool] | None = None) -> Window:
    """Scrape every SCRAPE_EVERY_S for ``seconds`` (or until ``until()``)."""
    window = Window()
    cpu0, started, unix0 = cpu_seconds(daemon.pid), time.monotonic(), time.time()
    next_at = started
    while True:
        now = time.monotonic()
        if now - started >= seconds or (until is not None and until()):
            break
        daemon.ensure_alive()
        latency, samples = scrape(daemon.url)
        window.latencies.append(latency)
        if samples is None:
            window.failed += 1
        else:
            window.seen(samples)
            window.collectors_failing |= {key for key, value in samples.items()
                                          if key.startswith("tpuwatch_collector_success") and value != 1}
        next_at += SCRAPE_EVERY_S
        time.sleep(max(0.0, next_at - time.monotonic()))
    window.seconds, window.cpu = time.monotonic() - started, cpu_seconds(daemon.pid) - cpu0
    window.unix = (unix0, time.time())
    return window
