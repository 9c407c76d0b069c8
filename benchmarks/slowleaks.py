"""The slow-leak traces of ``benchmarks/trend.py``: 12 h of a chip's memory at 10 s, leak-free or leaking.

Leak-free kinds: flat noise, regular and irregular sawtooth, up-and-down
steps, one step up, a warm-up plateau, periodic load, spikes.  Leaking kinds,
from a random start, filling the room left in 2 h to 2 days (log-uniform):
linear, under a sawtooth, staircase, accelerating (within 1 day), a rising
floor under a fixed top, periodic plus leak.  Each trace misses a few samples
and has one short gap.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

GIB = 1024.0**3
CAPACITIES_GIB = (16, 32, 95)
STEP_S = 10.0
HOURS = 12
MINUTE, HOUR = 60.0, 3600.0
LEAK_FREE = ("flat", "sawtooth", "irregular_sawtooth", "steps_up_down", "step_up", "warmup", "periodic",
             "spikes")
LEAKING = ("linear", "under_sawtooth", "staircase", "accelerating", "rising_floor", "periodic_leak")


@dataclass
class Trace:
    """One labelled series: sample times, used bytes, capacity, leak start (None when leak-free)."""

    kind: str
    times: np.ndarray
    used: np.ndarray
    capacity: float
    leak_start: float | None


def _sawtooth(rng: np.random.Generator, t: np.ndarray, capacity: float, irregular: bool) -> np.ndarray:
    """Allocation cycles: a linear climb then a release, period and height fixed or drawn per cycle."""
    out = np.zeros_like(t)
    period = rng.uniform(2, 20) * MINUTE
    height = rng.uniform(0.05, 0.3) * capacity
    start = -rng.uniform(0, period)
    while start < t[-1]:
        length = rng.uniform(1, 30) * MINUTE if irregular else period
        top = rng.uniform(0.03, 0.3) * capacity if irregular else height
        inside = (t >= start) & (t < start + length)
        out[inside] = top * (t[inside] - start) / length
        start += length
    return out


def _steps(rng: np.random.Generator, t: np.ndarray, capacity: float) -> np.ndarray:
    """Model swaps: a new level every 20-120 min, up or down."""
    out = np.zeros_like(t)
    at = rng.uniform(20, 120) * MINUTE
    level = 0.0
    while at < t[-1]:
        level = rng.uniform(-0.1, 0.25) * capacity
        out[t >= at] = level
        at += rng.uniform(20, 120) * MINUTE
    return out


def _periodic(rng: np.random.Generator, t: np.ndarray, capacity: float) -> np.ndarray:
    period = rng.uniform(20, 120) * MINUTE
    return rng.uniform(0.05, 0.2) * capacity * np.sin(2 * np.pi * t / period + rng.uniform(0, 2 * np.pi))


def _leak(rng: np.random.Generator, t: np.ndarray, start: float, room: float, accelerating: bool) -> np.ndarray:
    """Growth from ``start`` that would use ``room`` bytes within 2 h to 2 days (accelerating: 1 day), log-uniform."""
    longest = 24 * HOUR if accelerating else 48 * HOUR
    to_exhaustion = float(np.exp(rng.uniform(np.log(2 * HOUR), np.log(longest))))
    elapsed = np.clip(t - start, 0, None)
    if accelerating:
        return room * (elapsed / to_exhaustion) ** 2
    return room * elapsed / to_exhaustion


def generate(kind: str, capacity_gib: int, rng: np.random.Generator) -> Trace:
    """One trace of ``kind`` with a few missed samples and one short gap."""
    capacity = capacity_gib * GIB
    t = np.arange(0, HOURS * HOUR, STEP_S)
    base = rng.uniform(0.15, 0.4) * capacity
    noise = rng.normal(0, rng.uniform(0.0005, 0.004) * capacity, t.size)
    used = base + noise
    leak_start = None
    if kind in ("sawtooth", "under_sawtooth", "rising_floor"):
        used += _sawtooth(rng, t, capacity, irregular=bool(rng.integers(2)))
    elif kind == "irregular_sawtooth":
        used += _sawtooth(rng, t, capacity, irregular=True)
    elif kind == "steps_up_down":
        used += _steps(rng, t, capacity)
    elif kind == "step_up":
        used += np.where(t >= rng.uniform(1, 11) * HOUR, rng.uniform(0.05, 0.3) * capacity, 0.0)
    elif kind == "warmup":
        at = rng.choice([0.0, rng.uniform(1, 10) * HOUR])
        height = rng.uniform(0.1, 0.4) * capacity
        if rng.integers(2):
            tau = rng.uniform(2, 10) * MINUTE
            used += np.where(t >= at, height * (1 - np.exp(-np.clip(t - at, 0, None) / tau)), 0)
        else:
            used += height * np.clip((t - at) / (rng.uniform(5, 20) * MINUTE), 0, 1)
    elif kind in ("periodic", "periodic_leak"):
        used += _periodic(rng, t, capacity)
    elif kind == "spikes":
        hits = rng.random(t.size) < rng.uniform(1, 6) / 360
        used += np.where(hits, rng.choice([-1, 1], t.size) * rng.uniform(0.05, 0.3, t.size) * capacity, 0)
    if kind in LEAKING:
        leak_start = float(rng.uniform(1, 7) * HOUR)
        room = capacity - float(used.max())
        if kind == "staircase":
            every = rng.uniform(5, 30) * MINUTE
            used += _leak(rng, np.floor(t / every) * every, leak_start, room, False)
        elif kind == "rising_floor":
            floor = _leak(rng, t, leak_start, room, False)
            top = used.max()
            used = np.maximum(used, base + floor + noise)
            used = np.minimum(used, np.maximum(top, base + floor + 0.05 * capacity))
        else:
            used += _leak(rng, t, leak_start, room, kind == "accelerating")
    used = np.clip(used, 0, capacity)
    keep = rng.random(t.size) > 0.01
    gap = rng.uniform(0, t[-1])
    keep &= ~((t >= gap) & (t < gap + rng.uniform(1, 5) * MINUTE))
    epoch = 1_700_000_000.0 + float(rng.integers(0, 10**6)) * STEP_S
    return Trace(kind, t[keep] + epoch, used[keep], capacity, None if leak_start is None else leak_start + epoch)


def traces(per_kind: int, seed: int) -> Iterator[Trace]:
    """``per_kind`` traces of every kind at every capacity."""
    rng = np.random.default_rng(seed)
    for kind in LEAK_FREE + LEAKING:
        for capacity in CAPACITIES_GIB:
            for _ in range(per_kind):
                yield generate(kind, capacity, rng)
