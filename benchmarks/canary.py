#!/usr/bin/env python3
"""Time the reference-inference canary and check that scheduling it leaves the daemon's memory alone.

Usage::

    python benchmarks/canary.py [--runs N] [--daemon-runs N] [--output BENCHMARKS.md]

On four CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=4``):

1. anchor: wall time of a bare ``python -c "import jax; jax.devices()"``;
2. wall time of one ``tpuwatch canary --json`` run with an empty compile cache
   (cold, a fresh state_dir each time) and with a warm one, process start
   included, plus the device time per chip the runs report;
3. resident memory of ``tpuwatch run`` (8 simulated chips) beside the same
   daemon with a canary run every 2 s in one of its threads (``--daemon-runs``
   runs), read from /proc after the runs, and whether jax got into it.

Medians over ``--runs`` runs; rewrites the ``canary`` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent / "tests")]
from common import BENCHMARKS_MD, cpu_model, write_section  # noqa: E402
from conftest import free_port  # noqa: E402

ENV = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
CANARY = [sys.executable, "-m", "tpuwatch", "canary"]
DAEMON_CONFIG = {"interval": "10s", "devices": {"backend": "sim", "sim": {"count": 8}}}
# The daemon with the canary scheduled: the real Daemon, plus run_once() every 2 s in a thread of it.
WITH_CANARY = """
import sys, threading, time
from tpuwatch import config as config_module
from tpuwatch.canary.collector import CanaryCollector
from tpuwatch.daemon import Daemon
config = config_module.load(sys.argv[1])
daemon = Daemon(config, sys.argv[1])
daemon.start()
canary = CanaryCollector(config)
def schedule():
    for _ in range(int(sys.argv[2])):
        canary.run_once()
        time.sleep(2)
    passed = next(s.value for s in canary.collect() if s.name == "tpuwatch_canary_runs_total"
                  and s.labels == (("path", "scheduled"), ("result", "pass")))
    print(int(passed), "jax" in sys.modules, flush=True)
threading.Thread(target=schedule, daemon=True).start()
daemon.wait()
"""


def timed(command: list[str]) -> tuple[float, str]:
    """Wall seconds of ``command`` and its stdout; it must succeed."""
    started = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, env=ENV, check=True, timeout=300)
    return time.perf_counter() - started, proc.stdout


def canary_run(workdir: Path, state: Path) -> tuple[float, list[float]]:
    """One ``tpuwatch canary --json`` run: wall seconds and per-chip device seconds."""
    config = workdir / f"{state.name}.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(state)}))
    wall, out = timed([*CANARY, "--json", "--config", str(config)])
    data = json.loads(out)
    assert data["status"] == "pass", data
    return wall, [d["duration_seconds"] for d in data["devices"]]


def rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def daemons(workdir: Path, runs: int) -> tuple[float, float, str]:
    """RSS MiB of the plain daemon and of the daemon running the canary, after ``runs`` canary runs."""
    config, plain_config = workdir / "daemon.yaml", workdir / "plain.yaml"
    for path in (config, plain_config):
        path.write_text(yaml.safe_dump({**DAEMON_CONFIG, "listen": f"127.0.0.1:{free_port()}",
                                        "state_dir": str(workdir / f"{path.stem}-state")}))
    plain = subprocess.Popen([sys.executable, "-m", "tpuwatch", "run", "--config", str(plain_config)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    with_canary = subprocess.Popen([sys.executable, "-c", WITH_CANARY, str(config), str(runs)],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV)
    try:
        assert with_canary.stdout is not None
        report = with_canary.stdout.readline().strip()
        if plain.poll() is not None or not report:
            raise RuntimeError("a daemon exited early; run it by hand to see why")
        return rss_mib(plain.pid), rss_mib(with_canary.pid), report
    finally:
        for proc in (plain, with_canary):
            proc.terminate()
            proc.wait(timeout=10)




def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--daemon-runs", type=int, default=10)
    parser.add_argument("--output", type=Path, default=BENCHMARKS_MD)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        canary_run(workdir, workdir / "warm")  # fills the warm cache
        anchors, cold, warm = [], [], []
        for i in range(args.runs):  # interleaved, so all three see the same background load
            anchors.append(timed([sys.executable, "-c", "import jax; jax.devices()"])[0])
            cold.append(canary_run(workdir, workdir / f"cold{i}"))
            warm.append(canary_run(workdir, workdir / "warm"))
        plain_rss, canary_rss, report = daemons(workdir, args.daemon_runs)
    anchor = statistics.median(anchors)
    cold_s = statistics.median(w for w, _ in cold)
    warm_s = statistics.median(w for w, _ in warm)
    device_ms = statistics.median(d for _, ds in warm for d in ds) * 1000
    passes, jax_loaded = report.split()
    import jax

    section = f"""## Reference-inference canary

`{shlex.join([Path(sys.executable).name, *sys.argv])}` on {os.cpu_count()} CPUs ({cpu_model()}),
Python {platform.python_version()}, jax {jax.__version__}, four XLA CPU devices,
{datetime.now(UTC):%Y-%m-%d %H:%M} UTC. Medians of {args.runs} runs.

| Measure | Value | vs anchor |
|---|---|---|
| anchor: `python -c "import jax; jax.devices()"` | {anchor:.2f} s | 1.00 |
| `tpuwatch canary` cold (empty compile cache), process start included | {cold_s:.2f} s | {cold_s / anchor:.2f} |
| `tpuwatch canary` warm (persistent compile cache in state_dir) | {warm_s:.2f} s | {warm_s / anchor:.2f} |
| device time per chip (one inference, after compile) | {device_ms:.3f} ms | |
| daemon RSS, 8 sim chips, no canary | {plain_rss:.1f} MiB | |
| same daemon after {args.daemon_runs} canary runs in its thread ({passes} passed, jax in process: {jax_loaded}) | {canary_rss:.1f} MiB | {canary_rss / plain_rss:.2f} × |

Target: warm ≤ 1.5 s — {"met" if warm_s <= 1.5 else "NOT met"}. The canary's jax lives only in the worker
subprocess, so the daemon's own memory does not grow by jax's ~140 MB.
"""
    write_section("canary", section, args.output)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
