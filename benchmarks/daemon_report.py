"""What benchmarks/daemon.py measures (the daemon's settings, the plan, the results) and its section of
BENCHMARKS.md: the figures against their targets, the notes, the RSS samples, the machine."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from servers import CLK_TCK, Fit, least_squares, ratio

from tpuwatch.config import Config

SIM_CHIPS = 8
INTERVAL_S = 10.0
SCRAPE_INTERVAL_S = 15.0
WARMUP_CYCLES = 20
MIB = 1024.0
TARGETS = {"scrape_ratio": 1.0, "cycle_ms": 5.0}  # RSS: footprint.py and soak.py judge it in MiB


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


@dataclass(frozen=True)
class ScrapeCost:
    """Figure 2 for one server."""

    per_scrape_ms: float
    burst_cpu_s: float
    burst_wall_s: float
    idle_cpu_ms_per_s: float


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
