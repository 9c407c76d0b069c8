"""Simulated accelerators: the fire-drill mode for alert routing and the base of tests.

Each chip runs a workload whose memory follows an allocator sawtooth around a
per-chip baseline, with utilization, temperature and power that follow the
load.  A scenario injects one fault into ``fault_device`` once ``fault_after``
has passed; the ``hbm-leak`` scenario's leak began ``LEAK_LEAD_S`` earlier, so
that ``history()``, the chips' simulated past handed to the leak detector at
start, already shows an hour of it.  Values depend only on the seed, the chip,
the number of reads and the elapsed time on the injected clock, so a run is
reproducible.

The simulator exports every signal tpuwatch knows, including temperature,
power and ECC counters that real TPUs do not expose, so that every alert
route can be drilled on any host.  It is a backend like the others: what a
drill needs and changes beyond the chips' readings (the ``sdc`` drill's
canary, the ``hung`` drill's shorter hang time, the state kept apart, feeding
``history()`` to the detectors) belongs to ``tpuwatch.drills``.

In the ``hung`` scenario every chip is held by a simulated training process
and reports a runtime status whose sequencer advances at every read with
programs queued, as libtpu's GetTpuRuntimeStatus would; from ``fault_after``
the faulty chip's sequencer stops where it is, its duty cycle drops to 0 and
its programs stay queued, which the hang detector (tpuwatch.devices.hang)
judges hung once ``devices.hang.after`` has passed.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from tpuwatch.config import Config, SimConfig
from tpuwatch.devices.base import DeviceReading, ProcessUse
from tpuwatch.devices.progress import ChipStatus
from tpuwatch.hw.chips import CHIPS

# The load cycle: not a multiple or divisor of a minute (nor of the 10 s history step), so that per-minute means
# (temperature drift) see every phase of it, as a real load's would; with 120 s, every other minute saw the same half
# cycle, the learned spread was near zero and healthy chips drifted.
SAWTOOTH_PERIOD_S = 137.0
LEAK_FRACTION_PER_S = 0.15 / 3600  # of capacity: 15 % per hour
LEAK_LEAD_S = 3600.0  # the leak began this long before fault_after
OVERHEAT_C_PER_S = 0.5
OVERHEAT_MAX_C = 96.0
UNCORRECTED_AFTER_S = (0.0, 120.0)  # after the fault starts, one uncorrectable error at each
HUNG_QUEUED = 3  # programs queued on each chip of the hung scenario


class _Model(NamedTuple):
    """What the simulator takes from a chip's row of the chip table."""

    memory_bytes: int
    idle_watts: float
    max_watts: float


def _model(chip: str) -> _Model:
    row = CHIPS[chip]
    if row.hbm_bytes is None or row.idle_watts is None or row.max_watts is None:
        raise ValueError(f"chip {chip} cannot be simulated: no capacity or power range in the chip table")
    return _Model(row.hbm_bytes, row.idle_watts, row.max_watts)


def build(config: Config) -> SimBackend:
    """The backend ``devices.backend: sim`` names, from ``devices.sim``."""
    return SimBackend(config.devices.sim)


class SimBackend:
    """``devices.backend: sim``: N deterministic simulated chips following a scenario."""

    name = "sim"

    def __init__(self, config: SimConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._start = clock()
        self._model = _model(config.chip)
        self._rngs = [random.Random(f"{config.seed}:{i}") for i in range(config.count)]
        self._baseline = [0.55 + 0.15 * rng.random() for rng in self._rngs]
        self._phase = [rng.random() for rng in self._rngs]
        self._corrected = [0] * config.count

    def read(self) -> list[DeviceReading]:
        """One reading per present chip."""
        elapsed = self._clock() - self._start
        fault_age = elapsed - self.config.fault_after
        readings = []
        for index in range(self.config.count):
            faulty = index == self.config.fault_device and fault_age >= 0
            if faulty and self.config.scenario == "device-lost":
                continue
            readings.append(self._chip(index, elapsed, fault_age if faulty else None))
        return readings

    def _chip(self, index: int, elapsed: float, fault_age: float | None) -> DeviceReading:
        rng, model, scenario = self._rngs[index], self._model, self.config.scenario
        cycle = (elapsed / SAWTOOTH_PERIOD_S + self._phase[index]) % 1.0
        used_fraction = self._baseline[index] + 0.12 * cycle + rng.gauss(0, 0.003)
        if scenario == "hbm-leak" and index == self.config.fault_device:
            used_fraction += LEAK_FRACTION_PER_S * max(0.0, elapsed - self.config.fault_after + LEAK_LEAD_S)
        used = min(1.0, max(0.05, used_fraction)) * model.memory_bytes

        load = 0.8 + 0.15 * math.sin(2 * math.pi * cycle) + rng.gauss(0, 0.02)
        utilization = min(1.0, max(0.0, load))
        temperature = 38.0 + 30.0 * utilization + rng.gauss(0, 0.4)
        if fault_age is not None and scenario == "overheat":
            temperature = min(OVERHEAT_MAX_C, temperature + OVERHEAT_C_PER_S * fault_age)
        power = model.idle_watts + (model.max_watts - model.idle_watts) * utilization + rng.gauss(0, 2.0)

        hung = fault_age is not None and scenario == "hung"
        if hung:
            utilization = 0.0
        uncorrected = 0
        if fault_age is not None and scenario == "ecc-errors":
            self._corrected[index] += rng.randint(0, 4)
            uncorrected = sum(1 for after in UNCORRECTED_AFTER_S if fault_age >= after)
        return DeviceReading(
            device=str(index),
            chip=self.config.chip,
            pci=f"0000:{index + 0x10:02x}:00.0",
            memory_used_bytes=round(used),
            memory_total_bytes=model.memory_bytes,
            utilization_ratio=round(utilization, 4),
            temperature_celsius=round(temperature, 1),
            power_watts=round(max(0.0, power), 1),
            ecc_corrected_total=self._corrected[index],
            ecc_uncorrected_total=uncorrected,
            device_files=(f"{self.config.device_dir}/accel{index}",) if self.config.device_dir else (),
            sources={"all readings": f"simulator (scenario {scenario}, seed {self.config.seed})"},
            **(_workload(index, elapsed - (fault_age or 0.0) if hung else elapsed) if scenario == "hung" else {}),
        )


def _workload(index: int, progress: float) -> dict[str, Any]:
    """The hung scenario's holder and runtime status of a chip whose sequencer got ``progress`` seconds far."""
    steps = int(progress * 10)
    status = ChipStatus(positions=((index, 1, 0, 0x400 + steps % 4096, 7, steps // 4096 + 1),), queued=HUNG_QUEUED)
    return {"processes": (ProcessUse(4100 + index, "python3"),), "runtime_status": status}


def history(config: SimConfig, span: float, step: float) -> Iterator[tuple[float, list[DeviceReading]]]:
    """The chips' readings over the ``span`` seconds before start, every ``step``, as (offset, readings)."""
    elapsed = 0.0
    backend = SimBackend(config, clock=lambda: elapsed)
    for k in range(int(span / step), 0, -1):
        elapsed = -k * step
        yield elapsed, backend.read()
