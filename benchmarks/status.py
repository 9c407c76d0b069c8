#!/usr/bin/env python3
"""Measure the status page: its render CPU and size for 1, 8 and 64 chips, the CPU a request costs a daemon,
and the daemon's RSS with and without the page served, beside node_exporter; write the status section of
BENCHMARKS.md.

Usage::

    python benchmarks/status.py [--renders 200] [--requests 200] [--soak 300] [--quick] [--output BENCHMARKS.md]

1. Render CPU, in this process: the status document (tpuwatch.views.document.build_status) of simulated
   chips with an hour of history (360 points per series, the default store: 10 s for an hour), their leak
   detectors fed the same hour and more (tests/statusdoc.py, as the daemon feeds them), then the page,
   ``/api/status`` and ``/api/series``, and the three gzip-compressed: ``time.process_time()`` over
   ``--renders`` builds, for 1, 8 and 64 healthy chips and 8 chips with hbm-leak (the forecast drawn).  What
   one sampling cycle costs when the page is viewed: all of it is made at most once per cycle.
2. Page size: bytes of the page, plain and gzip, and of both JSON routes, for the same hosts.
3. CPU per request in a real daemon (8 simulated chips, interval 10 s): ``--requests`` sequential GETs of
   ``/`` with gzip, less the daemon's idle CPU over as long (benchmarks/daemon.py's figure 2 method): the
   answer is the cycle's cached page.  The anchor, same run: node_exporter's CPU per /metrics scrape.
4. RSS with and without the page served: two identical daemons (8 chips, interval 2 s, so that the page is
   rebuilt often), both scraped every 15 s and read every second for ``--soak`` seconds: one ``/``,
   ``/api/status`` and ``/api/series`` (a browser tab refreshing and a script polling), the other
   ``/healthz`` and ``/api/alerts`` (the routes it had before, so that both run the endpoint's route
   workers).  VmRSS of both at the end, and of the served one before serving began.

``--quick`` is a smoke run (20 renders, 20 requests, 30 s soak): do not quote it.  Only the section between
``<!-- status:begin -->`` and ``<!-- status:end -->`` of the output file is rewritten.
"""

from __future__ import annotations

import argparse
import gzip
import shlex
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import requests
import yaml
from servers import (
    BenchmarkError,
    Child,
    cpu_seconds,
    free_port,
    idle_cpu_rates,
    interrupt,
    machine_facts,
    node_exporter_binary,
    progress,
    ratio,
    rss_kib,
    scrape_burst,
    start_child,
    stop_children,
    wait_ready,
)

from common import BENCHMARKS_MD, REPO_ROOT, machine_and_command, write_section

sys.path.insert(0, str(REPO_ROOT / "tests"))

from tpuwatch.views.document import build_status  # noqa: E402
from tpuwatch.views.page import GZIP_LEVEL, series_body, status_body  # noqa: E402
from tpuwatch.views.render import render_page  # noqa: E402

from statusdoc import T0, SimHost  # noqa: E402

HOSTS = {"1 chip": ("healthy", 1), "8 chips": ("healthy", 8), "8 chips, hbm-leak": ("hbm-leak", 8),
         "64 chips": ("healthy", 64)}
TARGETS = {"render_ms": 20.0, "page_bytes": 300_000, "rss_kib": 2048}
SERVED_INTERVAL_S = 2.0
SCRAPE_EVERY_S = 15.0
READ_EVERY_S = 1.0
PAGE_ROUTES = ("/", "/api/status", "/api/series")
OTHER_ROUTES = ("/healthz", "/api/alerts")


@dataclass
class Render:
    """Figures 1 and 2 for one simulated host."""

    build_ms: float
    page_ms: float
    json_ms: float
    gzip_ms: float
    page_bytes: int
    page_gzip_bytes: int
    status_bytes: int
    series_bytes: int


@dataclass
class StatusResults:
    """Everything the report shows."""

    renders: dict[str, Render] = field(default_factory=dict)
    request_ms: dict[str, float] = field(default_factory=dict)
    rss_kib: dict[str, int] = field(default_factory=dict)
    served_requests: int = 0
    served_failed: int = 0


def measure_render(scenario: str, chips: int, renders: int) -> Render:
    """Figure 1 and 2: CPU per build of each part, in ms, and the bytes, for one simulated host."""
    host = SimHost(scenario, count=chips, fault_device=min(2, chips - 1))
    readers = host.readers()
    for _ in range(3):  # warm-up
        render_page(build_status(readers, T0, "bench"))

    def timed(step: object) -> float:
        start = time.process_time()
        for _ in range(renders):
            step()  # type: ignore[operator]
        return (time.process_time() - start) / renders * 1000

    doc = build_status(readers, T0, "bench")
    page = render_page(doc).encode()
    bodies = (page, status_body(doc), series_body(doc))
    return Render(
        build_ms=timed(lambda: build_status(readers, T0, "bench")),
        page_ms=timed(lambda: render_page(doc).encode()),
        json_ms=timed(lambda: (status_body(doc), series_body(doc))),
        gzip_ms=timed(lambda: [gzip.compress(body, GZIP_LEVEL) for body in bodies]),
        page_bytes=len(page), page_gzip_bytes=len(gzip.compress(page, GZIP_LEVEL)),
        status_bytes=len(status_body(doc)), series_bytes=len(series_body(doc)))


def daemon_yaml(port: int, state_dir: Path, interval: float) -> str:
    return yaml.safe_dump({"listen": f"127.0.0.1:{port}", "interval": f"{interval:g}s", "state_dir": str(state_dir),
                           "kernel_log": {"source": "none"}, "canary": {"enabled": False},
                           "devices": {"backend": "sim", "sim": {"count": 8, "scenario": "healthy"}}})


def start_daemon(name: str, workdir: Path, interval: float) -> tuple[Child, str]:
    port = free_port()
    state = workdir / name
    state.mkdir()
    config = workdir / f"{name}.yaml"
    config.write_text(daemon_yaml(port, state, interval))
    child = start_child(name, [sys.executable, "-m", "tpuwatch", "run", "--config", str(config)], port, workdir)
    return child, f"http://127.0.0.1:{port}"


def page_burst(child: Child, base: str, count: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) the daemon spent answering ``count`` sequential GET / with gzip."""
    with requests.Session() as session:
        cpu, wall = cpu_seconds(child.pid), time.monotonic()
        for _ in range(count):
            response = session.get(base + "/", headers={"Accept-Encoding": "gzip"}, timeout=10)
            response.raise_for_status()
        return cpu_seconds(child.pid) - cpu, time.monotonic() - wall


def measure_requests(workdir: Path, node_exporter: str, count: int, results: StatusResults) -> None:
    """Figure 3: CPU per page request in a daemon, and per /metrics scrape of node_exporter, idle subtracted."""
    children: list[Child] = []
    try:
        daemon, base = start_daemon("tpuwatch", workdir, 10.0)
        children.append(daemon)
        port = free_port()
        children.append(start_child("node_exporter", [node_exporter, f"--web.listen-address=127.0.0.1:{port}"],
                                    port, workdir))
        for child in children:
            wait_ready(child)
        requests.get(base + "/", timeout=10).raise_for_status()  # this cycle's page built
        progress(f"figure 3: {count} sequential GET / of tpuwatch, {count} scrapes of node_exporter")
        bursts = {"tpuwatch": page_burst(daemon, base, count), "node_exporter": scrape_burst(children[1], count)}
        window = max(10.0, max(wall for _, wall in bursts.values()))
        idle = idle_cpu_rates(children, window)
        for name, (cpu, wall) in bursts.items():
            results.request_ms[name] = (cpu - idle[name] * wall) / count * 1000
            progress(f"figure 3: {name} {results.request_ms[name]:.3f} ms CPU per request")
    finally:
        stop_children(children)


class Reader(threading.Thread):
    """Reads ``routes`` of a daemon every second; counts what the page routes answered."""

    def __init__(self, base: str, routes: tuple[str, ...], results: StatusResults) -> None:
        super().__init__(name="reader", daemon=True)
        self.base, self.routes, self.results = base, routes, results
        self.stopped = threading.Event()

    def run(self) -> None:
        with requests.Session() as session:
            while not self.stopped.wait(READ_EVERY_S):
                for route in self.routes:
                    try:
                        session.get(self.base + route, headers={"Accept-Encoding": "gzip"},
                                    timeout=10).raise_for_status()
                        self.results.served_requests += route in PAGE_ROUTES
                    except requests.RequestException:
                        self.results.served_failed += 1


def measure_rss(workdir: Path, soak: float, results: StatusResults) -> None:
    """Figure 4: two identical daemons, one serving the page, both scraped."""
    children: list[Child] = []
    readers: list[Reader] = []
    try:
        served, served_base = start_daemon("served", workdir, SERVED_INTERVAL_S)
        plain, plain_base = start_daemon("not-served", workdir, SERVED_INTERVAL_S)
        children += [served, plain]
        for child in children:
            wait_ready(child)
        time.sleep(3 * SERVED_INTERVAL_S)
        results.rss_kib["served, before"] = rss_kib(served.pid)
        readers = [Reader(served_base, PAGE_ROUTES, results), Reader(plain_base, OTHER_ROUTES, results)]
        for reader in readers:
            reader.start()
        progress(f"figure 4: {soak:g} s, the page and its JSON every {READ_EVERY_S:g} s from one daemon")
        end = time.monotonic() + soak
        next_scrape = time.monotonic()
        with requests.Session() as session:
            while time.monotonic() < end:
                for child in children:
                    child.ensure_alive()
                if time.monotonic() >= next_scrape:
                    for child in children:
                        session.get(child.url, timeout=10).raise_for_status()
                    next_scrape += SCRAPE_EVERY_S
                time.sleep(0.5)
        results.rss_kib["served"] = rss_kib(served.pid)
        results.rss_kib["not served"] = rss_kib(plain.pid)
        progress(f"figure 4: RSS served {results.rss_kib['served']} KiB, not served {results.rss_kib['not served']} KiB")
    finally:
        for reader in readers:
            reader.stopped.set()
        stop_children(children)


def report(results: StatusResults, args: argparse.Namespace, facts: dict[str, str], started: datetime,
           command: str) -> str:
    eight = results.renders["8 chips"]
    per_cycle = eight.build_ms + eight.page_ms + eight.json_ms + eight.gzip_ms
    anchor = results.request_ms["node_exporter"]
    rss = results.rss_kib
    rss_delta = rss["served"] - rss["not served"]
    lines = ["## status: the status page and its JSON", ""]
    if args.quick:
        lines += ["**Quick smoke run: do not quote these figures.**", ""]
    lines += [
        "| Figure | tpuwatch | Anchor (same run) | Ratio | Target | Met |",
        "|---|---|---|---|---|---|",
        f"| CPU per build, 8 chips (document, page, both JSON routes, each gzip; at most once per cycle) | {per_cycle:.2f} ms | "
        f"node_exporter {anchor:.3f} ms per /metrics scrape | {ratio(per_cycle, anchor)} | <= "
        f"{TARGETS['render_ms']:g} ms | {'yes' if per_cycle <= TARGETS['render_ms'] else '**no**'} |",
        f"| Page size, 8 chips, an hour of history | {eight.page_bytes / 1000:.0f} kB ({eight.page_gzip_bytes / 1000:.0f}"
        f" kB gzip) | | | <= {TARGETS['page_bytes'] / 1000:g} kB | "
        f"{'yes' if eight.page_bytes <= TARGETS['page_bytes'] else '**no**'} |",
        f"| CPU per GET / in the daemon (the cycle's page, cached) | {results.request_ms['tpuwatch']:.3f} ms | "
        f"node_exporter {anchor:.3f} ms per scrape | {ratio(results.request_ms['tpuwatch'], anchor)} | | |",
        f"| RSS, page served vs not, after {args.soak:g} s | {rss_delta / 1024:+.2f} MiB ({rss['served'] / 1024:.1f} vs "
        f"{rss['not served'] / 1024:.1f} MiB) | | | <= +{TARGETS['rss_kib'] / 1024:g} MiB | "
        f"{'yes' if rss_delta <= TARGETS['rss_kib'] else '**no**'} |",
        "", "### Render CPU and size per host", "",
        f"| Host | Document | HTML | JSON (both routes) | gzip (level {GZIP_LEVEL}) of the three | Page | Page gzip | /api/status | /api/series |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.renders.items():
        lines.append(f"| {name} | {r.build_ms:.2f} ms | {r.page_ms:.2f} ms | {r.json_ms:.2f} ms | {r.gzip_ms:.2f} ms | "
                     f"{r.page_bytes / 1000:.0f} kB | {r.page_gzip_bytes / 1000:.0f} kB | {r.status_bytes / 1000:.0f} kB"
                     f" | {r.series_bytes / 1000:.0f} kB |")
    lines += [
        "", f"Figure 4: {results.served_requests} page and JSON requests served to the served daemon over "
        f"{args.soak:g} s ({results.served_failed} requests failed in all), sampling every {SERVED_INTERVAL_S:g} s (the "
        "page rebuilt each cycle); the other daemon read on /healthz and /api/alerts as often; the served one's RSS "
        f"before serving began: {rss['served, before'] / 1024:.1f} MiB. The plots draw at most two points per "
        "bucket, 60 buckets a series for up to 8 chips, fewer beyond (at least 20), so the page grows with the "
        "chips, not with the history kept.", "",
        *machine_and_command(facts, started, command),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--renders", type=int, default=200)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--soak", type=float, default=300.0)
    parser.add_argument("--quick", action="store_true", help="smoke run: figures not to quote")
    parser.add_argument("--output", type=Path, default=BENCHMARKS_MD)
    args = parser.parse_args(argv)
    if args.quick:
        args.renders, args.requests, args.soak = 20, 20, 30.0
    signal.signal(signal.SIGTERM, interrupt)
    started = datetime.now(timezone.utc)
    command = shlex.join(["python", *sys.argv])
    results = StatusResults()
    try:
        node_exporter = node_exporter_binary()
        for name, (scenario, chips) in HOSTS.items():
            progress(f"figure 1: {args.renders} builds, {name}")
            results.renders[name] = measure_render(scenario, chips, args.renders)
        with tempfile.TemporaryDirectory(prefix="tpuwatch-status-bench-") as tmp:
            measure_requests(Path(tmp), node_exporter, args.requests, results)
        with tempfile.TemporaryDirectory(prefix="tpuwatch-status-bench-") as tmp:
            measure_rss(Path(tmp), args.soak, results)
        facts = machine_facts(node_exporter)
    except BenchmarkError as exc:
        print(f"status benchmark: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    markdown = report(results, args, facts, started, command)
    write_section("status", markdown, args.output)
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
