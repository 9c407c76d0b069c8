#!/usr/bin/env python3
"""Measure /metrics under a connection flood beside node_exporter, and the CPU a scrape costs; write the flood
section of BENCHMARKS.md.

Usage::

    python benchmarks/flood.py [--scrapes 400] [--cpu-scrapes 1000] [--renders 200] [--quick] [--output BENCHMARKS.md]

1. /metrics latency, p50 and p99 over ``--scrapes`` sequential scrapes, each on
   a new connection (as after an eviction: TCP and, over TLS, a full
   handshake), with Prometheus's Accept header and gzip; with no flood, with 500
   idle connections and with 500 trickling ones (a byte a second) held open
   from 127.0.0.1, the scraper's own address; plain and TLS.  tpuwatch (8
   simulated chips) and node_exporter (the anchor) each alone under the same
   flood, in the same run.
2. CPU per scrape with the pre-rendered exposition, tpuwatch with 1, 8 and 64
   simulated chips beside node_exporter: benchmarks/daemon.py's figure 2 (a
   burst of sequential scrapes, less the idle CPU over as long).  And the CPU
   one render costs (once per sampling cycle), in this process.

``--quick`` is a smoke run (40 scrapes, 20 CPU scrapes, 20 renders, 2 s
warm-up): do not quote it.  Only the section between ``<!-- flood:begin -->``
and ``<!-- flood:end -->`` of the output file is rewritten.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import ssl
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import requests
import yaml
from daemon import measure_scrapes
from daemon_report import Results
from servers import (
    PROMETHEUS_ACCEPT,
    BenchmarkError,
    Child,
    free_port,
    interrupt,
    machine_facts,
    node_exporter_binary,
    progress,
    ratio,
    start_child,
    stop_children,
    wait_ready,
)

from common import BENCHMARKS_MD, REPO_ROOT, machine_and_command, write_section

sys.path.insert(0, str(REPO_ROOT / "tests"))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tpuwatch import config as config_module  # noqa: E402
from tpuwatch.exporter import build_registry  # noqa: E402
from tpuwatch.registry import build_collectors  # noqa: E402
from tpuwatch.sampler import Sampler  # noqa: E402
from tpuwatch.store import SeriesStore  # noqa: E402

from certs import make_tls_files  # noqa: E402
from slowloris import Flood, attacker_tls  # noqa: E402

FLOOD_CONNECTIONS = 500
SHARED = ("127.0.0.1",)  # the scraper's own address: tpuwatch keeps 128 of the flood's connections
SPREAD = tuple(f"127.0.0.{n}" for n in range(2, 10))  # 8 addresses, under both caps: tpuwatch keeps all 500
CONDITIONS = {  # name -> (idle, trickling, source addresses)
    "none": (0, 0, SHARED),
    "500 idle, shared address": (FLOOD_CONNECTIONS, 0, SHARED),
    "500 trickling, shared address": (0, FLOOD_CONNECTIONS, SHARED),
    "500 idle, 8 addresses": (FLOOD_CONNECTIONS, 0, SPREAD),
    "500 trickling, 8 addresses": (0, FLOOD_CONNECTIONS, SPREAD),
}
LATENCY_CHIPS = 8
CPU_CHIPS = (1, 8, 64)
INTERVAL_S = 10.0
SCRAPE_TIMEOUT_S = 10.0
WARMUP_S = 8.0  # past the 5 s header deadline, so the flood's steady state includes its closes
TARGET_P99_S = 1.0


@dataclass
class Latency:
    """Scrape latencies (s) of one server under one condition, and how many failed."""

    seconds: list[float] = field(default_factory=list)
    failed: int = 0

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (nearest rank), in ms; nan without samples."""
        ordered = sorted(self.seconds)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else float("nan")


@dataclass
class FloodResults:
    """Everything the report shows."""

    latency: dict[tuple[str, str, str], Latency] = field(default_factory=dict)  # (scheme, condition, server)
    closed: dict[str, dict[str, float]] = field(default_factory=dict)  # scheme -> reason -> count, tpuwatch
    flood_opened: dict[tuple[str, str, str], int] = field(default_factory=dict)
    cpu: Results = field(default_factory=Results)
    series: dict[int, int] = field(default_factory=dict)
    render_ms: dict[int, float] = field(default_factory=dict)


def tpuwatch_config(port: int, state_dir: str, chips: int, web: Path | None) -> str:
    """The YAML config of a measured daemon."""
    return yaml.safe_dump({"listen": f"127.0.0.1:{port}", "interval": f"{INTERVAL_S:g}s", "state_dir": state_dir,
                           "kernel_log": {"source": "none"}, "canary": {"enabled": False},
                           **({"web_config": str(web)} if web else {}),
                           "devices": {"backend": "sim", "sim": {"count": chips, "scenario": "healthy"}}})


def start_tpuwatch(name: str, workdir: Path, chips: int, web: Path | None = None) -> tuple[Child, int]:
    port = free_port()
    state = workdir / name
    state.mkdir()
    config = workdir / f"{name}.yaml"
    config.write_text(tpuwatch_config(port, str(state), chips, web))
    return start_child(name, [sys.executable, "-m", "tpuwatch", "run", "--config", str(config)], port, workdir), port


def start_node_exporter(binary: str, workdir: Path, web: Path | None = None) -> tuple[Child, int]:
    port = free_port()
    argv = [binary, f"--web.listen-address=127.0.0.1:{port}", *([f"--web.config.file={web}"] if web else [])]
    return start_child(f"node_exporter{'-tls' if web else ''}", argv, port, workdir), port


def scrape(url: str) -> bytes:
    """One scrape on a new connection, as Prometheus makes it."""
    response = requests.get(url, headers={"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"},
                            timeout=SCRAPE_TIMEOUT_S)
    response.raise_for_status()
    return response.content


def measure_latency(child: Child, port: int, scheme: str, condition: str, scrapes: int,
                    warmup: float, results: FloodResults) -> None:
    idle, trickle, sources = CONDITIONS[condition]
    url = f"{scheme}://127.0.0.1:{port}/metrics"
    latency = Latency()
    with Flood(port, idle=idle, trickle=trickle, tls=attacker_tls() if scheme == "https" else None,
               sources=sources) as flood:
        time.sleep(warmup if idle or trickle else 0)
        for _ in range(scrapes):
            child.ensure_alive()
            started = time.monotonic()
            try:
                scrape(url)
                latency.seconds.append(time.monotonic() - started)
            except requests.RequestException:
                latency.failed += 1
        results.flood_opened[(scheme, condition, child.name)] = flood.counts.opened
    results.latency[(scheme, condition, child.name.split("-")[0])] = latency
    progress(f"{scheme} {condition:30} {child.name:17} p50 {latency.quantile(0.5):7.1f} ms  "
             f"p99 {latency.quantile(0.99):7.1f} ms  failed {latency.failed}  flood opened {flood.counts.opened}")


def closed_counts(port: int, scheme: str) -> dict[str, float]:
    """tpuwatch's closed connections by reason, from the first render after now (the exposition is per cycle)."""
    now, deadline = time.time(), time.monotonic() + 3 * INTERVAL_S
    while time.monotonic() < deadline:
        text = requests.get(f"{scheme}://127.0.0.1:{port}/metrics", timeout=SCRAPE_TIMEOUT_S).text
        samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
        if any(s.name == "tpuwatch_last_sample_timestamp_seconds" and s.value > now for s in samples):
            return {s.labels["reason"]: s.value for s in samples
                    if s.name == "tpuwatch_http_connections_closed_total" and s.value}
        time.sleep(1.0)
    raise BenchmarkError(f"no render after the floods within {3 * INTERVAL_S:g} s")


def latency_figures(node_exporter: str, workdir: Path, scrapes: int, warmup: float, results: FloodResults) -> None:
    """Figure 1: each server under each flood, plain and TLS."""
    tls = make_tls_files(workdir)
    os.environ["REQUESTS_CA_BUNDLE"] = str(tls.ca_cert)  # requests trusts the throwaway CA for every https URL
    web = workdir / "web.yml"
    web.write_text(yaml.safe_dump({"tls_server_config": {"cert_file": str(tls.server_cert),
                                                         "key_file": str(tls.server_key)}}))
    for scheme in ("http", "https"):
        children: list[Child] = []
        try:
            servers = [start_tpuwatch(f"tpuwatch-{scheme}", workdir, LATENCY_CHIPS, web if scheme == "https" else None),
                       start_node_exporter(node_exporter, workdir, web if scheme == "https" else None)]
            children = [child for child, _ in servers]
            for child, port in servers:
                child.url = f"{scheme}://127.0.0.1:{port}/metrics"
                wait_ready(child)
            for condition in CONDITIONS:
                for child, port in servers:
                    measure_latency(child, port, scheme, condition, scrapes, warmup, results)
            results.closed[scheme] = closed_counts(servers[0][1], scheme)
        finally:
            stop_children(children)


def exposition_series(child: Child) -> int:
    text = requests.get(child.url, timeout=SCRAPE_TIMEOUT_S).text
    return sum(len(f.samples) for f in text_string_to_metric_families(text))


def render_cpu_ms(chips: int, renders: int) -> float:
    """Mean process CPU (ms) of one render of the exposition with ``chips`` simulated chips, in this process."""
    config = config_module.parse(tpuwatch_config(free_port(), tempfile.gettempdir(), chips, None), "benchmark")
    store = SeriesStore(config.store.points_per_series, config.store.max_series)
    sampler = Sampler([list(build_collectors(config))], store, config.collector_deadline)
    sampler.run_once()
    registry = build_registry(store.current)
    registry.render()
    start = time.process_time()
    for _ in range(renders):
        registry.render()
    return (time.process_time() - start) / renders * 1000


def cpu_figures(node_exporter: str, workdir: Path, scrapes: int, renders: int, results: FloodResults) -> None:
    """Figure 2: CPU per scrape for 1, 8 and 64 chips beside node_exporter, and CPU per render."""
    for chips in CPU_CHIPS:
        progress(f"figure 2: {renders} renders with {chips} chips, in this process")
        results.render_ms[chips] = render_cpu_ms(chips, renders)
    children: list[Child] = []
    try:
        children = [start_tpuwatch(f"tpuwatch-{chips}", workdir, chips)[0] for chips in CPU_CHIPS]
        children.append(start_node_exporter(node_exporter, workdir)[0])
        for child in children:
            wait_ready(child)
        for chips, child in zip(CPU_CHIPS, children):
            results.series[chips] = exposition_series(child)
        measure_scrapes(children, scrapes, results.cpu)
    finally:
        stop_children(children)


# --- the report -------------------------------------------------------------------


def latency_rows(results: FloodResults) -> list[str]:
    rows = []
    for scheme in ("http", "https"):
        for condition in CONDITIONS:
            tw, ne = results.latency[(scheme, condition, "tpuwatch")], results.latency[(scheme, condition, "node_exporter")]
            p99 = tw.quantile(0.99)
            met = "yes" if p99 <= TARGET_P99_S * 1000 and not tw.failed else "**no**"
            rows.append(f"| {scheme} | {condition} | {tw.quantile(0.5):.1f} | {p99:.1f} | {ne.quantile(0.5):.1f} "
                        f"| {ne.quantile(0.99):.1f} | {ratio(tw.quantile(0.5), ne.quantile(0.5))} "
                        f"| {ratio(p99, ne.quantile(0.99))} | {tw.failed} / {ne.failed} "
                        f"| {met if condition != 'none' else 'context'} |")
    return rows


def cpu_rows(results: FloodResults) -> list[str]:
    ne = results.cpu.scrape["node_exporter"].per_scrape_ms
    rows = []
    for chips in CPU_CHIPS:
        tw = results.cpu.scrape[f"tpuwatch-{chips}"].per_scrape_ms
        rows.append(f"| {chips} | {results.series[chips]} | {tw:.3f} | {ne:.3f} | {ratio(tw, ne)} "
                    f"| {results.render_ms[chips]:.2f} |")
    return rows


def render(results: FloodResults, facts: dict[str, str], args: argparse.Namespace, started: datetime,
           command: str) -> str:
    lines = ["## The endpoint under a connection flood, beside node_exporter", ""]
    if args.quick:
        lines += ["> **QUICK MODE: smoke run only.** These figures only show that the benchmark runs; do not "
                  "quote them.", ""]
    closed = "; ".join(f"{scheme}: " + (", ".join(f"{reason} {n:.0f}" for reason, n in sorted(counts.items()))
                                         or "none") for scheme, counts in results.closed.items())
    cpu = results.cpu
    lines += [
        f"Figure 1: `/metrics` latency in ms over {args.scrapes} sequential scrapes from 127.0.0.1, each on a new "
        "connection (over TLS a full handshake each) with Prometheus's Accept header and gzip, while a flood "
        f"holds {FLOOD_CONNECTIONS} idle connections (over TLS half of them with the handshake done) or "
        f"{FLOOD_CONNECTIONS} trickling ones (a request head that never ends, one byte a second) and opens again, "
        "up to 200 a second, what the server closes (tests/slowloris.py). The flood comes from the scraper's own "
        "address, where tpuwatch keeps 128 of its connections and evicts the longest-waiting for each new one, or "
        "from 8 other loopback addresses, under both of tpuwatch's caps, so that it holds all 500 until their "
        f"5 s header deadline; node_exporter holds them all either way. tpuwatch runs {LATENCY_CHIPS} "
        f"simulated chips at interval {INTERVAL_S:g} s; node_exporter (the anchor) its default collectors; each "
        f"is measured alone under the same flood, {args.warmup:g} s after it began, in the same run. "
        f"Target: tpuwatch p99 <= {TARGET_P99_S * 1000:.0f} ms under the flood, no scrape failed.",
        "",
        "| Scheme | Flood | tpuwatch p50 | tpuwatch p99 | node_exporter p50 | node_exporter p99 | p50 ratio "
        "| p99 ratio | Failed (tw / ne) | Target met |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
        *latency_rows(results),
        "",
        f"What tpuwatch's endpoint closed over the run (`tpuwatch_http_connections_closed_total`): {closed}.",
        "",
        f"Figure 2: CPU per `/metrics` scrape (ms), {args.cpu_scrapes} sequential keep-alive scrapes with "
        "Prometheus's Accept header, less the idle CPU over as long (benchmarks/daemon.py's figure 2; idle window "
        f"{cpu.idle_window_s:g} s), tpuwatch with the pre-rendered exposition; and the CPU of one render, which "
        f"happens once per sampling cycle ({args.renders} renders in this process, `time.process_time()`).",
        "",
        "| Simulated chips | Series in the exposition | tpuwatch per scrape | node_exporter per scrape | Ratio "
        "| tpuwatch per render (per cycle) |",
        "|---:|---:|---:|---:|---:|---:|",
        *cpu_rows(results),
        "",
        *machine_and_command(facts, started, command),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scrapes", type=int, help="scrapes per server and flood in figure 1 (default 400, quick 40)")
    parser.add_argument("--cpu-scrapes", type=int, help="scrapes per server in figure 2 (default 1000, quick 20)")
    parser.add_argument("--renders", type=int, help="renders per chip count in figure 2 (default 200, quick 20)")
    parser.add_argument("--quick", action="store_true", help="smoke run; figures not to quote")
    parser.add_argument("--output", type=Path, default=BENCHMARKS_MD, metavar="PATH",
                        help="markdown file whose flood section is written (default BENCHMARKS.md)")
    args = parser.parse_args(argv)
    args.scrapes = args.scrapes or (40 if args.quick else 400)
    args.cpu_scrapes = args.cpu_scrapes or (20 if args.quick else 1000)
    args.renders = args.renders or (20 if args.quick else 200)
    args.warmup = 2.0 if args.quick else WARMUP_S
    signal.signal(signal.SIGTERM, interrupt)
    started = datetime.now(timezone.utc)
    command = shlex.join(["python", *sys.argv])
    results = FloodResults()
    try:
        node_exporter = node_exporter_binary()
        facts = machine_facts(node_exporter)
        with tempfile.TemporaryDirectory(prefix="tpuwatch-flood-") as tmp:
            latency_figures(node_exporter, Path(tmp), args.scrapes, args.warmup, results)
            cpu_figures(node_exporter, Path(tmp), args.cpu_scrapes, args.renders, results)
    except KeyboardInterrupt:
        progress("interrupted: servers stopped, no report written")
        return 130
    except (BenchmarkError, requests.RequestException, OSError, ssl.SSLError) as exc:
        progress(f"benchmark failed: {exc}")
        return 1
    write_section("flood", render(results, facts, args, started, command), args.output)
    progress(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
