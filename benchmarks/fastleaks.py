"""Fast leaks and their look-alikes for ``benchmarks/trend.py``: lead time before the chip is full, false alarms.

Alone: ``python benchmarks/fastleaks.py [--seeds S,S,...] [--held-out S,S,...] [--traces N] [--jobs N]
[--output FILE]``.

Each trace is 3 h (plus up to 20 min) of normal use at 10 s on a 16, 32 or
95 GiB chip (a level of 15-40 %, noise of 0.05-0.4 %, in half of them an
allocator sawtooth of a 1-5 min period), then one event at ``event_at``:

* leaks that fill the chip in 20-120 min (``SPEEDS`` bins): ``linear``;
  ``under_sawtooth`` (an allocator sawtooth of a 1-6 min period and 3-15 %
  over the leak); ``staircase`` (a step every 0.5 min up to min(6 min, an
  eighth of the time to full)); ``uneven_staircase`` (the same, each step
  0.3-1.7 times the mean size and 0.7-1.3 intervals after the last: requests
  of many sizes).  The chip is full at the first sample at
  capacity (at the trace's end if none does, where the trace's highest
  sample stood far above the leak's start); the trace ends 5 min later;
* look-alikes, followed for 2 h: ``model_load`` (to 60-90 % within 10-60 s),
  ``second_model`` (a first model of 10-25 % loaded 30 min before, a second loaded in 2-5 steps
  within 0.5-4 min, to 60-90 %), ``warmup`` (a cache that warms up over 10-25
  min and levels off at 50-85 %: exponential, quadratic, cubic or square-root
  ease-out), ``warmup_sawtooth`` (the same under an allocator sawtooth) and
  ``warmup_steps`` (the same taken in steps of 0.5-3 min: a cache that grows
  in chunks) and ``warmup_s_curve`` (the same along a logistic S of
  steepness 6-12: slow, then fast, then slow).

1 % of samples are missed.  A leak is scored by its lead: the time from the
first page (``first_alert_at``, the daemon's and ``tpuwatch analyze``'s) to
full; a look-alike that pages is a false alarm.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial

import numpy as np

from tpuwatch.analysis.leak import LeakDetector, LeakParams

GIB = 1024.0**3
MINUTE = 60.0
STEP_S = 10.0
CAPACITIES_GIB = (16, 32, 95)
SPEEDS = ((20, 30), (30, 45), (45, 60), (60, 90), (90, 120))  # minutes to full
FAST_LEAKS = ("linear", "under_sawtooth", "staircase")
ADDED_LEAKS = ("uneven_staircase",)  # drawn after the look-alikes, so that the traces before them stay as they were
ADDED_LOOK_ALIKES = ("warmup_s_curve",)  # and these after them
LOOK_ALIKES = ("model_load", "second_model", "warmup", "warmup_sawtooth", "warmup_steps")
EASE_OUT = ("exponential", "quadratic", "cubic", "sqrt")
REQUIRED_LEAD_MIN = 10.0
YOUNG_BEFORE_MIN = (0.0, 5.0, 30.0)  # minutes of history a young series holds before the event
INTERVAL_EVERY = (1, 2, 3, 6)  # the sampling intervals scored, in readings of the traces' STEP_S


@dataclass
class FastTrace:
    """One labelled series; ``full_at`` is None for a look-alike, ``speed`` the bin of its time to full."""

    kind: str
    speed: tuple[int, int] | None
    times: np.ndarray
    used: np.ndarray
    capacity: float
    event_at: float
    full_at: float | None


def _sawtooth(rng: np.random.Generator, t: np.ndarray, capacity: float, longest_min: float) -> np.ndarray:
    period = rng.uniform(1, longest_min) * MINUTE
    return rng.uniform(0.03, 0.15) * capacity * (((t + rng.uniform(0, period)) % period) / period)


def _ease_out(rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
    """A decelerating climb from 0 to 1 over x in [0, 1] (clipped), of a shape drawn from ``EASE_OUT``."""
    x = np.clip(x, 0.0, 1.0)
    shape = EASE_OUT[int(rng.integers(len(EASE_OUT)))]
    if shape == "exponential":
        return (1 - np.exp(-4 * x)) / (1 - np.exp(-4))
    if shape == "quadratic":
        return 1 - (1 - x) ** 2
    if shape == "cubic":
        return 1 - (1 - x) ** 3
    return np.sqrt(x)


def _s_curve(rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
    """A climb from 0 to 1 over x in [0, 1] (clipped) along a logistic S of steepness 6-12: slow, fast, slow."""
    steepness = rng.uniform(6, 12)
    low, high = 1 / (1 + np.exp(steepness / 2)), 1 / (1 + np.exp(-steepness / 2))
    return np.clip((1 / (1 + np.exp(-steepness * (np.clip(x, 0.0, 1.0) - 0.5))) - low) / (high - low), 0.0, 1.0)


def generate(kind: str, capacity_gib: int, rng: np.random.Generator,
             speed: tuple[int, int] | None = None) -> FastTrace:
    """One trace of ``kind`` (a leak of ``speed``, minutes to full, or a look-alike)."""
    capacity = capacity_gib * GIB
    event_at = (180 + rng.uniform(0, 20)) * MINUTE
    after = (speed[1] + 10 if speed else 120) * MINUTE
    t = np.arange(0, event_at + after, STEP_S)
    since = np.clip(t - event_at, 0, None)
    base = rng.uniform(0.15, 0.4) * capacity
    used = base + rng.normal(0, rng.uniform(0.0005, 0.004) * capacity, t.size)
    if rng.integers(2):
        used += _sawtooth(rng, t, capacity, 5)
    full_at = None
    if kind in FAST_LEAKS + ADDED_LEAKS:
        assert speed is not None
        if kind == "under_sawtooth":
            used += _sawtooth(rng, t, capacity, 6)
        room = capacity - float(used.max())
        to_full = rng.uniform(*speed) * MINUTE
        if kind == "staircase":
            every = rng.uniform(0.5, min(6.0, to_full / MINUTE / 8)) * MINUTE
            since = np.floor(since / every) * every
        if kind == "uneven_staircase":  # chunks of 0.3-1.7 times the mean, each 0.7-1.3 intervals after the last
            every = rng.uniform(0.5, min(6.0, to_full / MINUTE / 8)) * MINUTE
            count = int(after / every) + 2
            stepped_at = np.cumsum(rng.uniform(0.7, 1.3, count) * every)
            sizes = np.concatenate([[0.0], np.cumsum(rng.uniform(0.3, 1.7, count) * every)])
            since = sizes[np.searchsorted(stepped_at, since, side="right")]
        used = np.minimum(used + room * since / to_full, capacity)
        full = np.flatnonzero(used >= capacity)
        full_at = float(t[full[0]] if full.size else t[-1])
        keep = t <= full_at + 5 * MINUTE
        t, used = t[keep], used[keep]
    elif kind == "model_load":
        level = rng.uniform(0.6, 0.9) * capacity
        used += (level - base) * np.clip(since / rng.uniform(10, 60), 0, 1)
    elif kind == "second_model":
        first = rng.uniform(0.1, 0.25) * capacity
        steps = int(rng.integers(2, 6))
        within = rng.uniform(0.5, 4) * MINUTE
        level = rng.uniform(max(0.6, (first + base) / capacity + 0.1), 0.9) * capacity
        used += np.where(t >= event_at - 30 * MINUTE, first, 0.0)
        used += (level - first - base) * np.minimum(np.floor(since / (within / steps)) + 1, steps) / steps \
            * (t >= event_at)
    elif kind in ("warmup", "warmup_sawtooth", "warmup_steps", "warmup_s_curve"):
        if kind == "warmup_sawtooth":
            used += _sawtooth(rng, t, capacity, 5)
        level = rng.uniform(0.5, 0.85) * capacity - float(used[t < event_at].max())
        within = rng.uniform(10, 25) * MINUTE
        if kind == "warmup_steps":  # the cache grows in chunks: its ease-out taken in steps of 0.5-3 min
            every = rng.uniform(0.5, 3) * MINUTE
            since = np.ceil(since / every) * every
        shape = _s_curve if kind == "warmup_s_curve" else _ease_out
        used += max(level, 0.05 * capacity) * shape(rng, since / within)
    used = np.clip(used, 0, capacity)
    keep = rng.random(t.size) > 0.01
    epoch = 1_700_000_000.0 + float(rng.integers(0, 10**6)) * STEP_S
    return FastTrace(kind, speed, t[keep] + epoch, used[keep], capacity, event_at + epoch,
                     None if full_at is None else full_at + epoch)


def traces(per_cell: int, seed: int) -> Iterator[FastTrace]:
    """``per_cell`` traces of every leak kind, speed and capacity, and of every look-alike and capacity."""
    rng = np.random.default_rng(seed)
    for kind in FAST_LEAKS:
        for speed in SPEEDS:
            for capacity in CAPACITIES_GIB:
                for _ in range(per_cell):
                    yield generate(kind, capacity, rng, speed)
    yield from _look_alikes(LOOK_ALIKES, per_cell, rng)
    for kind in ADDED_LEAKS:
        for speed in SPEEDS:
            for capacity in CAPACITIES_GIB:
                for _ in range(per_cell):
                    yield generate(kind, capacity, rng, speed)
    yield from _look_alikes(ADDED_LOOK_ALIKES, per_cell, rng)


def _look_alikes(kinds: Sequence[str], per_cell: int, rng: np.random.Generator) -> Iterator[FastTrace]:
    """As many traces of each look-alike kind and capacity as there are of each leak kind and capacity."""
    for kind in kinds:
        for capacity in CAPACITIES_GIB:
            for _ in range(per_cell * len(SPEEDS)):
                yield generate(kind, capacity, rng)


def first_alert(trace: FastTrace, params: LeakParams | None = None) -> float | None:
    """The detector's first page on ``trace``, replayed sample by sample (``params``: the detector's defaults)."""
    detector = LeakDetector(params)
    update = detector.update
    for t, v in zip(trace.times.tolist(), trace.used.tolist()):
        update(t, v, trace.capacity)
    return detector.first_alert_at


@dataclass
class FastScore:
    """Leads (minutes before full; negative: paged after full; None: never) per (kind, speed); alarms per kind."""

    leads: dict[tuple[str, tuple[int, int]], list[float | None]]
    alarms: dict[str, list[bool]]
    slow_alarms: dict[str, int] = dataclasses.field(default_factory=dict)

    def add(self, trace: FastTrace, alert: float | None) -> None:
        if trace.full_at is None:
            self.alarms.setdefault(trace.kind, []).append(alert is not None)
            if alert is not None and first_alert(trace, dataclasses.replace(LeakParams(), fast=None)) is not None:
                self.slow_alarms[trace.kind] = self.slow_alarms.get(trace.kind, 0) + 1  # pages without the fast check
            return
        assert trace.speed is not None
        early = alert is not None and alert >= trace.event_at
        lead = (trace.full_at - alert) / MINUTE if early and alert is not None else None
        self.leads.setdefault((trace.kind, trace.speed), []).append(lead)

    def missed(self) -> int:
        """Leaks not paged at least ``REQUIRED_LEAD_MIN`` before full."""
        return sum(lead is None or lead < REQUIRED_LEAD_MIN for leads in self.leads.values() for lead in leads)


def _seed_score(per_cell: int, seed: int) -> FastScore:
    score = FastScore({}, {})
    for trace in traces(per_cell, seed):
        score.add(trace, first_alert(trace))
    return score


def evaluate(per_cell: int, seeds: list[int], jobs: int = 1) -> FastScore:
    """Every trace of ``seeds`` replayed and scored (the seeds on ``jobs`` processes)."""
    score = FastScore({}, {})
    with ProcessPoolExecutor(max(1, jobs)) as pool:
        for part in pool.map(_seed_score, [per_cell] * len(seeds), seeds):
            for key, leads in part.leads.items():
                score.leads.setdefault(key, []).extend(leads)
            for kind, fired in part.alarms.items():
                score.alarms.setdefault(kind, []).extend(fired)
            for kind, n in part.slow_alarms.items():
                score.slow_alarms[kind] = score.slow_alarms.get(kind, 0) + n
    return score


def report(score: FastScore, seeds: list[int], per_cell: int) -> list[str]:
    """The markdown lines of the fast-leak part of the trend section."""
    lines = [
        "### Fast leaks (20-120 min to full) and look-alikes",
        "",
        f"`benchmarks/fastleaks.py`, seeds {', '.join(map(str, seeds))}, {per_cell} per kind, speed and capacity "
        f"({', '.join(map(str, CAPACITIES_GIB))} GiB): 3 h of normal use, then the leak or look-alike. Lead: "
        f"minutes from the first page to the first sample at capacity (target >= {REQUIRED_LEAD_MIN:.0f}).",
        "",
        "| Leak | Minutes to full | Traces | Paged >= 10 min before full | Lead min | Lead median |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for (kind, speed), leads in score.leads.items():
        found = [lead for lead in leads if lead is not None]
        good = sum(lead >= REQUIRED_LEAD_MIN for lead in found)
        low, mid = (f"{min(found):.1f}", f"{np.median(found):.1f}") if found else ("-", "-")
        lines.append(f"| {kind} | {speed[0]}-{speed[1]} | {len(leads)} | {good} | {low} | {mid} |")
    lines += ["", "| Look-alike | Traces | False alarms | Of them also without the fast check |", "|---|---:|---:|---:|"]
    lines += [f"| {kind} | {len(fired)} | {sum(fired)} | {score.slow_alarms.get(kind, 0)} |"
              for kind, fired in score.alarms.items()]
    total = sum(len(leads) for leads in score.leads.values())
    lines += ["", f"Fast leaks paged >= {REQUIRED_LEAD_MIN:.0f} min before full: **{total - score.missed()} of "
                  f"{total}**; look-alikes paged: **{sum(sum(f) for f in score.alarms.values())} of "
                  f"{sum(len(f) for f in score.alarms.values())}** ({sum(score.slow_alarms.values())} of them page without the "
                  "fast check too: the slow scales')."]
    return lines


def young(trace: FastTrace, before_min: float) -> FastTrace:
    """``trace`` as a young series holds it: its readings from ``before_min`` minutes before the event on (a job's
    chip whose readings start with the job, or a series the daemon forgot and sees again)."""
    keep = trace.times >= trace.event_at - before_min * MINUTE
    return dataclasses.replace(trace, times=trace.times[keep], used=trace.used[keep])


def thinned(trace: FastTrace, every: int) -> FastTrace:
    """``trace`` read every ``every`` x ``STEP_S`` seconds instead: every ``every``-th of its readings (the same
    chip, scraped or sampled less often)."""
    return dataclasses.replace(trace, times=trace.times[::every], used=trace.used[::every])


Variant = tuple[str, Callable[[FastTrace], FastTrace]]  # a row's label, and the trace as that row reads it


def _variant_seed(per_cell: int, seed: int, variants: Sequence[Variant],
                  params: LeakParams | None) -> dict[str, list[int]]:
    counts = {label: [0, 0, 0, 0] for label, _ in variants}  # leaks, paged in time, look-alikes, paged
    for trace in traces(per_cell, seed):
        for label, variant in variants:
            count = counts[label]
            alert = first_alert(variant(trace), params)
            if trace.full_at is None:
                count[2] += 1
                count[3] += alert is not None
            else:
                count[0] += 1
                count[1] += alert is not None and alert >= trace.event_at \
                    and trace.full_at - alert >= REQUIRED_LEAD_MIN * MINUTE
    return counts


def _variant_rows(per_cell: int, seeds: list[int], variants: Sequence[Variant], jobs: int,
                  params: LeakParams | None) -> list[str]:
    """Every trace of ``seeds`` read as each variant reads it: a table row per variant (leaks, paged in time,
    look-alikes, paged)."""
    total = {label: [0, 0, 0, 0] for label, _ in variants}
    with ProcessPoolExecutor(max(1, jobs)) as pool:
        for part in pool.map(_variant_seed, [per_cell] * len(seeds), seeds, [variants] * len(seeds),
                             [params] * len(seeds)):
            for label, count in part.items():
                total[label] = [a + b for a, b in zip(total[label], count)]
    return [f"| {label} | {leaks} | {good} | {looks} | {paged} |"
            for label, (leaks, good, looks, paged) in total.items()]


def young_report(per_cell: int, seeds: list[int], jobs: int = 1, params: LeakParams | None = None) -> list[str]:
    """The markdown lines of the young-series part: every trace of ``seeds`` cut to ``YOUNG_BEFORE_MIN``."""
    variants = [(f"{before:g} min", partial(young, before_min=before)) for before in YOUNG_BEFORE_MIN]
    return ["### Young series: the same kinds with little or no history before the event", "",
            f"Seeds {', '.join(map(str, seeds))}, {per_cell} per kind, speed and capacity, each trace cut to its "
            "last minutes before the event (a job's chip, whose readings start with the job).", "",
            "| History before the event | Leaks | Paged >= 10 min before full | Look-alikes | Paged |",
            "|---|---:|---:|---:|---:|", *_variant_rows(per_cell, seeds, variants, jobs, params)]


def interval_report(per_cell: int, seeds: list[int], jobs: int = 1, params: LeakParams | None = None) -> list[str]:
    """The markdown lines of the sampling-interval part: every trace of ``seeds`` read every ``INTERVAL_EVERY``
    x ``STEP_S`` seconds (the same traces, so the rows pair)."""
    variants = [(f"{every * STEP_S:g} s", partial(thinned, every=every)) for every in INTERVAL_EVERY]
    return ["### Sampling interval: the same traces read less often", "",
            f"Seeds {', '.join(map(str, seeds))}, {per_cell} per kind, speed and capacity, each trace read at its "
            f"{STEP_S:g} s and at every {_spoken([_ordinal(e) for e in INTERVAL_EVERY[1:]], 'and')} of its readings "
            f"(a daemon's `interval` or a Prometheus scrape of "
            f"{_spoken([f'{e * STEP_S:g}' for e in INTERVAL_EVERY[1:]], 'or')} s).", "",
            "| Interval | Leaks | Paged >= 10 min before full | Look-alikes | Paged |",
            "|---|---:|---:|---:|---:|", *_variant_rows(per_cell, seeds, variants, jobs, params)]


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _spoken(words: list[str], last: str) -> str:
    """``a, b and c``."""
    return f"{', '.join(words[:-1])} {last} {words[-1]}" if len(words) > 1 else "".join(words)


def main() -> int:
    """Score the fast leaks and look-alikes alone and print (or write) their markdown."""
    import argparse
    import sys
    from pathlib import Path

    def seeds(text: str) -> list[int]:
        first, _, last = text.partition("-")
        return list(range(int(first), int(last) + 1)) if last else [int(s) for s in text.split(",")]

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=seeds, default=[2, 3], help="seeds, A-B or S,S,... (default 2,3)")
    parser.add_argument("--held-out", type=seeds, default=[], help="more seeds, reported apart")
    parser.add_argument("--traces", type=int, default=2, help="traces per kind, speed and capacity (default 2)")
    parser.add_argument("--jobs", type=int, default=1, help="processes for the seeds (default 1)")
    parser.add_argument("--output", type=Path, help="write the markdown here instead of printing it")
    args = parser.parse_args()
    lines = report(evaluate(args.traces, args.seeds, args.jobs), args.seeds, args.traces)
    if args.held_out:
        held = report(evaluate(args.traces, args.held_out, args.jobs), args.held_out, args.traces)
        lines += ["", *(line.replace("### Fast leaks", "### Held out: fast leaks", 1) for line in held)]
    text = "\n".join(lines) + "\n"
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
