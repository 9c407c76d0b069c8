"""Run the suite on a host's idle devices: every chip check on every chip, the collectives across them, the
memory pattern at rest around it all; re-run a deviating check twice at once (2 of 3 confirms it).

The worker and the scoreboard (benchmarks/sdc.py) run the same ``Suite``.
A result is a dict as the worker prints it: device, check, entry, finite,
max_abs_error, error_ratio (over 1 fails the reference), fingerprint,
duration_seconds, and a note where the check has one.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tpuwatch.canary import spec
from tpuwatch.canary.checks import bf16, collective, faults, gemm, memory, reference_model, transcendental
from tpuwatch.canary.checks.base import Case, measure
from tpuwatch.canary.speed import (
    BUSY_ROUNDS,
    SLOW,
    SPEED_ROUNDS,
    looks_slow,
    median,
    slow_against_peers,
    slow_beside,
    speed_verdict,
)

CHIP_CHECKS = {m.NAME: m for m in (reference_model, gemm, transcendental, bf16)}
ALL = spec.CHECKS
assert set(ALL) == {*CHIP_CHECKS, memory.NAME, collective.NAME}
REPEATS = 3  # runs of each check, back to back: its device time is the fastest; any two that differ deviate
SPEED = "speed"  # the confirm line of a chip that looked slow
CONFIRM_RUNS = 2  # extra runs of a deviating check: deviating in 2 of 3 confirms it
MEMORY_SEED = 0x7A11
_PROGRAMS: dict[tuple[Any, ...], Any] = {}  # compiled once per process: per check, fault class (and shape)
_WARM: set[tuple[Any, ...]] = set()  # (check, class, chip) already run once: compiled for that chip
HOST_SHAPE = (128, 256)  # the host reference: two (128x256)@(256x256) products on the host's CPU backend, ~0.5 ms
DISPUTED = "disputed"  # expected bits where the chips disagree with no majority: every one of them deviates
Chip = tuple[str, Any]  # (name, jax device)


@dataclass(frozen=True)
class Settings:
    """What the suite runs and how much memory it may keep at rest."""

    checks: tuple[str, ...] = ALL
    memory_bytes: int = 16 << 20
    memory_share: float = 0.05


class Suite:
    """The suite on one platform; ``fault`` (a drill) hits chip ``fault_chip`` only."""

    def __init__(self, jax: Any, platform: str, settings: Settings = Settings(),
                 fault: faults.Fault | None = None, fault_chip: str | None = None) -> None:
        self.jax = jax
        self.platform = platform
        self.settings = settings
        self.fault = fault
        self.fault_chip = fault_chip
        self._rng = np.random.default_rng(int(fault["seed"]) if fault else 0)
        self._knobs = faults.knobs(fault)
        self._cases: dict[tuple[str, int, bool], Case] = {}

    def _fires(self, chip: str) -> bool:
        return self.fault is not None and chip == self.fault_chip and bool(self._rng.random() < self.fault["p"])

    def _kind(self, faulty: bool) -> str | None:
        return self.fault.kind if faulty and self.fault is not None else None

    def _program(self, key: tuple[Any, ...], build: Callable[[], Any]) -> Any:
        """A compiled program, shared by every Suite of this process (one per check and fault class)."""
        if key not in _PROGRAMS:
            _PROGRAMS[key] = build()
        return _PROGRAMS[key]

    def _case(self, check: str, entry: int, faulty: bool) -> Case:
        entry = 0 if CHIP_CHECKS[check].FIXED else entry
        key = (check, entry, faulty)
        if key not in self._cases:
            if len(self._cases) > 4 * len(CHIP_CHECKS):
                self._cases.clear()
            self._cases[key] = CHIP_CHECKS[check].case(entry, self.platform, self.fault if faulty else None)
        return self._cases[key]

    def run_check(self, check: str, chip: Chip, entry: int) -> dict[str, Any]:
        """One check on one chip: its result line (without the event)."""
        name, device = chip
        faulty = self.fault is not None and name == self.fault_chip
        kind = self._kind(faulty)
        case = self._case(check, entry, faulty)
        program = self._program((check, kind), lambda: self.jax.jit(CHIP_CHECKS[check].program(self.jax, kind)))
        args = self.jax.device_put(case.inputs, device)
        knob = self.jax.device_put(self._knobs if faulty else {}, device)
        if (check, kind, name) not in _WARM:  # compile outside the timing, the fault asleep
            self.jax.block_until_ready(program(False, knob, *args))
            _WARM.add((check, kind, name))
        timed = check in spec.TIMED_CHECKS
        runs, outputs, host = [], [], [self._host_pace()] if timed else []
        for _ in range(REPEATS):  # the fastest is what the chip can do, not what the host's scheduler did
            fires = self._fires(name)
            started = time.perf_counter()
            outputs.append(np.asarray(self.jax.block_until_ready(program(fires, knob, *args))))
            runs.append(time.perf_counter() - started)
            host += [self._host_pace()] if timed else []  # the host's pace beside each run (speed.py)
        found = [measure(output, case) for output in outputs]
        seen = Counter(f["fingerprint"] for f in found)
        odd = min(found, key=lambda f: seen[f["fingerprint"]])  # a run unlike the others is the one to judge
        note = f"{len(seen)} different answers in {REPEATS} runs of the same program" if len(seen) > 1 else None
        return {"device": name, "check": check, "entry": 0 if CHIP_CHECKS[check].FIXED else entry, **odd,
                "duration_seconds": min(runs), **({"note": note, "error_ratio": float("inf")} if note else {}),
                **({"runs_seconds": runs, "host_seconds": host} if host and None not in host else {})}

    def _host_pace(self) -> float | None:
        """Seconds one run of the host reference takes: a fixed program on the host's CPU backend (the host's pace,
        not a chip's: a slow accelerator does not slow it); None where jax has no CPU backend."""
        def build() -> Any:
            try:
                cpu = self.jax.devices("cpu")[0]
            except RuntimeError:
                return None
            rng = np.random.default_rng(MEMORY_SEED)
            x = self.jax.device_put(rng.random(HOST_SHAPE, dtype=np.float32), cpu)
            w = self.jax.device_put(rng.random((HOST_SHAPE[1],) * 2, dtype=np.float32) / HOST_SHAPE[1], cpu)
            program = self.jax.jit(lambda x, w: (x @ w) @ w)
            self.jax.block_until_ready(program(x, w))  # compiled outside any timing
            return program, x, w

        reference = self._program(("host reference",), build)
        if reference is None:
            return None
        program, x, w = reference
        started = time.perf_counter()
        self.jax.block_until_ready(program(x, w))
        return time.perf_counter() - started

    def run(self, chips: Sequence[Chip], entry: int, on_chip: Callable[[str], None] = lambda name: None,
            on_result: Callable[[dict[str, Any]], None] = lambda result: None) -> list[dict[str, Any]]:
        """Every check of the settings on ``chips``, in order; the memory pattern rests through the others.

        ``on_chip(name)`` is called before a chip's checks, ``on_result`` with each result as it comes."""
        wanted = self.settings.checks
        resting = self._write(chips) if memory.NAME in wanted else {}
        out: list[dict[str, Any]] = []

        def keep(results: list[dict[str, Any]]) -> None:
            for result in results:
                on_result(result)
                out.append(result)

        for chip in chips:
            on_chip(chip[0])
            keep([self.run_check(check, chip, entry) for check in CHIP_CHECKS if check in wanted])
        if collective.NAME in wanted and len(chips) > 1:
            keep(self._collective(chips))
        keep([self._check_memory(chip, *resting[chip[0]]) for chip in chips if chip[0] in resting])
        return out

    def confirm(self, chips: Sequence[Chip], results: Sequence[dict[str, Any]],
                history: dict[tuple[str, int], dict[str, str]]) -> list[dict[str, Any]]:
        """For every result that deviates, CONFIRM_RUNS more runs at once: the confirm lines (device, check,
        entry, deviations: one flag per run, the first included)."""
        expected = expected_bits(results, history)
        by_name = dict(chips)
        out = []
        for r in results:
            key = (r["device"], r["check"], r["entry"])
            if not deviates(r, expected[key]):
                continue
            flags = [True]
            for _ in range(CONFIRM_RUNS):
                again = self._again(r, chips, by_name)
                flags.append(deviates(again, expected[key]))
            out.append({"device": r["device"], "check": r["check"], "entry": r["entry"], "deviations": flags})
        return out + self._confirm_speed(chips, results)

    def _confirm_speed(self, chips: Sequence[Chip], results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """When a chip looks slow (against its peers' median, or its fastest peer), every chip is timed up to
        SPEED_ROUNDS times more (BUSY_ROUNDS more while the host is too busy to tell), in a rotated order; each round
        compares the chips' fastest times so far, until no chip looks slow (speed.py).  A chip slow at first only
        against its fastest peer has its rounds from its second timing on.  A round that says slow is conclusive
        when the chip's timing in it is also slow against its peers' timings in that same round (the host's pace at
        that moment).  Each speed line keeps its rounds (``rounds``: the chip's timing, its peers' beside it, its
        fastest and its peers' median fastest so far, the host reference beside its runs, the round's verdict) so a
        verdict can be read back."""
        timed = {r["device"]: r for r in results if r["check"] in spec.TIMED_CHECKS}
        best = {d: r["duration_seconds"] for d, r in timed.items()}
        flags: dict[str, list[bool]] = {}
        conclusive: dict[str, list[bool]] = {}
        rounds: dict[str, list[dict[str, Any]]] = {}

        def judge_round(now: dict[str, dict[str, Any]], names: Sequence[str] | None = None) -> None:
            slow = slow_against_peers(best)
            for name in flags if names is None else names:
                mine = now[name]["duration_seconds"]
                beside = [r["duration_seconds"] for d, r in now.items() if d != name]
                flags[name].append(name in slow)
                conclusive[name].append(name not in slow or slow_beside(mine, beside))
                rounds[name].append({"took": mine, "beside": beside, "best": best[name],
                                     "peers_best": median([t for d, t in best.items() if d != name]),
                                     "host": now[name].get("host_seconds"), "slow": flags[name][-1],
                                     "conclusive": conclusive[name][-1]})

        for name in looks_slow(best):
            flags[name], conclusive[name], rounds[name] = [], [], []
        first = set(slow_against_peers(best))
        judge_round(timed, [name for name in flags if name in first])
        by_name, order = dict(chips), list(timed)
        for done in range(SPEED_ROUNDS + BUSY_ROUNDS if flags else 0):
            open_ = [n for n, seen in flags.items() if all(seen)]
            if not open_ or (done >= SPEED_ROUNDS and all(
                    speed_verdict(flags[n], conclusive[n]) == SLOW for n in open_)):
                break
            order = order[1:] + order[:1]
            now = {d: self.run_check(timed[d]["check"], (d, by_name[d]), timed[d]["entry"]) for d in order}
            for d, r in now.items():
                best[d] = min(best[d], r["duration_seconds"])
            judge_round(now)
        return [{"device": name, "check": SPEED, "entry": 0, "deviations": flags[name],
                 "conclusive": conclusive[name], "rounds": rounds[name]} for name in flags]

    def _again(self, result: dict[str, Any], chips: Sequence[Chip], by_name: dict[str, Any]) -> dict[str, Any]:
        name, check = result["device"], result["check"]
        if check in CHIP_CHECKS:
            return self.run_check(check, (name, by_name[name]), result["entry"])
        if check == collective.NAME:
            return next(r for r in self._collective(chips) if r["device"] == name)
        return self._check_memory((name, by_name[name]), *self._write([(name, by_name[name])])[name])

    def _write(self, chips: Sequence[Chip]) -> dict[str, tuple[Any, Any, int]]:
        resting = {}
        for name, device in chips:
            words = memory.words_for(device, self.settings.memory_bytes, self.settings.memory_share)
            faulty = self.fault is not None and name == self.fault_chip
            kind = self._kind(faulty)
            make, rest, check = self._program((memory.NAME, words, kind), lambda: tuple(
                self.jax.jit(f) for f in memory.programs(self.jax, words, MEMORY_SEED, kind)))
            with self.jax.default_device(device):
                buffer = rest(self._fires(name), self._knobs if faulty else {}, make())
            resting[name] = (buffer, check, words)
        return resting

    def _check_memory(self, chip: Chip, buffer: Any, check: Any, words: int) -> dict[str, Any]:
        started = time.perf_counter()
        bad, first, head = self.jax.device_get(check(buffer))
        took = time.perf_counter() - started
        return {"device": chip[0], "check": memory.NAME, "entry": 0, **memory.judge(bad, first, head, MEMORY_SEED),
                "duration_seconds": took, "words": words}

    def _collective(self, chips: Sequence[Chip]) -> list[dict[str, Any]]:
        names = [name for name, _ in chips]
        index = names.index(self.fault_chip) if self.fault_chip in names else None
        kind = self._kind(index is not None)
        program = self._program((collective.NAME, tuple(names), kind, index), lambda: self.jax.pmap(
            collective.program(self.jax, kind, index), axis_name="chips", in_axes=(0, None, 0),
            devices=[device for _, device in chips]))
        fires = self._fires(names[index]) if index is not None else False
        sent = collective.contributions(len(chips))
        started = time.perf_counter()
        gathered, summed = self.jax.device_get(program(np.full(len(chips), fires), self._knobs if kind else {},
                                                       sent))
        took = time.perf_counter() - started
        blamed = collective.blame(np.asarray(gathered), np.asarray(summed))
        return [{"device": name, "check": collective.NAME, "entry": len(chips), "finite": True,
                 "max_abs_error": 0.0 if i not in blamed else 1.0, "error_ratio": float("inf") if i in blamed else 0.0,
                 "fingerprint": f"{len(chips):016x}", "duration_seconds": took / len(chips),
                 "note": blamed.get(i)} for i, name in enumerate(names)]


def deviates(result: dict[str, Any], expected: str | None) -> bool:
    """Whether a result is off: not finite, over its bound, or other bits than ``expected`` (None: no claim)."""
    if not result["finite"] or (result["error_ratio"] is not None and result["error_ratio"] > 1):
        return True
    return expected is not None and result["fingerprint"] != expected


def expected_bits(results: Sequence[dict[str, Any]], history: dict[tuple[str, int], dict[str, str]]
                  ) -> dict[tuple[str, str, int], str | None]:
    """(device, check, entry) -> the bits it should have given: its peers' majority, else its own past."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["check"], r["entry"]), []).append(r)
    out: dict[tuple[str, str, int], str | None] = {}
    for (check, entry), group in groups.items():
        common, count = Counter(r["fingerprint"] for r in group).most_common(1)[0]
        majority = common if count * 2 > len(group) else None
        for r in group:
            past = history.get((check, entry), {}).get(r["device"])
            # Two chips that disagree: neither is right until its own past says so (the judge flags both).
            out[(r["device"], check, entry)] = majority or past or (DISPUTED if len(group) > 1 else None)
    return out
