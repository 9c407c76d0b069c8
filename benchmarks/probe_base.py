"""The probe benchmark's shared part: the host CPU devices set up before jax is imported, its settings and
targets, the scripts run in fresh interpreters, and small helpers (``benchmarks/probe.py`` runs it).

Every other ``probe_*`` module takes jax from here, so that ``XLA_FLAGS`` (four host CPU devices) and
``JAX_PLATFORMS`` are set before jax is first imported."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path

DEVICES = 4
_FLAG = f"--xla_force_host_platform_device_count={DEVICES}"
os.environ["XLA_FLAGS"] = " ".join(f for f in [os.environ.get("XLA_FLAGS", ""), _FLAG] if f)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# The other probe_* modules take jax, and what imports it, from here (F401: re-exported).
import jax  # noqa: E402, F401
import jax.numpy as jnp  # noqa: E402, F401
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402, F401

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]
from tpuwatch.probe.core import Probe  # noqa: E402, F401

# The job's model.
LAYERS, D_MODEL, HEADS, SEQ, VOCAB, BATCH = 2, 128, 4, 64, 256, 8
DATA_BATCHES = 32
LEARNING_RATE = 1e-3
# The daemon.
INTERVAL_S = 1.0
REPORTS_PER_MINUTE = 600
SCRAPE_EVERY_S = 0.5
START_LIMIT_S = 180.0
NOBODY = 65534
OVERSIZED_BYTES = 70 * 1024
ROTATE = 500  # hostile reports per sending process, under the per-process burst (REPORTS_PER_MINUTE)
CLK_TCK = os.sysconf("SC_CLK_TCK")
# Targets.
TARGET_ADDED_PCT = 0.1
TARGET_DEVICE_MIB = 4.0
DAEMON_LIBRARIES = ("psutil", "prometheus_client", "yaml", "apscheduler", "requests", "systemd")
SHARES = {"off": 1.5, "default": 2.5, "stressed": 1.0}  # of each round's training time, by arm
CALL_KINDS = ("compile_start", "nothing", "dispatch", "not_ready", "finish", "error")
CALL_NAMES = {"compile_start": "starts the compile thread", "nothing": "nothing to do (compiling, or no run due)",
              "dispatch": "dispatches a run", "not_ready": "outputs not ready: moved on",
              "finish": "reads back, judges, queues the report", "error": "the probe stopped itself"}
# The hostile mix: per kind, its share of --flood-rate and how its reports are made (FLOODER).
FLOOD_SHARES = {"malformed": 1 / 3, "oversized": 1 / 12, "not_holder": 1 / 4, "beyond_limit": 1 / 3}
FLOOD_THREADS = 4
REFUSALS = ("busy", "rate_limited", "timeout", "oversized", "malformed", "not_holder", "unknown_chip")

# In a child before exec: SIGTERM when this script dies, even by SIGKILL (prctl PR_SET_PDEATHSIG).
GUARD = ("import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); "
         "os.execv(sys.argv[1], sys.argv[1:])")
IMPORT_SCRIPT = """
import json, sys, time
def rss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
steps = []
for name in sys.argv[2:]:  # "module", or "module:attribute" (the attribute's first access, lazy modules)
    module, _, attribute = name.partition(":")
    before, started = rss_kib(), time.perf_counter()
    __import__(module)
    if attribute:
        getattr(sys.modules[module], attribute)
    steps.append([name, time.perf_counter() - started, rss_kib() - before])
print(json.dumps({"steps": steps, "loaded": [m for m in json.loads(sys.argv[1]) if m in sys.modules],
                  "tpuwatch": sorted(m for m in sys.modules if m.startswith("tpuwatch"))}))
"""
FRESH_CHECK_SCRIPT = """
import json, sys, time
def rss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
import jax
jax.devices()
from tpuwatch.probe import Probe
before, started = rss_kib(), time.perf_counter()
probe = Probe(socket=sys.argv[1])
made = time.perf_counter()
result = probe.check()
checked = time.perf_counter()
again = probe.check()
print(json.dumps({"init": made - started, "check": checked - made, "again": time.perf_counter() - checked,
                  "status": result.status if result else probe.error, "rss_kib": rss_kib() - before}))
"""


class BenchmarkError(RuntimeError):
    """A measurement could not be made; the message says why."""


def progress(message: str) -> None:
    """One progress line on stderr, stamped with the wall clock."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def pct(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (linear interpolation); nan for no values."""
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else float("nan")


def ms(seconds: float, digits: int = 1) -> str:
    """Seconds as milliseconds with ``digits`` decimals."""
    return f"{seconds * 1000:.{digits}f}"


def cpu_seconds(pid: int) -> float:
    """utime + stime of a whole process (all threads) in seconds, from /proc/PID/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()  # fields from 3 (state) on
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has been busy (all CPUs: user, nice, system, irq, softirq, steal)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(fields[:3]) + sum(fields[5:8])) / CLK_TCK


class OtherLoad:
    """CPU seconds used by everything but this process and ``pids`` (the daemon): other processes' load."""

    def __init__(self) -> None:
        self.pids: list[int] = []

    def __call__(self) -> float:
        own = os.times()
        ours = own.user + own.system + sum(cpu_seconds(pid) for pid in self.pids if Path(f"/proc/{pid}").exists())
        return machine_busy_seconds() - ours


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
