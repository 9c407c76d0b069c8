"""The servers the daemon benchmarks measure, side by side: start one with its log, wait until it serves, scrape it
as Prometheus would, read its RSS and CPU from /proc, stop it; the machine facts and progress lines every report
shares.  Used by daemon.py, footprint.py, soak.py, status.py, flood.py, container.py and quickstart.py."""

from __future__ import annotations

import ctypes
import math
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import requests

from common import REPO_ROOT, checkout_env, cpu_model

sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "tests")]  # this checkout's tpuwatch, whatever else is installed
import tpuwatch  # noqa: E402

from conftest import free_port  # noqa: E402, F401  (the benchmarks' ports, as the tests pick theirs)

NODE_EXPORTER_NAMES = ("prometheus-node-exporter", "node_exporter")
SCRAPE_TIMEOUT_S = 10.0
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
PR_SET_PDEATHSIG = 1
# What Prometheus 2.x sends, so each server picks the encoding it would use in production.
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


class BenchmarkError(RuntimeError):
    """The benchmark cannot go on; the message says why."""


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
class Fit:
    """Least-squares RSS slope with its standard error, both in KiB/hour."""

    slope: float
    stderr: float


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


def ratio(value: float, anchor: float) -> str:
    """``value / anchor`` as '1.23x'."""
    return f"{value / anchor:.2f}x" if anchor > 0 else "n/a"


def interrupt(signum: int, frame: object) -> None:
    """SIGTERM behaves like Ctrl-C, so the servers are stopped on the way out."""
    raise KeyboardInterrupt
