#!/usr/bin/env python3
"""The scoreboard: how many injected faults of the field's classes each checker catches, on which chip, how soon.

Usage::

    python benchmarks/sdc.py [--seed N] [--trials N] [--clean N] [--output BENCHMARKS.md] [--quick]

On four host CPU devices (``--xla_force_host_platform_device_count=4``), in one
process, with the canary's own code (``tpuwatch.canary.checks.suite.Suite``,
its confirmation re-runs and ``tpuwatch.canary.judge``), three checkers meet
the same randomized faults, each on one chip drawn at random:

- **suite**: the canary's suite, a new schedule entry each run, judged against
  the float64 reference, the other chips and the chip's own past;
- **fixed-input canary** (the anchor: what the canary ran before the suite): the
  reference model alone, one fixed input, reference + peers + history;
- **self-compare**: each chip's GEMM on one fixed input against the chip's own
  first run, as DCGM's diagnostic does (a chip wrong from the start is never
  caught).

Classes (``--trials`` injections each, parameters drawn from ``--seed``; the
mix of bit positions follows the field: single-bit flips of high bits are a
minority, most perturbations small, NaN about 1 % of all trials):

- persistent matmul corruption for operands with a common bit pattern, judged
  within one run; data-dependent (a rare pattern) within 24 runs; intermittent
  (p 5-30 %) within 24 runs (a day at the default hourly cadence);
- a transcendental wrong by a small relative amount in part of its range;
- a bit flipped in memory at rest; a corrupted contribution to the collectives;
- a chip slowed 3-8x; NaN.

A trial is caught when a run flags the right chip (fail, suspect or slow) and
counted wrong-chip when a run flags another one.  ``--clean`` fault-free runs
across the schedule give the false alarms (any chip flagged; counted by verdict and check, each printed to
stderr with its reason as it happens); they run first.  Chip time is the
device time the suite spends per chip and run.  Rewrites the ``sdc`` section of
BENCHMARKS.md.  Hardware (TPU, GPU) is not measured here: the table says so.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tpuwatch.canary.checks import faults  # noqa: E402
from tpuwatch.canary.checks.suite import Settings, Suite  # noqa: E402
from tpuwatch.canary.judge import DeviceOutcome, History, judge  # noqa: E402
from tpuwatch.canary.runner import SCHEDULE  # noqa: E402
from tpuwatch.canary.spec import TIMED_CHECKS as TIMED  # noqa: E402

from common import BENCHMARKS_MD, cpu_model, machine_and_command, write_section  # noqa: E402

CHIPS = [(str(i), d) for i, d in enumerate(jax.local_devices())]
START = {"event": "start", "platform": "cpu", "chip": "cpu", "devices": [c for c, _ in CHIPS], "stack": "scoreboard",
         "dtype": "float32"}
FLAGGED = ("fail", "suspect", "slow")
SETTINGS = Settings(memory_bytes=1 << 20)


@dataclass(frozen=True)
class Kind:
    """A class of fault: how its parameters are drawn, and how many runs a trial may take."""

    name: str
    draw: Callable[[np.random.Generator], str]
    runs: int = 1


def _flip_bit(rng: np.random.Generator) -> int:
    """A bit position of a float32 operand, as the field's outcomes go: mostly low mantissa (small perturbations),
    some high mantissa, few exponent bits."""
    band = rng.choice(3, p=[0.6, 0.3, 0.1])
    return int(rng.integers(0, 11) if band == 0 else rng.integers(11, 23) if band == 1 else rng.integers(23, 30))


def _matmul(rng: np.random.Generator, bits: tuple[int, int], p: float = 1.0) -> str:
    width = int(rng.integers(*bits))
    return (f"matmul:bits={width},pattern={int(rng.integers(0, 1 << width))},flip={_flip_bit(rng)},p={p:.3g},"
            f"seed={int(rng.integers(1 << 30))}")


def _transcendental(rng: np.random.Generator, p: float = 1.0) -> str:
    fn = str(rng.choice(faults.FUNCTIONS))
    lo, hi, logarithmic = {"exp": (-80, 80, False), "tanh": (-12, 12, False), "log": (-69, 69, True),
                           "rsqrt": (-69, 69, True), "erf": (-6, 6, False)}[fn]
    width = (hi - lo) * rng.uniform(0.05, 0.2)
    start = rng.uniform(lo, hi - width)
    a, b = (np.exp(start), np.exp(start + width)) if logarithmic else (start, start + width)
    rel = 10 ** rng.uniform(-6, -2)
    return f"transcendental:fn={fn},lo={a:.6g},hi={b:.6g},rel={rel:.3g},p={p:.3g},seed={int(rng.integers(1 << 30))}"


KINDS = [
    Kind("matmul, persistent", lambda rng: _matmul(rng, (3, 9))),
    Kind("matmul, data-dependent (rare pattern)", lambda rng: _matmul(rng, (13, 18)), runs=24),
    Kind("transcendental, part of its range", _transcendental),
    Kind("memory at rest, one bit", lambda rng: f"memory:index={rng.uniform(0, 1):.6f},flip={int(rng.integers(32))}"),
    Kind("collective, one chip's contribution",
         lambda rng: f"collective:index={int(rng.integers(4096))},add={float(2.0 ** int(rng.integers(0, 12)))}"),
    Kind("intermittent matmul, p 5-30 %", lambda rng: _matmul(rng, (3, 9), p=rng.uniform(0.05, 0.3)), runs=24),
    Kind("intermittent transcendental, p 5-30 %", lambda rng: _transcendental(rng, p=rng.uniform(0.05, 0.3)),
         runs=24),
    Kind("slow chip, 3-8x (DCGM's users saw a third of the throughput pass)",
         lambda rng: f"slow:factor={int(rng.integers(3, 9))}"),
    Kind("NaN", lambda rng: "nan"),
]


@dataclass
class Score:
    """One checker's record on one class."""

    trials: int = 0
    caught: int = 0
    wrong_chip: int = 0
    runs: list[int] = field(default_factory=list)

    def row(self) -> tuple[str, str, str, str]:
        rate = lambda n: f"{100 * n / self.trials:.1f} %" if self.trials else "-"  # noqa: E731
        right = f"{100 * (self.caught - self.wrong_chip) / self.caught:.1f} %" if self.caught else "-"
        median = f"{statistics.median(self.runs):g}" if self.runs else "-"
        return rate(self.caught), median, right, f"{self.trials}"


def verdict(lines: list[dict[str, Any]], history: History) -> tuple[dict[str, DeviceOutcome], History]:
    result, updated = judge(lines, None, history)
    return {o.device: o for o in result.devices}, updated


def suite_run(suite: Suite, entry: int, history: History
              ) -> tuple[dict[str, DeviceOutcome], History, list[dict[str, Any]], list[dict[str, Any]]]:
    """One run of ``suite`` at ``entry``, judged: (chip -> verdict, the history to keep, the results, the confirm
    lines)."""
    results = suite.run(CHIPS, entry)
    confirms = suite.confirm(CHIPS, results, {})
    lines = [{**START, "scale": 3.6073094633660014}, *({"event": "result", **r} for r in results),
             *({"event": "confirm", **c} for c in confirms)]
    outcomes, history = verdict(lines, history)
    return outcomes, history, results, confirms


def _ms(seconds: Sequence[float] | float | None) -> str:
    if seconds is None:
        return "-"
    if isinstance(seconds, (int, float)):
        return f"{seconds * 1000:.2f}"
    return "/".join(f"{t * 1000:.2f}" for t in seconds)


def speed_rounds(chip: str, results: list[dict[str, Any]], confirms: list[dict[str, Any]]) -> list[str]:
    """The speed check's rounds for ``chip`` as lines of text (ms): its timing, its peers' timings in the same
    round, its fastest so far against its peers' median fastest, the host reference beside its runs, the round's
    verdict; a chip never timed again: every chip's first timing."""
    line = next((c for c in confirms if c["check"] == "speed" and c["device"] == chip), None)
    if line is None or not line.get("rounds"):
        first = {r["device"]: r for r in results if r["check"] in TIMED}
        return ["never timed again; first timings: " + ", ".join(
            f"chip {d} {_ms(r['duration_seconds'])} (runs {_ms(r.get('runs_seconds'))}, host "
            f"{_ms(r.get('host_seconds'))})" for d, r in first.items())]
    return [f"round {i}: chip {_ms(r['took'])}, peers beside {_ms(r['beside'])}; fastest {_ms(r['best'])} vs peers' "
            f"{_ms(r['peers_best'])} ({r['best'] / r['peers_best']:.2f}x); host {_ms(r['host'])}; "
            f"{'slow' if r['slow'] else 'clear'}{', conclusive' if r['slow'] and r['conclusive'] else ''}"
            f"{', not slow beside its peers' if r['slow'] and not r['conclusive'] else ''}"
            for i, r in enumerate(line["rounds"])]


def by_status(outcomes: dict[str, DeviceOutcome]) -> dict[str, str]:
    """chip -> its verdict's status."""
    return {device: o.status for device, o in outcomes.items()}


def trial(kind: Kind, text: str, chip: str, baseline: History, first_entry: int,
          missed: list[str] | None = None) -> dict[str, tuple[bool, int, bool]]:
    """checker -> (caught, runs until caught, wrong chip flagged) for one injected fault; a slow fault the suite
    missed adds its last run's speed rounds to ``missed``."""
    fault = faults.parse(text)
    out = {}
    suite = Suite(jax, "cpu", SETTINGS, fault, chip)
    history = dict(baseline)
    last: dict[str, Any] = {}

    def run_suite(k: int) -> dict[str, str]:
        outcomes, _, results, confirms = suite_run(suite, (first_entry + k) % SCHEDULE, history)
        last.update(outcomes=outcomes, results=results, confirms=confirms)
        return by_status(outcomes)

    out["suite"] = _until(kind.runs, chip, run_suite)
    if fault.kind == "slow" and not out["suite"][0] and missed is not None:
        o = last["outcomes"][chip]
        block = [f"{text} on chip {chip} missed: {o.status} ({o.check or '-'}): {o.reason or 'no reason'}",
                 *(f"    {t}" for t in speed_rounds(chip, last["results"], last["confirms"]))]
        missed.extend(block)
        print("\n".join(block), file=sys.stderr, flush=True)
    fixed = Suite(jax, "cpu", Settings(("model",)), fault, chip)
    out["fixed-input canary"] = _until(kind.runs, chip, lambda k: by_status(suite_run(fixed, 0, dict(baseline))[0]))
    selfish = Suite(jax, "cpu", Settings(("gemm",)), fault, chip)
    first = {r["device"]: r["fingerprint"] for r in selfish.run(CHIPS, 0)}

    def self_compare(k: int) -> dict[str, str]:
        now = {r["device"]: r["fingerprint"] for r in selfish.run(CHIPS, 0)}
        return {d: "fail" if now[d] != first[d] else "pass" for d in now}

    out["self-compare"] = _until(kind.runs, chip, self_compare)
    return out


def _until(runs: int, chip: str, run: Callable[[int], dict[str, str]]) -> tuple[bool, int, bool]:
    wrong = False
    for k in range(runs):
        statuses = run(k)
        wrong = wrong or any(s in FLAGGED for d, s in statuses.items() if d != chip)
        if statuses.get(chip) in FLAGGED:
            return True, k + 1, wrong
    return False, runs, wrong


def clean_runs(count: int, alarmed: list[str] | None = None) -> tuple[int, Counter[str], list[float], list[float]]:
    """(runs with a chip flagged, flagged chips by verdict and check, chip time per chip and run, wall time per
    run) over ``count`` clean runs.  A chip whose speed was inconclusive (a pass, check ``speed``: the host too
    busy to tell) is not flagged; it is counted apart as ``inconclusive (speed)`` and printed like an alarm.  Each
    chip flagged slow adds its speed rounds to ``alarmed``."""
    suite = Suite(jax, "cpu", SETTINGS)
    history: History = {}
    alarms, kinds, chip_time, wall = 0, Counter[str](), [], []
    for k in range(count):
        started = time.perf_counter()
        outcomes, history, results, confirms = suite_run(suite, k % SCHEDULE, history)
        wall.append(time.perf_counter() - started)
        flagged = [o for o in outcomes.values() if o.status != "pass"]
        alarms += bool(flagged)
        for o in flagged + [o for o in outcomes.values() if o.status == "pass" and o.check == "speed"]:
            kinds[f"{o.status} ({o.check or '-'})" if o.status != "pass" else "inconclusive (speed)"] += 1
            print(f"clean run {k + 1}: chip {o.device} {o.status} ({o.check}): {o.reason}", file=sys.stderr, flush=True)
            if o.status == "slow" and alarmed is not None:
                alarmed.append(f"clean run {k + 1}: chip {o.device} {o.status}: {o.reason}")
                alarmed.extend(f"    {t}" for t in speed_rounds(o.device, results, confirms))
                print("\n".join(speed_rounds(o.device, results, confirms)), file=sys.stderr, flush=True)
        if (k + 1) % 1000 == 0:
            print(f"clean runs: {k + 1}, false alarms so far {alarms}", file=sys.stderr, flush=True)
        for name, _ in CHIPS:
            chip_time.append(sum(r["duration_seconds"] for r in results if r["device"] == name))
    return alarms, kinds, chip_time, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=20261206)
    parser.add_argument("--trials", type=int, default=200, help="injections per class")
    parser.add_argument("--clean", type=int, default=10_000, help="fault-free runs for false alarms")
    parser.add_argument("--output", type=Path, default=BENCHMARKS_MD)
    parser.add_argument("--quick", action="store_true", help="a smoke run (5 trials, 50 clean runs), not written")
    parser.add_argument("--classes", default="", help="only the classes whose name contains one of these "
                        "comma-separated words (e.g. 'slow,NaN'; all by default)")
    args = parser.parse_args()
    words = [w.strip().lower() for w in args.classes.split(",") if w.strip()]
    chosen = [kind for kind in KINDS if not words or any(w in kind.name.lower() for w in words)]
    if args.quick:
        args.trials, args.clean = 5, 50
    started = datetime.now(UTC)
    began = time.monotonic()
    baseline: History = {}
    for k in range(SCHEDULE):  # a day of clean runs: every chip's past on every entry, as a running host has
        _, baseline, _, _ = suite_run(Suite(jax, "cpu", SETTINGS), k, baseline)
    alarmed: list[str] = []
    missed: list[str] = []
    alarms, kinds, chip_time, wall = clean_runs(args.clean, alarmed)
    rng = np.random.default_rng(args.seed)
    checkers = ("suite", "fixed-input canary", "self-compare")
    scores = {(kind.name, c): Score() for kind in chosen for c in checkers}
    for kind in chosen:
        for _ in range(args.trials):
            text, chip = kind.draw(rng), str(int(rng.integers(len(CHIPS))))
            first = int(rng.integers(SCHEDULE))
            for checker, (caught, runs, wrong) in trial(kind, text, chip, baseline, first, missed).items():
                score = scores[(kind.name, checker)]
                score.trials += 1
                if caught:
                    score.caught += 1
                    score.runs.append(runs)
                    score.wrong_chip += wrong
        print(f"{kind.name}: " + ", ".join(f"{c} {scores[(kind.name, c)].row()[0]}" for c in checkers),
              file=sys.stderr, flush=True)
    lines = ["## Silent data corruption: the scoreboard (`benchmarks/sdc.py`)", "",
             f"{args.trials} randomized injections per class (seed {args.seed}), each on one of 4 host CPU devices "
             "drawn at random, met by three checkers in the same run. Recall is the share caught within the class's "
             "runs (1 for persistent faults; 24, a day at the hourly default, for data-dependent and intermittent "
             "ones); runs is the median number of runs until caught; right chip is the share of catches that flagged "
             "no other chip. TPU and GPU hardware: not measured (no accelerator here).", "",
             "| Class | Runs allowed | Checker | Recall | Runs until caught | Right chip | Trials |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for kind in chosen:
        for checker in checkers:
            recall, median, right, count = scores[(kind.name, checker)].row()
            lines.append(f"| {kind.name} | {kind.runs} | {checker} | {recall} | {median} | {right} | {count} |")
    per_chip = sorted(chip_time) or [float("nan")]
    lines += ["", f"False alarms: **{alarms}** of {args.clean} clean runs of the suite across the {SCHEDULE}-entry "
                  f"schedule (4 chips each; any chip flagged counts). Chip time per chip and run: median "
                  f"{statistics.median(per_chip) * 1000:.1f} ms, p99 {per_chip[int(0.99 * (len(per_chip) - 1))] * 1000:.1f}"
                  f" ms, max {per_chip[-1] * 1000:.1f} ms (target <= 2 s); wall time of a 4-chip run, confirmation "
                  f"and judging included: median {statistics.median(wall or [float('nan')]) * 1000:.0f} ms. Flagged chips by verdict "
                  f"(check), and chips whose speed was inconclusive (passed, not flagged): "
                  f"{', '.join(f'{k} {n}' for k, n in kinds.most_common()) or 'none'}.",
              "", "Speed rounds (ms) of each clean chip flagged slow and each slow chip the suite missed: the chip's "
              "timing (fastest of 3 runs), its peers' timings in the same round, its fastest so far against its "
              "peers' median fastest, the host reference beside its runs, and the round's verdict:", "",
              "```", *(alarmed or ["no clean chip flagged slow"]), *(missed or ["no slow chip missed"]), "```",
              "", f"Whole run: {(time.monotonic() - began) / 60:.1f} min.", ""]
    lines += machine_and_command({"CPU": f"{cpu_model()} ({os.cpu_count()} logical CPUs)",
                                  "Python": platform.python_version(), "jax": jax.__version__}, started,
                                 "python benchmarks/sdc.py " + " ".join(sys.argv[1:]))
    text = "\n".join(lines)
    print(text)
    if not args.quick:
        write_section("sdc", text, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
