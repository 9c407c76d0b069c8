#!/usr/bin/env python3
"""Where the daemon's memory levels off: hours of real time beside node_exporter, both scraped as often.

Usage::

    python benchmarks/soak.py [--daemon INTERVAL:CHIPS ...] [--hours H] [--scrape S] [--quick]
                              [--output BENCHMARKS.md]

One ``tpuwatch run`` per ``--daemon`` (default one, ``10s:8``: the config's
default interval, 8 simulated chips; scenario healthy, defaults otherwise, started
with the environment the systemd unit sets, e.g. ``MALLOC_ARENA_MAX``) and
Debian's node_exporter run side by side for ``--hours`` (default 6).  Every
``--scrape`` seconds (default 1) each server's /metrics is scraped with
Prometheus's Accept header, and each daemon's /healthz too; every 5 s each
daemon's status page.  Every minute every server's VmRSS is recorded (and
appended to ``soak-samples.jsonl`` in the work directory, kept on failure).

Each daemon is judged from its *fill time* on: the time its bounded histories
that hold one point per cycle or per minute take to fill (the series store's
rings, ``store.points_per_series`` x interval; the leak detector's sliding
windows, an hour).  The histories that hold points for longer (the leak
detector's per-minute floors, the alert tracker's counter points) are
allocated whole at their first point, like the store's rings, so nothing
grows after that time; docs/memory.md accounts for each structure and
``benchmarks/days.py`` measures them on a simulated clock.
Target: from the fill time on, the daemon's RSS slope is within
node_exporter's noise band (``abs(slope) + 2 standard errors`` of
node_exporter's own slope over the same window).  The plateau (the median RSS
of the last hour) is recorded beside node_exporter's: the size target is the
daemon's own heap, judged by ``benchmarks/footprint.py`` (a third of the RSS is
the pages of shared libraries the project does not control).

It rewrites one section of BENCHMARKS.md per daemon (``soak-200ms-8``,
``soak-10s-64``, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import requests
import yaml
from servers import (
    PROMETHEUS_ACCEPT,
    BenchmarkError,
    Child,
    Fit,
    die_with_parent,
    free_port,
    interrupt,
    least_squares,
    machine_facts,
    node_exporter_binary,
    progress,
    rss_kib,
    stop_children,
    wait_ready,
)

from common import BENCHMARKS_MD, REPO_ROOT, checkout_env, machine_and_command, write_section

sys.path.insert(0, str(REPO_ROOT))
from tpuwatch.analysis.leak import LeakParams  # noqa: E402
from tpuwatch.config import StoreConfig  # noqa: E402
from tpuwatch.syntax import parse_duration  # noqa: E402

UNIT = REPO_ROOT / "systemd" / "tpuwatch.service"
PAGE_EVERY_S = 5.0
RSS_EVERY_S = 60.0
PLATEAU_S = 3600.0
MIB = 1024.0


@dataclass
class Soak:
    """What one run recorded: RSS rows (seconds, KiB per server) and scrape counts."""

    names: list[str]
    samples: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    ok: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)


def unit_environment(unit: Path = UNIT) -> dict[str, str]:
    """The ``Environment=`` assignments of the systemd unit: the daemon is measured as the unit runs it."""
    env: dict[str, str] = {}
    for line in unit.read_text().splitlines():
        if line.startswith("Environment="):
            for item in shlex.split(line.removeprefix("Environment=")):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def unit_environment_text() -> str:
    """``MALLOC_ARENA_MAX=2``: the unit's environment as the report shows it."""
    return " ".join(f"{key}={value}" for key, value in unit_environment().items()) or "(none)"


def fill_seconds(interval: float) -> float:
    """Seconds until the histories that take a point per cycle or per minute are full."""
    params = LeakParams()
    return max(StoreConfig().points_per_series * interval, params.high_window, *params.floor_windows)


def label(interval: float) -> str:
    """'200ms', '10s', '2m': the section's name."""
    if interval < 1:
        return f"{interval * 1000:g}ms"
    return f"{interval:g}s" if interval < 60 else f"{interval / 60:g}m"


def start(name: str, argv: list[str], port: int, workdir: Path, env: dict[str, str]) -> Child:
    """Start a server with its output in ``workdir/NAME.log``."""
    log_path = workdir / f"{name}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   cwd=workdir, env=checkout_env(env), preexec_fn=die_with_parent)
    progress(f"started {name} (pid {process.pid}) on 127.0.0.1:{port}: {shlex.join(argv)}")
    return Child(name, process, f"http://127.0.0.1:{port}/metrics", log_path)


def daemon_spec(text: str) -> tuple[float, int]:
    """``INTERVAL:CHIPS`` (``200ms:8``) -> (seconds, chips)."""
    interval, _, chips = text.partition(":")
    try:
        return parse_duration(interval), int(chips or 8)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: expected INTERVAL:CHIPS, e.g. 200ms:8 ({exc})") from None


def name_of(interval: float, chips: int) -> str:
    """The daemon's name in the report and its section: 'tpuwatch-200ms-8'."""
    return f"tpuwatch-{label(interval)}-{chips}"


def start_daemon(interval: float, chips: int, workdir: Path) -> Child:
    """One ``tpuwatch run`` at ``interval`` with ``chips`` simulated chips and the unit's environment."""
    port = free_port()
    home = workdir / name_of(interval, chips)
    home.mkdir()
    config = home / "config.yaml"
    config.write_text(yaml.safe_dump({
        "listen": f"127.0.0.1:{port}", "interval": label(interval), "state_dir": str(home / "state"),
        "devices": {"backend": "sim", "sim": {"count": chips, "scenario": "healthy"}}}))
    env = {**os.environ, **unit_environment()}
    return start(name_of(interval, chips), [sys.executable, "-m", "tpuwatch", "run", "--config", str(config)],
                 port, home, env)


class Scraper(threading.Thread):
    """Scrapes every server's /metrics (and each daemon's /healthz) every ``period`` s, daemons' pages every 5 s."""

    def __init__(self, children: list[Child], soak: Soak, period: float) -> None:
        super().__init__(name="scraper", daemon=True)
        self.children, self.soak, self.period = children, soak, period
        self.stopped = threading.Event()

    def _get(self, session: requests.Session, name: str, url: str, accept: str | None = None) -> None:
        try:
            response = session.get(url, headers={"Accept": accept} if accept else {}, timeout=10)
            response.raise_for_status()
            self.soak.ok[name] = self.soak.ok.get(name, 0) + 1
        except requests.RequestException:
            self.soak.failed[name] = self.soak.failed.get(name, 0) + 1

    def run(self) -> None:
        sessions = {child.name: requests.Session() for child in self.children}
        next_page = time.monotonic()
        while not self.stopped.is_set():
            began = time.monotonic()
            page = began >= next_page
            for child in self.children:
                session = sessions[child.name]
                self._get(session, child.name, child.url, PROMETHEUS_ACCEPT)
                if child.name.startswith("tpuwatch"):
                    base = child.url.removesuffix("/metrics")
                    self._get(session, child.name, base + "/healthz")
                    if page:
                        self._get(session, child.name, base + "/")
            if page:
                next_page = began + PAGE_EVERY_S
            self.stopped.wait(max(0.0, self.period - (time.monotonic() - began)))


def record(children: list[Child], soak: Soak, hours: float, journal: Path) -> None:
    """RSS of every server each minute for ``hours``; each row appended to ``journal`` as it is taken."""
    t0 = time.monotonic()
    end = hours * 3600
    tick = 0
    with open(journal, "a") as out:
        while (at := tick * RSS_EVERY_S) <= end + 1e-9:
            while (left := t0 + at - time.monotonic()) > 0:
                for child in children:
                    child.ensure_alive()
                time.sleep(min(1.0, left))
            row = {child.name: rss_kib(child.pid) for child in children}
            soak.samples.append((at, row))
            out.write(json.dumps({"t": at, **row}) + "\n")
            out.flush()
            if tick % 10 == 0:
                progress(f"t={at / 60:.0f}/{end / 60:.0f} min RSS "
                         + ", ".join(f"{name} {kib / MIB:.1f} MiB" for name, kib in row.items()))
            tick += 1


def fit(soak: Soak, name: str, since: float) -> Fit:
    """The RSS slope (KiB/h) of one server from ``since`` seconds on."""
    return least_squares([(t, row[name]) for t, row in soak.samples if t >= since])


def plateau_mib(soak: Soak, name: str) -> float:
    """Median RSS of the last hour (of the last quarter when the run is shorter than four hours)."""
    end = soak.samples[-1][0]
    since = end - min(PLATEAU_S, end / 4)
    return statistics.median(row[name] for t, row in soak.samples if t >= since) / MIB


def render(soak: Soak, name: str, interval: float, chips: int, hours: float, scrape: float,
           facts: dict[str, str], started: datetime, command: str) -> str:
    """One daemon's BENCHMARKS.md section."""
    fill = fill_seconds(interval)
    ours, anchor = fit(soak, name, fill), fit(soak, "node_exporter", fill)
    band = abs(anchor.slope) + 2 * anchor.stderr
    level = abs(ours.slope) <= band
    plateau, ne_plateau = plateau_mib(soak, name), plateau_mib(soak, "node_exporter")
    rows = [(t, row) for t, row in soak.samples if t % 3600 == 0 or t == soak.samples[-1][0]]
    lines = [f"## Memory over {hours:g} h, {chips} chips at interval {label(interval)}, beside node_exporter "
             f"(`benchmarks/soak.py`)", "",
             f"`tpuwatch run` ({chips} simulated chips, scenario healthy, interval {label(interval)}, defaults "
             f"otherwise, the unit's environment `{unit_environment_text()}`) and node_exporter side by side; "
             f"/metrics of both scraped every {scrape:g} s, tpuwatch's /healthz as often and its status page every "
             f"{PAGE_EVERY_S:g} s; VmRSS every minute. Fill time at this interval: {fill / 60:g} min (series "
             "rings, the leak detector's windows); slopes are fitted from it on.", "",
             "| Hour | tpuwatch RSS (MiB) | node_exporter RSS (MiB) |", "|---:|---:|---:|"]
    lines += [f"| {t / 3600:.1f} | {row[name] / MIB:.1f} | {row['node_exporter'] / MIB:.1f} |" for t, row in rows]
    lines += ["", "| Figure | tpuwatch | node_exporter | Target | Met |", "|---|---:|---:|---|---|",
              f"| RSS slope after the fill time (KiB/h, ± 2 SE) | {ours.slope:+.0f} ± {2 * ours.stderr:.0f} | "
              f"{anchor.slope:+.0f} ± {2 * anchor.stderr:.0f} | within node_exporter's band (± {band:.0f}) | "
              f"{'yes' if level else '**no**'} |",
              f"| Plateau: median RSS of the last hour (MiB) | {plateau:.1f} | {ne_plateau:.1f} | "
              "(recorded: the heap is judged by `benchmarks/footprint.py`) | |",
              f"| Ratio to node_exporter | {plateau / ne_plateau:.2f}x | 1.00x | (recorded) | |",
              f"| Scrapes ok / failed | {soak.ok.get(name, 0)} / {soak.failed.get(name, 0)} | "
              f"{soak.ok.get('node_exporter', 0)} / {soak.failed.get('node_exporter', 0)} | | |", ""]
    return "\n".join(lines + machine_and_command(facts, started, command))


def main(argv: list[str] | None = None) -> int:
    """Run the soak and write one section per interval; exit 1 on failure, 130 when interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--daemon", action="append", type=daemon_spec, metavar="INTERVAL:CHIPS",
                        help="repeatable (default 10s:8)")
    parser.add_argument("--hours", type=float, default=6.0)
    parser.add_argument("--scrape", type=float, default=1.0, help="seconds between scrapes of each server")
    parser.add_argument("--quick", action="store_true", help="a 6-minute smoke run at 200 ms: not to quote")
    parser.add_argument("--output", type=Path, default=BENCHMARKS_MD)
    args = parser.parse_args(argv)
    daemons = args.daemon or [(10.0, 8)]
    if args.quick:
        daemons, args.hours = [(0.2, 8)], 0.1
    signal.signal(signal.SIGTERM, interrupt)
    started = datetime.now(timezone.utc)
    command = shlex.join(["python", "benchmarks/soak.py", *(argv if argv is not None else sys.argv[1:])])
    workdir = Path(tempfile.mkdtemp(prefix="tpuwatch-bench-soak-"))
    journal = workdir / "soak-samples.jsonl"
    progress(f"work directory {workdir} (RSS rows in {journal.name})")
    children: list[Child] = []
    scraper: Scraper | None = None
    try:
        ne = node_exporter_binary()
        children = [start_daemon(interval, chips, workdir) for interval, chips in daemons]
        port = free_port()
        children.append(start("node_exporter", [ne, f"--web.listen-address=127.0.0.1:{port}"], port, workdir,
                               checkout_env()))
        for child in children:
            wait_ready(child)
        soak = Soak([child.name for child in children])
        scraper = Scraper(children, soak, args.scrape)
        scraper.start()
        record(children, soak, args.hours, journal)
        facts = machine_facts(ne)
    except KeyboardInterrupt:
        progress(f"interrupted: servers stopped, no report written (rows so far in {journal})")
        return 130
    except (BenchmarkError, OSError, requests.RequestException) as exc:
        progress(f"benchmark failed: {exc} (rows so far in {journal})")
        return 1
    finally:
        if scraper is not None:
            scraper.stopped.set()
        stop_children(children)
    for (interval, chips), child in zip(daemons, children):
        section = render(soak, child.name, interval, chips, args.hours, args.scrape, facts, started, command)
        if args.quick:
            section = section.replace("## Memory over", "## (quick run: not to quote) Memory over", 1)
        write_section(child.name.replace("tpuwatch-", "soak-"), section, args.output)
        print(section)
    progress(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
