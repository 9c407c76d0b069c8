"""The probe benchmark's report: the Markdown section for BENCHMARKS.md from one run's results."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import tpuwatch

from common import cpu_model, machine_and_command
from probe_base import (
    BATCH,
    CALL_KINDS,
    CALL_NAMES,
    D_MODEL,
    DAEMON_LIBRARIES,
    DEVICES,
    FLOOD_SHARES,
    HEADS,
    INTERVAL_S,
    LAYERS,
    OVERSIZED_BYTES,
    REFUSALS,
    REPORTS_PER_MINUTE,
    ROTATE,
    SEQ,
    TARGET_ADDED_PCT,
    TARGET_DEVICE_MIB,
    VOCAB,
    jax,
    ms,
    np,
    pct,
)
from probe_daemon import ReportCost, Window
from probe_flood import Flood
from probe_job import Arm, DeviceMemory, ImportCost, Job

# --- the report -----------------------------------------------------------------------------------------


@dataclass
class Results:
    """Everything one run measured."""

    job: Job
    arms: list[Arm]
    warm_step_s: float
    imports: ImportCost
    fresh: dict[str, Any]
    check_first_s: float
    check_again_s: float
    memory: DeviceMemory
    reports: ReportCost
    flood: Flood
    daemon_accepted_job_reports: int
    complaints: list[str]


def mean_step(blocks: list[list[float]]) -> float:
    """Mean step seconds over ``blocks``."""
    return sum(map(sum, blocks)) / sum(map(len, blocks))


def added_pct(arm: Arm, off: Arm) -> tuple[float, list[float]]:
    """Added job time in %: mean step with / without - 1, overall and per round (same round's off block)."""
    overall = 100 * (mean_step(arm.blocks) / mean_step(off.blocks) - 1)
    per_round = [100 * (statistics.fmean(b) / statistics.fmean(o) - 1) for b, o in zip(arm.blocks, off.blocks)]
    return overall, per_round


def spread(values: list[float]) -> str:
    """'min to max' of ``values`` in %."""
    return f"{min(values):+.2f} to {max(values):+.2f} %"


def verdict(ok: bool) -> str:
    """Met or not."""
    return "met" if ok else "**not met**"


@dataclass
class Estimate:
    """The default cadence's added job time, scaled from the stressed blocks."""

    mean_pct: float  # stressed, mean over rounds
    se_pct: float
    job_s_per_run: float  # stressed job seconds per run
    per_run_s: float
    host_per_run_s: float
    every: float

    @property
    def pct(self) -> float:
        """Added job time at the default cadence, %."""
        return self.mean_pct * self.job_s_per_run / self.every

    @property
    def upper_pct(self) -> float:
        """The same from the mean + 2 SE."""
        return (self.mean_pct + 2 * self.se_pct) * self.job_s_per_run / self.every

    @property
    def floor_pct(self) -> float:
        """What the time inside ``step()`` alone adds, %: a floor."""
        return 100 * self.host_per_run_s / self.every

    def verdict(self) -> str:
        """Met when even the upper bound is; unresolved when only the estimate is."""
        if self.upper_pct <= TARGET_ADDED_PCT:
            return "met (upper bound)"
        if self.pct <= TARGET_ADDED_PCT:
            return f"**not resolved** (estimate within it, upper bound {self.upper_pct:+.3f} % not)"
        return "**not met**"


@dataclass
class Fit:
    """Every block's mean step by least squares: base + slope x other processes' cores + the arm's effect."""

    base: float  # seconds, without the probe and with nothing else running
    slope: float | None  # seconds per core of other processes' load (None: too little load to fit)
    effect: dict[str, float]  # arm -> added seconds per step
    se: dict[str, float]  # arm -> its standard error
    blocks: int

    def pct(self, arm: str) -> tuple[float, float]:
        """The arm's added job time and its standard error, in %."""
        return 100 * self.effect[arm] / self.base, 100 * self.se[arm] / self.base


def fit_blocks(arms: list[Arm]) -> Fit:
    """Fit the blocks' mean step times (``Fit``); the load term only when the load varied between blocks."""
    loads = [load for arm in arms for load in arm.others]
    with_load = max(loads) - min(loads) > 0.05
    probed = [arm.name for arm in arms if arm.probe is not None]
    rows, means = [], []
    for arm in arms:
        for block, load in zip(arm.blocks, arm.others):
            rows.append([1.0, *([load] if with_load else []), *(float(arm.name == name) for name in probed)])
            means.append(statistics.fmean(block))
    x, y = np.array(rows), np.array(means)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    dof = max(len(y) - x.shape[1], 1)
    residual = y - x @ coef
    cov = float(residual @ residual) / dof * np.linalg.pinv(x.T @ x)
    first = 2 if with_load else 1
    return Fit(float(coef[0]), float(coef[1]) if with_load else None,
               {name: float(coef[first + i]) for i, name in enumerate(probed)},
               {name: float(np.sqrt(cov[first + i, first + i])) for i, name in enumerate(probed)}, len(y))


def estimate(r: Results, runs: int, fit: Fit) -> Estimate:
    """Scale the stressed blocks' added time (``fit``: other processes' load taken out) to the default cadence by
    job seconds per run."""
    _, default, stressed = r.arms
    assert default.every is not None
    runs = max(runs, 1)
    job_s = sum(map(sum, stressed.blocks))
    mean_pct, se_pct = fit.pct("stressed")
    per_run = fit.effect["stressed"] * sum(map(len, stressed.blocks)) / runs
    return Estimate(mean_pct, se_pct, job_s / runs, per_run, sum(stressed.calls.all()) / runs, default.every)


def job_section(r: Results, args: argparse.Namespace) -> list[str]:
    """Figure 1's table and what follows from it."""
    off, default, stressed = r.arms
    assert default.probe is not None and stressed.probe is not None
    steps = {a.name: [s for b in a.blocks for s in b] for a in r.arms}
    block_p99 = {a.name: [pct(b, 99) for b in a.blocks] for a in r.arms}
    added = {a.name: added_pct(a, off) for a in r.arms[1:]}
    runs = {a.name: a.probe.runs - a.runs_at_start for a in r.arms if a.probe is not None}
    calls = {a.name: a.calls for a in r.arms[1:]}
    off_noise = max(block_p99["off"]) - min(block_p99["off"])
    p99_delta = pct(steps["default"], 99) - pct(steps["off"], 99)
    fit = fit_blocks(r.arms)
    est = estimate(r, runs["stressed"], fit)
    busiest = max(o for a in r.arms for o in a.others)
    all_calls = calls["default"].all() + calls["stressed"].all()
    not_ready = {n: len(c.seconds["not_ready"]) for n, c in calls.items()}

    def col(name: str, fn: Callable[[Arm], str]) -> str:
        return fn(next(a for a in r.arms if a.name == name))

    def row(label: str, fn: Callable[[Arm], str], target: str = "") -> str:
        return f"| {label} | {col('off', fn)} | {col('default', fn)} | {col('stressed', fn)} | {target} |"

    lines = [
        "### 1. The job's overhead", "",
        f"{args.rounds} rounds; each round one block of each kind, the order rotated every round: {off.steps} steps "
        f"without the probe, {default.steps} at every {default.every:g} s (longer, so that it runs several times), "
        f"{stressed.steps} at every {stressed.every:g} s. "
        "Step time is from dispatching the train step to `float(loss)` returning, `probe.step()` between them.", "",
        f"| | no probe | `Probe(every={default.every:g})` | `Probe(every={stressed.every:g})` (stressed) | Target |",
        "|---|---:|---:|---:|---|",
        row("steps measured", lambda a: str(len(steps[a.name]))),
        row("median step (ms)", lambda a: ms(statistics.median(steps[a.name]))),
        row("p99 step (ms), all blocks", lambda a: ms(pct(steps[a.name], 99)),
            f"unchanged within noise: {verdict(abs(p99_delta) <= off_noise)}"),
        row("p99 step (ms) per block, min to max", lambda a: f"{ms(min(block_p99[a.name]))} to "
            f"{ms(max(block_p99[a.name]))}", f"noise: {ms(off_noise)} ms between blocks without the probe"),
        row("mean step (ms)", lambda a: ms(mean_step(a.blocks), 2)),
        row("added job time (mean with / without - 1)", lambda a: "" if a.probe is None else
            f"{added[a.name][0]:+.2f} %"),
        row("added job time per round (same round's block without)", lambda a: "" if a.probe is None else
            spread(added[a.name][1])),
        row(f"added job time, other processes' load taken out (least squares over the {fit.blocks} blocks' means)",
            lambda a: "" if a.probe is None else "{:+.2f} % ± {:.2f} (1 SE)".format(*fit.pct(a.name)),
            f"<= {TARGET_ADDED_PCT} % at the default cadence"),
        row("probe runs in the measured blocks (+ start phase)", lambda a: "" if a.probe is None else
            f"{runs[a.name]} (+{a.runs_at_start})"),
        row("`probe.step()` calls", lambda a: "" if a.probe is None else str(len(a.calls.all()))),
        row("time inside `probe.step()`: p99 / max (ms)", lambda a: "" if a.probe is None else
            f"{ms(pct(a.calls.all(), 99), 3)} / {ms(max(a.calls.all()), 2)}", "no step waits on the probe"),
        row("calls that found the outputs not ready and moved on", lambda a: "" if a.probe is None else
            str(not_ready[a.name])),
        row("reports sent / failed / dropped (channel)", lambda a: "" if a.probe is None else
            f"{a.probe.channel.sent} / {a.probe.channel.failed} / {a.probe.channel.dropped}"),
        row("other processes' CPU during the blocks (cores), mean / busiest block", lambda a:
            f"{statistics.fmean(a.others):.2f} / {max(a.others):.2f}", "0: nothing else running"),
        "",
        *([f"**Other processes used up to {busiest:.2f} of the {os.cpu_count()} CPUs during the blocks (this "
           "process and the daemon not counted): the step times carry their noise; the fit below takes out what "
           f"is linear in it ({ms(fit.slope or 0.0)} ms a step per core).**", ""] if busiest > 0.1 else []),
        f"- Added job time at the default cadence (every {default.every:g} s), measured directly: "
        f"{added['default'][0]:+.2f} % (per round {spread(added['default'][1])}); a run every {default.every:g} s "
        f"is far inside this noise. Scaled from the stressed blocks, whose runs cost the same each: "
        f"{est.mean_pct:+.2f} % ± {est.se_pct:.2f} (1 SE, the fit) with a run every {est.job_s_per_run:.2f} s of "
        "job time, "
        f"{ms(est.per_run_s, 2)} ms of job time per run (of which {ms(est.host_per_run_s, 2)} ms inside `step()`, "
        f"a floor; the rest is the probe's program and its report thread on the job's cores), so every "
        f"{default.every:g} s adds {est.pct:+.4f} % (upper bound, mean + 2 SE: {est.upper_pct:+.4f} %; floor from "
        f"`step()` alone {est.floor_pct:.4f} %). Target <= {TARGET_ADDED_PCT} %: {est.verdict()}"
        f"{' (other processes loaded the machine: rerun on an idle one to confirm)' if busiest > 0.1 else ''}.",
        f"- p99 step time with the probe at the default cadence {ms(pct(steps['default'], 99))} ms against "
        f"{ms(pct(steps['off'], 99))} ms without ({ms(p99_delta):s} ms; the p99 of blocks without the probe spans "
        f"{ms(off_noise)} ms): {verdict(abs(p99_delta) <= off_noise)}.",
        f"- Waiting on the probe: the longest of the {len(all_calls)} `probe.step()` calls in the measured blocks "
        f"took {ms(max(all_calls), 2)} ms ({100 * max(all_calls) / statistics.median(steps['off']):.1f} % of a "
        f"median step; p99 {ms(pct(all_calls, 99), 3)} ms); no call waits on the chip (a run is read back only once "
        f"every output `is_ready()`): {sum(not_ready.values())} calls found the outputs still running and moved "
        f"on. The daemon accepted {r.daemon_accepted_job_reports} of the "
        f"{default.probe.runs + stressed.probe.runs} reports the two probes made.", ""]
    return lines


def cost_section(r: Results, args: argparse.Namespace) -> list[str]:
    """Figure 2."""
    _, default, stressed = r.arms
    assert default.start is not None and stressed.start is not None
    imp, mem = r.imports, r.memory
    lines = ["### 2. The probe's own cost", "",
             "`probe.step()` calls, both probes together, the start phases included:", "",
             "| The call | Calls | Median (ms) | p99 (ms) | Max (ms) |", "|---|---:|---:|---:|---:|"]
    for kind in CALL_KINDS:
        values = [s for a in (default, stressed) for c in (a.start_calls, a.calls) for s in c.seconds[kind]]
        if values:
            lines.append(f"| {CALL_NAMES[kind]} | {len(values)} | {ms(statistics.median(values), 3)} | "
                         f"{ms(pct(values, 99), 3)} | {ms(max(values), 3)} |")
    resident = max(mem.resident.values())
    lines += [
        "", "| Measure | Value | Target / anchor |", "|---|---|---|",
        *[f"| compile in the job, first `step()` to `probe._compiled` (every {a.every:g} s) | "
          f"{a.start.compile_s:.2f} s; until the first run was judged {len(a.start.steps)} job steps, median "
          f"{ms(statistics.median(a.start.steps))} ms against {ms(r.warm_step_s)} ms before: "
          f"{sum(a.start.steps) - len(a.start.steps) * r.warm_step_s:+.2f} s of job time once | in a thread: steps "
          "go on |"
          for a in (default, stressed) if a.start is not None and a.start.compile_s is not None],
        *[f"| first run judged, from the first `step()` (every {a.every:g} s) | {a.start.first_result_s:.2f} s | |"
          for a in (default, stressed) if a.start is not None and a.start.first_result_s is not None],
        f"| `Probe()` + `check()` in a fresh process (jax imported, devices up) | {r.fresh['init']:.2f} s + "
        f"{r.fresh['check']:.2f} s (status {r.fresh['status']}); a second `check()` {ms(r.fresh['again'], 2)} ms; "
        f"RSS +{r.fresh['rss_kib'] / 1024:.1f} MiB | |",
        f"| `check()` on a fresh `Probe` in this process (jax warm) | {r.check_first_s:.2f} s; a second one "
        f"{ms(r.check_again_s, 2)} ms | |",
        f"| anchor: `import jax` in a fresh interpreter | {imp.jax_s:.2f} s, RSS +{imp.jax_kib / 1024:.1f} MiB | |",
        f"| `import tpuwatch.probe` in a fresh interpreter (lazy) | {ms(imp.module_s)} ms, RSS "
        f"+{imp.module_kib / 1024:.1f} MiB | |",
        f"| then `tpuwatch.probe.Probe` (loads jax with it) | {imp.probe_cold_s:.2f} s, RSS "
        f"+{imp.probe_cold_kib / 1024:.1f} MiB | {imp.probe_cold_s / imp.jax_s:.2f}x the anchor |",
        f"| `from tpuwatch.probe import Probe` after `import jax` (what a job pays) | "
        f"{ms(imp.probe_after_jax_s)} ms, RSS +{imp.probe_after_jax_kib / 1024:.1f} MiB | |",
        f"| daemon libraries it loads ({', '.join(DAEMON_LIBRARIES)}) | {', '.join(imp.loaded) or 'none'} | none |",
        f"| device memory kept resident per device (weights + input, nbytes) | {resident / 1024:.0f} KiB "
        f"({resident / 2 ** 20:.2f} MiB) | <= {TARGET_DEVICE_MIB:g} MiB: "
        f"{verdict(resident <= TARGET_DEVICE_MIB * 2 ** 20)} |",
        f"| per run besides (XLA memory analysis: temporaries, output; generated code) | "
        f"{_bytes(mem.temp)}, {_bytes(mem.output)}; {_bytes(mem.code)} | |",
        f"| `device.memory_stats()` | {mem.memory_stats} | |",
        "",
        f"Imports: medians of {args.import_runs} fresh interpreters each. `Probe` loads "
        f"{len(imp.tpuwatch_modules)} tpuwatch modules: {', '.join(imp.tpuwatch_modules)}.", ""]
    return lines


def _bytes(value: int | None) -> str:
    """Bytes as KiB, or 'n/a'."""
    return "n/a" if value is None else f"{value / 1024:.1f} KiB"


def daemon_section(r: Results, args: argparse.Namespace) -> list[str]:
    """Figure 3."""
    rc, fl = r.reports, r.flood
    by_kind = {s.kind: s for s in fl.senders}
    clients, server = fl.clients, fl.server
    reasons = ["accepted", *REFUSALS]
    extra = sorted(set(clients) - set(reasons))
    cycles_ok = fl.during.stretch() <= 2 * INTERVAL_S
    lines = [
        "### 3. The daemon's side", "",
        f"One `tpuwatch run` (4 simulated chips, interval {INTERVAL_S:g} s, canary off, `probe.reports_per_minute: "
        f"{REPORTS_PER_MINUTE}`); this process holds the chips' device files open.", "",
        "| Measure | Value |", "|---|---|",
        f"| daemon CPU per accepted report ({rc.count} valid reports one after another from the holder, idle CPU "
        f"subtracted) | {ms(rc.per_report, 3)} ms ({rc.cpu:.2f} s CPU in {rc.seconds:.2f} s; answers "
        f"{_tally(rc.answers)}) |",
        f"| daemon CPU idle, over {rc.idle_seconds:.1f} s | {ms(rc.idle_rate, 1)} ms/s |",
        f"| report round trip seen by the sender, median / p99 | {ms(statistics.median(rc.latencies), 2)} / "
        f"{ms(pct(rc.latencies, 99), 2)} ms |", ""]
    lines += [
        f"The flood: {fl.seconds:.1f} s; malformed, oversized ({OVERSIZED_BYTES // 1024} KB lines) and not-holder "
        f"senders start a new process every {ROTATE} reports (so each process stays inside its burst of "
        f"{REPORTS_PER_MINUTE}); the beyond-the-limit sender is one process of the holder's user sending valid "
        f"reports; {fl.slow} slow connections send nothing and reconnect when the daemon gives up on them. "
        + ("Every hostile sender but the beyond-the-limit one runs as another user (uid 65534)." if os.geteuid() == 0
           else "Not root: every sender runs as this user, the holder's."), "",
        "| Sender | Target rate (/s) | Reached (/s) | Processes | Answers it got |", "|---|---:|---:|---:|---|"]
    for kind in (*FLOOD_SHARES, "slow"):
        sender = by_kind.get(kind)
        if sender is None:
            lines.append(f"| {kind} | | | | left out (needs root) |")
            continue
        reached = fl.attempts(sender) / max(sender.result.get("seconds", fl.seconds), 1e-9)
        lines.append(f"| {kind} | {'' if sender.rate is None else f'{sender.rate:.0f}'} | {reached:.0f} | "
                     f"{sender.result.get('pids', 1)} | {_tally(Counter(sender.result.get('counts', {})))} |")
    lines += [f"| all | {args.flood_rate:g} | {fl.rate:.0f} | | |", "",
              "| Outcome | Daemon's counter (delta) | Senders' tally | Match |", "|---|---:|---:|---|"]
    for reason in reasons:
        lines.append(f"| {reason} | {server.get(reason, 0)} | {clients.get(reason, 0)} | "
                     f"{'yes' if server.get(reason, 0) == clients.get(reason, 0) else '**no**'} |")
    for reason in extra:
        lines.append(f"| senders only: {reason} | | {clients[reason]} | no answer read |")
    lines += [
        "", "| During the flood | Value | Before it |", "|---|---|---|",
        f"| `/metrics` scrape latency median / p99 / max (ms) | {_latency(fl.during)} | {_latency(fl.before)} |",
        f"| scrapes failed | {fl.during.failed} of {len(fl.during.latencies)} | {fl.before.failed} of "
        f"{len(fl.before.latencies)} |",
        f"| sampling cycles ended (distinct `tpuwatch_last_sample_timestamp_seconds`), against the window / "
        f"interval | {_cycles(fl.during)} | {_cycles(fl.before)} |",
        f"| slowest collectors (longest `tpuwatch_collector_duration_seconds` seen); "
        f"`tpuwatch_scheduler_events_total` | {_slowest(fl.during)} | {_slowest(fl.before)} |",
        f"| collectors not succeeding (`tpuwatch_collector_success` != 1) | "
        f"{', '.join(sorted(fl.during.collectors_failing)) or 'none'} | "
        f"{', '.join(sorted(fl.before.collectors_failing)) or 'none'} |",
        f"| daemon CPU | {fl.during.cpu / fl.during.seconds * 100:.0f} % of a core | "
        f"{fl.before.cpu / fl.before.seconds * 100:.1f} % |",
        f"| the holder's reports, one a second | {_tally(fl.holder)}; round trip median "
        f"{ms(statistics.median(fl.holder_latencies), 1) if fl.holder_latencies else 'n/a'} ms, max "
        f"{ms(max(fl.holder_latencies), 1) if fl.holder_latencies else 'n/a'} ms | |",
        f"| the holder's report right after the flood | {fl.after} in {ms(fl.after_latency, 1)} ms | |", "",
        f"- The sampling cycle kept running (no stretch over {2 * INTERVAL_S:g} s without a cycle ending, no "
        f"scrape failed): {verdict(cycles_ok and not fl.during.failed)}; the holder accepted "
        f"after the flood: {verdict(fl.after == 'accepted')}.",
        f"- The daemon's log over the whole run, WARNING and ERROR messages: "
        f"{'; '.join(f'`{c[:160]}`' for c in r.complaints[:6]) or 'none'}.", ""]
    return lines


def _cycles(window: Window) -> str:
    """'19 of 20.3; longest stretch without one 1.02 s, between two 1.01 s'."""
    span = window.unix[1] - window.unix[0]
    return (f"{len(window.cycles())} of {span / INTERVAL_S:.1f}; longest stretch without one {window.stretch():.2f} s "
            f"(edges included), between two {max(window.gaps(), default=float('nan')):.2f} s")


def _slowest(window: Window) -> str:
    """The two slowest collectors' longest run seen, and the scheduler's problems."""
    top = sorted(window.slowest.items(), key=lambda kv: -kv[1])[:2]
    events = window.scheduler_events()
    return (", ".join(f"{name} {ms(value)} ms" for name, value in top) or "n/a") + \
        f"; scheduler problems: {', '.join(f'{k} {v}' for k, v in events.items()) or 'none'}"


def _tally(counts: Counter[str]) -> str:
    """'accepted 3, busy 1' or 'none'."""
    return ", ".join(f"{k} {v}" for k, v in counts.most_common() if v) or "none"


def _latency(window: Window) -> str:
    """median / p99 / max of a window's scrapes, in ms."""
    if not window.latencies:
        return "n/a"
    values = window.latencies
    return f"{ms(statistics.median(values), 1)} / {ms(pct(values, 99), 1)} / {ms(max(values), 1)}"


def render(r: Results, args: argparse.Namespace, started: datetime, command: str) -> str:
    """The ``probe`` section of BENCHMARKS.md."""
    quick = ["**Quick run (`--quick`): a smoke test, do not quote these figures.**", ""] if args.quick else []
    facts = {"nproc": str(len(os.sched_getaffinity(0))), "CPU": cpu_model(), "Kernel": platform.release(),
             "Python": platform.python_version(), "jax": f"{jax.__version__}, {DEVICES} XLA CPU devices",
             "tpuwatch": tpuwatch.__version__}
    intro = [
        "## In-job probe", "", *quick,
        "What `tpuwatch.probe` costs a JAX training job, what it costs itself, and the daemon's side under a "
        "flood of hostile reports (`benchmarks/probe.py`).", "",
        f"A JAX training job in this process: a decoder-only transformer LM ({LAYERS} layers, d_model {D_MODEL}, "
        f"{HEADS} heads, sequence {SEQ}, vocabulary {VOCAB}, {r.job.parameters:,} parameters), batch {BATCH} per "
        f"device, data parallel over {DEVICES} host CPU devices (`jax.jit`, `NamedSharding` over a `Mesh`), Adam "
        "by hand, random tokens from seed 0. Each probe's cadence counts only its own blocks' time (a clock paused "
        "outside them), so it runs as often as in a job that always has it; its compile and first run are a start "
        "phase before the measured rounds. Reports go to the daemon of part 3.", ""]
    return "\n".join([*intro, *job_section(r, args), *cost_section(r, args), *daemon_section(r, args),
                      *machine_and_command(facts, started, command)])
